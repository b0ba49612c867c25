"""What tf.distribute and Keras users expect beyond the basics, with their names and rules:
`distribute_datasets_from_function`, `Strategy.gather` / `ReplicaContext.all_gather`,
ModelCheckpoint / EarlyStopping / LearningRateScheduler, and `model.save` / `load_model` /
`save_weights` / `load_weights` (no pickle, checked before anything is assigned). Replica
features run on real worker processes; the rest on the default strategy."""

from __future__ import annotations

import json
import os
import zipfile

import numpy as np
import pytest

import labdist as ld
from labdist.training.checkpoint_files import CheckpointError


def data(n=96, features=8, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, features)).astype(np.float32), rng.integers(0, classes, n))


def small_model(strategy=None, optimizer=None, units=6):
    strategy = strategy or ld.get_strategy()
    with strategy.scope():
        model = ld.models.Sequential([
            ld.layers.Dense(units, activation="relu", input_shape=(8,)),
            ld.layers.Dropout(0.1),
            ld.layers.Dense(3, activation="softmax")], seed=3)
        model.compile(loss="sparse_categorical_crossentropy",
                      optimizer=optimizer or ld.optimizers.SGD(0.1, momentum=0.5),
                      metrics=["accuracy"])
    return model


# -- distribute_datasets_from_function ---------------------------------------------------------
@pytest.mark.timeout(120)
def test_datasets_from_function_give_each_replica_its_pipeline(mirrored2):
    contexts = []

    def dataset_fn(ctx: ld.InputContext):
        contexts.append(ctx)
        per_replica = ctx.get_per_replica_batch_size(8)
        start = 100 * ctx.input_pipeline_id
        return [(np.arange(start + 10 * i, start + 10 * i + per_replica), i) for i in range(3)]

    per_replica = ld.InputOptions(experimental_replication_mode="PER_REPLICA")
    dist = mirrored2.distribute_datasets_from_function(dataset_fn, options=per_replica)
    assert [(c.num_input_pipelines, c.input_pipeline_id, c.num_replicas_in_sync)
            for c in contexts] == [(2, 0, 2), (2, 1, 2)]

    def step(batch, i):
        ctx = ld.get_replica_context()
        return ctx.replica_id_in_sync_group, batch.sum(), i

    sums = []
    for batch, i in dist:
        assert isinstance(batch, ld.PerReplica) and batch[0].shape == (4,)
        ranks, total, steps = (mirrored2.experimental_local_results(v)
                               for v in mirrored2.run(step, args=(batch, i)))
        assert ranks == (0, 1) and {int(s) for s in steps} == {int(i[0])} == {int(i[1])}
        sums.append(tuple(int(t) for t in total))
    assert sums == [(6, 406), (46, 446), (86, 486)]  # replica r reads pipeline r, in order
    assert len(list(dist)) == 3  # re-iterable


@pytest.mark.timeout(120)
def test_datasets_from_function_pad_uneven_pipelines_and_refuse_bad_arguments(mirrored2):
    per_replica = ld.InputOptions(experimental_replication_mode="PER_REPLICA")
    uneven = mirrored2.distribute_datasets_from_function(
        lambda ctx: [np.zeros(2)] * (2 + ctx.input_pipeline_id), options=per_replica)
    assert [[len(c) for c in step] for step in uneven] == [[2, 2], [2, 2], [0, 2]]
    shapes = mirrored2.distribute_datasets_from_function(
        lambda ctx: [(np.zeros(2), 1)] if ctx.input_pipeline_id else [np.zeros(2)],
        options=per_replica)
    with pytest.raises(ValueError, match="different structures"):
        list(shapes)
    with pytest.raises(TypeError, match="dataset_fn=3 is not callable"):
        mirrored2.distribute_datasets_from_function(3)
    with pytest.raises(TypeError, match="returned None for input_pipeline_id=0"):
        mirrored2.distribute_datasets_from_function(lambda ctx: None)
    with pytest.raises(TypeError, match="options=.*must be None or an ld.InputOptions"):
        mirrored2.distribute_datasets_from_function(lambda ctx: [], options={"x": 1})
    with pytest.raises(ValueError, match="global_batch_size=9 is not divisible by "
                                         "num_replicas_in_sync=2"):
        ld.InputContext(2, 0, 2).get_per_replica_batch_size(9)


