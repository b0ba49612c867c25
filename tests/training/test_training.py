"""Keras-style training under a strategy: the seed program on the digits data, replica-count
equivalence, steps_per_execution, weights, inference — through real worker processes."""

from __future__ import annotations

import numpy as np
import pytest

import labdist as ld


def mlp(strategy, optimizer, dropout=0.0, input_dim=64, seed=0):
    with strategy.scope():
        model = ld.models.Sequential([
            ld.layers.Dense(64, activation="relu", input_shape=(input_dim,)),
            ld.layers.Dropout(dropout),
            ld.layers.Dense(10, activation="softmax")], seed=seed)
        model.compile(loss="sparse_categorical_crossentropy", optimizer=optimizer,
                      metrics=["accuracy"])
    return model


def test_the_seed_program_learns_digits_on_two_replicas(mirrored2, capsys):
    (x, y), (x_val, y_val) = ld.datasets.digits.load_data()
    with mirrored2.scope():
        model = ld.models.Sequential([
            ld.layers.Dense(512, activation="relu", input_shape=(64,)),
            ld.layers.Dropout(0.2),
            ld.layers.Dense(10, activation="softmax")])
        model.compile(loss="sparse_categorical_crossentropy", optimizer=ld.optimizers.Adam(),
                      metrics=["accuracy"])
    history = model.fit(x, y, epochs=8, batch_size=64, validation_data=(x_val, y_val))
    assert history.history["val_accuracy"][-1] >= 0.95
    assert history.history["loss"][-1] < history.history["loss"][0] / 3
    assert set(history.history) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert "Epoch 8/8" in capsys.readouterr().out  # progress shown by default
    loss, accuracy = model.evaluate(x_val, y_val, verbose=0)
    assert accuracy == pytest.approx(history.history["val_accuracy"][-1])
    assert loss == pytest.approx(history.history["val_loss"][-1])
    assert model.predict(x_val[:5], verbose=0).shape == (5, 10)


def test_replica_count_equivalence_with_sgd():
    """Same global batches and SGD: 1, 2 and 3 replicas end with the same weights."""
    from conftest import make_strategy

    rng = np.random.default_rng(0)
    x = rng.normal(size=(50 * 30, 64)).astype(np.float32)
    y = rng.integers(0, 10, len(x))
    weights = []
    for strategy in (ld.OneDeviceStrategy(device="cpu"), make_strategy("mirrored-2"),
                     make_strategy("mirrored-3")):
        model = mlp(strategy, ld.optimizers.SGD(0.05, momentum=0.9))
        model.fit(x, y, batch_size=30, epochs=1, shuffle=False, verbose=0)  # 50 steps
        weights.append(model.get_weights())
    for other in weights[1:]:
        for a, b in zip(weights[0], other, strict=True):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


