"""Core benchmark: `strategy.run` latency and `all_reduce` bandwidth, each against a baseline
measured in the same run on the same machine.

Run: `python bench/bench_core.py [--quick] [--json PATH]`.

Every figure is printed with a ratio against a baseline taken in the same process, on the same
cluster, interleaved in rounds: the machine this was written for has 2 cores shared by the
driver, the scheduler and both workers, so absolute numbers drift from minute to minute while
ratios of interleaved measurements hold still. What is measured and why is in
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from _machine import cpu_account, machine  # bench/ is on sys.path when this runs as a script
from _machine import cpu_seconds as _cpu_seconds
from loopback import TcpPeer

# Targets from the project's performance goals; a benchmark reports, it never fails on them.
RUN_OVER_ACTOR_TARGET = 1.5  # strategy.run latency / bare actor round trip, at most
ALL_REDUCE_OVER_TCP_TARGET = 0.5  # all_reduce bandwidth (16 MiB) / raw TCP bandwidth, at least
TARGET_PAYLOAD = "16 MiB"

TCP_STREAM_BYTES = 256 * 2**20
NUMPY_REPS = 3  # numpy additions of each kind per payload per round (cheap, so a few)
FLOAT32 = np.dtype(np.float32).itemsize
BUSY_LOADAVG = 1.0  # 1-minute load average at start above which other work is running
BUSY_OTHERS = 0.05  # share of the CPUs other processes may take during the run, unremarked

# label -> float32 elements; the "MB" sizes are decimal on purpose (1e6 and 64e6 bytes).
PAYLOADS: dict[str, int] = {
    "1 MB": 1_000_000 // FLOAT32,
    "16 MiB": 16 * 2**20 // FLOAT32,
    "64 MB": 64_000_000 // FLOAT32,
}


@dataclass(frozen=True)
class Settings:
    """Repetition counts: --quick trades precision for a smoke run well under a minute."""

    latency_rounds: int
    latency_calls: int  # calls of each variant per round
    latency_warmup: int
    bandwidth_rounds: int
    bandwidth_reps: dict[str, int]  # all_reduce repetitions per payload per round
    tcp_runs: int  # raw TCP streams per round

    @classmethod
    def make(cls, quick: bool) -> Settings:
        if quick:
            return cls(4, 10, 20, 3, {"1 MB": 3, "16 MiB": 1, "64 MB": 1}, 1)
        return cls(60, 25, 100, 25, {"1 MB": 5, "16 MiB": 3, "64 MB": 2}, 1)


@dataclass
class Figure:
    """One measured quantity in `unit`: its samples' median and p90, where p90 is always the
    slow tail (the 90th percentile of time: for a bandwidth, the 10th percentile of GB/s)."""

    name: str
    unit: str
    median: float
    p90: float
    n: int
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, name: str, unit: str, samples: list[float], higher_is_better: bool = False,
           **extra: Any) -> Figure:
        arr = np.asarray(samples, dtype=float)
        tail = np.percentile(arr, 10 if higher_is_better else 90)
        return cls(name, unit, float(np.median(arr)), float(tail), len(arr), extra)


@dataclass
class Ratio:
    """A figure over its baseline, with the project's target when there is one."""

    name: str
    value: float
    target: str = ""
    met: bool | None = None


# -- worker-side code (pickled by value from __main__, so it must not close over big objects) --
class Pinger:
    """The smallest possible Dask actor: the floor under any actor-based `strategy.run`."""

    async def ping(self) -> None:
        """Runs on the worker's event loop, like labdist's Replica methods."""
        return None

    def ping_sync(self) -> None:
        """Runs on the worker's single actor thread (one thread hop more)."""
        return None


def all_reduce_step(n: int) -> tuple[float, float, float, int]:
    """Allocate the payload on the worker (nothing travels from the driver), then time only the
    all_reduce. Returns (alloc seconds, all_reduce seconds, first element, size) so the driver
    can check the sum and separate allocation from the end-to-end time."""
    import labdist as ld

    t0 = time.perf_counter()
    x = np.ones(n, np.float32)
    t1 = time.perf_counter()
    y = ld.get_replica_context().all_reduce("SUM", x)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, float(y[0]), int(y.size)


# -- measurement helpers -------------------------------------------------------------------------
def time_calls(fn: Callable[[], Any], calls: int) -> list[float]:
    """Per-call wall times in microseconds."""
    out = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1e3)
    return out


