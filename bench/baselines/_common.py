"""What every training runner shares: its arguments, the data, the timing and the one JSON
line it prints last. Only the standard library and numpy, so it runs under any interpreter
(labdist's, torch's, TensorFlow's); a runner imports it from its own folder.

The model is the same everywhere: MLP 784-512-10 (ReLU, softmax), SGD(0.01), sparse
categorical cross-entropy, float32; `--batch` is the global batch of one step.
bench_scale.py varies two things through the environment (runners that support them say so
in their docstring): LABDIST_BENCH_REPLICAS (replicas / processes, default 2) and
LABDIST_BENCH_HIDDEN (the hidden layers' widths, comma-separated, default 512).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

FEATURES, CLASSES = 784, 10
LAYERS = tuple(int(w) for w in os.environ.get("LABDIST_BENCH_HIDDEN", "512").split(","))
HIDDEN = LAYERS[0]  # runners with one hidden layer only (numpy_one, tf_custom, labdist's loop)
LEARNING_RATE = 0.01
REPLICAS = int(os.environ.get("LABDIST_BENCH_REPLICAS", "2"))


def parse(description: str, extra: Callable[[argparse.ArgumentParser], None] | None = None
          ) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--batch", type=int, required=True, help="global batch of one step")
    parser.add_argument("--steps", type=int, required=True, help="steps in one timed pass")
    parser.add_argument("--passes", type=int, default=3, help="timed passes (median is kept)")
    parser.add_argument("--warmup", type=int, default=20, help="steps before the timing")
    if extra is not None:
        extra(parser)
    return parser.parse_args()


def data(samples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`samples` random images (float32 in [0, 1)) and labels (int64 in [0, 10)): the same
    arrays in every runner for the same `samples`."""
    rng = np.random.default_rng(seed)
    x = rng.random((samples, FEATURES), dtype=np.float32)
    y = rng.integers(0, CLASSES, samples)
    return x, y


def timed_passes(run_pass: Callable[[], Any], steps: int, passes: int) -> list[float]:
    """Steps/s of each of `passes` calls of `run_pass` (each runs `steps` steps)."""
    rates = []
    for _ in range(passes):
        start = time.perf_counter()
        run_pass()
        rates.append(steps / (time.perf_counter() - start))
    return rates


def emit(rates: list[float], **info: Any) -> None:
    """The runner's result: one JSON line, the last thing it prints to stdout."""
    info.setdefault("python", sys.version.split()[0])
    info.setdefault("pid", os.getpid())
    print(json.dumps({"steps_per_s": statistics.median(rates), "passes": rates, "info": info}),
          flush=True)


def fail(reason: str) -> None:
    """A configuration this interpreter cannot run: said in the JSON line, exit status 3."""
    print(json.dumps({"steps_per_s": None, "error": reason}), flush=True)
    sys.exit(3)
