"""The layers beyond Dense, against TensorFlow: outputs and gradients of small fixed programs
recorded from TF 2.21 (tf_recorded/record_layers.py), on host arrays and on the strict device
double; then the same layers in models that `fit` on real replicas, save and load, and refuse
what TensorFlow refuses."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import labdist as ld
from labdist.devices import get_backend, to_host

RECORDED = np.load(Path(__file__).with_name("tf_recorded") / "layers.npz")
CASES = sorted({k.split("/")[0] for k in RECORDED.files if "/" in k})


def recorded(case: str) -> tuple[ld.layers.Layer, dict[str, np.ndarray]]:
    spec = json.loads(str(RECORDED[f"{case}/config"]))
    config = {k: tuple(v) if isinstance(v, list) else v for k, v in spec["config"].items()}
    layer = {"Conv2D": ld.layers.Conv2D, "MaxPooling2D": ld.layers.MaxPooling2D,
             "AveragePooling2D": ld.layers.AveragePooling2D, "Flatten": ld.layers.Flatten,
             "GlobalAveragePooling1D": ld.layers.GlobalAveragePooling1D,
             "Dense": ld.layers.Dense, "Embedding": ld.layers.Embedding}[spec["class_name"]]
    return layer(**config), {k[len(case) + 1:]: RECORDED[k] for k in RECORDED.files
                             if k.startswith(case + "/")}


def test_the_recording_is_tensorflows():
    assert str(RECORDED["tensorflow_version"]).startswith("2.21")
    assert len(CASES) == 11


@pytest.mark.parametrize("device", ["cpu", "strict"])
@pytest.mark.parametrize("case", CASES)
def test_output_and_gradients_match_tensorflow(case, device):
    layer, rec = recorded(case)
    backend = get_backend(device)
    xp = backend.xp
    params = {k.removeprefix("param/"): backend.to_device(v) for k, v in rec.items()
              if k.startswith("param/")}
    x = rec["x"]
    assert tuple(layer.output_shape(x.shape[1:])) == rec["y"].shape[1:]
    assert {k: tuple(v) for k, v in layer.param_shapes(x.shape[1:]).items()} == \
        {k: v.shape for k, v in params.items()}
    y, cache = layer.forward(xp, params, backend.to_device(x), training=True)
    np.testing.assert_allclose(to_host(y), rec["y"], rtol=1e-5, atol=1e-5)
    dx, grads = layer.backward(xp, params, cache, backend.to_device(rec["dy"]))
    if "dx" in rec:
        np.testing.assert_allclose(to_host(dx), rec["dx"], rtol=1e-5, atol=1e-5)
    assert set(grads) == set(params)
    for k, g in grads.items():
        np.testing.assert_allclose(to_host(g), rec[f"grad/{k}"], rtol=1e-5, atol=1e-5,
                                   err_msg=f"{case}: d/d{k}")
    none, again = layer.backward(xp, params, cache, backend.to_device(rec["dy"]),
                                 input_grad=False)
    assert none is None
    for k, g in again.items():  # the first layer's shortcut changes no weight gradient
        np.testing.assert_array_equal(to_host(g), to_host(grads[k]))


@pytest.mark.parametrize("case", [c for c in CASES if c.startswith(("conv", "dense", "emb"))])
def test_gradients_written_into_a_steps_buffer_are_the_same_bits(case):
    """`fit` hands a layer its persistent gradient buffer (`out=`): the same numbers land
    there as in fresh arrays, whatever the buffer held before."""
    layer, rec = recorded(case)
    params = {k.removeprefix("param/"): v for k, v in rec.items() if k.startswith("param/")}
    _, cache = layer.forward(np, params, rec["x"], training=True)
    _, fresh = layer.backward(np, params, cache, rec["dy"])
    out = {k: np.full_like(v, np.nan) for k, v in params.items()}
    _, written = layer.backward(np, params, cache, rec["dy"], out=out)
    for k in params:
        assert written[k] is out[k]
        np.testing.assert_array_equal(out[k], fresh[k])


def small_cnn(strategy, seed=0) -> ld.models.Sequential:
    with strategy.scope():
        model = ld.models.Sequential([
            ld.layers.Conv2D(8, 3, padding="same", activation="relu", input_shape=(8, 8, 1)),
            ld.layers.MaxPooling2D(),
            ld.layers.Conv2D(16, 3, activation="relu"),
            ld.layers.AveragePooling2D(2, padding="same"),
            ld.layers.Flatten(),
            ld.layers.Dense(10, activation="softmax")], seed=seed)
        model.compile(loss="sparse_categorical_crossentropy",
                      optimizer=ld.optimizers.SGD(0.1, momentum=0.9), metrics=["accuracy"])
    return model


def images():
    (x, y), (x_val, y_val) = ld.datasets.digits.load_data()
    return (x.reshape(-1, 8, 8, 1), y), (x_val.reshape(-1, 8, 8, 1), y_val)


def test_a_small_cnn_learns_digits_on_two_replicas_and_the_copies_stay_equal(mirrored2):
    (x, y), (x_val, y_val) = images()
    model = small_cnn(mirrored2)
    assert model.input_shape == (None, 8, 8, 1) and model.output_shape == (None, 10)
    history = model.fit(x, y, batch_size=64, epochs=6, validation_data=(x_val, y_val),
                        verbose=0)
    assert history.history["val_accuracy"][-1] >= 0.9, history.history
    for v in model.weights:
        copies = mirrored2.experimental_local_results(v)
        np.testing.assert_array_equal(copies[0], copies[1], err_msg=v.name)
    assert [v.name for v in model.weights] == [
        "conv2d_0/kernel", "conv2d_0/bias", "conv2d_2/kernel", "conv2d_2/bias",
        "dense_5/kernel", "dense_5/bias"]
    assert model.predict(x_val[:3], verbose=0).shape == (3, 10)


def test_one_two_and_three_replicas_take_the_same_steps(mirrored2, mirrored3):
    """The replicas' gradients sum to the global batch's: the same weights after the same
    batches, whatever the replica count (float32 sums in another order: a few ulps)."""
    (x, y), _ = images()
    weights = []
    for strategy in (ld.OneDeviceStrategy(device="cpu"), mirrored2, mirrored3):
        model = small_cnn(strategy)
        model.fit(x[:600], y[:600], batch_size=60, epochs=1, shuffle=False, verbose=0)
        weights.append(model.get_weights())
    for other in weights[1:]:
        for a, b in zip(weights[0], other, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_a_cnn_saves_and_loads_with_its_shapes(mirrored2, tmp_path):
    (x, y), (x_val, _) = images()
    model = small_cnn(mirrored2)
    model.fit(x[:128], y[:128], batch_size=64, verbose=0)
    model.save(tmp_path / "cnn")
    with mirrored2.scope():
        again = ld.models.load_model(tmp_path / "cnn")
    assert again.input_shape == (None, 8, 8, 1)
    assert [repr(a) for a in again.layers] == [repr(a) for a in model.layers]
    np.testing.assert_array_equal(again.predict(x_val[:8], verbose=0),
                                  model.predict(x_val[:8], verbose=0))


def test_an_embedding_model_learns_which_tokens_mean_yes(mirrored2):
    """Embedding -> GlobalAveragePooling1D -> Dense: Keras' text classifier in miniature,
    on sequences whose label is whether token 3 appears."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 10, (512, 6)).astype(np.float32)
    y = (x == 3).any(axis=1).astype(np.int64)
    with mirrored2.scope():
        model = ld.models.Sequential([ld.layers.Embedding(10, 8, input_shape=(6,)),
                                      ld.layers.GlobalAveragePooling1D(),
                                      ld.layers.Dense(2, activation="softmax")])
        model.compile(loss="sparse_categorical_crossentropy",
                      optimizer=ld.optimizers.Adam(0.05), metrics=["accuracy"])
    history = model.fit(x, y, batch_size=64, epochs=25, verbose=0)
    assert history.history["accuracy"][-1] > 0.9, history.history["accuracy"]


