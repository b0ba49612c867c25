"""A user's own training loop: steps/s of `strategy.run` per step, written as README's
"Training" section writes it (variables under `scope()`, a step function from `__main__`, a
distributed dataset iterated on the driver), for the 784-512-10 MLP on 2 replicas.

Run: `python bench/bench_loop.py [--batch 64] [--steps 300] [--modes loop,dff]`, or paired
against another checkout: `python bench/bench_loop.py --vs OTHER_TREE` (each configuration
in its own process, the two trees alternating, ratios of this tree over OTHER_TREE; a
`loop-K` / `dff-K` mode is compared with the other tree's `loop` / `dff`).
`loop_steps(mode, batch, steps)` is the measurement, for other benches to call.

Modes: `loop` (experimental_distribute_dataset, `for x, y in dataset: strategy.run(step,
args=(x, y))`), `dff` (the same over distribute_datasets_from_function), and `loop-K` /
`dff-K`: the dataset's iterator as the argument, `strategy.run(step, args=(iterator,),
steps=K)` (needs a labdist that has `steps`; `dff-K` makes the batches on the replicas).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

LR = 0.01


def _model(ld, strategy):
    rng = np.random.default_rng(0)
    with strategy.scope():
        w0 = ld.Variable((rng.normal(size=(784, 512)) * 0.05).astype(np.float32),
                         aggregation="MEAN", name="w0")
        b0 = ld.Variable(np.zeros(512, np.float32), aggregation="MEAN", name="b0")
        w1 = ld.Variable((rng.normal(size=(512, 10)) * 0.05).astype(np.float32),
                         aggregation="MEAN", name="w1")
        b1 = ld.Variable(np.zeros(10, np.float32), aggregation="MEAN", name="b1")
    return [w0, b0, w1, b1]


def make_step(ld, params):
    """The README-style step: forward, backward, one all_reduce of the gradients, then each
    variable's assign_sub (a MEAN variable all-reduces its update, as in TF)."""
    w0, b0, w1, b1 = params

    def train_step(x, y):
        ctx = ld.get_replica_context()
        W0, B0, W1, B1 = (v.read_value() for v in (w0, b0, w1, b1))
        h = np.maximum(x @ W0 + B0, 0)
        z = h @ W1 + B1
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        n = len(x)
        loss = -np.log(p[np.arange(n), y] + 1e-9).mean()
        dz = p
        dz[np.arange(n), y] -= 1
        dz /= n
        dh = (dz @ W1.T) * (h > 0)
        grads = ctx.all_reduce("MEAN", [x.T @ dh, dh.sum(0), h.T @ dz, dz.sum(0)])
        for v, g in zip((w0, b0, w1, b1), grads, strict=True):
            v.assign_sub(LR * g, read_value=False)
        return loss

    def batch_step(batch):  # TF's shape: the step takes the iterator's element
        return train_step(*batch)

    return train_step, batch_step


def _data(batch: int, steps: int):
    rng = np.random.default_rng(1)
    n = batch * steps
    return rng.normal(size=(n, 784)).astype(np.float32), rng.integers(0, 10, n).astype(np.int64)


DRIVER_CPU_MS: dict[str, float] = {}  # the driver's CPU time per step (load-robust)


def loop_steps(mode: str, batch: int, steps: int, reps: int = 3) -> float:
    """Median steps/s over `reps` passes of `steps` steps (after a warm-up pass); the driver
    process's CPU milliseconds per step go to DRIVER_CPU_MS[mode]."""
    import labdist as ld

    x, y = _data(batch, steps)
    k = int(mode.split("-")[1]) if "-" in mode else 0
    with ld.MirroredStrategy(num_replicas=2, device="cpu") as strategy:
        step, batch_step = make_step(ld, _model(ld, strategy))
        if mode.startswith("dff"):
            def dataset_fn(ctx):  # TF's idiom: each pipeline its share of the batches (all
                # of them for MirroredStrategy's one pipeline, whose replicas take them in turn)
                per = ctx.get_per_replica_batch_size(batch)
                n, first = ctx.num_input_pipelines, ctx.input_pipeline_id * per
                return [(x[i:i + per], y[i:i + per]) for i in range(first, len(x), n * per)]

            dataset = strategy.distribute_datasets_from_function(dataset_fn)
        else:
            dataset = strategy.experimental_distribute_dataset(ld.batches((x, y), batch))
        rates, cpu = [], []
        for rep in range(reps + 1):
            start, cpu_start = time.perf_counter(), time.process_time()
            if not k:
                for bx, by in dataset:
                    loss = strategy.run(step, args=(bx, by))
            else:
                iterator = iter(dataset)
                for _ in range(steps // k):
                    loss = strategy.run(batch_step, args=(iterator,), steps=k)
            elapsed = time.perf_counter() - start
            if rep:  # the first pass is the warm-up
                rates.append(steps / elapsed)
                cpu.append((time.process_time() - cpu_start) / steps * 1e3)
        float(strategy.reduce("MEAN", loss, axis=None))
    DRIVER_CPU_MS[mode] = statistics.median(cpu)
    return statistics.median(rates)


def _child(tree: str, mode: str, batch: int, steps: int) -> tuple[float, float]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--modes", mode, "--batch", str(batch),
         "--steps", str(steps), "--json"], env=env, capture_output=True, text=True,
        cwd=os.path.abspath(tree), check=False)
    if out.returncode:
        return float("nan"), float("nan")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return got[mode], got[f"{mode} driver cpu ms"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--modes", default="loop,dff")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vs", help="another checkout to compare with, paired")
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args()
    modes = opts.modes.split(",")
    if not opts.vs:
        got = {m: loop_steps(m, opts.batch, opts.steps) for m in modes}
        got.update({f"{m} driver cpu ms": DRIVER_CPU_MS[m] for m in modes})
        print(json.dumps(got) if opts.json else got)
        return
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    print(f"load: {os.getloadavg()}")
    for mode in modes:
        base = mode.split("-")[0]  # `steps=K` modes against the other tree's plain loop
        ratios, news, olds, cpus = [], [], [], []
        for i in range(opts.rounds):  # alternate which tree goes first
            first, second = (here, opts.vs) if i % 2 == 0 else (opts.vs, here)
            a = _child(first, mode if first == here else base, opts.batch, opts.steps)
            b = _child(second, mode if second == here else base, opts.batch, opts.steps)
            (new, new_cpu), (old, old_cpu) = (a, b) if i % 2 == 0 else (b, a)
            news.append(new)
            olds.append(old)
            ratios.append(new / old)
            cpus.append((new_cpu, old_cpu))
        print(f"{mode:7} batch {opts.batch}: this {statistics.median(news):7.1f}  other "
              f"{statistics.median(olds):7.1f} steps/s; paired ratio median "
              f"{statistics.median(ratios):.2f} ({', '.join(f'{r:.2f}' for r in ratios)}); "
              f"driver CPU ms/step this {statistics.median(c[0] for c in cpus):.2f} other "
              f"{statistics.median(c[1] for c in cpus):.2f}")


if __name__ == "__main__":
    main()
