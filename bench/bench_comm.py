"""Less communication: bytes per step and steps/s of each mode against plain mirrored
training, in one run, over shared memory and over Dask comms (`transport="tcp"`).

The model is bench_train.py's 784-512-10 MLP (SGD 0.01, batch 64, 2 replicas, float32; 1.6 MB
of gradients a step) on synthetic data. Each transport gets one strategy; every mode trains a
fresh model with the same seed through `fit` (steps_per_execution 1), switched with the
strategy's setters. Modes run in a new random order each round; figures are medians over the
rounds, and the report gives each mode's ratio to plain mirrored on the same transport (the
machine may be shared: ratios hold up better than absolute figures). Bytes are the array
bytes replica 0 sent to its peer (`strategy.communication_stats()`), per optimizer step.

Run: `python bench/bench_comm.py [--quick] [--rounds N] [--steps N] [--json PATH]`.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from _machine import cpu_account, cpu_seconds, machine  # bench/ is on sys.path as a script

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import labdist as ld

NESTEROV = {"learning_rate": 0.7, "momentum": 0.9, "nesterov": True}


def modes() -> dict[str, dict]:
    """Mode name -> (compression, local_steps, outer optimizer)."""
    return {
        "mirrored": {},
        "fp16": {"compression": "fp16"},
        "bf16": {"compression": "bf16"},
        "topk 1%": {"compression": ld.compression.TopK(0.01)},
        "powersgd r=4": {"compression": ld.compression.PowerSGD(4)},
        "local SGD H=8": {"local_steps": 8},
        "DiLoCo H=8": {"local_steps": 8, "outer": ld.optimizers.SGD(**NESTEROV)},
        "DiLoCo H=8 + topk 1%": {"local_steps": 8, "outer": ld.optimizers.SGD(**NESTEROV),
                                 "compression": ld.compression.TopK(0.01)},
    }


def measure(strategy, mode: dict, x, y, steps: int, warmup: int) -> tuple[float, float]:
    """(steps/s, bytes per step) of one mode: a fresh model, `warmup` steps, then `steps`."""
    strategy.set_local_sgd(mode.get("local_steps"), mode.get("outer"))
    strategy.compression = mode.get("compression")
    try:
        with strategy.scope():
            model = ld.models.Sequential([ld.layers.Dense(512, activation="relu",
                                                          input_shape=(784,)),
                                          ld.layers.Dense(10, activation="softmax")], seed=0)
            model.compile(loss="sparse_categorical_crossentropy",
                          optimizer=ld.optimizers.SGD(0.01))
        model.fit(x[:64 * warmup], y[:64 * warmup], batch_size=64, verbose=0, shuffle=False)
        before = strategy.communication_stats()[0]["bytes_sent"]
        start = time.perf_counter()
        model.fit(x[:64 * steps], y[:64 * steps], batch_size=64, verbose=0, shuffle=False)
        seconds = time.perf_counter() - start
        sent = strategy.communication_stats()[0]["bytes_sent"] - before
    finally:
        strategy.compression = None
        strategy.set_local_sgd(None)
    return steps / seconds, sent / steps


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 round of 16 steps")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    rounds, steps = (1, 16) if args.quick else (args.rounds, args.steps)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64 * steps, 784)).astype(np.float32)
    y = rng.integers(0, 10, 64 * steps)
    info = machine()
    table: dict[str, dict[str, dict]] = {}
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    for transport in ("shm", "tcp"):
        strategy = ld.MirroredStrategy(num_replicas=2, device="cpu", transport=transport)
        try:
            runs: dict[str, list[tuple[float, float]]] = {name: [] for name in modes()}
            for r in range(rounds):
                order = list(modes().items())
                random.Random(r).shuffle(order)
                for name, mode in order:
                    runs[name].append(measure(strategy, mode, x, y, steps, warmup=8))
                    print(f"{transport} round {r + 1}: {name}: {runs[name][-1][0]:.1f} steps/s",
                          file=sys.stderr, flush=True)
        finally:
            strategy.close()
        base = statistics.median(s for s, _ in runs["mirrored"])
        base_bytes = statistics.median(b for _, b in runs["mirrored"])
        table[transport] = {
            name: {"steps_per_s": statistics.median(s for s, _ in rs),
                   "bytes_per_step": statistics.median(b for _, b in rs),
                   "speed_vs_mirrored": statistics.median(s for s, _ in rs) / base,
                   "bytes_vs_mirrored": statistics.median(b for _, b in rs) / base_bytes}
            for name, rs in runs.items()}
    info["cpu_use"] = cpu_account(cpu0, time.perf_counter() - t0)
    report = format_report(table, info, rounds, steps)
    print(report)
    result = {"table": table, "machine": info, "rounds": rounds, "steps": steps}
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return result


def format_report(table: dict, info: dict, rounds: int, steps: int) -> str:
    lines = [f"bench_comm: 784-512-10 MLP, batch 64, 2 replicas; {rounds} round(s) of {steps} "
             f"steps per mode; others took {info['cpu_use']['others_share']:.0%} of the CPUs",
             "", "| transport | mode | steps/s | x mirrored | bytes/step | x mirrored |",
             "|---|---|---:|---:|---:|---:|"]
    for transport, rows in table.items():
        for name, row in rows.items():
            lines.append(f"| {transport} | {name} | {row['steps_per_s']:.1f} | "
                         f"{row['speed_vs_mirrored']:.2f} | {row['bytes_per_step']:,.0f} | "
                         f"{row['bytes_vs_mirrored']:.4f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
