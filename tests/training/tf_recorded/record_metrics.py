"""Records Keras' metric objects in TensorFlow, for tests/training/test_metric_objects.py.

Run it with a TensorFlow venv (never a labdist dependency), from the repository root:
    /path/to/tf-venv/bin/python tests/training/tf_recorded/record_metrics.py
It writes metrics.json beside itself: each metric's result on fixed batches (with and without
sample weights), and under MirroredStrategy on 1-3 logical CPUs: the variables'
synchronization and aggregation, each replica's partial result inside `strategy.run`, the
cross-replica result, and the result after a cross-replica `update_state`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import tensorflow as tf

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 3)

RNG = np.random.default_rng(0)
N = 12
LOGITS = RNG.standard_normal((N, 4)).astype(np.float32)
PROBS = (np.exp(LOGITS) / np.exp(LOGITS).sum(1, keepdims=True)).astype(np.float32)
IDS = RNG.integers(0, 4, N).astype(np.int64)
ONE_HOT = np.eye(4, dtype=np.float32)[IDS]
SCORES = RNG.random(N).astype(np.float32)
LABELS = (RNG.random(N) < 0.5).astype(np.float32)
TARGETS = RNG.standard_normal((N, 4)).astype(np.float32)
WEIGHTS = RNG.random(N).astype(np.float32)
VALUES = RNG.standard_normal(N).astype(np.float32)

# name: (class, kwargs, arguments of update_state)
CASES = {
    "Mean": ("Mean", {}, (VALUES,)),
    "Sum": ("Sum", {}, (VALUES,)),
    "SparseCategoricalAccuracy": ("SparseCategoricalAccuracy", {}, (IDS, PROBS)),
    "CategoricalAccuracy": ("CategoricalAccuracy", {}, (ONE_HOT, PROBS)),
    "MeanSquaredError": ("MeanSquaredError", {}, (TARGETS, PROBS)),
    "AUC": ("AUC", {}, (LABELS, SCORES)),
    "AUC_11": ("AUC", {"num_thresholds": 11}, (LABELS, SCORES)),
}


def main() -> None:
    out: dict = {"tensorflow_version": tf.__version__, "cases": {}}
    for name, (cls, kwargs, args) in CASES.items():
        case: dict = {"class_name": cls, "kwargs": kwargs,
                      "args": [a.tolist() for a in args], "weights": WEIGHTS.tolist()}
        m = getattr(tf.keras.metrics, cls)(**kwargs)
        m.update_state(*args)
        case["result"] = float(m.result())
        m.reset_state()
        m.update_state(*args, sample_weight=WEIGHTS)
        case["weighted_result"] = float(m.result())
        for n in (1, 2, 3):
            strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
            with strategy.scope():
                m = getattr(tf.keras.metrics, cls)(**kwargs)

            def step(m=m, n=n, args=args):
                r = tf.distribute.get_replica_context().replica_id_in_sync_group
                size = N // n  # N splits evenly over 1, 2 and 3 replicas
                m.update_state(*[tf.constant(a)[r * size:(r + 1) * size] for a in args])
                return m.result()

            per_replica = strategy.run(tf.function(step))
            partials = [float(v) for v in strategy.experimental_local_results(per_replica)]
            entry = {
                "synchronization": [str(v.synchronization).split(".")[-1]
                                    for v in m.variables],
                "aggregation": [str(v.aggregation).split(".")[-1] for v in m.variables],
                "partials": partials,
                "result": float(m.result()),
            }
            m.update_state(*args)  # cross-replica
            entry["after_cross_replica_update"] = float(m.result())
            entry["copies_after_cross_replica_update"] = [
                [np.asarray(c).tolist() for c in strategy.experimental_local_results(v.value)]
                for v in m.variables]
            case[f"replicas_{n}"] = entry
        out["cases"][name] = case
    path = Path(__file__).with_name("metrics.json")
    path.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(f"{len(CASES)} metrics from TensorFlow {tf.__version__} written to {path}")


if __name__ == "__main__":
    main()
