"""Runner for bench_scale.py: a trivial `strategy.run` and a 1 MB all-reduce on N replicas of
an embedded cluster, in one process; prints one JSON line.

The all-reduce is timed on the workers, in a loop inside one step (after one all-reduce that
lines the replicas up), so what is measured is the collective itself, not the skew of the
step's arrival at each replica. Next to it, `floor_ms`: the memory work the all-reduce cannot
skip at this replica count, timed in this process and shared by the cores
(allreduce_floor.py). Run: `python bench/baselines/scale_micro.py --replicas 8`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
from allreduce_floor import floor  # bench/baselines is on sys.path as a script

import labdist as ld

MB = 1_000_000


def all_reduce_loop(n: int, reps: int) -> float:
    """Seconds per all-reduce of `n` float32 ones, over `reps` back-to-back calls."""
    ctx = ld.get_replica_context()
    x = np.ones(n, np.float32)
    y = ctx.all_reduce("SUM", x)  # lines the replicas up
    t0 = time.perf_counter()
    for _ in range(reps):
        y = ctx.all_reduce("SUM", x)
    seconds = (time.perf_counter() - t0) / reps
    if float(y[0]) != ctx.num_replicas_in_sync or y.size != n:
        raise AssertionError(f"all_reduce gave {y[0]} x {y.size}")
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, required=True)
    p.add_argument("--calls", type=int, default=300, help="trivial runs timed")
    p.add_argument("--rounds", type=int, default=15, help="all-reduce loops timed")
    p.add_argument("--reps", type=int, default=20, help="all-reduces per loop")
    p.add_argument("--bytes", type=int, default=MB)
    args = p.parse_args()
    bound = floor(args.replicas, args.bytes)  # before the replicas start: this process alone
    with ld.MirroredStrategy(num_replicas=args.replicas, device="cpu") as strategy:
        for _ in range(20):
            strategy.run(lambda: 1)
        trivial = []
        for _ in range(args.calls):
            t0 = time.perf_counter()
            strategy.run(lambda: 1)
            trivial.append(time.perf_counter() - t0)
        n = args.bytes // 4
        strategy.run(all_reduce_loop, args=(n, 2))
        reduce = []
        for _ in range(args.rounds):
            got = strategy.experimental_local_results(
                strategy.run(all_reduce_loop, args=(n, args.reps)))
            reduce.append(max(float(s) for s in got))
        measured = statistics.median(reduce)
        ms = {k: bound[k] * 1e3 for k in ("floor", "copy_in", "sum", "copy_out")}
        print(f"{args.replicas} replicas: {args.bytes / MB:g} MB all-reduce "
              f"{measured * 1e3:.3f} ms; floor {ms['floor']:.3f} ms (copy in "
              f"{ms['copy_in']:.3f} + sum {ms['sum']:.3f} + copy out {ms['copy_out']:.3f} ms "
              f"over {bound['cores']} cores): {measured / bound['floor']:.1f}x the floor",
              flush=True)
        print(json.dumps({"replicas": args.replicas, "transport": strategy.transport,
                          "trivial_run_us": statistics.median(trivial) * 1e6,
                          "all_reduce_ms": measured * 1e3,
                          "floor_ms": bound["floor"] * 1e3,
                          "floor_parts_ms": {k: bound[k] * 1e3
                                             for k in ("copy_in", "sum", "copy_out")}}),
              flush=True)


if __name__ == "__main__":
    main()