def test_datasets_from_function_on_the_default_strategy_is_the_dataset():
    dist = ld.get_strategy().distribute_datasets_from_function(lambda ctx: [np.ones(3)] * 2)
    assert [b.tolist() for b in dist] == [[1, 1, 1]] * 2


# -- gather / all_gather --------------------------------------------------------------------------
def _rows(rank_plus):
    ctx = ld.get_replica_context()
    r = ctx.replica_id_in_sync_group
    return np.full((r + rank_plus, 2), r, dtype=np.float32)


@pytest.mark.timeout(120)
def test_gather_concatenates_replicas_along_an_axis(mirrored2):
    value = mirrored2.run(_rows, args=(1,))  # replica 0: (1, 2), replica 1: (2, 2)
    gathered = mirrored2.gather(value, axis=0)
    np.testing.assert_array_equal(gathered, [[0, 0], [1, 1], [1, 1]])
    nested = mirrored2.gather({"a": value, "b": 7}, axis=0)
    assert nested["b"] == 7 and nested["a"].shape == (3, 2)
    with pytest.raises(ValueError, match=r"replica 1's value has shape \(2, 2\), replica 0's "
                                         r"\(1, 2\); they must match except along axis=1"):
        mirrored2.gather(value, axis=1)
    with pytest.raises(ValueError, match=r"axis=2 is out of range .* allowed: 0..1"):
        mirrored2.gather(value, axis=2)
    with pytest.raises(TypeError, match="axis='0' is not allowed; use an integer"):
        mirrored2.gather(value, axis="0")
    scalars = mirrored2.run(lambda: 1.5)
    with pytest.raises(ValueError, match="scalars .rank 0.*rank >= 1"):
        mirrored2.gather(scalars, axis=0)
    with mirrored2.scope():
        v = ld.Variable(np.arange(3.0))
    np.testing.assert_array_equal(mirrored2.gather(v, axis=0), [0, 1, 2, 0, 1, 2])


@pytest.mark.timeout(120)
def test_all_gather_inside_a_step_gives_every_replica_the_whole(mirrored2):
    def step():
        ctx = ld.get_replica_context()
        mine = _rows(2)  # replica 0: (2, 2) of 0, replica 1: (3, 2) of 1
        return ctx.all_gather({"rows": mine, "cols": mine[:2].T}, axis=0)

    out = mirrored2.experimental_local_results(mirrored2.run(step))
    for replica in out:  # the same on both replicas
        np.testing.assert_array_equal(replica["rows"][:, 0], [0, 0, 1, 1, 1])
        assert replica["cols"].shape == (4, 2)

    default = ld.get_strategy()  # runs steps in this process, where the strategy is at hand
    with pytest.raises(RuntimeError,
                       match="gather requires being in cross-replica context.*all_gather"):
        default.run(lambda: default.gather(np.zeros(2), axis=0))
    np.testing.assert_array_equal(default.run(step)["rows"], np.zeros((2, 2)))


# -- callbacks ------------------------------------------------------------------------------------
class Script(ld.callbacks.Callback):
    """Puts scripted values of "score" into the logs, and records the weights each epoch."""

    def __init__(self, scores):
        self.scores = scores
        self.weights = []

    def on_epoch_end(self, epoch, logs=None):
        logs["score"] = self.scores[epoch]
        self.weights.append(self.model.get_weights())


def test_early_stopping_stops_fit_and_restores_the_best_weights():
    x, y = data()
    model = small_model()
    script = Script([3.0, 1.0, 2.0, 1.5, 0.5, 0.1])
    stop = ld.callbacks.EarlyStopping(monitor="score", patience=2, restore_best_weights=True)
    history = model.fit(x, y, epochs=6, verbose=0, callbacks=[script, stop])
    assert history.epoch == [0, 1, 2, 3]  # best at epoch 1, no better in 2 and 3: stop
    assert (stop.stopped_epoch, stop.best_epoch, stop.best) == (3, 1, 1.0)
    assert model.stop_training
    for a, b in zip(model.get_weights(), script.weights[1], strict=True):
        np.testing.assert_array_equal(a, b)
    assert history.history["score"] == [3.0, 1.0, 2.0, 1.5]
    model.fit(x, y, epochs=1, verbose=0)  # the flag is reset by the next fit
    assert not model.stop_training