def interleaved(variants: dict[str, Callable[[], Any]], rounds: int, calls: int,
                warmup: int, seed: int = 0) -> dict[str, list[float]]:
    """Run every variant `calls` times per round, in a fresh random order each round, so slow
    drifts of a noisy machine hit all variants alike."""
    for fn in variants.values():
        time_calls(fn, warmup)
    rng = random.Random(seed)
    samples: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for _ in range(rounds):
        rng.shuffle(names)
        for name in names:
            samples[name] += time_calls(variants[name], calls)
    return samples


def gbps(nbytes: int, seconds: float) -> float:
    """Decimal GB/s, as network and memory bandwidths are usually quoted."""
    return nbytes / seconds / 1e9


# -- the two benchmarks -----------------------------------------------------------------------
def bench_latency(strategy, settings: Settings) -> tuple[list[Figure], list[Ratio]]:
    """`strategy.run(lambda: 1)` against a bare Dask actor round trip on the same cluster."""
    from distributed import Client

    # Actor handles need a default client; direct_to_workers so calls skip the scheduler, as
    # labdist's own calls do.
    client = Client(strategy.client.scheduler.address, direct_to_workers=True)
    try:
        pingers = [client.submit(Pinger, actor=True, workers=[w], allow_other_workers=False,
                                 pure=False).result() for w in strategy.workers]
        first = pingers[0]
        step = lambda: 1  # noqa: E731 - a lambda on purpose: what users pass, cloudpickled

        def both_async() -> None:
            for f in [p.ping() for p in pingers]:
                f.result()

        variants: dict[str, Callable[[], Any]] = {
            "strategy.run(lambda: 1)": lambda: strategy.run(step),
            "bare actor, async def (1 worker)": lambda: first.ping().result(),
            "bare actor, def (1 worker)": lambda: first.ping_sync().result(),
            "bare actor, async def (both workers)": both_async,
            "in-process call of the same fn": step,
        }
        got = strategy.experimental_local_results(strategy.run(step))
        if tuple(got) != (1,) * strategy.num_replicas_in_sync:
            raise AssertionError(f"strategy.run(lambda: 1) returned {got}")
        samples = interleaved(variants, settings.latency_rounds, settings.latency_calls,
                              settings.latency_warmup)
    finally:
        client.close()
    figures = {name: Figure.of(f"latency: {name}", "us", s) for name, s in samples.items()}
    run = figures["strategy.run(lambda: 1)"].median
    over_actor = run / figures["bare actor, async def (1 worker)"].median
    ratios = [
        Ratio("strategy.run / bare actor round trip (async def)", over_actor,
              f"<= {RUN_OVER_ACTOR_TARGET}x", over_actor <= RUN_OVER_ACTOR_TARGET),
        Ratio("strategy.run / bare actor round trip (def)",
              run / figures["bare actor, def (1 worker)"].median),
        Ratio("strategy.run / bare actor on both workers at once",
              run / figures["bare actor, async def (both workers)"].median),
        Ratio("strategy.run / in-process call",
              run / figures["in-process call of the same fn"].median),
    ]
    return list(figures.values()), ratios


Samples = dict[tuple[str, str], list[float]]  # (series, payload label) -> seconds


def bench_all_reduce(strategies: dict[str, Any],
                     settings: Settings) -> tuple[list[Figure], list[Ratio]]:
    """all_reduce("SUM") bandwidth across the worker processes of each strategy (keyed by its
    transport), against raw loopback TCP and a single-process `a + b`, interleaved in rounds so
    drifts of the machine hit all alike."""
    peer = TcpPeer(TCP_STREAM_BYTES)
    operands = {label: (np.ones(n, np.float32), np.ones(n, np.float32), np.ones(n, np.float32))
                for label, n in PAYLOADS.items()}
    samples: Samples = {}

    def record(series: str, label: str, seconds: list[float]) -> None:
        samples.setdefault((series, label), []).extend(seconds)

    try:
        for n in PAYLOADS.values():  # warm-up: the first collectives of a size are slower
            for strategy in strategies.values():
                _all_reduce_once(strategy, n)
            peer.stream(n * FLOAT32)
            peer.exchange(n * FLOAT32)
        peer.stream(TCP_STREAM_BYTES)
        for _ in range(settings.bandwidth_rounds):
            record("tcp stream", "256 MiB", [peer.stream(TCP_STREAM_BYTES)
                                             for _ in range(settings.tcp_runs)])
            for label, n in PAYLOADS.items():
                record("tcp one way", label, [peer.stream(n * FLOAT32)])
                record("tcp both ways", label, [peer.exchange(n * FLOAT32)])
                fresh, preallocated = _numpy_add_times(*operands[label], NUMPY_REPS)
                record("numpy a + b", label, fresh)
                record("numpy add out", label, preallocated)
                for _ in range(settings.bandwidth_reps[label]):
                    for transport, strategy in strategies.items():
                        alloc, on_worker, e2e = _all_reduce_once(strategy, n)
                        record(f"alloc/{transport}", label, [alloc])
                        record(f"on workers/{transport}", label, [on_worker])
                        record(f"end to end/{transport}", label, [e2e])
    finally:
        peer.close()
    return _bandwidth_figures(samples, list(strategies))


