"""The memory work no all-reduce among N replicas on one host can skip, timed in one process:
N private 1 MB inputs copied into shared buffers, those N summed into one result in rank order,
and N fresh copies of the result handed back; divided by the cores that could share it.

It is the floor under scale_micro.py's all-reduce: no wake-ups, no Python per rank, no
waiting, only the copies and sums the semantics demand (fresh arrays from private inputs, one
rank-order sum). If the floor at 8 replicas is already more than 3x the measured all-reduce
at 2, issue 26's "8 <= 3x 2" cannot be met on this machine by any algorithm.
Run: `python bench/baselines/allreduce_floor.py --replicas 8`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

MB = 1_000_000


def floor(replicas: int, nbytes: int = MB, cores: int | None = None, rounds: int = 15,
          reps: int = 20) -> dict[str, float]:
    """Median seconds per all-reduce of each part (copy_in, sum, copy_out) over `rounds` loops
    of `reps`, and `floor`: their sum divided by `cores` (default: this process's cores)."""
    cores = cores or len(os.sched_getaffinity(0))
    n = nbytes // 4
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(n, dtype=np.float32) for _ in range(replicas)]
    shared = [np.empty(n, np.float32) for _ in range(replicas)]
    result = np.empty(n, np.float32)
    outs = [np.empty(n, np.float32) for _ in range(replicas)]

    def copy_in() -> None:
        for src, dst in zip(inputs, shared, strict=True):
            np.copyto(dst, src)

    def reduce() -> None:  # one pass per addend, as a rank-order fold must
        np.add(shared[0], shared[1], out=result) if replicas > 1 else np.copyto(result, shared[0])
        for s in shared[2:]:
            np.add(result, s, out=result)

    def copy_out() -> None:
        for i in range(replicas):
            outs[i] = result.copy()  # a fresh array, as an all-reduce returns

    parts = {"copy_in": copy_in, "sum": reduce, "copy_out": copy_out}
    times: dict[str, list[float]] = {k: [] for k in parts}
    for _ in range(2):  # warm: page faults, caches
        for fn in parts.values():
            fn()
    for _ in range(rounds):
        for key, fn in parts.items():  # interleaved, so the caches hold what a real one's do
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            times[key].append((time.perf_counter() - t0) / reps)
    out = {k: statistics.median(v) for k, v in times.items()}
    out["floor"] = sum(out.values()) / cores
    out["cores"] = cores
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, nargs="+", default=[2, 8])
    p.add_argument("--bytes", type=int, default=MB)
    args = p.parse_args()
    for n in args.replicas:
        f = floor(n, args.bytes)
        print(json.dumps({"replicas": n, **{f"{k}_ms": v * 1e3 for k, v in f.items()
                                            if k != "cores"}, "cores": f["cores"]}))


if __name__ == "__main__":
    main()
