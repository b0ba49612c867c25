"""What making time visible costs (issue 27): `model.fit` steps/s on a 2-replica mirrored
strategy with phase recording on vs off, and inside `ld.profile(...)` (a trace file written at
the end) vs not. Paired runs in alternating order, so the machine's drift hits both sides
alike; only the ratios mean anything on a shared machine. Also what a trace costs when its
`with` block ends (gathering every process's spans and writing the file), per 1000 spans.

    python bench/bench_time.py [--pairs 8] [--epochs 3] [--quick] [--json out.json]

Prints each target's median ratio with PASS or FAIL (recording <= 3 % of steps/s, tracing
<= 10 %); exits 0 either way: a benchmark reports, it does not judge a loaded machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import labdist as ld
from labdist.timing import phases

BATCH, STEPS_PER_EPOCH = 32, 40
ROWS = BATCH * STEPS_PER_EPOCH
RECORDING_TARGET, TRACING_TARGET = 0.03, 0.10  # the most each may cost of fit's steps/s


MODELS = {  # name -> (inputs, hidden units): the tiny one magnifies any per-step cost
    "tiny": (32, 64),
    "mlp": (784, 512),  # the MLP of bench_train.py and the README
}


def model_on(strategy, inputs: int = 32, hidden: int = 64) -> ld.models.Sequential:
    with strategy.scope():
        model = ld.models.Sequential([ld.layers.Dense(hidden, activation="relu",
                                                      input_shape=(inputs,)),
                                      ld.layers.Dense(10, activation="softmax")], seed=0)
        model.compile(loss="sparse_categorical_crossentropy", optimizer=ld.optimizers.Adam())
    return model


def timed_fit(model, x, y, epochs: int, wrap) -> dict[str, float]:
    """One fit inside `wrap()`: steps/s of the whole (the wrapper's entry and exit included)
    and of the fit alone, and the seconds the wrapper's exit took (a trace: gather + write)."""
    t0 = time.perf_counter()
    with wrap():
        t1 = time.perf_counter()
        model.fit(x, y, batch_size=BATCH, epochs=epochs, verbose=0, shuffle=False)
        t2 = time.perf_counter()
    t3 = time.perf_counter()
    steps = epochs * STEPS_PER_EPOCH
    return {"whole": steps / (t3 - t0), "fit": steps / (t2 - t1), "exit_s": t3 - t2}


def recording(strategy, on: bool) -> None:
    strategy.client.run(phases.set_enabled, on)
    phases.set_enabled(on)


def spans_in(path: Path) -> int:
    return sum(e.get("ph") == "X" for e in json.loads(path.read_text())["traceEvents"])


def verdict(ratios: list[float], target: float) -> str:
    median = statistics.median(ratios)
    cost = 1 - median
    return (f"{median:.3f} (cost {100 * cost:.1f} %, target <= {100 * target:.0f} %: "
            f"{'PASS' if cost <= target else 'FAIL'}; pairs {min(ratios):.2f} to "
            f"{max(ratios):.2f})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=3, help="epochs of 40 steps per fit")
    parser.add_argument("--quick", action="store_true", help="3 pairs of 2 epochs")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--model", choices=sorted(MODELS), default="tiny",
                        help="tiny: 32-64-10 (steps of ~0.3 ms); mlp: 784-512-10")
    args = parser.parse_args(argv)
    if args.quick:
        args.pairs, args.epochs = 3, 2
    rng = np.random.default_rng(0)
    inputs, hidden = MODELS[args.model]
    x = rng.normal(size=(ROWS, inputs)).astype(np.float32)
    y = rng.integers(0, 10, ROWS)
    strategy = ld.MirroredStrategy(num_replicas=2, device="cpu")
    trace = Path(tempfile.mkdtemp()) / "trace.json"
    rec, tr, tr_fit, per_1000 = [], [], [], []
    try:
        model = model_on(strategy, inputs, hidden)
        timed_fit(model, x, y, 1, contextlib.nullcontext)  # warm
        for i in range(args.pairs):
            order = (True, False) if i % 2 == 0 else (False, True)
            got = {}
            for on in order:
                recording(strategy, on)
                got[on] = timed_fit(model, x, y, args.epochs, contextlib.nullcontext)
            recording(strategy, True)
            rec.append(got[True]["whole"] / got[False]["whole"])
            got = {}
            for traced in order:
                wrap = (lambda: ld.profile(trace, strategy)) if traced else contextlib.nullcontext
                got[traced] = timed_fit(model, x, y, args.epochs, wrap)
            tr.append(got[True]["whole"] / got[False]["whole"])
            tr_fit.append(got[True]["fit"] / got[False]["fit"])
            spans = spans_in(trace)
            per_1000.append(1e3 * got[True]["exit_s"] / (spans / 1000))
            print(f"pair {i}: recording on/off {rec[-1]:.3f}   traced/untraced {tr[-1]:.3f} "
                  f"(fit alone {tr_fit[-1]:.3f}; trace's exit {1e3 * got[True]['exit_s']:.1f} "
                  f"ms for {spans} spans)", flush=True)
    finally:
        strategy.close()
    load = os.getloadavg()[0]
    print(f"\n{args.model} model, {args.pairs} pairs x {args.epochs} epochs of "
          f"{STEPS_PER_EPOCH} steps, "
          f"load average {load:.1f}")
    print(f"recording on / off, steps/s:  {verdict(rec, RECORDING_TARGET)}")
    print(f"traced / untraced, steps/s:   {verdict(tr, TRACING_TARGET)}")
    print(f"  the fit alone inside ld.profile / untraced: {statistics.median(tr_fit):.3f}")
    print(f"  gathering + writing the trace at the block's end: "
          f"{statistics.median(per_1000):.1f} ms per 1000 spans (median)")
    if args.json:
        args.json.write_text(json.dumps({
            "model": args.model, "pairs": args.pairs, "epochs": args.epochs, "load": load,
            "recording": rec, "tracing": tr, "tracing_fit_alone": tr_fit,
            "exit_ms_per_1000_spans": per_1000}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