def _numpy_add_times(a: np.ndarray, b: np.ndarray, out: np.ndarray,
                     reps: int) -> tuple[list[float], list[float]]:
    """Seconds of `a + b` (a fresh result, as all_reduce's combine makes: page faults
    included) and of `np.add(a, b, out=out)` (memory bandwidth alone)."""
    fresh, preallocated = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        _ = a + b
        t1 = time.perf_counter()
        np.add(a, b, out=out)
        t2 = time.perf_counter()
        fresh.append(t1 - t0)
        preallocated.append(t2 - t1)
    return fresh, preallocated


def _all_reduce_once(strategy, n: int) -> tuple[float, float, float]:
    """One all_reduce step: (slowest replica's allocation, slowest replica's all_reduce,
    end-to-end seconds of the strategy.run that carried it). Checks the sum, too."""
    world = strategy.num_replicas_in_sync
    t0 = time.perf_counter()
    result = strategy.run(all_reduce_step, args=(n,))
    e2e = time.perf_counter() - t0
    per_replica = strategy.experimental_local_results(result)
    for _, _, first, size in per_replica:
        if float(first) != float(world) or int(size) != n:
            raise AssertionError(f"all_reduce returned {first} x {size}; expected {world} x {n}")
    alloc = max(float(r[0]) for r in per_replica)
    return alloc, max(float(r[1]) for r in per_replica), e2e


def _bandwidth(name: str, nbytes: int, seconds: list[float]) -> Figure:
    """Algorithm bandwidth (payload bytes / time) of each sample; the median time rides along."""
    return Figure.of(name, "GB/s", [gbps(nbytes, t) for t in seconds], higher_is_better=True,
                     median_ms=float(np.median(seconds) * 1e3))


def _bandwidth_figures(samples: Samples,
                       transports: list[str]) -> tuple[list[Figure], list[Ratio]]:
    """Figures per payload; the target applies to the first transport (the default one)."""
    stream = _bandwidth("raw loopback TCP, 256 MiB stream one way", TCP_STREAM_BYTES,
                        samples[("tcp stream", "256 MiB")])
    figures, ratios = [stream], []
    for label, n in PAYLOADS.items():
        nbytes = n * FLOAT32
        names = [(f"{kind}/{t}", f"all_reduce [{t}] {what}")
                 for t in transports
                 for kind, what in (("on workers", "on the workers"),
                                    ("end to end", "end to end (strategy.run)"))]
        names += [("tcp one way", "raw loopback TCP one way"),
                  ("tcp both ways", "raw loopback TCP both ways at once"),
                  ("numpy a + b", "numpy a + b in one process"),
                  ("numpy add out", "numpy add(out=) in one process")]
        fig = {series: _bandwidth(f"{name}, {label}", nbytes, samples[(series, label)])
               for series, name in names}
        for t in transports:
            fig[f"end to end/{t}"].extra["alloc_median_ms"] = float(
                np.median(samples[(f"alloc/{t}", label)]) * 1e3)
        figures += fig.values()
        for i, t in enumerate(transports):
            ratios += _all_reduce_ratios(label, t, fig, stream, has_target=i == 0)
    return figures, ratios


