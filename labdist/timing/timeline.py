"""Gather every process's recorded phases (labdist/timing/phases.py) on the driver, on one clock.

Each worker's clock offset against the driver is measured by round trips (`client.run`): the
offset is the worker's reading minus the midpoint of the round trip, from the round trip that
was fastest, so a span's time on the driver's clock is its recorded time minus the offset.
"""

from __future__ import annotations

import time
from typing import Any

from labdist.timing import phases

ROUND_TRIPS = 5
OFFSET_TTL_S = 10.0  # a measured offset is reused this long (clocks drift by µs in that time)
_offsets: dict[str, tuple[float, float]] = {}  # worker address -> (measured at, offset)
MARGIN_S = 0.1  # workers send spans ending this much before the window (offsets' error: ms)


def clock_offsets(client: Any, rounds: int = ROUND_TRIPS, workers: list[str] | None = None
                  ) -> dict[str, float]:
    """Worker address -> seconds its wall clock runs ahead of the driver's (every worker, or
    those in `workers`)."""
    best: dict[str, tuple[float, float]] = {}
    for _ in range(rounds):
        t0 = time.time()
        readings = client.run(phases.clock, workers=workers)
        t1 = time.time()
        for address, reading in readings.items():
            if address not in best or t1 - t0 < best[address][0]:
                best[address] = (t1 - t0, reading - (t0 + t1) / 2)
    return {address: offset for address, (_, offset) in best.items()}


def _fresh_offsets() -> dict[str, float]:
    at = time.monotonic()
    return {a: off for a, (when, off) in _offsets.items() if at - when <= OFFSET_TTL_S}


def _measure(client: Any, rounds: int, workers: list[str] | None) -> dict[str, float]:
    at = time.monotonic()
    _offsets.update({a: (at, off)
                     for a, off in clock_offsets(client, rounds, workers).items()})
    return _fresh_offsets()


def known_offsets(client: Any, rounds: int = ROUND_TRIPS, again: bool = False,
                  workers: list[str] | None = None) -> dict[str, float]:
    """Worker address -> clock offset: those measured in the last `OFFSET_TTL_S` seconds, or
    all measured now if there are none (or `again`: a worker new to us answered)."""
    return (not again and _fresh_offsets()) or _measure(client, rounds, workers)


def earliest(since: float, offsets: dict[str, float]) -> float:
    """What workers are asked for to be sure of every span begun since `since` (driver's
    clock): the spans that ended after it on the earliest clock, less the offsets' error."""
    return since + min(offsets.values(), default=0.0) - MARGIN_S


def collect(client: Any | None, since: float = 0.0, rounds: int = ROUND_TRIPS,
            shifted: bool = True, workers: list[str] | None = None) -> list[dict[str, Any]]:
    """Every process's spans begun since `since` (driver clock), on the driver's clock: one dict per
    process with `name` (worker address or "driver"), `pid`, `offset`, `threads`, `spans`.
    Each process sends only its spans of the window (phases.Recorder.snapshot); offsets are
    measured again only where a worker has none from the last `OFFSET_TTL_S` seconds (a
    timeline refreshed every second, a trace per notebook cell). `shifted=False` leaves each
    worker's spans on its own clock, unfiltered (a trace shifts them as it writes them: one
    pass over the spans instead of two); the dict's `clock` says which. `workers`: ask only
    these worker addresses (default: every worker of `client`)."""
    found = []
    if client is not None:
        offsets = known_offsets(client, rounds, workers=workers)
        snaps = client.run(phases.snapshot, earliest(since, offsets), workers=workers)
        if any(address not in offsets for address in snaps):  # a worker new to us
            offsets = known_offsets(client, rounds, again=True, workers=workers)
            snaps = client.run(phases.snapshot, earliest(since, offsets), workers=workers)
        for address, snap in sorted(snaps.items()):
            off = offsets.get(address, 0.0)
            if not shifted:
                found.append({**snap, "name": address, "offset": off, "clock": "own"})
                continue
            spans = [(n, s - off, e - off, t, a) for n, s, e, t, a in snap["spans"]
                     if s - off >= since]  # begun in the window
            found.append({**snap, "name": address, "offset": off, "spans": spans,
                          "clock": "driver"})
    local = phases.snapshot(since)
    if all(p["pid"] != local["pid"] for p in found):  # a LocalCluster with threads: no twice
        local["spans"] = [s for s in local["spans"] if s[1] >= since]
        found.append({**local, "name": "driver", "offset": 0.0, "clock": "driver"})
    return found


