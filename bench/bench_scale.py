"""Cost as the work grows: the same global batch (256) on 2, 4 and 8 replicas of this machine
(more, smaller shards: the ideal is a flat line), for the 784-512-10 MLP and the larger
784-2048-2048-10, under labdist `fit` (steps_per_execution 10) and torch DDP (gloo) with as
many processes; and, at each replica count, a trivial `strategy.run` and a 1 MB all-reduce
timed on the workers (`baselines/scale_micro.py`), beside its floor: the memory work such an
all-reduce cannot skip, timed in one process and shared by the cores
(`baselines/allreduce_floor.py`), which says whether "8 replicas <= 3x 2" is possible here.

Every figure comes from a process of its own (bench_train.py's runners, told the replica
count and the layers through LABDIST_BENCH_REPLICAS / LABDIST_BENCH_HIDDEN); the
configurations are interleaved in rounds, in a new random order each round, and each figure
is the median over the rounds. torch runs in its own interpreter (`--torch-python` /
LABDIST_BENCH_TORCH_PY); without one the DDP rows say "not measured".

Run: `python bench/bench_scale.py [--rounds 3] [--replicas 2 4 8] [--json PATH]`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _machine import cpu_account, cpu_seconds, machine  # bench/ is on sys.path as a script

HERE = Path(__file__).resolve().parent
RUNNERS = HERE / "baselines"
BATCH = 256
MODELS = {"784-512-10": "512", "784-2048-2048-10": "2048,2048"}
STEPS = {"784-512-10": 60, "784-2048-2048-10": 20}  # one timed pass (a multiple of 10)


def commands(n: int, model: str, torch_python: str | None, passes: int
             ) -> dict[str, tuple[list[str] | None, dict[str, str]]]:
    """key -> (command, extra environment) of the training runners at `n` replicas."""
    env = {"LABDIST_BENCH_REPLICAS": str(n), "LABDIST_BENCH_HIDDEN": MODELS[model]}
    common = ["--batch", str(BATCH), "--steps", str(STEPS[model]), "--passes", str(passes),
              "--warmup", "10"]
    return {
        f"fit {model} x{n}": ([sys.executable, str(RUNNERS / "labdist_train.py"), *common,
                               "--mode", "fit", "--spe", "10"], env),
        f"ddp {model} x{n}": (None if torch_python is None else
                              [torch_python, str(RUNNERS / "torch_ddp.py"), *common], env),
    }


def run(cmd: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """One runner process: its last JSON line, with the others' CPU share while it ran."""
    before, start = cpu_seconds(), time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              cwd=HERE.parent, env={**os.environ, **env})
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:g} s"}
    seconds = time.perf_counter() - start
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.startswith("{"):
            out = json.loads(line)
            out["others_share"] = cpu_account(before, seconds)["others_share"]
            return out
    tail = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
    return {"error": f"no JSON result (exit {proc.returncode}): {tail}"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--passes", type=int, default=3, help="timed passes inside each runner")
    p.add_argument("--replicas", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--torch-python", default=os.environ.get("LABDIST_BENCH_TORCH_PY"))
    p.add_argument("--json", type=Path)
    p.add_argument("--timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    todo: list[tuple[str, list[str], dict[str, str]]] = []
    samples: dict[str, list[float]] = {}
    for n in args.replicas:
        for model in MODELS:
            for key, (cmd, env) in commands(n, model, args.torch_python, args.passes).items():
                samples[key] = []
                if cmd is not None:
                    todo.append((key, cmd, env))
        samples[f"trivial run x{n}"], samples[f"1 MB all-reduce x{n}"] = [], []
        samples[f"1 MB all-reduce floor x{n}"] = []
        todo.append((f"micro x{n}", [sys.executable, str(RUNNERS / "scale_micro.py"),
                                     "--replicas", str(n)], {}))
    runs = []
    for r in range(args.rounds):
        order = todo[:]
        random.Random(r).shuffle(order)
        for key, cmd, env in order:
            out = run(cmd, env, args.timeout)
            out.update(key=key, round=r)
            runs.append(out)
            if key.startswith("micro") and "error" not in out:
                n = key.split("x")[1]
                samples[f"trivial run x{n}"].append(out["trivial_run_us"])
                samples[f"1 MB all-reduce x{n}"].append(out["all_reduce_ms"])
                if out.get("floor_ms") is not None:
                    samples[f"1 MB all-reduce floor x{n}"].append(out["floor_ms"])
            elif out.get("steps_per_s") is not None:
                samples[key].append(out["steps_per_s"])
            print(f"round {r + 1}/{args.rounds}: {key}: "
                  f"{out.get('error') or {k: v for k, v in out.items() if k != 'info'}}",
                  file=sys.stderr, flush=True)
    figures = {k: (statistics.median(v) if v else None) for k, v in samples.items()}
    print(report(figures, args.replicas))
    print("\n" + "\n".join(targets(figures)))
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "figures": figures,
                                         "runs": runs}, indent=1))
    return 0