def _all_reduce_ratios(label: str, transport: str, fig: dict[str, Figure], stream: Figure,
                       has_target: bool) -> list[Ratio]:
    on_workers = fig[f"on workers/{transport}"].median
    over_stream = on_workers / stream.median
    has_target = has_target and label == TARGET_PAYLOAD
    name = f"all_reduce [{transport}] {label}"
    return [
        Ratio(f"{name} (on workers) / raw TCP stream", over_stream,
              f">= {ALL_REDUCE_OVER_TCP_TARGET}x" if has_target else "",
              over_stream >= ALL_REDUCE_OVER_TCP_TARGET if has_target else None),
        Ratio(f"{name} (end to end) / raw TCP stream",
              fig[f"end to end/{transport}"].median / stream.median),
        Ratio(f"{name} (on workers) / raw TCP both ways, same size",
              on_workers / fig["tcp both ways"].median),
        Ratio(f"{name} (on workers) / numpy a + b", on_workers / fig["numpy a + b"].median),
    ]


# -- reporting ----------------------------------------------------------------------------------
def print_report(figures: list[Figure], ratios: list[Ratio], info: dict[str, Any]) -> None:
    print(f"\nmachine: {info['nproc']} cores, {info['cpu_model']}; Python {info['python']}, numpy "
          f"{info['numpy']}, distributed {info['distributed']}; labdist {info['git']}")
    print(f"load average at start: {', '.join(f'{x:.2f}' for x in info['loadavg_at_start'])}")
    cpu = info["cpu_use"]
    print(f"during the run: other processes {cpu['others_share']:.0%} of the CPUs, softirq "
          f"{cpu['softirq_share']:.0%}, steal {cpu['steal_share']:.0%}\n")
    if info["loadavg_at_start"][0] > BUSY_LOADAVG or cpu["others_share"] > BUSY_OTHERS:
        print("WARNING: other work ran on this machine; these figures are noisier than usual\n")
    width = max(len(f.name) for f in figures)
    print(f"{'figure':<{width}}  {'median':>10}  {'p90':>10}  unit  {'n':>5}  time (median)")
    for f in figures:
        ms = ", ".join(f"{v:.2f} ms" if k == "median_ms" else
                       f"{k.removesuffix('_median_ms')} {v:.2f} ms" for k, v in f.extra.items())
        print(f"{f.name:<{width}}  {f.median:>10.3f}  {f.p90:>10.3f}  {f.unit:<4}  {f.n:>5}  "
              f"{ms}".rstrip())
    print("(p90 is the slow tail: 90th percentile of time, 10th percentile of bandwidth)")
    width = max(len(r.name) for r in ratios)
    print(f"\n{'ratio (of medians)':<{width}}  {'value':>9}  target")
    for r in ratios:
        verdict = "" if r.met is None else ("met" if r.met else "MISSED")
        print(f"{r.name:<{width}}  {r.value:>8.3f}x  {r.target} {verdict}".rstrip())


@contextlib.contextmanager
def _tcp_strategy(default: str):
    """A second strategy forced onto Dask comms (TCP), to compare with the default transport
    when that is something else; None when it is TCP already or labdist has no such option."""
    import labdist as ld

    if default == "tcp":
        yield None
        return
    try:
        strategy = ld.MirroredStrategy(num_replicas=2, device="cpu", transport="tcp")
    except TypeError:  # a labdist without the transport option
        yield None
        return
    with strategy:
        yield strategy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few repetitions (smoke run)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write figures here")
    args = parser.parse_args(argv)
    settings = Settings.make(args.quick)

    import labdist as ld

    info = machine()
    cpu_before = _cpu_seconds()
    started = time.perf_counter()
    with ld.MirroredStrategy(num_replicas=2, device="cpu") as strategy:
        default = getattr(strategy, "transport", "default")
        print(f"strategy up in {time.perf_counter() - started:.1f} s on {strategy.workers}, "
              f"transport {default}", file=sys.stderr)
        lat_figures, lat_ratios = bench_latency(strategy, settings)
        print("latency done", file=sys.stderr)
        # Started only now so its idle cluster cannot disturb the latency figures.
        with _tcp_strategy(default) as tcp_strategy:
            strategies = {default: strategy}
            if tcp_strategy is not None:
                strategies["tcp"] = tcp_strategy
            bw_figures, bw_ratios = bench_all_reduce(strategies, settings)
    info["transports"] = list(strategies)
    info["seconds"] = time.perf_counter() - started
    info["cpu_use"] = cpu_account(cpu_before, info["seconds"])
    info["quick"] = args.quick
    figures, ratios = lat_figures + bw_figures, lat_ratios + bw_ratios
    print_report(figures, ratios, info)
    if args.json:
        args.json.write_text(json.dumps(
            {"machine": info, "settings": asdict(settings),
             "figures": [asdict(f) for f in figures], "ratios": [asdict(r) for r in ratios]},
            indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
