"""Local SGD / DiLoCo on real clusters, against references written here: H = 1 with outer
SGD(1) is mirrored training; H in {4, 16} with Nesterov outer momentum is a numpy rendering of
Algorithm 1 of Douillard et al. (2023); switches never lose or repeat an update; checkpoints
carry the outer state and every replica's inner state."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_strategy

import labdist as ld

IN, OUT, BATCH = 5, 1, 12  # a global batch that 2 and 3 replicas split evenly


def data(steps: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((steps * BATCH, IN)).astype(np.float32)
    y = (x @ rng.standard_normal((IN, OUT)) + 0.1 * rng.standard_normal((len(x), OUT))
         ).astype(np.float32)
    return x, y


def linear_model(strategy, optimizer):
    with strategy.scope():
        model = ld.models.Sequential([ld.layers.Dense(OUT, input_shape=(IN,))], seed=3)
        model.compile(loss="mse", optimizer=optimizer)
    return model


@pytest.fixture
def local2():
    """mirrored-2, with local SGD turned off again afterwards."""
    strategy = make_strategy("mirrored-2")
    yield strategy
    strategy.set_local_sgd(None)
    strategy.compression = None


def test_one_local_step_with_outer_sgd_1_is_mirrored_training(local2):
    (x, y), _ = ld.datasets.digits.load_data()

    def model():
        with local2.scope():
            m = ld.models.Sequential([ld.layers.Dense(32, activation="relu", input_shape=(64,)),
                                      ld.layers.Dense(10, activation="softmax")], seed=1)
            m.compile(loss="sparse_categorical_crossentropy", optimizer=ld.optimizers.SGD(0.2))
        return m

    mirrored, local = model(), model()
    for step in range(6):
        bx, by = x[step * 64:(step + 1) * 64], y[step * 64:(step + 1) * 64]
        local2.set_local_sgd(None)
        mirrored.fit(bx, by, batch_size=64, epochs=1, shuffle=False, verbose=0)
        local2.set_local_sgd(1, ld.optimizers.SGD(1.0))
        local.fit(bx, by, batch_size=64, epochs=1, shuffle=False, verbose=0)
        for a, b in zip(mirrored.get_weights(), local.get_weights(), strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)
    for v in local.weights:  # the replicas agree after every synchronisation
        first, second = local2.experimental_local_results(v)
        np.testing.assert_array_equal(first, second)


def algorithm_1(weights, x, y, replicas, local_steps, rounds, inner_lr, outer_lr, momentum):
    """Douillard et al. 2023, Algorithm 1, in float64: every replica starts each round from
    the shared weights, takes `local_steps` Adam steps on its own shard of each global batch
    (its mean squared error), then the average of (shared - replica) is the outer gradient,
    applied by SGD with Nesterov momentum (PyTorch's form)."""
    shared = [w.astype(np.float64) for w in weights]
    adam = [[{"m": np.zeros_like(w), "v": np.zeros_like(w)} for w in shared]
            for _ in range(replicas)]
    buf = [np.zeros_like(w) for w in shared]
    b1, b2, eps = 0.9, 0.999, 1e-7
    step = 0
    for _ in range(rounds):
        finals = []
        for r in range(replicas):
            theta = [w.copy() for w in shared]
            for h in range(local_steps):
                t = step + h + 1
                lo = (step + h) * BATCH + r * BATCH // replicas
                hi = lo + BATCH // replicas
                xs, ys = x[lo:hi].astype(np.float64), y[lo:hi].astype(np.float64)
                err = xs @ theta[0] + theta[1] - ys
                dpred = 2 * err / err.size  # d mean((pred - y)^2) / d pred
                grads = [xs.T @ dpred, dpred.sum(axis=0)]
                alpha = inner_lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t)
                for w, g, s in zip(theta, grads, adam[r], strict=True):
                    s["m"] += (g - s["m"]) * (1 - b1)
                    s["v"] += (g * g - s["v"]) * (1 - b2)
                    w -= alpha * s["m"] / (np.sqrt(s["v"]) + eps)
            finals.append(theta)
        step += local_steps
        for i, w in enumerate(shared):
            delta = np.mean([w - f[i] for f in finals], axis=0)
            buf[i] = momentum * buf[i] + delta
            w -= outer_lr * (delta + momentum * buf[i])
    return shared


