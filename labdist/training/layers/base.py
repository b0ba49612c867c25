"""The seam every layer fills: a model walks its layers through these methods only.

A layer is a small object holding its settings; its parameters live outside it (a model keeps
them in distributed variables), so `forward` and `backward` are pure functions of
(parameters, input) that run alike on a host replica (numpy) and a GPU replica (cupy): `xp`
is the replica's array module. Shapes leave out the batch axis, as Keras' `input_shape=`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from labdist import checks
from labdist.training.activations import Activation

Shape = tuple[int, ...]


class Layer(ABC):
    """One step of a `Sequential` model.

    `input_shape`: set on a model's first layer to build the model at once (Keras' rule).
    `activation`: the activation a layer ends with, None for layers without one; `fit` fuses
    a final softmax with the cross-entropy loss through `backward_linear` (see `Dense`).
    """

    input_shape: Shape | None = None
    activation: Activation | None = None
    # parameters whose gradient TensorFlow keeps as one slice per lookup (IndexedSlices: an
    # embedding's table); the step asks `squared_slices` for them, for the optimizers'
    # second moments. Most layers have none: their steps make no extra work
    sliced: frozenset[str] = frozenset()

    @abstractmethod
    def output_shape(self, input_shape: Shape) -> Shape:
        """The shape of one sample's output; a `ValueError` naming the layer and the shapes
        when this layer cannot take `input_shape` (raised before anything is built)."""

    def param_shapes(self, input_shape: Shape) -> dict[str, Shape]:
        """{name: shape} of the parameters `build` makes: a saved model is checked against
        them before anything is allocated."""
        return {}

    def build(self, input_shape: Shape, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Initial parameters as float32 host arrays, in `param_shapes` order."""
        return {}

    def state_shapes(self, input_shape: Shape) -> dict[str, Shape]:
        """{name: shape} of the layer's non-trainable state (batch norm's moving statistics):
        each replica keeps and updates its own copy, TensorFlow's ON_WRITE / NONE."""
        return {}

    def build_state(self, input_shape: Shape) -> dict[str, np.ndarray]:
        """Initial state as float32 host arrays, in `state_shapes` order."""
        return {}

    def regularizers(self) -> dict[str, Any]:
        """{parameter name: penalty} (Keras' `kernel_regularizer=` ...): what the layer adds
        to the loss for its weights. Most layers add nothing."""
        return {}

    @property
    def makes_collectives(self) -> bool:
        """Whether a training step of this layer talks to the other replicas (synchronized
        batch norm); most layers do not."""
        return False

    def join_without_data(self, xp, input_shape: Shape, backward: bool,
                          state: dict | None = None) -> None:
        """On a replica whose shard of a training batch is empty: take part in the
        collectives `forward` (backward=False) or `backward` makes with the other replicas,
        contributing nothing, so that they do not wait for it forever (and update `state`
        from what comes back, as the others do)."""
        return None

    def check_input_values(self, x: np.ndarray, what: str) -> None:
        """On a model's first layer, before `fit` / `evaluate` / `predict` touch anything: a
        `ValueError` for input values this layer cannot take (an embedding's unknown id).
        Most layers take any number."""
        return None

    @abstractmethod
    def forward(self, xp, params: dict, x, training: bool = False, rng: Any = None,
                state: dict | None = None):
        """(output, cache): the cache is what `backward` needs from this call. `state`: this
        replica's copies of the layer's state ({name: array}), updated in place while
        training; passed only to a layer that has state (`state_shapes`), so a layer
        without any may leave the argument out."""

    @abstractmethod
    def backward(self, xp, params: dict, cache, dy, input_grad: bool = True,
                 out: dict | None = None):
        """(d loss / d input, {name: d loss / d param}). The first layer passes
        input_grad=False and gets None for the input (a gradient nobody uses); with `out`
        ({name: array}, a step's persistent buffer) the parameter gradients go there."""

    def squared_slices(self, xp, cache, dy, out: dict) -> None:
        """For each parameter in `sliced`: the sum, per element, of its lookups' squared
        gradient slices (what Keras 3's Adam, Adagrad and RMSprop accumulate, not the summed
        gradient squared), written into `out` ({name: array}); `cache` and `dy` are those
        `backward` gets."""
        return None

    @abstractmethod
    def get_config(self) -> dict[str, Any]:
        """The constructor's keyword arguments, JSON-able: `model.save` writes them and
        `load_model` calls the class with them."""

    def incompatible(self, input_shape: Shape, expected: str) -> ValueError:
        """Keras' wording for an input a layer cannot take."""
        return ValueError(f"Input of layer {self!r} is incompatible with the layer: expected "
                          f"{expected}, got shape (None, {', '.join(map(str, input_shape))}) "
                          "(batch axis first); give the first layer input_shape= or data of "
                          "the shape it takes")


def check_input_shape(value: Any, ndim: int | None = None, example: str = "(64,)",
                      name: str = "input_shape") -> Shape | None:
    """`input_shape=` (or `name`=): None, or a tuple of positive integers (of `ndim` entries
    if given)."""
    if value is None:
        return None
    if (not isinstance(value, tuple) or not value or (ndim is not None and len(value) != ndim)
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in value)):
        what = f"a {ndim}-tuple" if ndim is not None else "a tuple"
        checks.refuse(name, value, f"{what} of positive integers, like {example}")
    return value


def penalties(layer: Any) -> dict[str, Any]:
    """{parameter: regularizer} of a layer with `kernel_regularizer` / `bias_regularizer`."""
    out = {"kernel": layer.kernel_regularizer}
    if layer.use_bias:
        out["bias"] = layer.bias_regularizer
    return {k: r for k, r in out.items() if r is not None}


def penalties_config(layer: Any) -> dict[str, Any]:
    """The regularizers' part of `get_config` (left out where there are none, so configs
    saved before regularizers existed read the same)."""
    given = {"kernel_regularizer": layer.kernel_regularizer,
             "bias_regularizer": layer.bias_regularizer}
    return {name: r.get_config() for name, r in given.items() if r is not None}


def pair(name: str, value: Any) -> tuple[int, int]:
    """Keras' `kernel_size` / `strides` / `pool_size`: an int n (meaning (n, n)) or a pair."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value, value)
    if (not isinstance(value, tuple | list) or len(value) != 2
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in value)):
        checks.refuse(name, value, "a positive integer or a pair of them, like 3 or (3, 3)")
    return int(value[0]), int(value[1])


def glorot_uniform(rng: np.random.Generator, shape: Shape, fan_in: int, fan_out: int
                   ) -> np.ndarray:
    """Keras' default kernel initializer: U(-l, l), l = sqrt(6 / (fan_in + fan_out))."""
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, shape).astype(np.float32)
