"""What making time visible costs (issue 27): `model.fit` steps/s on a 2-replica mirrored
strategy with phase recording on vs off, and inside `ld.profile(...)` (a trace file written at
the end) vs not. Paired runs in alternating order, so the machine's drift hits both sides
alike; only the ratios mean anything on a shared machine. A benchmark: it never fails.

    python bench/bench_time.py [--pairs 8] [--epochs 3]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import labdist as ld
from labdist import phases

BATCH, ROWS = 32, 32 * 40  # 40 steps an epoch


def model_on(strategy) -> ld.models.Sequential:
    with strategy.scope():
        model = ld.models.Sequential([ld.layers.Dense(64, activation="relu", input_shape=(32,)),
                                      ld.layers.Dense(10, activation="softmax")], seed=0)
        model.compile(loss="sparse_categorical_crossentropy", optimizer=ld.optimizers.Adam())
    return model


def steps_per_s(model, x, y, epochs: int, wrap, inside: list | None = None) -> float:
    """Steps/s of one fit, the wrapper's entry and exit (the trace written) included;
    `inside` gets the steps/s of the fit alone."""
    start = time.perf_counter()
    with wrap():
        t0 = time.perf_counter()
        model.fit(x, y, batch_size=BATCH, epochs=epochs, verbose=0, shuffle=False)
        fit_s = time.perf_counter() - t0
    if inside is not None:
        inside.append(epochs * (ROWS // BATCH) / fit_s)
    return epochs * (ROWS // BATCH) / (time.perf_counter() - start)


def recording(strategy, on: bool) -> None:
    strategy.client.run(phases.set_enabled, on)
    phases.set_enabled(on)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 32)).astype(np.float32)
    y = rng.integers(0, 10, ROWS)
    strategy = ld.MirroredStrategy(num_replicas=2, device="cpu")
    trace = Path(tempfile.mkdtemp()) / "trace.json"
    try:
        model = model_on(strategy)
        steps_per_s(model, x, y, 1, contextlib.nullcontext)  # warm
        rec, tr, tr_fit = [], [], []
        for i in range(args.pairs):
            order = (True, False) if i % 2 == 0 else (False, True)
            got = {}
            for on in order:
                recording(strategy, on)
                got[on] = steps_per_s(model, x, y, args.epochs, contextlib.nullcontext)
            recording(strategy, True)
            rec.append(got[True] / got[False])
            got, fit = {}, {}
            for traced in order:
                wrap = (lambda: ld.profile(trace, strategy)) if traced else contextlib.nullcontext
                inside: list[float] = []
                got[traced] = steps_per_s(model, x, y, args.epochs, wrap, inside)
                fit[traced] = inside[0]
            tr.append(got[True] / got[False])
            tr_fit.append(fit[True] / fit[False])
            print(f"pair {i}: recording on/off {rec[-1]:.3f}   traced/untraced {tr[-1]:.3f} "
                  f"(fit alone {tr_fit[-1]:.3f})", flush=True)
    finally:
        strategy.close()
    print(f"median steps/s ratio, recording on / off: {statistics.median(rec):.3f} "
          f"(cost {100 * (1 - statistics.median(rec)):.1f} %, target <= 3 %)")
    print(f"median steps/s ratio, traced / untraced:  {statistics.median(tr):.3f} "
          f"(cost {100 * (1 - statistics.median(tr)):.1f} %, target <= 10 %)")
    print(f"  the fit alone inside ld.profile / untraced: {statistics.median(tr_fit):.3f} "
          "(the rest is gathering and writing the trace at the end: a cost per file)")
    print(f"trace file: {trace.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