def test_partitioned_update_matches_one_replica_with_adam():
    """Above 1 MiB of gradients each replica applies Adam to the segment it owns and gathers
    the rest (ZeRO-1 style): weights match one replica's, and after fit every replica holds
    the whole, identical optimizer state (checkpoints and recovery read any replica's)."""
    from conftest import make_strategy

    rng = np.random.default_rng(1)
    x = rng.normal(size=(20 * 32, 256)).astype(np.float32)
    y = rng.integers(0, 10, len(x))
    runs = []
    for strategy in (ld.OneDeviceStrategy(device="cpu"), make_strategy("mirrored-2"),
                     make_strategy("mirrored-3")):
        with strategy.scope():
            model = ld.models.Sequential([
                ld.layers.Dense(1024, activation="relu", input_shape=(256,)),
                ld.layers.Dense(10, activation="softmax")], seed=3)
            model.compile(loss="sparse_categorical_crossentropy",
                          optimizer=ld.optimizers.Adam(1e-3), steps_per_execution=4)
        assert sum(w.nbytes for w in model.get_weights()) > 1 << 20  # the segmented path
        model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)  # 20 steps
        slots = [strategy.experimental_local_results(v) for layer in model._slots
                 for d in layer.values() for v in d.values()]
        for copies in slots:
            for c in copies[1:]:
                np.testing.assert_array_equal(c, copies[0])
        runs.append((model.get_weights(), [copies[0] for copies in slots]))
    (w1, s1), *others = runs
    for w, s_ in others:
        for a, b in zip(w1 + s1, w + s_, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_steps_per_execution_changes_nothing_but_speed(mirrored2):
    (x, y), _ = ld.datasets.digits.load_data()
    x, y = x[:640], y[:640]
    results = []
    for k in (1, 4):
        model = mlp(mirrored2, "sgd", seed=1)
        model.compile(loss="sparse_categorical_crossentropy", optimizer="sgd",
                      metrics=["accuracy"], steps_per_execution=k)
        results.append((model.fit(x, y, batch_size=64, epochs=2, shuffle=False,
                                  verbose=0).history, model.get_weights()))
    (h1, w1), (h4, w4) = results
    np.testing.assert_allclose(h1["loss"], h4["loss"], rtol=1e-6)
    for a, b in zip(w1, w4, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_weights_round_trip_and_copies_stay_identical(mirrored3):
    model = mlp(mirrored3, "adam")
    (x, y), _ = ld.datasets.digits.load_data()
    model.fit(x[:300], y[:300], batch_size=32, epochs=1, verbose=0)
    for w in model._weights:
        for v in w.values():
            copies = mirrored3.experimental_local_results(v)
            assert all(np.array_equal(copies[0], c) for c in copies[1:])
    saved = model.get_weights()
    model.set_weights([np.zeros_like(w) for w in saved])
    assert all((w == 0).all() for w in model.get_weights())
    model.set_weights(saved)
    assert all(np.array_equal(a, b) for a, b in zip(saved, model.get_weights(), strict=True))
    with pytest.raises(ValueError, match="got 1 arrays"):
        model.set_weights(saved[:1])


def test_regression_with_mse_on_the_strict_device():
    s = ld.MirroredStrategy(num_replicas=2, device="strict")
    try:
        rng = np.random.default_rng(0)
        x = rng.normal(size=(400, 3)).astype(np.float32)
        y = x @ np.array([1.0, -2.0, 0.5]) + 0.3
        with s.scope():
            model = ld.models.Sequential([ld.layers.Dense(1, input_shape=(3,))])
            model.compile(loss="mse", optimizer=ld.optimizers.SGD(0.1))
        history = model.fit(x, y, batch_size=40, epochs=20, verbose=0)
        assert history.history["loss"][-1] < 1e-3
        kernel, bias = model.get_weights()
        np.testing.assert_allclose(kernel.ravel(), [1.0, -2.0, 0.5], atol=0.02)
        np.testing.assert_allclose(bias, [0.3], atol=0.02)
    finally:
        s.close()


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda m, x, y: m.fit(x, y, epochs=0), ValueError, "epochs=0"),
    (lambda m, x, y: m.fit(x, y, batch_size=-1), ValueError, "batch_size=-1"),
    (lambda m, x, y: m.fit(x, y[:5]), ValueError, "same length"),
    (lambda m, x, y: m.compile(loss="mse", metrics=["auc"]), ValueError, "auc"),
    (lambda m, x, y: m.compile(loss="mse", steps_per_execution=0), ValueError,
     "steps_per_execution=0"),
])
def test_bad_input(mirrored2, call, error, match):
    model = mlp(mirrored2, "sgd")
    x, y = np.zeros((10, 64), np.float32), np.zeros(10, np.int64)
    with pytest.raises(error, match=match):
        call(model, x, y)


def test_fit_before_compile_and_foreign_layers(mirrored2):
    with mirrored2.scope():
        model = ld.models.Sequential([ld.layers.Dense(2, input_shape=(3,))])
    with pytest.raises(RuntimeError, match="compile"):
        model.fit(np.zeros((4, 3)), np.zeros(4))
    with pytest.raises(TypeError, match="not a labdist layer"):
        ld.models.Sequential(["dense"])


