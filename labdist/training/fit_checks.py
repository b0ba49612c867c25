"""What `fit` and `evaluate` check before they touch the model, as Keras checks its arguments
and targets first: a bad label found three batches in would leave the weights half-trained.

Every refusal names the argument, the value (or the offending entry) and what is allowed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from labdist import checks
from labdist.data import dataset as dataset_lib
from labdist.training.callback_base import Callback


def sample_shape(value: Any) -> tuple[int, ...]:
    """`model.build`'s argument as one sample's shape: an int n is (n,), and Keras' leading
    None (the batch axis) is dropped."""
    shape = (value,) if isinstance(value, int | np.integer) else value
    if isinstance(shape, tuple | list) and shape and shape[0] is None:
        shape = shape[1:]
    if (not isinstance(shape, tuple | list) or not shape
            or any(isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1
                   for n in shape)):
        checks.refuse("input_shape", value, "positive integers, like (784,), (None, 784) or "
                      "(28, 28, 1)")
    return tuple(int(n) for n in shape)


def _float_x(x: Any, what: str) -> np.ndarray:
    try:
        x = np.asarray(x, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{what}: x cannot be read as numbers ({e}); allowed: a numeric "
                        "array of shape (samples, ...)") from None
    if x.ndim < 2:
        raise ValueError(f"{what}: x has shape {x.shape}; allowed: (samples, features) or "
                         "(samples, ...) for layers that take images or sequences")
    return x


def from_dataset(dataset: Any, y: Any, what: str, targets: bool = True
                 ) -> tuple[Any, Any, int]:
    """(x, y, batch size) from one pass of an `ld.data.Dataset` given as x."""
    if y is not None:
        raise ValueError(f"{what}: x is a dataset, so y comes from it; got y as well (leave "
                         "y out)")
    x, y, size = dataset_lib.one_pass(dataset, what)
    if targets and y is None:
        raise ValueError(f"{what}: the dataset gives x alone; allowed: (x, y) batches "
                         "(Dataset.from_tensor_slices((x, y)).batch(n))")
    return x, y, size


def arrays(x: Any, y: Any, what: str = "fit") -> tuple[np.ndarray, np.ndarray]:
    """x as float32 (samples, ...) and y as an array of the same length, at least one
    sample."""
    if y is None:
        raise TypeError(f"{what}: y is missing; give x and y, or an ld.data.Dataset of (x, y) "
                        "batches as x")
    x = _float_x(x, what)
    y = np.asarray(y)
    if len(x) != len(y):
        raise ValueError(f"{what}: x must be (samples, ...) and y (samples, ...) of the "
                         f"same length; got x {x.shape} and y {y.shape}")
    if len(x) == 0:
        raise ValueError(f"{what}: x and y hold 0 samples; allowed: at least 1")
    if y.dtype.kind not in "biuf":
        raise TypeError(f"{what}: y has dtype {y.dtype}; allowed: numbers (integer class ids "
                        "or float targets)")
    return x, y


def inputs(model, x: Any, what: str) -> np.ndarray:
    """x as float32, each sample of the shape the model takes (of a shape its layers can take,
    before it is built), with values its first layer takes (an embedding's ids)."""
    x = _float_x(x, what)
    expected = model.input_shape
    if expected is not None and x.shape[1:] != expected[1:]:
        if x.ndim == 2 and len(expected) == 2:
            raise ValueError(f"{what}: x has {x.shape[1]} features per sample, but the "
                             f"model's first layer takes {expected[1]}; allowed: x of shape "
                             f"(samples, {expected[1]})")
        raise ValueError(f"{what}: x has samples of shape {x.shape[1:]}, but the model takes "
                         f"{expected[1:]}; allowed: x of shape (samples, "
                         f"{', '.join(map(str, expected[1:]))})")
    if expected is None:
        try:
            model.shapes(x.shape[1:])
        except ValueError as e:
            raise ValueError(f"{what}: {e}") from None
    if model.layers:
        model.layers[0].check_input_values(x, what)
    return x


def check_data(model, x: np.ndarray, y: np.ndarray, what: str = "fit") -> None:
    """x's samples suit the model (`inputs`); y suits the compiled loss: class ids in
    [0, classes) for a sparse loss (whole numbers, also when stored as floats), one target
    per output for mse."""
    inputs(model, x, what)
    shapes = model.shapes(x.shape[1:])
    width = shapes[-1][-1] if shapes else x.shape[-1]
    if model._loss.name == "sparse_categorical_crossentropy":
        labels = y.reshape(len(y), -1)
        if labels.shape[1] != 1:
            raise ValueError(f"{what}: y has shape {y.shape}; sparse_categorical_crossentropy "
                             "takes one class id per sample: allowed y of shape (samples,) or "
                             "(samples, 1)")
        if y.dtype.kind == "f":
            whole = np.isfinite(y) & (y == np.round(y))
            if not whole.all():
                bad = y.reshape(-1)[~whole.reshape(-1)][0].item()
                raise ValueError(f"{what}: y holds {bad!r}, not a class id; "
                                 "sparse_categorical_crossentropy takes whole numbers in "
                                 f"0..{width - 1} (one-hot or float targets need loss='mse')")
        low, high = y.min(), y.max()
        if low < 0 or high >= width:
            bad = (low if low < 0 else high).item()
            raise ValueError(f"{what}: y holds the class id {bad!r}, but the model has {width} "
                             f"output(s); allowed: class ids 0..{width - 1}")
    elif y.reshape(len(y), -1).shape[1] != width:
        raise ValueError(f"{what}: y has shape {y.shape}, but the model has {width} output(s); "
                         f"allowed for loss='mse': y of shape (samples, {width})"
                         + (" or (samples,)" if width == 1 else ""))


def validation(model, data: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """validation_data as checked arrays: None, or (x_val, y_val) (a tuple or list of two)."""
    if data is None:
        return None
    if not isinstance(data, tuple | list) or len(data) != 2:
        raise TypeError(f"validation_data={_short(data)} is not allowed; use (x_val, y_val) "
                        "or None")
    x, y = arrays(*data, what="validation_data")
    check_data(model, x, y, "validation_data")
    return x, y


def callbacks(value: Any) -> list[Callback]:
    """A list or tuple of `ld.callbacks.Callback` objects (None: no callbacks)."""
    if value is None:
        return []
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise TypeError(f"callbacks={_short(value)} is not allowed; use a list of "
                        "ld.callbacks.Callback objects")
    for i, cb in enumerate(value):
        if not isinstance(cb, Callback):
            raise TypeError(f"callbacks[{i}]={_short(cb)} is not allowed; use an "
                            "ld.callbacks.Callback (subclass Callback for your own)")
    return list(value)


def fit_arguments(model, epochs: Any, shuffle: Any, initial_epoch: Any,
                  steps_per_epoch: Any = None) -> int | None:
    """Checks `fit`'s loop arguments; returns `steps_per_epoch` as Keras reads it (None or 0:
    a whole pass of the data each epoch)."""
    checks.integer("epochs", epochs, 1)
    if not isinstance(shuffle, bool | np.bool_):
        checks.refuse("shuffle", shuffle, "True or False ('batch' shuffling is not supported)",
                      TypeError)
    checks.integer("initial_epoch", initial_epoch, 0)
    if steps_per_epoch is None:
        return None
    return checks.integer("steps_per_epoch", steps_per_epoch, 0) or None


def stream(dataset: Any, steps_per_epoch: int | None, epochs: int, initial_epoch: int) -> Any:
    """A dataset that repeats forever, as `fit(..., steps_per_epoch=n)` reads it: the batches
    the epochs from `initial_epoch` to `epochs` take, one after another (Keras' iterator
    carries on from epoch to epoch); any other dataset as it is."""
    if dataset.finite:
        return dataset
    if steps_per_epoch is None:
        raise ValueError("fit: the dataset repeats forever, so an epoch has no end; give "
                         "steps_per_epoch=n (the batches an epoch takes), or a finite "
                         "dataset (drop .repeat(), or .take(n))")
    return dataset.take(steps_per_epoch * max(1, epochs - initial_epoch))


def _short(value: Any) -> str:
    if isinstance(value, tuple | list) and any(hasattr(v, "shape") for v in value):
        return f"a {type(value).__name__} of {len(value)} item(s)"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def sample_weights(y: np.ndarray, sample_weight: Any, class_weight: Any) -> np.ndarray | None:
    """Keras' `fit(..., sample_weight=, class_weight=)` as one weight per sample (float64), or
    None for neither. A class weight is looked up by the sample's class id (its argmax for
    one-hot targets); a class the dict leaves out weighs 1."""
    if sample_weight is not None and class_weight is not None:
        raise ValueError("You cannot use class_weight and sample_weight at the same time: "
                         "fold the class weights into sample_weight")
    n = len(y)
    if sample_weight is not None:
        w = np.asarray(sample_weight)
        if w.dtype.kind not in "biuf" or w.reshape(-1).shape != (n,) or w.ndim > 2:
            raise ValueError(f"sample_weight of shape {w.shape} (dtype {w.dtype}) is not "
                             f"allowed; use one number per sample: shape ({n},)")
        w = w.reshape(-1).astype(np.float64)
        if not np.isfinite(w).all():
            raise ValueError("sample_weight holds nan or inf; use finite numbers")
        return w
    if class_weight is None:
        return None
    if not isinstance(class_weight, dict) or not all(
            isinstance(k, int | np.integer) and not isinstance(k, bool) and k >= 0
            and checks.is_number(v) and np.isfinite(v) for k, v in class_weight.items()):
        checks.refuse("class_weight", class_weight,
                      "a dict {class id (int >= 0): weight (a finite number)}", TypeError)
    ids = y.reshape(-1) if y.ndim == 1 or y.shape[1:] == (1,) else y.argmax(axis=-1)
    ids = ids.astype(np.int64)
    table = np.ones(max(int(ids.max()) + 1, max(class_weight) + 1), np.float64)
    for k, v in class_weight.items():
        table[int(k)] = float(v)
    return table[ids]


def with_weights(y: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """`y` with each sample's weight as one more column (float64, exact for class ids): the
    weights travel with the targets through every path the targets take, and the step splits
    them off again (trainer/steps.py `split_weights`)."""
    return np.concatenate([y.reshape(len(y), -1).astype(np.float64), weights[:, None]], axis=1)
