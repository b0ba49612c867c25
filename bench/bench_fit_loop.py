"""`fit` with the replicas running the loop (one dispatch an epoch) against the driver sending
each group (what `fit` did before; here forced by a callback with a no-op batch hook, which
needs the driver after every group), in one process on one cluster, alternating fit by fit:
pairs a second apart, so a loaded machine moves both sides of a pair alike. Prints the median
of the per-pair ratios (free / per group) and each side's median steps/s, with the load; and
the CPU time per step of the driver and of the workers (this process's descendants: the
cluster's processes), which a loaded machine moves far less than wall time.

`--compare fresh` pairs something else: `fit` again on the same x and y (which takes the
/dev/shm copy the last `fit` kept, after a compare) against `fit` on fresh copies of them
(made outside the timing, so each such `fit` pays for writing its copy, as a first `fit` does).
`fit` keeps one copy, so before each timed `fit` on x and y an untimed one makes it theirs.

Run: `python bench/bench_fit_loop.py [--pairs 7] [--steps 200] [--replicas 2] [--compare fresh]`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import psutil

import labdist as ld


def cpu() -> tuple[float, float]:
    """CPU seconds of this process (the driver) and of its descendants (the workers)."""
    me = psutil.Process()
    t = me.cpu_times()
    rest = 0.0
    for child in me.children(recursive=True):
        try:
            c = child.cpu_times()
            rest += c.user + c.system
        except psutil.Error:
            pass
    return t.user + t.system, rest


class Hook(ld.callbacks.Callback):
    """Implements a batch hook, so fit dispatches per group (the driver needed each group)."""

    def on_train_batch_end(self, batch, logs=None):
        pass


def make_model(strategy, spe: int):
    with strategy.scope():
        m = ld.models.Sequential([ld.layers.Dense(512, activation="relu", input_shape=(784,)),
                                  ld.layers.Dense(10, activation="softmax")])
        m.compile(loss="sparse_categorical_crossentropy", optimizer=ld.optimizers.SGD(0.01),
                  steps_per_execution=spe)
    return m


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=7)
    p.add_argument("--steps", type=int, default=200, help="steps of one timed fit")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    p.add_argument("--spe", type=int, nargs="+", default=[1, 10])
    p.add_argument("--compare", choices=("hook", "fresh"), default="hook",
                   help="the other side of each pair: fit per group, or on fresh arrays")
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    out = {"loadavg_at_start": os.getloadavg(), "compare": args.compare, "rows": []}
    with ld.MirroredStrategy(num_replicas=args.replicas) as strategy:
        for batch in args.batches:
            x = rng.random((batch * args.steps, 784), dtype=np.float32)
            y = rng.integers(0, 10, len(x))
            for spe in args.spe:
                model = make_model(strategy, spe)

                cpus: dict[int, list] = {0: [], 1: []}

                def rate(side: int, model=model, x=x, y=y, batch=batch, cpus=cpus) -> float:
                    """side 0: the replicas loop on x, y; side 1: per group (a batch hook),
                    or with --compare fresh, on fresh copies of x and y."""
                    fresh = side == 1 and args.compare == "fresh"
                    xs, ys = (x.copy(), y.copy()) if fresh else (x, y)
                    callbacks = [Hook()] if side == 1 and not fresh else []
                    if side == 0 and args.compare == "fresh":  # the kept copy is x's again
                        model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
                    c0, start = cpu(), time.perf_counter()
                    model.fit(xs, ys, batch_size=batch, epochs=1, shuffle=False, verbose=0,
                              callbacks=callbacks)
                    seconds, c1 = time.perf_counter() - start, cpu()
                    cpus[side].append(
                        ((c1[0] - c0[0]) / args.steps * 1e3, (c1[1] - c0[1]) / args.steps * 1e3))
                    return args.steps / seconds

                rate(0), rate(1)  # warm up both paths
                cpus[0].clear()
                cpus[1].clear()
                free, grouped = [], []
                for i in range(args.pairs):
                    order = (0, 1) if i % 2 == 0 else (1, 0)
                    got = {side: rate(side) for side in order}
                    free.append(got[0])
                    grouped.append(got[1])
                ratios = [f / g for f, g in zip(free, grouped, strict=True)]
                ms = {k: [statistics.median(c[j] for c in v) for j in (0, 1)]
                      for k, v in cpus.items()}
                row = {"batch": batch, "spe": spe, "free": statistics.median(free),
                       "per_group": statistics.median(grouped),
                       "ratio": statistics.median(ratios), "ratios": ratios,
                       "cpu_ms_per_step": {"free": ms[0], "per_group": ms[1]}}
                out["rows"].append(row)
                one, other = (("same arrays (kept copy)", "fresh arrays")
                              if args.compare == "fresh" else ("replicas loop", "driver per group"))
                print(f"batch {batch:>4} spe {spe:>2}: {one} {row['free']:7.1f} "
                      f"steps/s, {other} {row['per_group']:7.1f}; ratio "
                      f"{row['ratio']:.2f}x (pairs {min(ratios):.2f}..{max(ratios):.2f}); "
                      f"CPU ms/step driver {ms[0][0]:.2f} vs {ms[1][0]:.2f}, workers "
                      f"{ms[0][1]:.2f} vs {ms[1][1]:.2f}", flush=True)
    out["loadavg_at_end"] = os.getloadavg()
    print(f"load average: start {out['loadavg_at_start'][0]:.2f}, "
          f"end {out['loadavg_at_end'][0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
