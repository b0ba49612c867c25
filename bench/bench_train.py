"""Training throughput: steps/s of the 784-512-10 MLP (SGD 0.01, sparse categorical
cross-entropy, float32, 2 replicas) under labdist (`fit` with steps_per_execution 1 and 10, and
a README-style custom loop), against what a user would pick instead, measured in the same run:
numpy in one process, and, when their interpreters are given, torch in one process (2 threads),
torch DDP (gloo, 2 processes x 1 thread) and TensorFlow's MirroredStrategy custom loop (1 and
10 steps per call). torch and TensorFlow are never labdist dependencies: each runs in its own
interpreter (`--torch-python` / LABDIST_BENCH_TORCH_PY, `--tf-python` / LABDIST_BENCH_TF_PY).

Every configuration runs in its own process (a runner under bench/baselines/ printing one JSON
line); the configurations are interleaved in rounds, in a new random order each round, and
each figure is the median over the rounds. The report gives the ratios behind issue 26's
targets and the CPU share other processes took while the bench ran.

`--before PATH` (LABDIST_BENCH_BEFORE) also runs `fit` and the custom loop under the labdist
source tree at PATH (e.g. `git worktree add /tmp/before <commit>`), interleaved with this
tree's, and reports the per-round ratios. The targets printed with PASS / FAIL are issue 26's.

Run: `python bench/bench_train.py [--quick] [--json PATH] [--rounds N] [--only KEYS]`.
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from _machine import cpu_account, cpu_seconds, machine  # bench/ is on sys.path as a script

HERE = Path(__file__).resolve().parent
RUNNERS = HERE / "baselines"
BATCHES = (64, 256)
BUSY_OTHERS = 0.05  # others' CPU share above which a run is not a quiet one
INTERPRETERS = {  # framework -> (flag, environment variable)
    "torch": ("--torch-python", "LABDIST_BENCH_TORCH_PY"),
    "tf": ("--tf-python", "LABDIST_BENCH_TF_PY"),
    "before": ("--before", "LABDIST_BENCH_BEFORE"),  # a labdist source tree, not a python
}


@dataclass(frozen=True)
class Config:
    """One configuration: a runner script and its arguments, under a framework's interpreter."""

    key: str
    label: str
    framework: str  # "numpy" and "labdist" run under this interpreter; "torch", "tf" their own
    script: str
    args: tuple[str, ...] = ()


CONFIGS = (
    Config("numpy", "numpy, one process (both cores: BLAS threads)", "numpy", "numpy_one.py"),
    Config("torch_one", "torch, one process, 2 threads", "torch", "torch_one.py",
           ("--threads", "2")),
    Config("torch_ddp", "torch DDP (gloo), 2 processes x 1 thread", "torch", "torch_ddp.py"),
    Config("tf_loop_1", "TF MirroredStrategy custom loop, 1 step/call", "tf", "tf_custom.py",
           ("--steps-per-call", "1")),
    Config("tf_loop_10", "TF MirroredStrategy custom loop, 10 steps/call", "tf",
           "tf_custom.py", ("--steps-per-call", "10")),
    Config("fit_1", "labdist fit, steps_per_execution=1", "labdist", "labdist_train.py",
           ("--mode", "fit", "--spe", "1")),
    Config("fit_10", "labdist fit, steps_per_execution=10", "labdist", "labdist_train.py",
           ("--mode", "fit", "--spe", "10")),
    Config("loop_1", "labdist custom loop, strategy.run per step", "labdist",
           "labdist_train.py", ("--mode", "loop")),
    Config("loop_10", "labdist custom loop, 10 steps per call", "labdist", "labdist_train.py",
           ("--mode", "loop", "--steps-per-call", "10")),
    Config("loop_assign_1", "labdist custom loop, all_reduce + assign_sub", "labdist",
           "labdist_train.py", ("--mode", "loop", "--update", "assign")),
    Config("loop_10_pipes", "labdist custom loop, 10 steps/call, input on the replicas",
           "labdist", "labdist_train.py",
           ("--mode", "loop", "--steps-per-call", "10", "--input", "pipelines")),
    # fit and the custom loop under another labdist tree (--before): before / after pairs
    Config("fit_1_before", "labdist fit spe=1, the --before tree", "before",
           "labdist_train.py", ("--mode", "fit", "--spe", "1")),
    Config("fit_10_before", "labdist fit spe=10, the --before tree", "before",
           "labdist_train.py", ("--mode", "fit", "--spe", "10")),
    Config("loop_1_before", "labdist custom loop, run per step, the --before tree", "before",
           "labdist_train.py", ("--mode", "loop")),
    Config("loop_10_before", "labdist custom loop, 10 steps per call, the --before tree",
           "before", "labdist_train.py", ("--mode", "loop", "--steps-per-call", "10")),
)
PAIRS = (("fit_1", "fit_1_before"), ("fit_10", "fit_10_before"), ("loop_1", "loop_1_before"),
         ("loop_10", "loop_10_before"))
