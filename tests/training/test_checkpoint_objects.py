"""`ld.train.Checkpoint(**objects)`, TensorFlow's object checkpoint: a custom loop's model,
lazily built optimizer (its slots and step count) and bare variables saved with TF's prefix
numbering and restored into new objects; ON_READ variables across replica counts (measured
in TF 2.21: copies summing to 28, restored on 3 replicas, hold 9.33 each and read 28; an int64
one holds 9 each and reads 27; MEAN and ONLY_FIRST_REPLICA copies each take the value);
restores into objects not built yet applied at their build, by a custom loop's lazy build or
by `fit` (TF's deferred restoration); fit's slots are the optimizer's (`optimizer.variables`);
refusals that name what is wrong and change nothing."""

from __future__ import annotations

import numpy as np
import pytest

import labdist as ld

X = np.random.default_rng(0).normal(size=(8, 5)).astype(np.float32)
Y = np.random.default_rng(1).integers(0, 2, 8)


def _model(**kwargs):
    return ld.Sequential([ld.layers.Dense(4, activation="relu", **kwargs), ld.layers.Dense(2)],
                         seed=3)


def _train(strategy, model, optimizer, steps: int = 3) -> None:
    """A TF custom loop: `optimizer.apply_gradients` inside `strategy.run`, one batch a step."""
    loss_object = ld.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def step(xb, yb):
        with ld.GradientTape() as tape:
            loss = ld.nn.compute_average_loss(loss_object(yb, model(xb, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    dataset = ld.data.Dataset.from_tensor_slices((X, Y)).batch(8)
    for _ in range(steps):
        for xb, yb in strategy.experimental_distribute_dataset(dataset):
            strategy.run(step, args=(xb, yb))


def _slots(strategy, optimizer) -> dict[str, list[np.ndarray]]:
    """Every replica's copy of every slot, by slot name."""
    return {v.name: [c.copy() for c in strategy.experimental_local_results(v)]
            for v in optimizer.variables[1:]}


def _assert_same_slots(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for name, copies in got.items():
        assert len(copies) == len(want[name])
        for copy, expected in zip(copies, want[name], strict=True):
            np.testing.assert_array_equal(copy, expected, err_msg=name)


def test_a_custom_loops_objects_round_trip_with_tensorflows_numbering(mirrored2, tmp_path):
    with mirrored2.scope():
        model, optimizer = _model(), ld.optimizers.Adam(0.05)
        step = ld.Variable(np.int64(0), name="step", trainable=False)
    _train(mirrored2, model, optimizer)
    step.assign(np.int64(3))
    checkpoint = ld.train.Checkpoint(model=model, optimizer=optimizer, step=step)
    prefix = tmp_path / "ckpts" / "ckpt"
    first = checkpoint.save(prefix)
    assert first == str(tmp_path / "ckpts" / "ckpt-1.npz") and checkpoint.save_counter == 1
    assert ld.train.latest_checkpoint(tmp_path / "ckpts") == first
    with np.load(first) as stored:  # keys named by keyword; slots by their variable's name
        assert "model/weight/dense_0/kernel" in stored and "step" in stored
        assert "optimizer/slot/dense_0/kernel/m" in stored and "optimizer/iterations" in stored
        assert int(stored["optimizer/iterations"]) == 3
    weights, slots = model.get_weights(), _slots(mirrored2, optimizer)
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
    restored.restore(str(prefix) + "-1")  # TF's name for it: the prefix and the count
    for a, b in zip(weights, other.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(other_opt.iterations.numpy()) == 3 and int(other_step.numpy()) == 3
    _assert_same_slots(_slots(mirrored2, other_opt), slots)  # every replica's copy
    assert restored.save_counter == 1
    restored.save(prefix)  # TF's save_counter is restored, so this save is the second again
    assert ld.train.latest_checkpoint(prefix.parent) == second


def test_a_restore_before_the_lazy_build_continues_training_exactly(mirrored2, tmp_path):
    with mirrored2.scope():
        model, optimizer = _model(), ld.optimizers.Adam(0.05)
    _train(mirrored2, model, optimizer, steps=2)
    path = ld.train.Checkpoint(model=model, optimizer=optimizer).write(tmp_path / "c.npz")
    with mirrored2.scope():  # built model, optimizer not built: its part waits
        fresh, fresh_opt = _model(input_shape=(5,)), ld.optimizers.Adam(0.05)
    ld.train.Checkpoint(model=fresh, optimizer=fresh_opt).restore(path)
    assert fresh_opt.iterations is None and fresh_opt.variables == []
    _train(mirrored2, fresh, fresh_opt, steps=1)  # apply_gradients builds it: values arrive
    _train(mirrored2, model, optimizer, steps=1)
    assert int(fresh_opt.iterations.numpy()) == int(optimizer.iterations.numpy()) == 3
    for a, b in zip(model.get_weights(), fresh.get_weights(), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)  # bias correction at step 3
    for name, copies in _slots(mirrored2, optimizer).items():
        np.testing.assert_allclose(_slots(mirrored2, fresh_opt)[name][1], copies[1],
                                   rtol=1e-6, atol=1e-9)


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
    want = {name: copies[0] for name, copies in _slots(mirrored2, optimizer).items()}
    got = {name: copies[0] for name, copies in _slots(ld.get_strategy(), fresh_opt).items()}
    _assert_same_slots({k: [v] for k, v in got.items()}, {k: [v] for k, v in want.items()})


def _fit(model, epochs: int = 1) -> None:
    model.fit(X, Y, batch_size=8, epochs=epochs, verbose=0, shuffle=False)


def _compiled(strategy):
    with strategy.scope():
        model = _model()
        model.compile(loss=ld.losses.SparseCategoricalCrossentropy(from_logits=True),
                      optimizer=ld.optimizers.Adam(0.05))
    return model


def test_fits_slots_are_the_optimizers_and_an_object_checkpoint_resumes_fit(mirrored2,
                                                                             tmp_path):
    model = _compiled(mirrored2)
    _fit(model, epochs=2)
    optimizer = model.optimizer
    fit_slots = [v for layer in model._slots for slots in layer.values()
                 for v in slots.values()]
    assert optimizer.variables[0] is optimizer.iterations
    assert optimizer.variables[1:] == fit_slots and len(fit_slots) == 8
    assert int(optimizer.iterations.numpy()) == 2
    with mirrored2.scope():
        epoch = ld.Variable(np.int64(2), name="epoch", trainable=False)
    path = ld.train.Checkpoint(model=model, optimizer=optimizer, epoch=epoch).write(
        tmp_path / "fit.npz")
    saved_slots = _slots(mirrored2, optimizer)

    fresh = _compiled(mirrored2)  # not built, no slots: both parts wait for fit to make them
    with mirrored2.scope():
        fresh_epoch = ld.Variable(np.int64(0), name="epoch", trainable=False)
    ld.train.Checkpoint(model=fresh, optimizer=fresh.optimizer, epoch=fresh_epoch).restore(path)
    assert int(fresh_epoch.numpy()) == 2 and not fresh.built
    used = _compiled(mirrored2)  # trained 1 step: restored at once; its step count follows
    _fit(used)
    ld.train.Checkpoint(model=used, optimizer=used.optimizer, epoch=fresh_epoch).restore(path)
    assert used._iterations == 2
    _assert_same_slots(_slots(mirrored2, used.optimizer), saved_slots)

    for other in (model, fresh, used):  # one more epoch: the same step 3 everywhere
        _fit(other)
    for other in (fresh, used):
        assert int(other.optimizer.iterations.numpy()) == 3 and other._iterations == 3
        for a, b in zip(model.get_weights(), other.get_weights(), strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)


def test_fit_takes_the_slots_a_custom_loop_made_rather_than_resetting_them(mirrored2):
    model = _compiled(mirrored2)
    _train(mirrored2, model, model.optimizer, steps=2)  # Keras: one optimizer state
    made, before = list(model.optimizer.variables), _slots(mirrored2, model.optimizer)
    model.evaluate(X, Y, batch_size=8, verbose=0)  # makes fit's state: the same variables
    assert model.optimizer.variables == made
    _assert_same_slots(_slots(mirrored2, model.optimizer), before)
    fit_slots = [v for layer in model._slots for slots in layer.values()
                 for v in slots.values()]
    assert fit_slots == made[1:]


def test_on_read_variables_restore_across_replica_counts_as_tensorflow(mirrored2, mirrored3,
                                                                       tmp_path):
    kinds = {"sum": (np.float32, "SUM"), "int_sum": (np.int64, "SUM"),
             "mean": (np.float32, "MEAN"), "first": (np.float32, "ONLY_FIRST_REPLICA")}

    def made(strategy):
        with strategy.scope():
            return {k: ld.Variable(dtype(0), synchronization="ON_READ", aggregation=agg)
                    for k, (dtype, agg) in kinds.items()}

    saved = made(mirrored2)

    def put():
        rank = ld.get_replica_context().replica_id_in_sync_group
        for v in saved.values():
            v.assign(v.dtype.type(10 + 8 * rank))  # copies 10 and 18

    mirrored2.run(put)
    path = ld.train.Checkpoint(**saved).write(tmp_path / "on_read.npz")
    with np.load(path) as stored:  # the cross-replica reads
        assert {k: stored[k].item() for k in kinds} == {"sum": 28, "int_sum": 28, "mean": 14,
                                                       "first": 10}
    again = made(mirrored3)
    ld.train.Checkpoint(**again).restore(path)
    copies = {k: [c.item() for c in mirrored3.experimental_local_results(v)]
              for k, v in again.items()}
    assert copies["sum"] == pytest.approx([28 / 3] * 3)
    assert float(again["sum"].numpy()) == pytest.approx(28)
    assert copies["int_sum"] == [9, 9, 9] and int(again["int_sum"].numpy()) == 27  # TF: 27
    assert copies["mean"] == [14, 14, 14] and copies["first"] == [10, 10, 10]

    with mirrored2.scope():
        no_read = ld.Variable(np.float32(0), synchronization="ON_READ", aggregation="NONE")
    with pytest.raises(ValueError, match=r"cannot read 'total'.*no cross-replica value"):
        ld.train.Checkpoint(total=no_read).write(tmp_path / "never.npz")
    assert not (tmp_path / "never.npz").exists()


def test_refusals_name_what_is_wrong_and_change_nothing(mirrored2, tmp_path):
    with pytest.raises(TypeError, match=r"Checkpoint\(thing=3\): a int cannot be checkpoint"
                                        r"ed; allowed: labdist models"):
        ld.train.Checkpoint(thing=3)
    with pytest.raises(ValueError, match="needs something to save"):
        ld.train.Checkpoint()
    with pytest.raises(RuntimeError, match=r"model=.* has made no variables yet"):
        ld.train.Checkpoint(model=_model()).save(tmp_path / "x")
    assert not (tmp_path / "checkpoint").exists()
    with mirrored2.scope():
        small = ld.Variable(np.zeros(3, np.float32), name="w")
        big = ld.Variable(np.ones(4, np.float32), name="w")
        wide = ld.Variable(np.zeros(3, np.int32), name="w")
        keep = ld.Variable(np.float32(7), name="keep")
        built = _model(input_shape=(5,))
    path = ld.train.Checkpoint(w=small, keep=keep).write(tmp_path / "a.npz")
    keep.assign(np.float32(1))
    with pytest.raises(ld.train.CheckpointError,
                       match=r"w has shape \(3,\), the variable has \(4,\)"):
        ld.train.Checkpoint(keep=keep, w=big).restore(path)
    with pytest.raises(ld.train.CheckpointError, match=r"w is float32, which does not restore"):
        ld.train.Checkpoint(keep=keep, w=wide).restore(path)
    with pytest.raises(ld.train.CheckpointError, match=r"missing \['other'\], unexpected "
                                                       r"\['w'\]"):
        ld.train.Checkpoint(keep=keep, other=small).restore(path)
    assert float(keep.numpy()) == 1 and big.numpy().tolist() == [1, 1, 1, 1]
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        ld.train.Checkpoint(keep=keep).restore(tmp_path / "a-1")

    fit_model = _compiled(mirrored2)  # a compiled model's own checkpoint is another format
    fit_model.build((5,))
    own = ld.train.Checkpoint(model=fit_model).save(tmp_path / "own")
    with pytest.raises(ld.train.CheckpointError, match="a compiled model's own checkpoint"):
        ld.train.Checkpoint(model=built, step=keep).restore(own)

    unbuilt = ld.optimizers.Adam()  # an optimizer with no state yet stores nothing
    nothing = ld.train.Checkpoint(model=built, optimizer=unbuilt).write(tmp_path / "n.npz")
    with np.load(nothing) as stored:
        assert not [k for k in stored if k.startswith("optimizer/")]
    deeper = ld.Sequential([ld.layers.Dense(4), ld.layers.Dense(3), ld.layers.Dense(2)])
    ld.train.Checkpoint(model=deeper, optimizer=ld.optimizers.Adam()).restore(nothing)
    with pytest.raises(ld.train.CheckpointError, match=r"lacks \['weight/dense_2/bias'"):
        deeper.build((5,))  # another model's weights, applied at build: refused


def test_latest_checkpoint_is_none_without_an_index(tmp_path):
    assert ld.train.latest_checkpoint(tmp_path / "nothing-here") is None
    assert ld.train.latest_checkpoint(tmp_path) is None
