"""GPU benchmark: NCCL all-reduce bus bandwidth over payload sizes, and training steps/s on
1..N GPUs against one GPU with cupy alone.

Run: `python bench/bench_gpu.py [--gpus N] [--json PATH]` on a machine with GPUs (it exits,
saying so, without one); `python bench/bench_gpu.py --double` runs the same code on CPU workers
with the strict device and its NCCL double, as a smoke test (those figures mean nothing).

Bus bandwidth is nccl-tests' formula for all-reduce, so it compares with `all_reduce_perf`
on the same machine: algbw = bytes / time, busbw = algbw * 2 (n - 1) / n. The time is
labdist's `ctx.all_reduce` on a float32 array, as a step sees it: the host signature exchange
plus the NCCL call and its stream wait (so small sizes show labdist's overhead, large ones
NCCL's bandwidth).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

import labdist as ld
from labdist.devices import get_backend, gpu_count
from labdist.devices.strict import cuda as strict_cuda
from labdist.training import layers, losses, optimizers
from labdist.training.trainer.steps import DeviceRNG, gradients

SIZES = [2**k for k in range(10, 29, 2)]  # bytes: 1 KiB .. 256 MiB, as nccl-tests -b/-e/-f 4
FEATURES, CLASSES, BATCH = 256, 10, 1024


def all_reduce_timing(strategy, nbytes: int, iters: int) -> float:
    """Seconds per all-reduce of `nbytes` (the slowest replica's mean over `iters`)."""
    def step(n, iters):
        ctx = ld.get_replica_context()
        x = ctx.xp.ones(n // 4, dtype=ctx.xp.float32)
        ctx.all_reduce("SUM", x)  # warm up (buffers, NCCL's channels)
        start = time.perf_counter()
        for _ in range(iters):
            ctx.all_reduce("SUM", x)
        return (time.perf_counter() - start) / iters
    out = strategy.run(step, args=(nbytes, iters))
    return max(float(t) for t in strategy.experimental_local_results(out))


def bus_bandwidth(strategy, sizes: list[int], iters: int) -> list[dict]:
    n = strategy.num_replicas_in_sync
    rows = []
    for nbytes in sizes:
        seconds = all_reduce_timing(strategy, nbytes, iters)
        algbw = nbytes / seconds / 1e9
        rows.append({"bytes": nbytes, "time_us": seconds * 1e6, "algbw_GBps": algbw,
                     "busbw_GBps": algbw * 2 * (n - 1) / n})
        print(f"  {nbytes:>11,d} B  {seconds * 1e6:10.1f} us  algbw {algbw:8.3f} GB/s  "
              f"busbw {rows[-1]['busbw_GBps']:8.3f} GB/s", flush=True)
    return rows


def data(steps: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * BATCH, FEATURES)).astype(np.float32)
    return x, rng.integers(0, CLASSES, size=len(x))


def model_layers() -> list:
    return [layers.Dense(512, activation="relu"), layers.Dense(CLASSES, activation="softmax")]


def strategy_steps_per_s(strategy, steps: int) -> float:
    x, y = data(steps)
    with strategy.scope():
        model = ld.models.Sequential([ld.layers.Dense(512, activation="relu",
                                                      input_shape=(FEATURES,)),
                                      ld.layers.Dense(CLASSES, activation="softmax")])
        model.compile(loss="sparse_categorical_crossentropy", optimizer="sgd",
                      steps_per_execution=steps)
    model.fit(x[:BATCH * 2], y[:BATCH * 2], batch_size=BATCH, verbose=0)  # warm up
    start = time.perf_counter()
    model.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False)
    return steps / (time.perf_counter() - start)


def alone_steps_per_s(xp, backend, steps: int) -> float:
    """The same model and steps with the array module alone, in this process, one device."""
    x, y = data(steps)
    rng = np.random.default_rng(0)
    stack, width, params = model_layers(), FEATURES, []
    for layer in stack:
        params.append({k: backend.to_device(v) for k, v in layer.build(width, rng).items()})
        width = layer.units
    loss, sgd = losses.get("sparse_categorical_crossentropy"), optimizers.get("sgd")
    xs, ys = backend.to_device(x), backend.to_device(y)
    start = 0.0
    for i in range(steps + 2):  # two warm-up steps
        if i == 2:
            xp.cuda.Device().synchronize()
            start = time.perf_counter()
        bx, by = xs[(i % steps) * BATCH:(i % steps + 1) * BATCH], ys[(i % steps) * BATCH:
                                                                     (i % steps + 1) * BATCH]
        grads, _ = gradients(xp, stack, params, loss, bx, by, DeviceRNG(backend, (0, 0, i)),
                             BATCH, BATCH)
        for p, g in zip(params, grads, strict=True):
            for k in p:
                sgd.apply(xp, p[k], g[k], {}, i + 1)
    xp.cuda.Device().synchronize()
    return steps / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--double", action="store_true",
                        help="CPU workers with the strict device and the NCCL double (smoke)")
    parser.add_argument("--gpus", type=int, default=None, help="most GPUs to use (default all)")
    parser.add_argument("--iters", type=int, default=20, help="all-reduces per size")
    parser.add_argument("--steps", type=int, default=50, help="training steps per figure")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    if args.double:
        device, most, sizes = "strict", args.gpus or 2, SIZES[:4]
        os.environ[strict_cuda.ENV_GPUS] = str(most)
        backend = get_backend("strict")
        args.iters, args.steps = min(args.iters, 3), min(args.steps, 4)
    else:
        if gpu_count() == 0:
            print("bench_gpu: no GPU is visible (cupy + CUDA needed); nothing to measure. "
                  "Run with --double for a smoke test on CPU.", file=sys.stderr)
            return 2
        device, most, sizes, backend = "gpu", min(args.gpus or gpu_count(), gpu_count()), \
            SIZES, get_backend("gpu")
    results: dict = {"device": device, "gpus": most, "allreduce": {}, "training": {}}
    alone = alone_steps_per_s(backend.xp, backend, args.steps)
    results["training"]["alone"] = alone
    print(f"training, one GPU with {backend.name} alone: {alone:.2f} steps/s")
    for n in range(1, most + 1):
        with ld.MirroredStrategy(n, device=device, transport="nccl" if n > 1 else "auto",
                                 collective_timeout=600) as strategy:
            if n > 1:
                print(f"NCCL all-reduce, {n} GPUs:")
                results["allreduce"][n] = bus_bandwidth(strategy, sizes, args.iters)
            rate = strategy_steps_per_s(strategy, args.steps)
        results["training"][n] = rate
        print(f"training, {n} GPU(s) through labdist: {rate:.2f} steps/s "
              f"({rate / alone:.2f} x one GPU alone)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