def test_early_stopping_min_delta_mode_and_baseline():
    x, y = data()
    model = small_model()
    # max mode ("acc" in the name), improvements below min_delta do not count
    stop = ld.callbacks.EarlyStopping(monitor="val_acc_like", min_delta=0.1, patience=1)
    assert stop.monitor_op is np.greater
    script = Script([0.5, 0.55, 0.58, 0.9])
    script_key = Script([0.5, 0.55, 0.58, 0.9])
    script_key.on_epoch_end = lambda epoch, logs: logs.update(val_acc_like=script.scores[epoch])
    history = model.fit(x, y, epochs=4, verbose=0, callbacks=[script_key, stop])
    assert history.epoch == [0, 1]
    # a baseline not reached: patience runs out even though the value improves
    # a baseline not beaten: improving epochs do not reset the wait (Keras' rule), so the
    # first epoch without improvement stops at once
    scores = [3.0, 2.0, 2.5, 2.4, 2.3]
    base = ld.callbacks.EarlyStopping(monitor="score", patience=2, baseline=0.0, mode="min")
    history = model.fit(x, y, epochs=5, verbose=0, callbacks=[Script(scores), base])
    assert history.epoch == [0, 1, 2]
    plain = ld.callbacks.EarlyStopping(monitor="score", patience=2, mode="min")
    history = model.fit(x, y, epochs=5, verbose=0, callbacks=[Script(scores), plain])
    assert history.epoch == [0, 1, 2, 3]
    with pytest.warns(RuntimeWarning, match="'nope', which is not logged"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[ld.callbacks.EarlyStopping("nope")])
    with pytest.raises(ValueError, match="mode='up' is not allowed"):
        ld.callbacks.EarlyStopping(mode="up")
    with pytest.raises(ValueError, match="patience=-1"):
        ld.callbacks.EarlyStopping(patience=-1)


