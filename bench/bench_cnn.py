"""A CNN step: steps/s of the tutorial CNN (cnn_common.py: two convolution + pooling stages,
16x16 images, SGD) under labdist's `fit` on 1 and 2 replicas, against TensorFlow's `fit` in one
process and under MirroredStrategy (2 logical CPUs), and torch in one process and under DDP,
measured in the same run. torch and TensorFlow are never labdist dependencies: each runs in its
own interpreter (`--tf-python` / LABDIST_BENCH_TF_PY, `--torch-python` /
LABDIST_BENCH_TORCH_PY); a framework without one is reported as not measured.

Every configuration runs in its own process, interleaved in rounds in a new random order each
round; each figure is the median over the rounds. It ends with where a labdist step's compute
goes: each layer's forward and backward time in one process (`cnn_labdist.py --profile`).

Run: `python bench/bench_cnn.py [--quick] [--rounds N] [--json PATH]`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from _machine import cpu_account, cpu_seconds, machine  # bench/ is on sys.path as a script
from bench_train import Config, Run, Settings, medians, run_one

HERE = Path(__file__).resolve().parent
BATCHES = (64, 256)
CONFIGS = (
    Config("labdist_1", "labdist fit, 1 host replica (OneDeviceStrategy)", "labdist",
           "cnn_labdist.py", ("--replicas", "1")),
    Config("labdist_2", "labdist fit, MirroredStrategy, 2 replicas", "labdist",
           "cnn_labdist.py", ("--replicas", "2")),
    Config("tf_1", "TensorFlow fit, one process", "tf", "cnn_tf.py", ("--replicas", "1")),
    Config("tf_2", "TensorFlow fit, MirroredStrategy, 2 logical CPUs", "tf", "cnn_tf.py",
           ("--replicas", "2")),
    Config("torch_1", "torch, one process, 2 threads", "torch", "cnn_torch.py",
           ("--replicas", "1")),
    Config("torch_2", "torch DDP (gloo), 2 processes x 1 thread", "torch", "cnn_torch.py",
           ("--replicas", "2")),
)
INTERPRETERS = {"tf": ("--tf-python", "LABDIST_BENCH_TF_PY"),
                "torch": ("--torch-python", "LABDIST_BENCH_TORCH_PY")}


def settings(quick: bool, rounds: int | None) -> Settings:
    if quick:
        return Settings(rounds or 1, 1, 5, {64: 30, 256: 10}, 300.0)
    return Settings(rounds or 3, 3, 10, {64: 100, 256: 40}, 600.0)


def profile(batch: int) -> dict:
    proc = subprocess.run([sys.executable, str(HERE / "baselines" / "cnn_labdist.py"),
                           "--batch", str(batch), "--steps", "20", "--profile"],
                          capture_output=True, text=True, timeout=300, cwd=HERE.parent)
    return json.loads(proc.stdout.strip().splitlines()[-1])["info"]["layers"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--json", type=Path, metavar="PATH")
    for framework, (flag, env) in INTERPRETERS.items():
        parser.add_argument(flag, metavar="PYTHON", help=f"interpreter with {framework} "
                            f"(default: ${env})")
    args = parser.parse_args(argv)
    pythons = {"labdist": sys.executable}
    for framework, (flag, env) in INTERPRETERS.items():
        pythons[framework] = getattr(args, flag.lstrip("-").replace("-", "_")) or \
            os.environ.get(env)
    plan = settings(args.quick, args.rounds)
    info = machine()
    before, start = cpu_seconds(), time.perf_counter()
    runs: list[Run] = []
    todo = [(c, b) for c in CONFIGS for b in BATCHES if pythons.get(c.framework)]
    for r in range(plan.rounds):
        random.Random(r).shuffle(todo)
        for config, batch in todo:
            run = run_one(config, pythons[config.framework], batch, r, plan)
            runs.append(run)
            figure = f"{run.steps_per_s:.1f} steps/s" if run.steps_per_s else run.error
            print(f"round {r + 1}: {config.key} batch {batch}: {figure}", file=sys.stderr)
    seconds = time.perf_counter() - start
    use = cpu_account(before, seconds)
    figures = medians(runs)
    lines = [f"machine: {info['nproc']} cores, {info['cpu_model']}; labdist {info['git']}",
             f"other processes took {use['others_share']:.0%} of the CPUs during the run",
             "", f"{'configuration (steps/s, median)':<52}"
             + "".join(f"{f'batch {b}':>12}" for b in BATCHES)]
    for c in CONFIGS:
        cells = [figures.get(c.key, {}).get(b) for b in BATCHES]
        shown = "".join(f"{'—' if v is None else f'{v:.1f}':>12}" for v in cells)
        lines.append(f"{c.label:<52}{shown}")
    missing = sorted({f"{c.framework}: not measured (set {INTERPRETERS[c.framework][1]})"
                      for c in CONFIGS if not pythons.get(c.framework)})
    lines += [f"  — {m}" for m in missing]
    lines += ["", "ratios (same run):"]
    for num, den in (("labdist_2", "labdist_1"), ("labdist_1", "tf_1"), ("labdist_2", "tf_2"),
                     ("labdist_1", "torch_1"), ("labdist_2", "torch_2")):
        for b in BATCHES:
            a, z = figures.get(num, {}).get(b), figures.get(den, {}).get(b)
            if a and z:
                lines.append(f"  {num} / {den}, batch {b}: {a / z:.2f}x")
    layers = {b: profile(b) for b in BATCHES}
    lines += ["", "where a labdist step's compute goes (one process, ms, median):"]
    for b in BATCHES:
        total = sum(v["forward_ms"] + v["backward_ms"] for v in layers[b].values())
        lines.append(f"  batch {b}: {total:.2f} ms of layer compute a step")
        for name, v in layers[b].items():
            lines.append(f"    {name[:60]:<62} fwd {v['forward_ms']:6.2f}  "
                         f"bwd {v['backward_ms']:6.2f}")
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "cpu_use": use,
                                         "runs": [asdict(r) for r in runs],
                                         "medians": {k: {str(b): v for b, v in d.items()}
                                                     for k, d in figures.items()},
                                         "profile": layers}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