def test_shapes_the_layers_cannot_take_are_refused_before_anything_changes(mirrored2):
    with mirrored2.scope():
        model = ld.models.Sequential([ld.layers.Conv2D(4, 3), ld.layers.Flatten(),
                                      ld.layers.Dense(2)])
        model.compile(loss="mse", optimizer="sgd")
    with pytest.raises(ValueError, match=r"fit: Input of layer Conv2D\(4, \(3, 3\).* is "
                                         r"incompatible with the layer: expected images "
                                         r"\(height, width, channels\), got shape \(None, 64\)"):
        model.fit(np.zeros((8, 64)), np.zeros((8, 2)), verbose=0)
    assert not model.built
    with pytest.raises(ValueError, match=r"expected images of at least 3x3 for "
                                         r"padding='valid', got shape \(None, 2, 5, 1\)"):
        model.fit(np.zeros((8, 2, 5, 1)), np.zeros((8, 2)), verbose=0)
    model.fit(np.zeros((8, 5, 5, 1)), np.zeros((8, 2)), verbose=0)
    with pytest.raises(ValueError, match=r"evaluate: x has samples of shape \(6, 6, 1\), but "
                                         r"the model takes \(5, 5, 1\)"):
        model.evaluate(np.zeros((8, 6, 6, 1)), np.zeros((8, 2)), verbose=0)


