"""Time to first step: a fresh process (as a fresh kernel is) imports the library, makes a
2-replica mirrored strategy, builds and compiles the MLP of the other benches, and trains one
step with `fit`. labdist (its embedded cluster: a scheduler and two worker processes) against
TensorFlow's MirroredStrategy on 2 logical CPUs, same model and data, rounds interleaved.

Prints each phase's median (import, strategy, model, first fit) and the ratio of the totals
(TF / labdist: above 1, labdist's first step comes sooner). TensorFlow runs under its own
interpreter, never a labdist dependency: LABDIST_BENCH_TF_PY=/path/to/tf-venv/bin/python.
Without it, only labdist's phases are printed.

Run: `python bench/bench_first_step.py --rounds 5 [--json out.json]`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Each child prints one JSON line: seconds per phase, from its first line of Python on.
LABDIST = """
import time, json
t0 = time.perf_counter()
import numpy as np
import labdist as ld
from labdist.cluster import local
t1 = time.perf_counter()
spans = {}
start = local.start_local_cluster
def timed(*a, **k):
    s = time.perf_counter()
    try:
        return start(*a, **k)
    finally:
        spans["cluster"] = time.perf_counter() - s
local.start_local_cluster = timed
import labdist.cluster.actor_group as actor_group
actor_group.start_local_cluster = timed
if __name__ == "__main__":
    strategy = ld.MirroredStrategy(num_replicas=2)
    t2 = time.perf_counter()
    rng = np.random.default_rng(0)
    x = rng.random((64, 784), dtype=np.float32); y = rng.integers(0, 10, 64)
    with strategy.scope():
        model = ld.models.Sequential([ld.layers.Dense(512, activation="relu", input_shape=(784,)),
                                      ld.layers.Dense(10, activation="softmax")])
        model.compile(loss="sparse_categorical_crossentropy", optimizer=ld.optimizers.SGD(0.01))
    t3 = time.perf_counter()
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    t4 = time.perf_counter()
    print(json.dumps({"import": t1 - t0, "strategy": t2 - t1, "model": t3 - t2,
                      "first fit": t4 - t3, "total": t4 - t0,
                      "of which cluster start": spans.get("cluster", 0.0)}))
    strategy.close()
"""

TENSORFLOW = """
import os, time, json
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
t0 = time.perf_counter()
import numpy as np
import tensorflow as tf
t1 = time.perf_counter()
cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
t2 = time.perf_counter()
rng = np.random.default_rng(0)
x = rng.random((64, 784), dtype=np.float32); y = rng.integers(0, 10, 64)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((784,)),
                                 tf.keras.layers.Dense(512, activation="relu"),
                                 tf.keras.layers.Dense(10, activation="softmax")])
    model.compile(loss="sparse_categorical_crossentropy", optimizer=tf.keras.optimizers.SGD(0.01))
t3 = time.perf_counter()
model.fit(x, y, batch_size=64, epochs=1, verbose=0)
t4 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "strategy": t2 - t1, "model": t3 - t2,
                  "first fit": t4 - t3, "total": t4 - t0}))
"""


def one(python: str, code: str) -> dict[str, float]:
    """One fresh process; its phases, and its whole life seen from outside ("process")."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    started = time.perf_counter()
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env,
                          timeout=600, cwd=ROOT)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"{python} failed:\n{done.stderr[-3000:]}")
    phases = json.loads(done.stdout.strip().splitlines()[-1])
    phases["process"] = wall
    return phases


def medians(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="write the raw figures here")
    args = parser.parse_args()
    tf_python = os.environ.get("LABDIST_BENCH_TF_PY")
    rows: dict[str, list] = {"labdist": [], "tensorflow": []}
    for i in range(args.rounds):  # interleaved: the same machine state for both
        rows["labdist"].append(one(sys.executable, LABDIST))
        if tf_python:
            rows["tensorflow"].append(one(tf_python, TENSORFLOW))
        print(f"round {i + 1}/{args.rounds}: labdist {rows['labdist'][-1]['total']:.2f} s"
              + (f", TensorFlow {rows['tensorflow'][-1]['total']:.2f} s" if tf_python else ""),
              file=sys.stderr)
    result = {name: medians(r) for name, r in rows.items() if r}
    print(f"time to first step, medians of {args.rounds} fresh processes (seconds)")
    names = list(result)
    phases = list(result["labdist"])
    print(f"{'phase':<24}" + "".join(f"{n:>12}" for n in names))
    for phase in phases:
        print(f"{phase:<24}" + "".join(
            f"{result[n][phase]:>12.2f}" if phase in result[n] else f"{'-':>12}"
            for n in names))
    if tf_python:
        ratio = result["tensorflow"]["total"] / result["labdist"]["total"]
        print(f"TensorFlow / labdist, total: {ratio:.2f}x "
              f"({'labdist sooner' if ratio > 1 else 'TensorFlow sooner'})")
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rows, "medians": result}, indent=1))


if __name__ == "__main__":
    main()
