"""A cluster the user brings against the embedded one: the median time of a `strategy.run`
whose step makes a 16 MiB float32 array and all-reduces it (SUM) on 2 replicas, with
`ld.MirroredStrategy(num_replicas=2)` (labdist starts the workers) and with
`ld.MirroredStrategy(cluster=client)` on a plain `LocalCluster(n_workers=2)` (the common Dask
pattern). Each configuration runs in its own process, interleaved in rounds; `--before PATH`
also runs the user's cluster under the labdist source tree at PATH (e.g. a `git worktree` of
the commit before), for a before / after pair in the same run.

Run: `python bench/bench_user_cluster.py [--rounds N] [--before PATH]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _machine import cpu_account, cpu_seconds, machine  # bench/ is on sys.path as a script

RUNNER = r'''
import sys, time
import numpy as np
import labdist as ld
from distributed import Client, LocalCluster

def step():
    x = np.ones(4 * 1024 * 1024, np.float32)  # 16 MiB, made in the step as a gradient is
    return ld.get_replica_context().all_reduce("SUM", x)[:1]

def measure(strategy, calls):
    for _ in range(3):
        strategy.run(step)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        strategy.run(step)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]

if __name__ == "__main__":
    kind, calls = sys.argv[1], int(sys.argv[2])
    if kind == "embedded":
        strategy = ld.MirroredStrategy(num_replicas=2)
        print(measure(strategy, calls))
        strategy.close()
    else:
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                          dashboard_address=":0") as cluster, Client(cluster) as client:
            strategy = ld.MirroredStrategy(cluster=client)
            print(measure(strategy, calls))
            strategy.close()
'''


def run(kind: str, calls: int, tree: Path | None) -> float:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    out = subprocess.run([sys.executable, "-c", RUNNER, kind, str(calls)], capture_output=True,
                         text=True, timeout=300, env=env, cwd="/tmp")
    return float(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=15)
    parser.add_argument("--before", type=Path, help="another labdist source tree")
    args = parser.parse_args()
    here = Path(__file__).resolve().parents[1]
    configs = [("embedded", here), ("user cluster", here)]
    if args.before:
        configs.append(("user cluster, --before tree", args.before.resolve()))
    info, before, start = machine(), cpu_seconds(), time.perf_counter()
    got: dict[str, list[float]] = {label: [] for label, _ in configs}
    for r in range(args.rounds):
        for label, tree in (configs if r % 2 == 0 else configs[::-1]):
            kind = "embedded" if label == "embedded" else "user"
            got[label].append(run(kind, args.calls, tree))
            print(f"round {r + 1}: {label}: {1e3 * got[label][-1]:.1f} ms", file=sys.stderr)
    use = cpu_account(before, time.perf_counter() - start)
    print(f"machine: {info['nproc']} cores; labdist {info['git']}; other processes "
          f"{use['others_share']:.0%} of the CPUs")
    base = statistics.median(got["embedded"])
    for label, values in got.items():
        m = statistics.median(values)
        print(f"{label:<32} {1e3 * m:7.1f} ms  ({m / base:.2f}x the embedded cluster; rounds "
              + ", ".join(f"{1e3 * v:.1f}" for v in values) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