@pytest.mark.parametrize("bad", [7.0, -1.0, 2.5, np.nan])
def test_an_id_outside_the_embedding_is_refused(mirrored2, bad):
    with mirrored2.scope():
        model = ld.models.Sequential([ld.layers.Embedding(7, 2, input_shape=(3,)),
                                      ld.layers.Flatten(), ld.layers.Dense(1)])
        model.compile(loss="mse", optimizer="sgd")
    before = model.get_weights()
    x = np.zeros((4, 3), np.float32)
    x[2, 1] = bad
    with pytest.raises(ValueError, match=rf"fit: x holds {bad!r}, not an id of "
                                         r"Embedding\(7, 2\); allowed: whole numbers 0..6"):
        model.fit(x, np.zeros(4), verbose=0)
    for a, b in zip(before, model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("make", "match"), [
    (lambda: ld.layers.Conv2D(0, 3), r"filters=0 is not allowed"),
    (lambda: ld.layers.Conv2D(2, (3, 0)), r"kernel_size=\(3, 0\) is not allowed; use a "
                                          r"positive integer or a pair of them"),
    (lambda: ld.layers.Conv2D(2, 3, padding="full"), r"padding='full' is not allowed; use "
                                                     r"'valid' or 'same'"),
    (lambda: ld.layers.Conv2D(2, 3, input_shape=(8, 8)), r"input_shape=\(8, 8\) is not "
                                                          r"allowed; use a 3-tuple"),
    (lambda: ld.layers.MaxPooling2D(strides=(1, 2, 3)), r"strides=\(1, 2, 3\) is not allowed"),
    (lambda: ld.layers.Embedding(0, 4), r"input_dim=0 is not allowed"),
])
def test_bad_layer_settings_name_the_setting(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_summary_shows_each_layers_output_shape(capsys):
    model = small_cnn(ld.OneDeviceStrategy(device="cpu"))
    model.summary()
    out = capsys.readouterr().out
    for shape in ("(None, 8, 8, 8)", "(None, 4, 4, 8)", "(None, 2, 2, 16)",
                  "(None, 1, 1, 16)", "(None, 16)", "(None, 10)"):
        assert shape in out, out
    assert "Total params: 1418" in out  # 8*9+8 + 16*8*9+16 + 16*10+10
