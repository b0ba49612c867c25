"""Recorded phases as a Chrome Trace Event Format file (opens in Perfetto's UI and in
chrome://tracing): one track per process and thread, a complete ("X") span per phase, the
collectives' kind, bytes and peers as args, and flow arrows from a PS push to its apply.

`profile(path)` checks that it can write `path` before its body runs (an unwritable path
fails before training starts) and writes what every process recorded meanwhile when the body
ends. The recorders are ring buffers, so a long run's trace holds its last spans, bounded.
Each worker formats its own spans then (labdist/timing/trace_events.py), all at once; the driver
joins their text and draws the push -> apply arrows.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from labdist.timing import phases, timeline, trace_events


def chrome_trace(processes: list[dict[str, Any]], origin: float) -> dict[str, Any]:
    """The trace of `processes` (timeline.collect's), times in µs after `origin`, as a dict
    (what `encode` writes, read back)."""
    return json.loads(encode(processes, origin))


def encode(processes: list[dict[str, Any]], origin: float) -> str:
    """The trace of `processes` (timeline.collect's, shifted to the driver's clock or not) as
    Chrome Trace Event Format JSON text (unshifted spans begun before `origin` left out): one
    track per process and thread, a complete ("X") event per span, flow arrows from a push
    to its apply; times in µs to the nanosecond. Formatted here, on the driver: the same
    text as `gather` has the workers format."""
    fragments = []
    for proc in processes:
        own = proc.get("clock") == "own"  # spans on the process's own clock move here
        fragments.append(trace_events.fragment(
            proc["spans"], int(proc["pid"]), proc["name"], proc["threads"],
            origin + (proc["offset"] if own else 0.0), own))
    return join(fragments, origin)


def gather(clients: list[Any], since: float) -> str:
    """Every process's spans begun since `since` (driver's clock) as a trace, times in µs
    after `since`, from the workers of each of `clients`: each worker formats its own spans
    at once, shifted by its clock offset (trace_events.worker_fragment), so the driver only
    joins text and draws the flows. The same text as
    `encode(timeline.collect(client, since, shifted=False), since)` for one client."""
    fragments = []
    for client in clients:
        offsets = timeline.known_offsets(client)
        found = client.run(trace_events.worker_fragment, timeline.earliest(since, offsets),
                           since, offsets)
        if any(f is None for f in found.values()):  # a worker new to us
            offsets = timeline.known_offsets(client, again=True)
            found = client.run(trace_events.worker_fragment,
                               timeline.earliest(since, offsets), since, offsets)
        fragments += [f for _, f in sorted(found.items()) if f is not None]
    local = phases.snapshot(since)
    if all(f["pid"] != local["pid"] for f in fragments):  # a LocalCluster with threads
        fragments.append(trace_events.fragment(local["spans"], local["pid"], "driver",
                                               local["threads"], since, True))
    return join(fragments, since)


def join(fragments: list[dict[str, Any]], origin: float) -> str:
    """The trace file's text from each process's formatted spans (trace_events.fragment's),
    in process order: their metadata, their events (each track in time order, processes by
    pid) and a flow arrow from each push to each apply it caused, put where the track's time
    order wants it."""
    meta: list[str] = []
    pushes: dict[int, tuple] = {}
    applies: dict[int, list[tuple]] = {}
    for index, f in enumerate(fragments):
        pid = f["pid"]
        meta.append(f["process"])
        meta.append(f'{{"ph":"M","name":"process_sort_index","pid":{pid},"tid":0,'
                    f'"args":{{"sort_index":{index}}}}}')
        meta.extend(f["threads"])
        for kind, flow, tid, ts in f["ends"]:
            if kind == "push":
                pushes[flow] = (pid, tid, ts)
            else:
                applies.setdefault(flow, []).append((pid, tid, ts))
    flows: dict[tuple, list[str]] = {}  # (pid, tid, µs) -> its flow events, in order
    for flow, targets in applies.items():
        push = pushes.get(flow)
        if push is None:
            continue
        for n, (pid, tid, ts) in enumerate(targets):
            ident = f"{flow}.{n}"
            flows.setdefault(push, []).append(
                f'{{"ph":"s","name":"push → apply","cat":"flow","id":"{ident}",'
                f'"pid":{push[0]},"tid":{push[1]},"ts":{push[2]!r}}}')
            flows.setdefault((pid, tid, ts), []).append(
                f'{{"ph":"f","bp":"e","name":"push → apply","cat":"flow",'
                f'"id":"{ident}","pid":{pid},"tid":{tid},"ts":{ts!r}}}')
    body = meta
    for f in sorted(fragments, key=_pid):
        pid, pieces = f["pid"], f["pieces"]
        for piece, cut in zip(pieces, f["cuts"], strict=False):
            if piece:
                body.append(piece)
            body.extend(flows.get((pid, *cut), ()))
        if pieces[-1]:
            body.append(pieces[-1])
    other = json.dumps({"producer": "labdist", "origin_unix_s": origin},
                       separators=(",", ":"), ensure_ascii=False)
    return (f'{{"traceEvents":[{",".join(body)}],'
            f'"displayTimeUnit":"ms","otherData":{other}}}')


def _pid(fragment: dict[str, Any]) -> int:
    return fragment["pid"]


def _clients_of(where: Any) -> list[Any]:
    """The Dask clients whose workers a trace covers: `where`'s (a strategy or a client);
    with none named, Dask's default client if there is one, else every live labdist
    strategy's cluster (an embedded one is not Dask's default)."""
    if where is None:
        from distributed import default_client

        try:
            return [default_client()]
        except ValueError:  # no default client: every live strategy's own cluster
            from labdist.cluster import reaper

            candidates = reaper.live_owners()
    else:
        candidates = [where]
    clients: dict[int, Any] = {}
    for c in candidates:
        client = getattr(c, "client", c)  # a strategy, or a distributed.Client
        # a strategy without a cluster (OneDeviceStrategy), a lab: the driver's spans only
        if hasattr(client, "scheduler_info") and client.status == "running":
            clients.setdefault(id(client), client)
    return list(clients.values())


@contextmanager
def profile(path: str | os.PathLike, client: Any = None) -> Iterator[str]:
    """Record every process's phases while the body runs; write them to `path` as a Chrome
    trace. `client`: a distributed.Client or a strategy (default: Dask's default client, or
    with none, the clusters of every labdist strategy alive: embedded ones included)."""
    path = os.fspath(path)
    try:
        with open(path, "w") as f:  # fail here, before any training, if we cannot write
            f.write("")
    except OSError as e:
        raise ValueError(
            f"profile(path={path!r}): cannot write a trace there ({e.strerror}); give a file "
            "path in an existing, writable folder") from None
    clients = _clients_of(client)
    start = time.time()
    try:
        yield path
    finally:
        text = gather(clients, start)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)  # one write of the whole text