@pytest.mark.parametrize("kind,local_steps", [("mirrored-2", 4), ("mirrored-2", 16),
                                               ("mirrored-2-strict", 4), ("mirrored-3-tcp", 4)])
def test_diloco_matches_a_numpy_algorithm_1(kind, local_steps):
    strategy = make_strategy(kind)
    n = strategy.num_replicas_in_sync
    rounds = 2
    x, y = data(local_steps * rounds)
    outer = ld.optimizers.SGD(0.7, momentum=0.9, nesterov=True)
    strategy.set_local_sgd(local_steps, outer)
    try:
        model = linear_model(strategy, ld.optimizers.Adam(0.01))
        start = model.get_weights()
        before = strategy.communication_stats()[0]["outer_steps"]
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        after = strategy.communication_stats()[0]["outer_steps"]
    finally:
        strategy.set_local_sgd(None)
    expected = algorithm_1(start, x, y, n, local_steps, rounds, 0.01, 0.7, 0.9)
    for got, want in zip(model.get_weights(), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert after - before == rounds  # one outer step a round, none at fit's end


def test_local_steps_below_one_are_refused_before_anything_changes(local2):
    local2.set_local_sgd(4)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match=rf"local_steps={bad!r} is not allowed; use an "
                                             "integer >= 1"):
            local2.set_local_sgd(bad)
    assert local2.local_steps == 4
    with pytest.raises(TypeError, match="outer_optimizer='sgd' is not allowed"):
        local2.set_local_sgd(4, "sgd")
    with pytest.raises(ValueError, match="needs local_steps"):
        local2.set_local_sgd(None, ld.optimizers.SGD(0.7))
    assert local2.local_steps == 4


def test_constructor_refuses_local_steps_zero():
    with pytest.raises(ValueError, match="local_steps=0 is not allowed"):
        ld.MirroredStrategy(2, local_steps=0)
    with pytest.raises(ValueError, match="ratio=0 is not allowed"):
        ld.MirroredStrategy(2, compression=ld.compression.TopK(0))


def test_switching_modes_never_loses_or_repeats_an_update(local2):
    """A gradient that does not depend on the weights: every update, local or synchronised,
    moves w by exactly n * g in total, so the final w counts the updates applied."""
    n = local2.num_replicas_in_sync
    with local2.scope():
        w = ld.Variable(np.zeros(8, np.float32), aggregation="MEAN")
    optimizer = ld.optimizers.SGD(1.0)
    g = np.full(8, 0.5, np.float32)

    def step():
        optimizer.apply_gradients([(g, w)])

    schedule = [(None, None, 2), (3, None, 5), (None, None, 1), (4, "topk", 6), (2, None, 3),
                (None, "fp16", 2), (None, None, 1)]
    applied = 0
    for local_steps, compression, steps in schedule:
        local2.set_local_sgd(local_steps, None if local_steps is None
                             else ld.optimizers.SGD(1.0))
        local2.compression = ld.compression.TopK(0.25) if compression == "topk" else compression
        with local2.scope():  # local SGD's state for w, made (once) while it is on
            optimizer.build([w])
        for _ in range(steps):
            local2.run(step)
            applied += 1
    local2.set_local_sgd(None)
    local2.compression = None
    local2.run(step)  # the last residuals (top-k's) go out with this one
    applied += 1
    for copy in local2.experimental_local_results(w):
        np.testing.assert_allclose(copy, -applied * n * g, rtol=1e-6)
    stats = local2.communication_stats()
    assert all(s["residual_norm"] == 0 for s in stats)


def test_checkpoint_restores_outer_state_and_each_replicas_inner_state(local2, tmp_path):
    x, y = data(24)
    outer = ld.optimizers.SGD(0.7, momentum=0.9, nesterov=True)
    local2.set_local_sgd(4, outer)
    straight = linear_model(local2, ld.optimizers.Adam(0.01))
    straight.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)

    resumed = linear_model(local2, ld.optimizers.Adam(0.01))
    resumed.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    ld.train.Checkpoint(resumed).save(tmp_path)
    inner = [local2.experimental_local_results(v) for layer in resumed._slots
             for d in layer.values() for v in d.values()]
    assert any(not np.array_equal(a, b) for a, b in inner)  # each replica's own Adam state

    again = linear_model(local2, ld.optimizers.Adam(0.01))
    ld.train.Checkpoint(again).restore(tmp_path)
    again.fit(x, y, batch_size=BATCH, epochs=2, initial_epoch=1, shuffle=False, verbose=0)
    for a, b in zip(straight.get_weights(), again.get_weights(), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)