BY_KEY = {c.key: c for c in CONFIGS}


@dataclass(frozen=True)
class Target:
    """A target: the best of `numerator` over the best of `denominator` at `batch`
    is at least `at_least`."""

    text: str
    batch: int
    numerator: tuple[str, ...]
    denominator: tuple[str, ...]
    at_least: float


FIT, ONE = ("fit_1", "fit_10"), ("numpy", "torch_one")
TARGETS = (  # issue 26's, measured in this bench (bench_scale.py has the replica counts)
    Target("fit >= 0.8x one process (numpy or torch, the faster), batch 256", 256, FIT, ONE,
           0.8),
    Target("fit >= 0.6x one process (numpy or torch, the faster), batch 64", 64, FIT, ONE, 0.6),
    *(Target(f"fit >= the custom loop (run per step), batch {b}", b, FIT, ("loop_1",), 1.0)
      for b in BATCHES),
    *(Target(f"fit >= 1.2x TF's custom loop (best of 1, 10 steps/call), batch {b}", b, FIT,
             ("tf_loop_1", "tf_loop_10"), 1.2) for b in BATCHES),
    *(Target(f"fit >= 1.5x torch DDP (gloo), 2 replicas, batch {b}", b, FIT, ("torch_ddp",),
             1.5) for b in BATCHES),
    Target("custom loop (run per step) >= 1.5x TF's custom loop at 1 step/call, batch 64", 64,
           ("loop_1",), ("tf_loop_1",), 1.5),
    Target("custom loop, steps=10 >= 0.6x one process, batch 64", 64,
           ("loop_10", "loop_10_pipes"), ONE, 0.6),
)


@dataclass(frozen=True)
class Settings:
    rounds: int
    passes: int  # timed passes inside each runner (it reports their median)
    warmup: int
    steps: dict[int, int]  # batch -> steps of one timed pass
    timeout: float  # seconds one runner may take

    @classmethod
    def make(cls, quick: bool, rounds: int | None = None) -> Settings:
        if quick:
            return cls(rounds or 1, 1, 10, {64: 60, 256: 30}, 180.0)
        return cls(rounds or 3, 3, 20, {64: 300, 256: 120}, 600.0)


@dataclass
class Run:
    """One runner process: its figure (None when it failed or was not measured) and why."""

    key: str
    batch: int
    round: int
    steps_per_s: float | None
    error: str | None = None
    seconds: float = 0.0
    others_share: float | None = None
    info: dict[str, Any] = field(default_factory=dict)


# -- running -------------------------------------------------------------------------------------
def interpreters(args: argparse.Namespace) -> dict[str, str | None]:
    """framework -> interpreter path (None: not given, so not measured)."""
    found: dict[str, str | None] = {"numpy": sys.executable, "labdist": sys.executable}
    for framework, (flag, env) in INTERPRETERS.items():
        found[framework] = getattr(args, flag.lstrip("-").replace("-", "_")) or os.environ.get(env)
    return found


def not_measured(config: Config, pythons: dict[str, str | None], k_steps: bool) -> str | None:
    """Why `config` is not run at all, or None."""
    if config.framework == "before" and pythons.get("before") is None:
        return ("not measured: set LABDIST_BENCH_BEFORE (or --before) to another labdist "
                "source tree to compare fit before / after")
    if pythons.get(config.framework) is None:
        flag, env = INTERPRETERS[config.framework]
        return f"not measured: set {env} (or {flag}) to an interpreter with {config.framework}"
    if config.key.startswith("loop_10") and not k_steps:
        return "not measured: this labdist's strategy.run has no steps= (k steps per call)"
    return None


def command(config: Config, python: str, batch: int, settings: Settings) -> list[str]:
    return [python, str(RUNNERS / config.script), "--batch", str(batch),
            "--steps", str(settings.steps[batch]), "--passes", str(settings.passes),
            "--warmup", str(settings.warmup), *config.args]


