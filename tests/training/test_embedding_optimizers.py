"""Adam, Adagrad and RMSprop on an `Embedding` table under `fit` and in a custom loop, replayed
against TensorFlow 2.21 / Keras 3.15 (tf_recorded/record_embedding_optimizers.py): the table's
gradient is one slice per lookup, so the second moments (Adam's v, Adagrad's accumulator,
RMSprop's velocity) take the sum of the squared slices, over every replica's lookups, while
the first moments and the step take the summed gradient; SGD is the control. Weights and
every slot are compared after 3 steps on 1, 2 and 3 replicas."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import make_strategy

import labdist as ld
from labdist.autodiff import SlicedGradient, squares_of

RECORDED = json.loads(Path(__file__).with_name("tf_recorded").joinpath(
    "embedding_optimizers.json").read_text())

OPTIMIZERS = {
    "sgd": lambda: ld.optimizers.SGD(0.5),
    "adam": lambda: ld.optimizers.Adam(0.05),
    "adagrad": lambda: ld.optimizers.Adagrad(0.2),
    "rmsprop": lambda: ld.optimizers.RMSprop(0.01),
    "rmsprop_centered_momentum": lambda: ld.optimizers.RMSprop(0.01, momentum=0.5,
                                                              centered=True),
}
# Keras 3's slot names -> labdist's, per optimizer
SLOT_NAMES = {"adam": {"momentum": "m", "velocity": "v"}}


def test_the_recording_is_tensorflows():
    assert RECORDED["tensorflow_version"].startswith("2.21")
    assert set(RECORDED["fit"]) == set(OPTIMIZERS)
    x = np.asarray(RECORDED["x"])
    assert (x[:, 0] == x[:, 1]).all()  # every sample looks one row up twice, at least


def _fit(name: str, strategy) -> ld.models.Sequential:
    x = np.asarray(RECORDED["x"], np.float32)
    y = np.asarray(RECORDED["y"], np.int64)
    with strategy.scope():
        model = ld.models.Sequential([
            ld.Input((x.shape[1],)),
            ld.layers.Embedding(7, 3),
            ld.layers.GlobalAveragePooling1D(),
            ld.layers.Dense(2),
        ])
        model.set_weights([np.asarray(w, np.float32) for w in RECORDED["initial"]])
        model.compile(optimizer=OPTIMIZERS[name](),
                      loss=ld.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=RECORDED["batch_size"], epochs=1, shuffle=False, verbose=0)
    return model


def _check(model, strategy, name: str, recorded: dict, optimizer=None) -> None:
    optimizer = model.optimizer if optimizer is None else optimizer
    for got, want in zip(model.get_weights(), recorded["after"], strict=True):
        np.testing.assert_allclose(got, np.asarray(want), rtol=2e-5, atol=2e-6)
    rename = SLOT_NAMES.get(name, {})
    for w, want in zip(model.trainable_weights, recorded["slots"], strict=True):
        slots = optimizer.slot_variables.get(w.id, {})
        assert set(slots) == {rename.get(k, k) for k in want}, w.name
        for k, values in want.items():  # every replica's copy of the slot
            for copy in strategy.experimental_local_results(slots[rename.get(k, k)]):
                np.testing.assert_allclose(np.asarray(copy), np.asarray(values), rtol=2e-5,
                                           atol=2e-6, err_msg=f"{w.name} {k}")


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_one_replica_matches_tensorflow(name):
    strategy = ld.OneDeviceStrategy("cpu")
    try:
        _check(_fit(name, strategy), strategy, name, RECORDED["fit"][name]["1"])
    finally:
        strategy.close()


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_two_replicas_match_tensorflow(name, mirrored2):
    _check(_fit(name, mirrored2), mirrored2, name, RECORDED["fit"][name]["2"])


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_three_replicas_match_tensorflow(name, mirrored3):
    _check(_fit(name, mirrored3), mirrored3, name, RECORDED["fit"][name]["3"])


def _custom_loop(name: str, strategy):
    """TensorFlow's custom-training program (the recording's `with_custom_loop`), with the
    import changed: GradientTape inside strategy.run, apply_gradients summing the replicas'
    gradients. The tape hands the table's gradient out with its lookups' squared slices."""
    x = np.asarray(RECORDED["x"], np.float32)
    y = np.asarray(RECORDED["y"], np.int64)
    batch = RECORDED["batch_size"]
    with strategy.scope():
        model = ld.models.Sequential([ld.Input((x.shape[1],)), ld.layers.Embedding(7, 3),
                                      ld.layers.GlobalAveragePooling1D(), ld.layers.Dense(2)])
        model.set_weights([np.asarray(w, np.float32) for w in RECORDED["initial"]])
        optimizer = OPTIMIZERS[name]()
        optimizer.build(model.trainable_variables)
    loss_fn = ld.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    data = strategy.experimental_distribute_dataset(
        ld.data.Dataset.from_tensor_slices((x, y)).batch(batch))

    def step(xb, yb):
        with ld.GradientTape() as tape:
            loss = ld.nn.compute_average_loss(loss_fn(yb, model(xb, training=True)),
                                              global_batch_size=batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    for xb, yb in data:
        strategy.run(step, args=(xb, yb))
    return model, optimizer


@pytest.mark.parametrize("replicas", [1, 2, 3])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_custom_loop_matches_tensorflows(name, replicas, request):
    strategy = (ld.OneDeviceStrategy("cpu") if replicas == 1
                else request.getfixturevalue(f"mirrored{replicas}"))
    try:
        model, optimizer = _custom_loop(name, strategy)
        _check(model, strategy, name, RECORDED["custom_loop"][name][str(replicas)], optimizer)
    finally:
        if replicas == 1:
            strategy.close()


def test_a_sliced_gradient_computed_on_is_a_plain_gradient():
    """Scaling or clipping the table's gradient leaves the squares behind: they would no
    longer be the slices' own (the optimizer then squares the gradient it is given)."""
    g = SlicedGradient(np.array([[1.0, 2.0]]), np.array([[0.5, 2.5]]))
    assert squares_of(g).tolist() == [[0.5, 2.5]]
    for derived in (g * 0.5, np.clip(g, -1, 1), g + g, g[0:1]):
        assert squares_of(derived) is None
    cast = g.astype(np.float32)
    assert cast.dtype == np.float32 and squares_of(cast).dtype == np.float32


