"""Metric objects (`ld.metrics`) against Keras in TensorFlow 2.21, recorded by
tf_recorded/record_metrics.py: results with and without sample weights, and under a mirrored
strategy of 1-3 replicas the state variables' modes (ON_READ / SUM), each replica's partial
result inside `strategy.run`, the cross-replica result, and a cross-replica `update_state`.
Then the objects compiled into `fit`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import make_strategy

import labdist as ld

RECORDED = json.loads((Path(__file__).with_name("tf_recorded") / "metrics.json").read_text())
CASES = RECORDED["cases"]


def make(case: dict) -> ld.metrics.Metric:
    return getattr(ld.metrics, case["class_name"])(**case["kwargs"])


def arrays(case: dict) -> list[np.ndarray]:
    return [np.asarray(a, dtype=np.int64 if case["class_name"] == "SparseCategoricalAccuracy"
                       and i == 0 else np.float32) for i, a in enumerate(case["args"])]


def test_the_recording_is_tensorflows():
    assert RECORDED["tensorflow_version"].startswith("2.21")


@pytest.mark.parametrize("name", sorted(CASES))
def test_results_match_keras_with_and_without_sample_weights(name):
    case = CASES[name]
    m = make(case)
    m.update_state(*arrays(case))
    assert float(m.result()) == pytest.approx(case["result"], rel=1e-6, abs=1e-7)
    m.reset_state()
    assert float(m.result()) == 0.0
    m.update_state(*arrays(case), sample_weight=np.asarray(case["weights"], np.float32))
    assert float(m.result()) == pytest.approx(case["weighted_result"], rel=1e-6, abs=1e-7)


def shard_step(metric, args, n):
    """Each replica updates with its shard of the batch (12 samples split evenly)."""
    ctx = ld.get_replica_context()
    size = len(args[0]) // n
    r = ctx.replica_id_in_sync_group
    metric.update_state(*[ctx.xp.asarray(a[r * size:(r + 1) * size]) for a in args])
    return ld.to_host(metric.result())


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("name", sorted(CASES))
def test_on_read_sum_state_as_tensorflow_keeps_it(name, n):
    case, tf = CASES[name], CASES[name][f"replicas_{n}"]
    strategy = ld.OneDeviceStrategy(device="cpu") if n == 1 else make_strategy(f"mirrored-{n}")
    with strategy.scope():
        m = make(case)
    assert [v.synchronization.name.lower() for v in m.variables] == tf["synchronization"]
    assert [v.aggregation.name.lower() for v in m.variables] == tf["aggregation"]
    assert not any(v.trainable for v in m.variables)
    partials = strategy.run(shard_step, args=(m, arrays(case), n))
    got = [float(p) for p in strategy.experimental_local_results(partials)]
    np.testing.assert_allclose(got, tf["partials"], rtol=1e-6, atol=1e-7)
    assert float(m.result()) == pytest.approx(tf["result"], rel=1e-6, abs=1e-7)
    m.update_state(*arrays(case))  # cross-replica: each copy holds (sum + x) / N
    assert float(m.result()) == pytest.approx(tf["after_cross_replica_update"], rel=1e-6,
                                              abs=1e-7)
    for v, copies in zip(m.variables, tf["copies_after_cross_replica_update"], strict=True):
        np.testing.assert_allclose(np.stack(strategy.experimental_local_results(v)),
                                   np.asarray(copies), rtol=1e-5, atol=1e-6, err_msg=v.name)
    m.reset_state()
    assert float(m.result()) == 0.0


def classifier(strategy, metrics):
    with strategy.scope():
        model = ld.models.Sequential([ld.layers.Dense(16, activation="relu", input_shape=(64,)),
                                      ld.layers.Dense(10, activation="softmax")])
        model.compile(loss="sparse_categorical_crossentropy", optimizer="adam",
                      metrics=metrics)
    return model


def test_compiled_metric_objects_log_by_name_and_hold_the_last_epochs_figure(mirrored2):
    (x, y), (x_val, y_val) = ld.datasets.digits.load_data()
    with mirrored2.scope():
        accuracy = ld.metrics.SparseCategoricalAccuracy(name="acc")
        mse = ld.metrics.MeanSquaredError()
    model = classifier(mirrored2, [accuracy, "sparse_categorical_accuracy"])
    history = model.fit(x, y, batch_size=64, epochs=2, verbose=0)
    assert history.history["acc"] == history.history["sparse_categorical_accuracy"]
    assert float(accuracy.result()) == pytest.approx(history.history["acc"][-1], rel=1e-6)
    logs = model.evaluate(x_val, y_val, verbose=0, return_dict=True)
    assert float(accuracy.result()) == pytest.approx(logs["acc"], rel=1e-6)
    assert mse.formula == "mse"


def test_compiled_metric_objects_save_and_load(mirrored2, tmp_path):
    (x, y), _ = ld.datasets.digits.load_data()
    model = classifier(mirrored2, [ld.metrics.SparseCategoricalAccuracy(name="acc")])
    model.fit(x[:128], y[:128], verbose=0)
    model.save(tmp_path / "m")
    with mirrored2.scope():
        again = ld.models.load_model(tmp_path / "m")
    logs = again.evaluate(x[:128], y[:128], verbose=0, return_dict=True)
    assert set(logs) == {"loss", "acc"}


def test_a_metric_fit_cannot_add_up_is_refused_at_compile(mirrored2):
    with pytest.raises(ValueError, match=r"metrics: AUC\(name='auc'\) has no per-sample "
                                         r"formula fit can add up"):
        classifier(mirrored2, [ld.metrics.AUC()])
    with pytest.raises(ValueError, match=r"two metrics share a name"):
        classifier(mirrored2, ["mse", ld.metrics.MeanSquaredError(name="mse")])


def test_bad_metric_settings_name_the_setting():
    with pytest.raises(ValueError, match=r"curve='PR' is not allowed; use 'ROC'"):
        ld.metrics.AUC(curve="PR")
    with pytest.raises(ValueError, match=r"num_thresholds=1 is not allowed"):
        ld.metrics.AUC(num_thresholds=1)


def test_a_mean_of_one_value_takes_one_weight():
    """Keras' loss tracker adds each batch's mean loss weighted by its batch size:
    `Mean().update_state(2.0, sample_weight=5)` counts 5 samples of 2.0."""
    mean = ld.metrics.Mean()
    mean.update_state(2.0, sample_weight=5)
    mean.update_state(4.0, sample_weight=15)
    assert float(mean.result()) == pytest.approx((2 * 5 + 4 * 15) / 20)
    assert [float(v.numpy()) for v in mean.variables] == [70.0, 20.0]
    with pytest.raises(ValueError, match=r"sample_weight has shape \(2,\) for a single value"):
        mean.update_state(1.0, sample_weight=[1, 2])