def parse_output(stdout: str) -> dict[str, Any]:
    """The runner's result: the last line of its stdout that is a JSON object."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    raise ValueError("the runner printed no JSON result")


def run_one(config: Config, python: str, batch: int, round_: int, settings: Settings) -> Run:
    """Run one runner process and read its JSON line; a failure is a Run with its error."""
    before, start = cpu_seconds(), time.perf_counter()
    env = None
    if config.framework == "before":  # labdist from that tree, here and on its workers
        env = {**os.environ, "PYTHONPATH": str(Path(python).resolve())}
        python = sys.executable
    try:
        proc = subprocess.run(command(config, python, batch, settings), capture_output=True,
                              text=True, timeout=settings.timeout, cwd=HERE.parent, env=env)
    except subprocess.TimeoutExpired:
        return Run(config.key, batch, round_, None, f"timed out after {settings.timeout:g} s",
                   time.perf_counter() - start)
    seconds = time.perf_counter() - start
    others = cpu_account(before, seconds)["others_share"]
    try:
        out = parse_output(proc.stdout)
    except ValueError as e:
        tail = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        return Run(config.key, batch, round_, None, f"{e} (exit {proc.returncode}): {tail}",
                   seconds, others)
    return Run(config.key, batch, round_, out.get("steps_per_s"), out.get("error"), seconds,
               others, out.get("info", {}))


def has_k_steps() -> bool:
    """Whether this labdist's MirroredStrategy.run takes `steps=` (the same feature check as
    bench/baselines/labdist_train.py, without starting a cluster)."""
    import inspect

    import labdist as ld

    return "steps" in inspect.signature(ld.MirroredStrategy.run).parameters


def run_rounds(configs: list[Config], pythons: dict[str, str | None], settings: Settings,
               k_steps: bool, seed: int = 0, log=print) -> list[Run]:
    """Every (configuration, batch) once per round, in a new random order each round."""
    runs: list[Run] = []
    todo = []
    for config in configs:
        for batch in BATCHES:
            why = not_measured(config, pythons, k_steps)
            if why is None:
                todo.append((config, batch))
            else:
                runs.append(Run(config.key, batch, 0, None, why))
    for r in range(settings.rounds):
        order = todo[:]
        random.Random(seed + r).shuffle(order)
        for config, batch in order:
            run = run_one(config, pythons[config.framework], batch, r, settings)
            figure = f"{run.steps_per_s:.1f} steps/s" if run.steps_per_s else run.error
            log(f"round {r + 1}/{settings.rounds}: {config.key} batch {batch}: {figure} "
                f"({run.seconds:.0f} s, others {run.others_share or 0:.0%})", file=sys.stderr)
            runs.append(run)
    return runs


# -- figures ---------------------------------------------------------------------------------
def medians(runs: list[Run]) -> dict[str, dict[int, float | None]]:
    """key -> batch -> median steps/s over the rounds that measured it (None: none did)."""
    samples: dict[tuple[str, int], list[float]] = {}
    for run in runs:
        got = samples.setdefault((run.key, run.batch), [])
        if run.steps_per_s is not None:
            got.append(run.steps_per_s)
    out: dict[str, dict[int, float | None]] = {}
    for (key, batch), values in samples.items():
        out.setdefault(key, {})[batch] = statistics.median(values) if values else None
    return out


def why_missing(runs: list[Run], key: str, batch: int) -> str:
    errors = [r.error for r in runs if r.key == key and r.batch == batch and r.error]
    return errors[0] if errors else "not run"


def best(figures: dict[str, dict[int, float | None]], keys: tuple[str, ...], batch: int
         ) -> tuple[str, float] | None:
    """The fastest of `keys` at `batch` that was measured: (key, steps/s)."""
    measured = [(k, figures.get(k, {}).get(batch)) for k in keys]
    measured = [(k, v) for k, v in measured if v is not None]
    return max(measured, key=lambda kv: kv[1]) if measured else None


def evaluate(targets: tuple[Target, ...] | list[Target],
             figures: dict[str, dict[int, float | None]]) -> list[dict[str, Any]]:
    """Each target's measured ratio and verdict ("PASS", "FAIL", "not measured")."""
    rows = []
    for t in targets:
        num, den = best(figures, t.numerator, t.batch), best(figures, t.denominator, t.batch)
        row: dict[str, Any] = {"target": t.text, "batch": t.batch, "at_least": t.at_least,
                               "ratio": None, "verdict": "not measured", "of": None}
        if num is not None and den is not None:
            ratio = num[1] / den[1]
            row.update(ratio=ratio, verdict="PASS" if ratio >= t.at_least else "FAIL",
                       of=f"{num[0]} / {den[0]}")
        else:
            missing = [k for k, v in ((t.numerator, num), (t.denominator, den)) if v is None]
            row["of"] = "missing: " + "; ".join("/".join(k) for k in missing)
        rows.append(row)
    return rows


def ratios(figures: dict[str, dict[int, float | None]]) -> list[dict[str, Any]]:
    """Each configuration over numpy in one process, at each batch (informative)."""
    rows = []
    for config in CONFIGS:
        for batch in BATCHES:
            value, base = figures.get(config.key, {}).get(batch), figures.get("numpy", {}).get(
                batch)
            if value is not None and base:
                rows.append({"key": config.key, "batch": batch, "vs_numpy": value / base})
    return rows