@pytest.fixture
def local2():
    """mirrored-2, with local SGD turned off again afterwards."""
    strategy = make_strategy("mirrored-2")
    yield strategy
    strategy.set_local_sgd(None)


def test_a_local_step_squares_this_replicas_own_slices(local2):
    """Local SGD: each replica's inner Adagrad step is a one-replica step on its own shard
    (its gradient and its squared slices scaled to its shard), so with one local step and
    outer SGD(1) the weights are the mean of two one-replica fits, and each replica's
    accumulator is its own fit's."""
    x = np.asarray(RECORDED["x"], np.float32)[:12]
    y = np.asarray(RECORDED["y"], np.int64)[:12]

    def model(strategy):
        return _recorded_model(strategy, x.shape[1], ld.optimizers.Adagrad(0.2))

    alone = []
    one = ld.OneDeviceStrategy("cpu")
    try:
        for half in (slice(0, 6), slice(6, 12)):
            m = model(one)
            m.fit(x[half], y[half], batch_size=6, epochs=1, shuffle=False, verbose=0)
            table = m.trainable_weights[0]
            accumulator = m.optimizer.slot_variables[table.id]["accumulator"]
            alone.append((m.get_weights(), one.experimental_local_results(accumulator)[0]))
    finally:
        one.close()
    local2.set_local_sgd(1, ld.optimizers.SGD(1.0))
    m = model(local2)
    m.fit(x, y, batch_size=12, epochs=1, shuffle=False, verbose=0)
    for got, *each in zip(m.get_weights(), alone[0][0], alone[1][0], strict=True):
        np.testing.assert_allclose(got, np.mean(each, axis=0), rtol=1e-5, atol=1e-6)
    accumulator = m.optimizer.slot_variables[m.trainable_weights[0].id]["accumulator"]
    for copy, (_, want) in zip(local2.experimental_local_results(accumulator), alone,
                               strict=True):
        np.testing.assert_allclose(np.asarray(copy), np.asarray(want), rtol=1e-5, atol=1e-7)


def test_an_uneven_split_with_an_empty_shard_gives_the_one_replica_step(mirrored3):
    """A short last batch of 2 on 3 replicas (one shard empty, joining with zeros): the
    squared slices summed over the replicas are the one-replica step's."""
    x = np.asarray(RECORDED["x"], np.float32)[:14]
    y = np.asarray(RECORDED["y"], np.int64)[:14]

    def fit(strategy):
        m = _recorded_model(strategy, x.shape[1], ld.optimizers.Adam(0.05))
        m.fit(x, y, batch_size=12, epochs=1, shuffle=False, verbose=0)
        v = m.optimizer.slot_variables[m.trainable_weights[0].id]["v"]
        return m.get_weights(), strategy.experimental_local_results(v)

    one = ld.OneDeviceStrategy("cpu")
    try:
        want, (want_v,) = fit(one)
    finally:
        one.close()
    got, got_v = fit(mirrored3)
    # the sums' order differs: where a row's gradient nearly cancels (m ~ 3e-6), Adam's
    # m / sqrt(v) turns float32 rounding into ~5e-6 of weight; a wrong sum of squares would
    # be off by far more, in v first
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=2e-5)
    for copy in got_v:
        np.testing.assert_allclose(np.asarray(copy), np.asarray(want_v), rtol=1e-4, atol=1e-10)


def _recorded_model(strategy, length: int, optimizer):
    """The recordings' model (ids of `length` per sample), with their initial weights."""
    with strategy.scope():
        m = ld.models.Sequential([ld.Input((length,)), ld.layers.Embedding(7, 3),
                                  ld.layers.GlobalAveragePooling1D(), ld.layers.Dense(2)])
        m.set_weights([np.asarray(w, np.float32) for w in RECORDED["initial"]])
        m.compile(optimizer=optimizer,
                  loss=ld.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m


def test_a_table_used_twice_sums_both_uses_squares():
    """Two gradients of one table (a model called twice in a step) add up with their
    squares; a plain one among them leaves a plain sum."""
    from labdist.autodiff.sliced import add

    a = SlicedGradient(np.array([1.0, 2.0]), np.array([1.0, 4.0]))
    b = SlicedGradient(np.array([3.0, 0.0]), np.array([5.0, 0.0]))
    both = add(a, b)
    assert both.tolist() == [4.0, 2.0] and squares_of(both).tolist() == [6.0, 4.0]
    assert squares_of(add(a, np.array([1.0, 1.0]))) is None