def phase_totals(process: dict[str, Any], name: str) -> list[float]:
    """Per step of `process`: the seconds of phase `name` inside it (a test's and the panel's
    question: how long did replica 0 wait per step)."""
    steps = [s for s in process["spans"] if s[0] == phases.STEP]
    inner = [s for s in process["spans"] if s[0] == name]
    return [sum(min(e, se) - max(s, ss) for _, s, e, t, _ in inner
                if t == st and s < se and e > ss)
            for _, ss, se, st, _ in steps]


def summary(processes: list[dict[str, Any]], last: int = 100) -> str:
    """The timeline's line in words. Sync replicas: who was last to the collectives and how
    long the others waited; sync parameter servers: who was last to the barrier and how long
    the others waited there; async: no waiting, and how stale pushes landed."""
    per_run: dict[int, dict[int, float]] = {}  # run -> rank -> seconds waited
    talked: set[int] = set()  # runs in which some replica spent time in a collective
    barrier: dict[int, list[float]] = {}  # PS worker -> seconds waited at a barrier, per step
    pulls: dict[int, list[float]] = {}  # PS worker -> seconds pulling, per step
    for proc in processes:
        steps = [s for s in proc["spans"] if s[0] == phases.STEP]  # phase_totals' order
        for span, waited, pulled, comm in zip(steps, phase_totals(proc, "wait"),
                                              phase_totals(proc, "pull"),
                                              phase_totals(proc, "comm"), strict=True):
            args = span[4] or {}
            if "rank" in args and "run" in args:
                per_run.setdefault(args["run"], {})[args["rank"]] = waited
                if waited or comm:
                    talked.add(args["run"])
            elif "worker" in args:
                barrier.setdefault(args["worker"], []).append(waited)
                pulls.setdefault(args["worker"], []).append(pulled)
    mirrored = [r for r in sorted(per_run) if len(per_run[r]) > 1][-last:]
    runs = [per_run[r] for r in mirrored if r in talked]
    if mirrored and not runs:  # ON_READ without averaging, local steps: nobody meets
        return (f"sync replicas, no collective in the last {len(mirrored)} steps: each "
                "replica steps alone and nobody waits")
    if runs:
        lasts = [min(w, key=w.get) for w in runs]  # the last to arrive never waits
        slowest = max(set(lasts), key=lasts.count)
        share = 100 * lasts.count(slowest) / len(runs)
        others = [waited for w in runs for rank, waited in w.items() if rank != slowest]
        mean = 1e3 * sum(others) / max(len(others), 1)
        return (f"sync: replica {slowest} was last to the collectives in {share:.0f} % of the "
                f"last {len(runs)} steps; the others waited {mean:.0f} ms per step")
    waits = {w: sum(ws[-last:]) / len(ws[-last:]) for w, ws in barrier.items()}
    if len(waits) > 1 and any(waits.values()):  # sync PS: the workers meet at a barrier
        slowest = min(waits, key=waits.get)
        others = [v for w, v in waits.items() if w != slowest]
        return (f"sync PS: worker {slowest} was last to the barrier; the others waited "
                f"{1e3 * sum(others) / len(others):.0f} ms per step")
    applies = [s for p in processes for s in p["spans"] if s[0] == "apply"][-last:]
    if not applies and len(pulls) > 1:  # sync PS in fit: the next pull waits for the step
        means = {w: sum(ps[-last:]) / len(ps[-last:]) for w, ps in sorted(pulls.items())}
        return ("sync PS: each pull waits at the parameter servers until the step's gradients "
                "are in; pulled " + ", ".join(f"worker {w} {1e3 * v:.0f} ms"
                                              for w, v in means.items()) + " per step")
    if not applies:
        return "no steps recorded yet"
    line = f"async: nobody waits for a peer; {len(applies)} pushes applied"
    stale = sorted(s[4]["staleness"] for s in applies
                   if s[4] and s[4].get("staleness") is not None)
    if stale:
        line += (f", {stale[len(stale) // 2]} updates stale (median), {stale[-1]} at most")
    return line