def paired(runs: list[Run]) -> list[dict[str, Any]]:
    """`fit` after / before (the --before tree), per round (the two ran in the same round,
    interleaved), and the median of those ratios."""
    rows = []
    for after, before in PAIRS:
        for batch in BATCHES:
            got = {(r.key, r.round): r.steps_per_s for r in runs if r.batch == batch}
            pairs = [got[(after, k)] / got[(before, k)] for (key, k) in got
                     if key == before and got.get((after, k)) and got[(before, k)]]
            if pairs:
                rows.append({"after": after, "before": before, "batch": batch,
                             "ratio": statistics.median(pairs), "pairs": pairs})
    return rows


# -- report ----------------------------------------------------------------------------------
def format_report(runs: list[Run], figures, targets_rows, info: dict[str, Any]) -> str:
    lines = [f"machine: {info['nproc']} cores, {info['cpu_model']}; Python {info['python']}, "
             f"numpy {info['numpy']}; labdist {info['git']}",
             "load average at start: " + ", ".join(f"{x:.2f}" for x in info["loadavg_at_start"]),
             f"during the run: other processes {info['cpu_use']['others_share']:.0%} of the "
             f"CPUs (per runner: median {info['others_median']:.0%}, max "
             f"{info['others_max']:.0%})"]
    if info["cpu_use"]["others_share"] > BUSY_OTHERS:
        lines.append("WARNING: other work ran on this machine: not a quiet run; load distorts "
                     "every ratio (thread pools that spin, as BLAS's and TensorFlow's, suffer "
                     "most): record only quiet runs")
    head = "".join(f"{f'batch {b}':>22}" for b in BATCHES)
    lines += ["", f"{'configuration (steps/s, median; x numpy)':<50}{head}"]
    base = {b: figures.get("numpy", {}).get(b) for b in BATCHES}
    for config in CONFIGS:
        cells = []
        for b in BATCHES:
            v = figures.get(config.key, {}).get(b)
            if v is None:
                cells.append(f"{'—':>22}")
            else:
                rel = f" ({v / base[b]:.2f}x)" if base[b] else ""
                cells.append(f"{f'{v:.1f}{rel}':>22}")
        lines.append(f"{config.label:<50}{''.join(cells)}")
    notes = sorted({why_missing(runs, c.key, b) for c in CONFIGS for b in BATCHES
                    if figures.get(c.key, {}).get(b) is None})
    lines += [f"  — {n}" for n in notes]
    pairs = paired(runs)
    if pairs:
        lines += ["", "fit, this tree / the --before tree (median of per-round ratios):"]
        lines += [f"  {p['after']} batch {p['batch']}: {p['ratio']:.2f}x (pairs "
                  + ", ".join(f"{x:.2f}" for x in p["pairs"]) + ")" for p in pairs]
    lines += ["", f"{'target (issue 26)':<78}{'ratio':>8}  verdict"]
    for row in targets_rows:
        ratio = "" if row["ratio"] is None else f"{row['ratio']:.2f}x"
        lines.append(f"{row['target']:<78}{ratio:>8}  {row['verdict']} ({row['of']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 round, few steps")
    parser.add_argument("--rounds", type=int, help="rounds (default 3, --quick 1)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write every figure")
    parser.add_argument("--only", help="comma-separated configuration keys to run: "
                        + ", ".join(BY_KEY))
    for framework, (flag, env) in INTERPRETERS.items():
        parser.add_argument(flag, metavar="PYTHON",
                            help=f"interpreter with {framework} (default: ${env})")
    args = parser.parse_args(argv)
    settings = Settings.make(args.quick, args.rounds)
    configs = [BY_KEY[k] for k in args.only.split(",")] if args.only else list(CONFIGS)
    info = machine()
    before, start = cpu_seconds(), time.perf_counter()
    runs = run_rounds(configs, interpreters(args), settings, has_k_steps())
    info["seconds"] = time.perf_counter() - start
    info["cpu_use"] = cpu_account(before, info["seconds"])
    shares = [r.others_share for r in runs if r.others_share is not None] or [0.0]
    info["others_median"], info["others_max"] = statistics.median(shares), max(shares)
    info["loadavg_at_end"] = os.getloadavg()
    figures = medians(runs)
    rows = evaluate(TARGETS, figures)
    print(format_report(runs, figures, rows, info))
    if args.json:
        args.json.write_text(json.dumps(
            {"machine": info, "settings": asdict(settings),
             "runs": [asdict(r) for r in runs],
             "medians": {k: {str(b): v for b, v in d.items()} for k, d in figures.items()},
             "vs_numpy": ratios(figures), "targets": rows, "paired": paired(runs)},
            indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