def test_multi_worker_strategy_takes_both_modes_as_knobs():
    from clusters import local_client

    x, y = data(8)
    with local_client(2) as client:
        strategy = ld.MultiWorkerMirroredStrategy(client, local_steps=4, compression="fp16")
        try:
            assert strategy.local_steps == 4 and strategy.outer_optimizer is None
            assert strategy.compression == ld.compression.FP16()
            model = linear_model(strategy, ld.optimizers.SGD(0.05))
            model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
            stats = strategy.communication_stats()
            # 8 local steps: 2 rounds, whose pseudo-gradients went out in half precision
            assert [s["inner_steps"] for s in stats] == [8, 8]
            assert [s["outer_steps"] for s in stats] == [2, 2]
            assert [s["compressed_reductions"] for s in stats] == [2, 2]
        finally:
            strategy.close()


def replicas_agree(strategy, variables) -> None:
    for v in variables:
        first, *others = strategy.experimental_local_results(v)
        for other in others:
            np.testing.assert_array_equal(other, first)


def test_synchronous_steps_after_diloco_start_from_one_inner_state(local2):
    x, y = data(10)
    local2.set_local_sgd(3, ld.optimizers.SGD(0.7, momentum=0.9, nesterov=True))
    model = linear_model(local2, ld.optimizers.Adam(0.01))
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)  # 10 steps: 3+3+3+1
    slots = [v for layer in model._slots for d in layer.values() for v in d.values()]
    replicas_agree(local2, model.weights)  # fit closed the last round
    local2.set_local_sgd(None)
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    replicas_agree(local2, model.weights + slots)


def test_diloco_on_a_model_large_enough_to_update_partitioned(local2):
    """1.6 MB of weights: the pseudo-gradients reduce-scatter and each replica steps its own
    segment of the anchors and the outer momentum, then gathers the rest."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6 * 64, 784)).astype(np.float32)
    y = rng.integers(0, 10, len(x))

    def model():
        with local2.scope():
            m = ld.models.Sequential([ld.layers.Dense(512, activation="relu", input_shape=(784,)),
                                      ld.layers.Dense(10, activation="softmax")], seed=2)
            m.compile(loss="sparse_categorical_crossentropy", optimizer=ld.optimizers.SGD(0.05))
        return m

    mirrored, one_step, diloco = model(), model(), model()
    mirrored.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0)
    local2.set_local_sgd(1, ld.optimizers.SGD(1.0))
    one_step.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(mirrored.get_weights(), one_step.get_weights(), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    local2.set_local_sgd(2, ld.optimizers.SGD(0.7, momentum=0.9, nesterov=True))
    diloco.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0)
    outer = diloco._outer
    replicas_agree(local2, diloco.weights + outer.anchors
                   + [v for d in outer.slots for v in d.values()])
    assert any(np.abs(local2.experimental_local_results(v)[0]).max() > 0
               for d in outer.slots for v in d.values())  # the momentum did move


class SwitchAtEpochEnd(ld.callbacks.Callback):
    """Turns local SGD (H=1, outer SGD(1): the mirrored step) on after epoch 0, off after 1."""

    def __init__(self, strategy):
        self.strategy = strategy

    def on_epoch_end(self, epoch, logs=None):
        if epoch == 0:
            self.strategy.set_local_sgd(1, ld.optimizers.SGD(1.0))
        elif epoch == 1:
            self.strategy.set_local_sgd(None)


def test_switching_mid_fit_from_a_callback_neither_loses_nor_repeats_steps(local2):
    x, y = data(6)
    plain = linear_model(local2, ld.optimizers.SGD(0.05))
    plain.fit(x, y, batch_size=BATCH, epochs=3, shuffle=False, verbose=0)
    switched = linear_model(local2, ld.optimizers.SGD(0.05))
    before = local2.communication_stats()[0]
    switched.fit(x, y, batch_size=BATCH, epochs=3, shuffle=False, verbose=0,
                 callbacks=[SwitchAtEpochEnd(local2)])
    after = local2.communication_stats()[0]
    assert after["inner_steps"] - before["inner_steps"] == 6  # epoch 1: 6 local steps
    assert after["synced_steps"] - before["synced_steps"] == 12  # epochs 0 and 2
    for a, b in zip(plain.get_weights(), switched.get_weights(), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)