def test_model_checkpoint_formats_paths_and_saves_only_the_best(tmp_path):
    x, y = data()
    model = small_model()
    every = ld.callbacks.ModelCheckpoint(tmp_path / "all" / "w-{epoch:02d}-{score:.1f}.npz",
                                         save_weights_only=True, monitor="score")
    best = ld.callbacks.ModelCheckpoint(str(tmp_path / "best-{epoch}"), monitor="score",
                                        save_best_only=True)
    script = Script([3.0, 1.0, 2.0, 0.5])
    model.fit(x, y, epochs=4, verbose=0, callbacks=[script, every, best])
    assert sorted(os.listdir(tmp_path / "all")) == [
        "w-01-3.0.npz", "w-02-1.0.npz", "w-03-2.0.npz", "w-04-0.5.npz"]
    assert sorted(p for p in os.listdir(tmp_path) if p.startswith("best")) == [
        "best-1", "best-2", "best-4"]  # epoch 3 did not improve
    assert best.best == 0.5
    again = small_model(units=6)
    again.load_weights(tmp_path / "all" / "w-03-2.0.npz")
    for a, b in zip(again.get_weights(), script.weights[2], strict=True):
        np.testing.assert_array_equal(a, b)
    loaded = ld.models.load_model(tmp_path / "best-2")
    for a, b in zip(loaded.get_weights(), script.weights[1], strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(KeyError, match="could not format filepath"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[
            ld.callbacks.ModelCheckpoint(str(tmp_path / "{missing}.npz"),
                                         save_weights_only=True)])
    with pytest.warns(RuntimeWarning, match="can save best model only with 'val_loss'"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[
            ld.callbacks.ModelCheckpoint(str(tmp_path / "x"), save_best_only=True)])
    with pytest.raises(ValueError, match="ending in .npz"):
        ld.callbacks.ModelCheckpoint(str(tmp_path / "w.h5"), save_weights_only=True)


def _fit_epoch_by_epoch(model, x, y, rates):
    for epoch, rate in enumerate(rates):
        model.optimizer.learning_rate = rate
        model.fit(x, y, batch_size=16, epochs=epoch + 1, initial_epoch=epoch, verbose=0,
                  shuffle=False)


@pytest.mark.timeout(180)
def test_a_fit_with_callbacks_on_two_replicas(mirrored2, tmp_path):
    """LearningRateScheduler's rates reach the replicas: training with a schedule equals
    setting the same rates by hand between epochs; EarlyStopping and ModelCheckpoint work
    through real workers."""
    x, y = data(seed=1)
    scheduled = small_model(mirrored2)
    schedule = ld.callbacks.LearningRateScheduler(lambda epoch, lr: 0.3 / (epoch + 1))
    checkpoint = ld.callbacks.ModelCheckpoint(tmp_path / "w-{epoch}.npz",
                                              save_weights_only=True, monitor="loss")
    history = scheduled.fit(x, y, batch_size=16, epochs=3, verbose=0, shuffle=False,
                            callbacks=[schedule, checkpoint])
    assert history.history["learning_rate"] == pytest.approx([0.3, 0.15, 0.1])
    by_hand = small_model(mirrored2)
    _fit_epoch_by_epoch(by_hand, x, y, [0.3 / (epoch + 1) for epoch in range(3)])
    constant = small_model(mirrored2)
    _fit_epoch_by_epoch(constant, x, y, [0.3, 0.3, 0.3])
    for a, b in zip(scheduled.get_weights(), by_hand.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    for copy in mirrored2.experimental_local_results(scheduled.weights[0]):
        np.testing.assert_array_equal(copy, scheduled.get_weights()[0])
    assert not np.allclose(scheduled.get_weights()[0], constant.get_weights()[0])
    restored = small_model(mirrored2)
    restored.load_weights(tmp_path / "w-3.npz")
    for a, b in zip(restored.get_weights(), scheduled.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    stop = ld.callbacks.EarlyStopping(monitor="loss", min_delta=100.0, patience=1)
    assert scheduled.fit(x, y, epochs=5, verbose=0, callbacks=[stop]).epoch == [0, 1]


def test_learning_rate_scheduler_takes_keras_schedules_and_checks_them():
    x, y = data()
    model = small_model(optimizer=ld.optimizers.Adam(0.01))
    seen = []
    one_arg = ld.callbacks.LearningRateScheduler(lambda epoch: seen.append(epoch) or 0.001)
    model.fit(x, y, epochs=2, verbose=0, callbacks=[one_arg])
    assert seen == [0, 1] and model.optimizer.learning_rate == 0.001
    for bad in (0.0, -1.0, float("nan"), "0.1", None):
        with pytest.raises(ValueError, match=r"schedule returned .* for epoch 0"):
            model.fit(x, y, epochs=1, verbose=0,
                      callbacks=[ld.callbacks.LearningRateScheduler(lambda e, lr, b=bad: b)])
    with pytest.raises(TypeError, match="schedule=3"):
        ld.callbacks.LearningRateScheduler(3)


# -- save / load ----------------------------------------------------------------------------------
def test_save_and_load_model_round_trip_without_pickle(tmp_path):
    x, y = data()
    model = small_model(optimizer=ld.optimizers.Adam(0.02, beta_1=0.8))
    model.fit(x, y, epochs=2, verbose=0)
    path = model.save(tmp_path / "model")
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert [layer["class_name"] for layer in config["layers"]] == ["Dense", "Dropout", "Dense"]
    with zipfile.ZipFile(tmp_path / "model" / "weights.npz") as zf:  # numbers, no pickle
        assert sorted(zf.namelist()) == ["meta/format.npy", "weight/dense_0/bias.npy",
                                         "weight/dense_0/kernel.npy", "weight/dense_2/bias.npy",
                                         "weight/dense_2/kernel.npy"]
    np.load(tmp_path / "model" / "weights.npz", allow_pickle=False)
    loaded = ld.models.load_model(path)
    for a, b in zip(loaded.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
    assert loaded.optimizer.hyperparameters() == model.optimizer.hyperparameters()
    assert type(loaded.optimizer) is type(model.optimizer)
    # the step count is training state, not configuration: 2 epochs of 3 steps, and none yet
    assert int(model.optimizer.iterations.numpy()) == 6 and loaded.optimizer.iterations is None
    assert loaded.evaluate(x, y, verbose=0) == model.evaluate(x, y, verbose=0)
    assert loaded.name == model.name and loaded.seed == model.seed
    loaded.fit(x, y, epochs=1, verbose=0)  # compiled: it trains on
    bare = ld.models.load_model(path, compile=False)
    assert bare.optimizer is None


@pytest.mark.timeout(120)
def test_a_model_saved_on_one_replica_loads_on_two(tmp_path, mirrored2):
    x, y = data()
    model = small_model()
    model.fit(x, y, epochs=1, verbose=0)
    model.save(tmp_path / "m")
    with mirrored2.scope():
        loaded = ld.models.load_model(tmp_path / "m")
    for copy in mirrored2.experimental_local_results(loaded.weights[0]):
        np.testing.assert_array_equal(copy, model.get_weights()[0])


def test_loading_refuses_unknown_layers_and_mismatched_weights(tmp_path):
    model = small_model()
    model.save(tmp_path / "m")
    config_path = tmp_path / "m" / "config.json"
    config = json.loads(config_path.read_text())
    config["layers"][1] = {"class_name": "os.system", "config": {"command": "true"}}
    config_path.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"layer 1 has class_name='os.system', which "
                                              r"labdist does not know; allowed: Dense, Dropout"):
        ld.models.load_model(tmp_path / "m")
    config_path.write_text("{not json")
    with pytest.raises(CheckpointError, match="is not JSON"):
        ld.models.load_model(tmp_path / "m")
    with pytest.raises(FileNotFoundError, match="no saved model"):
        ld.models.load_model(tmp_path / "nowhere")

    model.save_weights(tmp_path / "w.npz")
    wider = small_model(units=7)
    before = wider.get_weights()
    with pytest.raises(CheckpointError, match=r"dense_0/kernel has shape \(8, 6\), the model "
                                              r"has \(8, 7\)"):
        wider.load_weights(tmp_path / "w.npz")
    for a, b in zip(wider.get_weights(), before, strict=True):  # nothing assigned
        np.testing.assert_array_equal(a, b)
    arrays = dict(np.load(tmp_path / "w.npz"))
    arrays["weight/dense_2/bias"] = arrays["weight/dense_2/bias"].astype(np.float64)
    np.savez(tmp_path / "f64.npz", **arrays)
    with pytest.raises(CheckpointError, match="float64, which does not restore into the "
                                              "model's float32"):
        model.load_weights(tmp_path / "f64.npz")
    del arrays["weight/dense_2/bias"]
    np.savez(tmp_path / "short.npz", **arrays)
    with pytest.raises(CheckpointError, match=r"missing \['weight/dense_2/bias'\]"):
        model.load_weights(tmp_path / "short.npz")
    with pytest.raises(ValueError, match="ending in .npz"):
        model.save_weights(tmp_path / "w.h5")


@pytest.mark.timeout(300)
def test_a_learning_rate_schedule_reaches_parameter_servers():
    """On parameter servers the optimizer runs on the PSs: a changed rate is bound again."""
    from distributed import Client

    from labdist.cluster import start_local_cluster

    x, y = data(seed=2)
    cluster = start_local_cluster(3)
    client = Client(cluster, direct_to_workers=True, set_as_default=False)
    try:
        weights = []
        for how in ("schedule", "by hand", "constant"):
            with ld.ParameterServerStrategy(client, num_workers=2, mode="sync") as strategy:
                model = small_model(strategy, ld.optimizers.SGD(0.3))
                if how == "schedule":
                    schedule = ld.callbacks.LearningRateScheduler(lambda e: 0.3 / (e + 1))
                    model.fit(x, y, batch_size=16, epochs=3, verbose=0, shuffle=False,
                              callbacks=[schedule])
                else:
                    rates = [0.3 / (e + 1) if how == "by hand" else 0.3 for e in range(3)]
                    _fit_epoch_by_epoch(model, x, y, rates)
                weights.append(model.get_weights())
    finally:
        client.close()
        cluster.close()
    scheduled, by_hand, constant = weights
    for a, b in zip(scheduled, by_hand, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert not np.allclose(scheduled[0], constant[0])
