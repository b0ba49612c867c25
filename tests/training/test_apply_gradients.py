"""`optimizer.apply_gradients` in a custom loop: TensorFlow's semantics (the gradients are
summed over the replicas, once), every replica's copy updated alike, optimizer state kept in
slot variables made by `build`, and clear errors that change nothing."""

from __future__ import annotations

import numpy as np
import pytest

import labdist as ld


def per_replica(strategy, fn):
    return [np.asarray(a) for a in strategy.experimental_local_results(strategy.run(fn))]


def test_sgd_sums_the_replicas_gradients_as_tensorflow_does(strategy):
    """TF 2.21, MirroredStrategy on 2 CPUs, SGD(1.0), gradients 1 and 2: the variable moves by
    -3 (the sum). Here with n replicas: -(1 + ... + n), on every copy."""
    n = strategy.num_replicas_in_sync
    with strategy.scope():
        v = ld.Variable(np.zeros(3, np.float32), aggregation="MEAN")
    opt = ld.optimizers.SGD(1.0)

    def step():
        rank = ld.get_replica_context().replica_id_in_sync_group
        opt.apply_gradients([(np.full(3, rank + 1, np.float32), v)])
        return v.read_value()

    copies = per_replica(strategy, step)
    expected = np.full(3, -n * (n + 1) / 2, np.float32)
    for c in copies:
        np.testing.assert_array_equal(c, expected)
    np.testing.assert_array_equal(v.numpy(), expected)


@pytest.mark.parametrize("optimizer", ["sgd-momentum", "adagrad", "adam"])
def test_stateful_optimizers_match_a_numpy_reference(mirrored2, optimizer):
    """Three steps of each optimizer on a variable large enough that the sum is reduce-
    scattered (each replica updates its own segment, slots included, then they are made
    whole): equal to the same optimizer applied in numpy to the summed gradients."""
    make = {"sgd-momentum": lambda: ld.optimizers.SGD(0.1, momentum=0.9),
            "adagrad": lambda: ld.optimizers.Adagrad(0.1),
            "adam": lambda: ld.optimizers.Adam(0.01)}[optimizer]
    rng = np.random.default_rng(1)
    start = [rng.standard_normal((300, 700)).astype(np.float32),
             rng.standard_normal(700).astype(np.float32)]
    grads = [[rng.standard_normal(a.shape).astype(np.float32) for a in start] for _ in range(2)]
    with mirrored2.scope():
        variables = [ld.Variable(a, aggregation="MEAN", name=f"w{i}")
                     for i, a in enumerate(start)]
        opt = make()
        opt.build(variables)

    def step(k):
        rank = ld.get_replica_context().replica_id_in_sync_group
        opt.apply_gradients(zip([g * (k + 1) for g in grads[rank]], variables, strict=True))

    for k in range(3):
        mirrored2.run(step, args=(k,))

    ref, params = make(), [a.copy() for a in start]
    slots = [ref.slots(p) for p in params]
    for k in range(3):
        for p, s, g0, g1 in zip(params, slots, grads[0], grads[1], strict=True):
            ref.apply(np, p, (g0 + g1) * (k + 1), s, k + 1)
    for v, p in zip(variables, params, strict=True):
        for c in per_replica(mirrored2, v.read_value):
            np.testing.assert_allclose(c, p, rtol=2e-5, atol=2e-6)
    assert int(opt.iterations.numpy()) == 3


def test_a_custom_loop_trains_as_fit_does(mirrored2):
    """The README's custom loop with apply_gradients and fit, same data, same start, SGD:
    the same weights after an epoch (the loss scaled by the global batch, as in TF)."""
    from labdist.training import layers, losses

    rng = np.random.default_rng(0)
    x = rng.random((256, 20), dtype=np.float32)
    y = rng.integers(0, 4, 256)
    with mirrored2.scope():
        model = ld.models.Sequential([ld.layers.Dense(16, activation="relu", input_shape=(20,)),
                                      ld.layers.Dense(4, activation="softmax")])
        model.compile(loss="sparse_categorical_crossentropy", optimizer=ld.optimizers.SGD(0.5))
        start = [w.numpy() for w in model.weights]
        mine = [ld.Variable(a, aggregation="MEAN") for a in start]
    opt = ld.optimizers.SGD(0.5)
    net = [layers.Dense(16, activation="relu"), layers.Dense(4, activation="softmax")]
    global_batch = 64

    def train_step(bx, by):
        xp = ld.get_replica_context().xp
        k0, b0, k1, b1 = (v.read_value() for v in mine)
        h, c0 = net[0].forward(xp, {"kernel": k0, "bias": b0}, bx)
        p, c1 = net[1].forward(xp, {"kernel": k1, "bias": b1}, h)
        dz = losses.fused_softmax_grad(xp, by, p) * (len(bx) / global_batch)
        dh, g1 = net[1].backward_linear(xp, {"kernel": k1, "bias": b1}, c1[0], dz)
        _, g0 = net[0].backward(xp, {"kernel": k0, "bias": b0}, c0, dh, input_grad=False)
        opt.apply_gradients(zip([g0["kernel"], g0["bias"], g1["kernel"], g1["bias"]], mine,
                                strict=True))

    for bx, by in mirrored2.experimental_distribute_dataset(ld.batches((x, y), global_batch)):
        mirrored2.run(train_step, args=(bx, by))
    model.fit(x, y, batch_size=global_batch, shuffle=False, verbose=0)
    for v, w in zip(mine, model.weights, strict=True):
        np.testing.assert_allclose(v.numpy(), w.numpy(), rtol=1e-4, atol=1e-6)
    assert not np.allclose(mine[0].numpy(), start[0])  # it trained