def report(figures: dict[str, float | None], counts: list[int]) -> str:
    """A markdown table: each figure, and its ratio to the first replica count's."""
    def cell(key: str, base: str, unit: str) -> str:
        v, b = figures.get(key), figures.get(base)
        if v is None:
            return "not measured"
        return f"{v:.3g} {unit} ({v / b:.2f}x)" if b else f"{v:.3g} {unit}"

    first = counts[0]
    rows = ["| replicas | " + " | ".join(
        [f"fit {m}" for m in MODELS] + [f"DDP {m}" for m in MODELS]
        + ["trivial run", "1 MB all-reduce", "its floor"]) + " |",
        "|---:|" + "---:|" * (2 * len(MODELS) + 3)]
    for n in counts:
        cells = [cell(f"{kind} {m} x{n}", f"{kind} {m} x{first}", "steps/s")
                 for kind in ("fit", "ddp") for m in MODELS]
        cells += [cell(f"trivial run x{n}", f"trivial run x{first}", "µs"),
                  cell(f"1 MB all-reduce x{n}", f"1 MB all-reduce x{first}", "ms"),
                  cell(f"1 MB all-reduce floor x{n}", f"1 MB all-reduce x{first}", "ms")]
        rows.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def targets(figures: dict[str, float | None]) -> list[str]:
    """Issue 26's replica-count targets (784-512-10 for fit and DDP), PASS / FAIL each."""
    m = "784-512-10"
    checks = [  # (text, numerator key, denominator key, bound, at least (else at most))
        ("fit at 4 replicas >= 0.75x its rate at 2", f"fit {m} x4", f"fit {m} x2", 0.75, True),
        ("fit at 8 replicas >= 0.5x its rate at 2", f"fit {m} x8", f"fit {m} x2", 0.5, True),
        ("trivial strategy.run at 8 <= 2x its time at 2", "trivial run x8", "trivial run x2",
         2.0, False),
        ("1 MB all-reduce at 8 <= 3x its time at 2", "1 MB all-reduce x8",
         "1 MB all-reduce x2", 3.0, False),
        ("floor at 8 <= 3x all-reduce at 2 (possible?)", "1 MB all-reduce floor x8",
         "1 MB all-reduce x2", 3.0, False),
        *((f"fit >= 1.5x torch DDP at {n} replicas, batch {BATCH}", f"fit {m} x{n}",
           f"ddp {m} x{n}", 1.5, True) for n in (2, 4, 8)),
    ]
    lines = [f"{'target (issue 26)':<52}{'ratio':>8}  verdict"]
    for text, num, den, bound, at_least in checks:
        a, b = figures.get(num), figures.get(den)
        if a is None or not b:
            lines.append(f"{text:<52}{'':>8}  not measured")
            continue
        ratio = a / b
        ok = ratio >= bound if at_least else ratio <= bound
        lines.append(f"{text:<52}{ratio:>7.2f}x  {'PASS' if ok else 'FAIL'}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
