"""Batch norm as TensorFlow distributes it, against runs recorded from TF 2.21 (Keras 3) by
tf_recorded/record_batch_norm.py: Dense -> BatchNormalization -> Dense, 4 SGD steps on 1-3
replicas. Without `synchronized`, each replica's moving statistics follow its own slice of
each batch and drift apart (ON_WRITE / NONE: TensorFlow's own use of aggregation NONE);
`get_weights` reads replica 0's copy, and `predict` / `evaluate` normalise each replica's
slice with that replica's copy. With `synchronized=True` the copies stay equal to one
replica's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import make_strategy

import labdist as ld
from labdist.training.layers import BatchNormalization

RECORDED = json.loads((Path(__file__).with_name("tf_recorded") / "batch_norm.json")
                      .read_text())
X = np.asarray(RECORDED["x"], np.float32)
Y = np.asarray(RECORDED["y"], np.int64)


def strategy_of(n: int) -> ld.Strategy:
    return ld.OneDeviceStrategy(device="cpu") if n == 1 else make_strategy(f"mirrored-{n}")


def model_like_tfs(strategy, synchronized: bool, initial) -> ld.models.Sequential:
    with strategy.scope():
        model = ld.models.Sequential([
            ld.layers.Dense(6, input_shape=(5,)),
            ld.layers.BatchNormalization(momentum=0.9, synchronized=synchronized),
            ld.layers.Dense(3, activation="softmax")])
        model.compile(loss="sparse_categorical_crossentropy",
                      optimizer=ld.optimizers.SGD(0.1))
    model.set_weights([np.asarray(w, np.float32) for w in initial])
    return model


def test_the_recording_is_tensorflows_and_shows_the_drift():
    assert RECORDED["tensorflow_version"].startswith("2.21")
    apart = RECORDED["runs"]["synchronized=False,replicas=2"]["copies"]["moving_mean"]
    assert not np.allclose(apart[0], apart[1])
    together = RECORDED["runs"]["synchronized=True,replicas=3"]["copies"]["moving_mean"]
    np.testing.assert_allclose(together[0], together[2], rtol=1e-6)


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("synchronized", [False, True])
def test_fit_predict_and_evaluate_match_tensorflow(synchronized, n):
    tf = RECORDED["runs"][f"synchronized={synchronized},replicas={n}"]
    strategy = strategy_of(n)
    model = model_like_tfs(strategy, synchronized, tf["initial"])
    bn = {v.name.rsplit("/", 1)[-1]: v for v in model.weights if "batchnorm" in v.name}
    for name in ("moving_mean", "moving_variance"):
        v = bn[name]
        assert [v.synchronization.name, v.aggregation.name, v.trainable] == tf["modes"][name]
    model.fit(X, Y, batch_size=12, epochs=2, shuffle=False, verbose=0)
    for name, copies in tf["copies"].items():
        np.testing.assert_allclose(np.stack(strategy.experimental_local_results(bn[name])),
                                   np.asarray(copies), rtol=1e-5, atol=1e-6, err_msg=name)
    for ours, theirs in zip(model.get_weights(), tf["weights"], strict=True):
        np.testing.assert_allclose(ours, np.asarray(theirs), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(model.predict(X[:12], batch_size=12, verbose=0),
                               np.asarray(tf["predict"]), rtol=1e-4, atol=1e-5)
    assert model.evaluate(X, Y, batch_size=12, verbose=0) == pytest.approx(tf["evaluate"],
                                                                           rel=1e-4)


def test_synchronized_batch_norm_copes_with_an_empty_shard(mirrored3):
    """A global batch smaller than the replica count leaves a replica without data: it still
    joins the batch statistics' collectives, so nobody waits, and the copies stay equal."""
    model = model_like_tfs(mirrored3, True, RECORDED["runs"]["synchronized=True,replicas=3"]
                           ["initial"])
    model.fit(X[:10], Y[:10], batch_size=2, epochs=1, shuffle=False, verbose=0)
    moving = next(v for v in model.weights if v.name.endswith("moving_mean"))
    copies = mirrored3.experimental_local_results(moving)
    np.testing.assert_array_equal(copies[0], copies[2])
    assert np.isfinite(copies[0]).all()


def test_batch_norm_gradients_against_finite_differences():
    rng = np.random.default_rng(1)
    layer = BatchNormalization()
    x = rng.normal(size=(7, 3, 4))  # statistics over every axis but the last
    params = {"gamma": rng.normal(size=4), "beta": rng.normal(size=4)}
    state = {"moving_mean": np.zeros(4), "moving_variance": np.ones(4)}
    proj = rng.normal(size=x.shape)

    def loss():
        s = {k: v.copy() for k, v in state.items()}
        return float((proj * layer.forward(np, params, x, training=True, state=s)[0]).sum())

    _, cache = layer.forward(np, params, x, training=True, state=dict(state))
    dx, grads = layer.backward(np, params, cache, proj)
    for target, got in ((x, dx), (params["gamma"], grads["gamma"]),
                        (params["beta"], grads["beta"])):
        numeric = np.zeros_like(target)
        for i in np.ndindex(target.shape):
            old = target[i]
            target[i] = old + 1e-6
            hi = loss()
            target[i] = old - 1e-6
            lo = loss()
            target[i] = old
            numeric[i] = (hi - lo) / 2e-6
        np.testing.assert_allclose(got, numeric, rtol=1e-5, atol=1e-7)


def test_a_batch_norm_model_saves_its_moving_statistics(mirrored2, tmp_path):
    model = model_like_tfs(mirrored2, False, RECORDED["runs"]["synchronized=False,replicas=2"]
                           ["initial"])
    model.fit(X, Y, batch_size=12, epochs=1, shuffle=False, verbose=0)
    model.save(tmp_path / "bn")
    with mirrored2.scope():
        again = ld.models.load_model(tmp_path / "bn")
    for a, b in zip(again.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert len(again.non_trainable_weights) == 2


def test_parameter_servers_refuse_layer_state_clearly():
    from labdist.parameter_server.fit import train_model_steps
    from labdist.training.trainer.steps import TrainStep

    with ld.OneDeviceStrategy(device="cpu").scope():
        model = ld.models.Sequential([ld.layers.Dense(2, input_shape=(3,)),
                                      ld.layers.BatchNormalization()])
    step = TrainStep(model.layers, model._weights, [], None, None, 0,
                     states=model._states)
    with pytest.raises(NotImplementedError, match=r"batchnormalization_1/moving_mean.*"
                                                  r"train it under MirroredStrategy"):
        train_model_steps(None, step, [], 0)