def test_none_gradients_are_skipped_and_bad_input_changes_nothing(mirrored2):
    with mirrored2.scope():
        a = ld.Variable(np.ones(2, np.float32), name="a")
        b = ld.Variable(np.ones(2, np.float32), name="b")
        r = ld.Variable(np.ones(2, np.float32), name="r", synchronization="NONE")
    sgd = ld.optimizers.SGD(1.0)  # (an optimizer not built yet is built by the step:
    # tests/training/test_gradient_tape.py)

    mirrored2.run(lambda: sgd.apply_gradients([(None, a), (np.ones(2, np.float32), b)]))
    np.testing.assert_array_equal(a.numpy(), [1, 1])
    np.testing.assert_array_equal(b.numpy(), [-1, -1])  # 1 - (1 + 1)

    cases = [
        (lambda: sgd.apply_gradients([(np.ones(2, np.float32), a),
                                      (np.ones(3, np.float32), b)]), ValueError,
         r"gradient of 'b' has shape \(3,\).*\(2,\)"),
        (lambda: sgd.apply_gradients([(np.ones(2, np.float32), r)]), ValueError,
         r"'r' is synchronization NONE"),
        (lambda: sgd.apply_gradients([(None, a)]), ValueError, "no gradients provided"),
        (lambda: sgd.apply_gradients([np.ones(3)]), TypeError, r"\(gradient, variable\) pair"),
    ]
    for fn, error, message in cases:
        with pytest.raises(error, match=message):
            mirrored2.run(fn)
    np.testing.assert_array_equal(a.numpy(), [1, 1])
    np.testing.assert_array_equal(b.numpy(), [-1, -1])
    assert mirrored2.run(lambda: 7) is not None  # still usable


def test_outside_a_step_it_says_where_it_runs(mirrored2):
    with mirrored2.scope():
        v = ld.Variable(np.zeros(2, np.float32))
    with pytest.raises(RuntimeError, match="inside strategy.run"):
        ld.optimizers.SGD(0.1).apply_gradients([(np.ones(2, np.float32), v)])
    with pytest.raises(RuntimeError, match="under strategy.scope"):
        mirrored2.run(lambda: ld.optimizers.Adam().build([v]))
    with pytest.raises(TypeError, match="not an ld.Variable"):
        ld.optimizers.Adam().build([np.zeros(2)])


def test_a_custom_loop_runs_k_steps_a_call_on_input_that_lives_on_the_replicas(mirrored2):
    """k steps per dispatch with the iterator on the workers: a distribute_datasets_from_
    function pipeline moves to the replicas with the first call, later calls carry no batch,
    and the weights are those of one strategy.run per step over the same global batches."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(240, 3)).astype(np.float32)
    Y = X @ np.array([1.0, -2.0, 0.5], np.float32)
    weights = []
    for k_steps in (False, True):
        with mirrored2.scope():
            w = ld.Variable(np.zeros(3, np.float32), aggregation="MEAN")
        opt = ld.optimizers.SGD(0.1)

        def train_step(x, y, w=w, opt=opt):
            grad = 2 * x.T @ (x @ w.read_value() - y) / 24
            opt.apply_gradients([(grad, w)])

        if k_steps:  # each replica's batches: its 12 rows of every global batch of 24
            data = mirrored2.distribute_datasets_from_function(
                lambda ctx: ld.batches((X, Y), ctx.get_per_replica_batch_size(24)))
            it = iter(data)
            for _ in range(2):
                mirrored2.run(lambda b: train_step(*b), args=(it,), steps=5)
                assert it.remote_key is not None  # its pipelines live on the replicas
        else:
            for x, y in mirrored2.experimental_distribute_dataset(ld.batches((X, Y), 24)):
                mirrored2.run(train_step, args=(x, y))
        weights.append([np.asarray(c) for c in mirrored2.experimental_local_results(w)])
    assert all(c.tobytes() == weights[0][0].tobytes() for copies in weights for c in copies)


def test_on_read_variables_take_the_summed_step_on_each_copy(mirrored2):
    """TensorFlow 2.21 (MirroredStrategy on 2 CPUs): an ON_READ/SUM variable whose copies
    hold 1 and 2, gradients 10 and 20, SGD(1.0): the copies become -29 and -28 (each takes the
    summed step, keeping its own offset) and the cross-replica read is -57."""
    with mirrored2.scope():
        v = ld.Variable(np.zeros(2, np.float32), synchronization="ON_READ", aggregation="SUM")
    opt = ld.optimizers.SGD(1.0)

    def put():
        rank = ld.get_replica_context().replica_id_in_sync_group
        v.assign(np.full(2, rank + 1, np.float32))

    def step():
        rank = ld.get_replica_context().replica_id_in_sync_group
        opt.apply_gradients([(np.full(2, 10.0 * (rank + 1), np.float32), v)])

    mirrored2.run(put)
    mirrored2.run(step)
    copies = [np.asarray(c) for c in mirrored2.experimental_local_results(v)]
    np.testing.assert_array_equal(copies[0], [-29, -29])
    np.testing.assert_array_equal(copies[1], [-28, -28])
    np.testing.assert_array_equal(v.numpy(), [-57, -57])