def test_checkpoint_restores_on_another_replica_count(mirrored2, mirrored3, tmp_path):
    (x, y), (x_val, _) = ld.datasets.digits.load_data()
    trained = mlp(mirrored2, ld.optimizers.Adam())
    trained.fit(x[:512], y[:512], batch_size=64, epochs=1, verbose=0)
    path = ld.train.Checkpoint(model=trained).save(tmp_path)
    assert path.endswith("ckpt-8.npz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "ckpt-8.npz"]
    restored = mlp(mirrored3, ld.optimizers.Adam(), seed=7)
    ld.train.Checkpoint(model=restored).restore(tmp_path)
    np.testing.assert_allclose(restored.predict(x_val, verbose=0),
                               trained.predict(x_val, verbose=0), rtol=1e-5, atol=1e-6)
    assert restored._iterations == 8
    # training on from the checkpoint matches training on without one (Adam state included)
    trained.fit(x[512:768], y[512:768], batch_size=64, epochs=1, shuffle=False, verbose=0)
    restored.fit(x[512:768], y[512:768], batch_size=64, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(trained.get_weights(), restored.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_checkpoint_of_another_model_is_refused_whole(mirrored2, tmp_path):
    small = mlp(mirrored2, "sgd")
    ld.train.Checkpoint(model=small).save(tmp_path)
    with mirrored2.scope():
        other = ld.models.Sequential([ld.layers.Dense(3, input_shape=(64,))])
        other.compile(loss="mse", optimizer="sgd")
    before = other.get_weights()
    with pytest.raises(ValueError, match="does not match this model"):
        ld.train.Checkpoint(model=other).restore(tmp_path)
    assert all(np.array_equal(a, b) for a, b in zip(before, other.get_weights(), strict=True))
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        ld.train.Checkpoint(model=other).restore(tmp_path / "empty")


def test_skewed_synthetic_data_gives_each_replica_its_own_shift(mirrored2):
    x, y = ld.datasets.synthetic.regression(n_samples=256, num_replicas=2,
                                            global_batch_size=64, skew=3.0)
    dist = mirrored2.experimental_distribute_dataset(ld.batches((x, y), 64))
    means = [[float(np.mean(part)) for part in bx] for bx, _ in dist]
    assert all(m1 - m0 > 2 for m0, m1 in means)  # replica 1's inputs sit ~3 higher
    xc, yc = ld.datasets.synthetic.classification(n_samples=100, n_classes=4)
    assert xc.shape == (100, 4) and set(np.unique(yc)) <= {0, 1, 2, 3}
    with pytest.raises(ValueError, match="num_replicas=0"):
        ld.datasets.synthetic.regression(num_replicas=0)


def test_mnist_fails_fast_offline_and_loads_from_the_cache(tmp_path, monkeypatch):
    import socket
    import time as clock

    monkeypatch.setenv("LABDIST_DATA", str(tmp_path / "cache"))
    with socket.socket() as s:  # a local port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = clock.monotonic()
    with pytest.raises(ConnectionError, match="could not download MNIST.*digits"):
        ld.datasets.mnist.load_data(url=f"http://127.0.0.1:{port}/mnist.npz", timeout=2)
    assert clock.monotonic() - start < 5
    assert not (tmp_path / "cache" / "mnist.npz").exists()
    rng = np.random.default_rng(0)  # a small stand-in with MNIST's layout
    arrays = {"x_train": rng.integers(0, 255, (6, 28, 28), dtype=np.uint8),
              "y_train": np.arange(6), "x_test": rng.integers(0, 255, (2, 28, 28),
                                                              dtype=np.uint8),
              "y_test": np.arange(2)}
    np.savez(tmp_path / "cache" / "mnist.npz", **arrays)
    (x, y), (xt, yt) = ld.datasets.mnist.load_data()
    assert x.shape == (6, 28, 28) and x.dtype == np.uint8 and list(yt) == [0, 1]
    assert list(y) == list(range(6)) and np.array_equal(xt, arrays["x_test"])
    np.savez(tmp_path / "bad.npz", x=np.zeros(1))
    with pytest.raises(ValueError, match="not an MNIST file"):
        ld.datasets.mnist.load_data(path=tmp_path / "bad.npz")
