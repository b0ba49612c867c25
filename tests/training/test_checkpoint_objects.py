"""`ld.train.Checkpoint(**objects)`, TensorFlow's object checkpoint: a custom loop's model,
lazily built optimizer (its slots and step count) and bare variables saved with TF's prefix
numbering and restored into new objects; an ON_READ/SUM variable across replica counts (TF
2.21: copies summing to 28, restored on 3 replicas, hold 9.33 each and read 28); restores
into objects not built yet applied at their build (TF's deferred restoration); refusals
that change nothing."""

from __future__ import annotations

import numpy as np
import pytest

import labdist as ld


def _model():
    return ld.Sequential([ld.layers.Dense(4, activation="relu"), ld.layers.Dense(2)], seed=3)


def _train(strategy, model, optimizer, steps: int = 3) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 5)).astype(np.float32)
    y = rng.integers(0, 2, 8)
    loss_object = ld.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def step(xb, yb):
        with ld.GradientTape() as tape:
            loss = ld.nn.compute_average_loss(loss_object(yb, model(xb, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    dataset = ld.data.Dataset.from_tensor_slices((x, y)).batch(8)
    for _ in range(steps):
        for xb, yb in strategy.experimental_distribute_dataset(dataset):
            strategy.run(step, args=(xb, yb))


def test_a_custom_loops_objects_round_trip_with_tensorflows_numbering(mirrored2, tmp_path):
    with mirrored2.scope():
        model, optimizer = _model(), ld.optimizers.Adam(0.05)
        step = ld.Variable(np.int64(0), name="step", trainable=False)
    _train(mirrored2, model, optimizer)
    step.assign(np.int64(3))
    checkpoint = ld.train.Checkpoint(model=model, optimizer=optimizer, step=step)
    prefix = tmp_path / "ckpts" / "ckpt"
    first = checkpoint.save(prefix)
    assert first.endswith("ckpt-1.npz") and checkpoint.save_counter == 1
    assert ld.train.latest_checkpoint(tmp_path / "ckpts") == first
    weights = model.get_weights()
    slots = {v.name: mirrored2.experimental_local_results(v)[0].copy()
             for v in optimizer.variables[1:]}
    assert len(slots) == 8 and int(optimizer.iterations.numpy()) == 3
    _train(mirrored2, model, optimizer)  # moves everything on, then a second save
    second = checkpoint.save(prefix)
    assert second.endswith("ckpt-2.npz") and ld.train.latest_checkpoint(prefix.parent) == second

    with mirrored2.scope():  # new objects, built, then restored from the first save
        other, other_opt = _model(), ld.optimizers.Adam(0.05)
        other.build((5,))
        other_opt.build(other.trainable_variables)
        other_step = ld.Variable(np.int64(0), name="step", trainable=False)
    restored = ld.train.Checkpoint(model=other, optimizer=other_opt, step=other_step)
    restored.restore(first)
    for a, b in zip(weights, other.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(other_opt.iterations.numpy()) == 3 and int(other_step.numpy()) == 3
    for v in other_opt.variables[1:]:
        for copy in mirrored2.experimental_local_results(v):  # every replica's slot
            np.testing.assert_array_equal(copy, slots[v.name])
    assert restored.save_counter == 1


def test_an_on_read_sum_variable_restores_across_replica_counts(mirrored2, mirrored3,
                                                                tmp_path):
    with mirrored2.scope():
        total = ld.Variable(np.float32(0), synchronization="ON_READ", aggregation="SUM")

    def add():
        rank = ld.get_replica_context().replica_id_in_sync_group
        total.assign_add(np.float32(10 + 8 * rank))  # copies 10 and 18: the sum reads 28

    mirrored2.run(add)
    assert float(total.numpy()) == 28
    path = ld.train.Checkpoint(total=total).write(tmp_path / "total.npz")
    with mirrored3.scope():
        again = ld.Variable(np.float32(0), synchronization="ON_READ", aggregation="SUM")
    ld.train.Checkpoint(total=again).restore(path)
    copies = [float(c) for c in mirrored3.experimental_local_results(again)]
    assert copies == pytest.approx([28 / 3] * 3) and float(again.numpy()) == pytest.approx(28)


def test_objects_not_built_yet_take_their_values_when_they_are(mirrored2, tmp_path):
    with mirrored2.scope():
        model, optimizer = _model(), ld.optimizers.Adam(0.05)
    _train(mirrored2, model, optimizer, steps=2)
    path = ld.train.Checkpoint(model=model, optimizer=optimizer).save(tmp_path / "ck")

    fresh, fresh_opt = _model(), ld.optimizers.Adam(0.05)  # no strategy: one host replica
    ld.train.Checkpoint(model=fresh, optimizer=fresh_opt).restore(path)
    assert not fresh.built and fresh_opt.iterations is None
    out = fresh(np.ones((3, 5), np.float32))  # the first call builds: the weights arrive
    for a, b in zip(model.get_weights(), fresh.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(out, model(np.ones((3, 5), np.float32)), rtol=1e-6)
    fresh_opt.build(fresh.trainable_variables)
    assert int(fresh_opt.iterations.numpy()) == 2


def test_refusals_name_the_object_and_change_nothing(mirrored2, tmp_path):
    with pytest.raises(TypeError, match=r"Checkpoint\(thing=3\)"):
        ld.train.Checkpoint(thing=3)
    with pytest.raises(ValueError, match="needs something to save"):
        ld.train.Checkpoint()
    with pytest.raises(RuntimeError, match="has made no variables yet"):
        ld.train.Checkpoint(model=_model()).save(tmp_path / "x")
    with mirrored2.scope():
        small = ld.Variable(np.zeros(3, np.float32), name="w")
        big = ld.Variable(np.ones(4, np.float32), name="w")
        keep = ld.Variable(np.float32(7), name="keep")
    path = ld.train.Checkpoint(w=small, keep=keep).write(tmp_path / "a.npz")
    keep.assign(np.float32(1))
    with pytest.raises(ld.train.CheckpointError, match=r"w has shape \(3,\)"):
        ld.train.Checkpoint(w=big, keep=keep).restore(path)
    assert float(keep.numpy()) == 1 and big.numpy().tolist() == [1, 1, 1, 1]
    assert ld.train.latest_checkpoint(tmp_path / "nothing-here") is None
