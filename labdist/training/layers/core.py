"""Keras' core layers: `Dense`, `Dropout` and `Flatten`."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from labdist import checks
from labdist.training import activations, regularizers
from labdist.training.layers.base import (
    Layer,
    Shape,
    check_input_shape,
    glorot_uniform,
    penalties,
    penalties_config,
)


class Dense(Layer):
    """y = activation(x @ kernel + bias) over the last axis, with Keras' glorot-uniform kernel
    and zero bias. On inputs with more axes, (batch, ..., features), every position gets the
    same kernel, as in Keras."""

    def __init__(self, units: int, activation: str | None = None,
                 input_shape: tuple[int, ...] | None = None, use_bias: bool = True,
                 kernel_regularizer: Any = None, bias_regularizer: Any = None):
        self.units = checks.integer("units", units, 1)
        self.kernel_regularizer = regularizers.get(kernel_regularizer, "kernel_regularizer")
        self.bias_regularizer = regularizers.get(bias_regularizer, "bias_regularizer")
        self.activation = activations.get(activation)
        self.input_shape = check_input_shape(input_shape)
        self.use_bias = checks.boolean("use_bias", use_bias)

    def output_shape(self, input_shape: Shape) -> Shape:
        return (*input_shape[:-1], self.units)

    def regularizers(self) -> dict[str, Any]:
        return penalties(self)

    def param_shapes(self, input_shape: Shape) -> dict[str, Shape]:
        shapes = {"kernel": (input_shape[-1], self.units)}
        if self.use_bias:
            shapes["bias"] = (self.units,)
        return shapes

    def build(self, input_shape: Shape | int, rng: np.random.Generator
              ) -> dict[str, np.ndarray]:
        """An int n means (n,): the features of a flat input (what Dense.build took before
        layers took images, which scripts and benchmarks still pass)."""
        features = input_shape if isinstance(input_shape, int) else input_shape[-1]
        checks.array_bytes(f"Dense(units={self.units}) kernel", (features, self.units), 4)
        params = {"kernel": glorot_uniform(rng, (features, self.units), features, self.units)}
        if self.use_bias:
            params["bias"] = np.zeros(self.units, np.float32)
        return params

    def forward(self, xp, params, x, training: bool = False, rng: Any = None,
                state: dict | None = None):
        z = x @ params["kernel"]
        if self.use_bias:
            z = z + params["bias"]
        a = self.activation.forward(xp, z)
        return a, (x, z, a)

    def backward(self, xp, params, cache, da, input_grad: bool = True, out: dict | None = None):
        x, z, a = cache
        return self.backward_linear(xp, params, x, self.activation.backward(xp, z, a, da),
                                    input_grad, out)

    def backward_linear(self, xp, params, x, dz, input_grad: bool = True,
                        out: dict | None = None):
        """From the gradient of the pre-activation `dz` (e.g. softmax + cross-entropy fused);
        with `out`, the parameter gradients are written there (the same bits)."""
        x2 = x if x.ndim == 2 else x.reshape(-1, x.shape[-1])
        dz2 = dz if dz.ndim == 2 else dz.reshape(-1, dz.shape[-1])
        if out is None:
            grads = {"kernel": x2.T @ dz2}
            if self.use_bias:
                grads["bias"] = dz2.sum(axis=0)
        else:
            grads = out
            xp.matmul(x2.T, dz2, out=out["kernel"])
            if self.use_bias:
                dz2.sum(axis=0, out=out["bias"])
        return (dz @ params["kernel"].T if input_grad else None), grads

    def get_config(self) -> dict[str, Any]:
        return {"units": self.units, "activation": self.activation.name,
                "use_bias": bool(self.use_bias), **penalties_config(self),
                "input_shape": list(self.input_shape) if self.input_shape else None}

    def __repr__(self) -> str:
        return f"Dense({self.units}, activation={self.activation.name!r})"


class Dropout(Layer):
    """Zeroes a fraction `rate` of inputs while training, scaling the rest by 1 / (1 - rate)."""

    def __init__(self, rate: float):
        self.rate = checks.fraction("rate", rate)

    def output_shape(self, input_shape: Shape) -> Shape:
        return input_shape

    def forward(self, xp, params, x, training: bool = False, rng: Any = None,
                state: dict | None = None):
        if not training or self.rate == 0:
            return x, None
        draw = (rng or xp.random).random(x.shape)
        mask = (draw >= self.rate).astype(x.dtype) / (1 - self.rate)
        return x * mask, mask

    def backward(self, xp, params, cache, dy, input_grad: bool = True, out: dict | None = None):
        if not input_grad:
            return None, {}
        return (dy if cache is None else dy * cache), {}

    def get_config(self) -> dict[str, Any]:
        return {"rate": self.rate}

    def __repr__(self) -> str:
        return f"Dropout({self.rate})"


class Flatten(Layer):
    """(batch, d1, d2, ...) -> (batch, d1 * d2 * ...), in row-major order: Keras' channels-last
    flattening, so a Dense after it sees the features in TensorFlow's order."""

    def __init__(self, input_shape: tuple[int, ...] | None = None):
        self.input_shape = check_input_shape(input_shape, example="(28, 28)")

    def output_shape(self, input_shape: Shape) -> Shape:
        return (math.prod(input_shape),)

    def forward(self, xp, params, x, training: bool = False, rng: Any = None,
                state: dict | None = None):
        return x.reshape(len(x), -1), x.shape

    def backward(self, xp, params, cache, dy, input_grad: bool = True, out: dict | None = None):
        return (dy.reshape(cache) if input_grad else None), {}

    def get_config(self) -> dict[str, Any]:
        return {"input_shape": list(self.input_shape) if self.input_shape else None}

    def __repr__(self) -> str:
        return "Flatten()"


class Reshape(Layer):
    """(batch, ...) -> (batch, *target_shape), in row-major order (one -1 in `target_shape`
    stands for what the sample's size leaves, as in Keras)."""

    def __init__(self, target_shape: tuple[int, ...],
                 input_shape: tuple[int, ...] | None = None):
        shape = tuple(target_shape) if isinstance(target_shape, tuple | list) else None
        if not shape or not all(isinstance(d, int) and not isinstance(d, bool)
                                and (d > 0 or d == -1) for d in shape):
            checks.refuse("target_shape", target_shape, "a tuple of positive integers, with at "
                          "most one -1 (what is left), like (28, 28, 1)")
        if shape.count(-1) > 1:
            raise ValueError(f"target_shape={target_shape!r} is not allowed: there must be at "
                             "most one unknown dimension (-1)")
        self.target_shape = shape
        self.input_shape = check_input_shape(input_shape, example="(784,)")

    def output_shape(self, input_shape: Shape) -> Shape:
        size, known = math.prod(input_shape), math.prod(d for d in self.target_shape if d > 0)
        if -1 in self.target_shape:
            if size % known:
                raise ValueError(f"{self!r}: a sample of shape {tuple(input_shape)} has "
                                 f"{size} values, which {self.target_shape} cannot divide")
            return tuple(size // known if d == -1 else d for d in self.target_shape)
        if size != known:
            raise ValueError(f"{self!r}: the total size must be unchanged; a sample of shape "
                             f"{tuple(input_shape)} has {size} values, target_shape "
                             f"{self.target_shape} holds {known}")
        return self.target_shape

    def forward(self, xp, params, x, training: bool = False, rng: Any = None,
                state: dict | None = None):
        return x.reshape(len(x), *self.target_shape), x.shape

    def backward(self, xp, params, cache, dy, input_grad: bool = True, out: dict | None = None):
        return (dy.reshape(cache) if input_grad else None), {}

    def get_config(self) -> dict[str, Any]:
        return {"target_shape": list(self.target_shape),
                "input_shape": list(self.input_shape) if self.input_shape else None}

    def __repr__(self) -> str:
        return f"Reshape({self.target_shape})"


class Input:
    """Keras 3's `keras.Input(shape)` as a `Sequential` model's first entry: it says the shape
    of one sample (the batch axis left out), as `input_shape=` on the first layer does. Not a
    layer: it computes nothing."""

    def __init__(self, shape: tuple[int, ...] | int, batch_size: int | None = None,
                 dtype: Any = None, name: str | None = None):
        shape = (shape,) if isinstance(shape, int) and not isinstance(shape, bool) else shape
        self.shape = check_input_shape(tuple(shape) if isinstance(shape, list) else shape,
                                       example="(784,)", name="shape")
        if self.shape is None:
            checks.refuse("shape", shape, "a tuple of positive integers, like (784,)")
        self.batch_size = checks.integer("batch_size", batch_size, 1, optional=True)
        self.name = name

    def __repr__(self) -> str:
        return f"Input(shape={self.shape})"


class InputLayer(Input):
    """Keras' `InputLayer` as a `Sequential` model's first entry: `Input` by its layer name,
    taking the older `input_shape=` too (as Keras 3 still does)."""

    def __init__(self, shape: tuple[int, ...] | int | None = None, batch_size: int | None = None,
                 dtype: Any = None, name: str | None = None,
                 input_shape: tuple[int, ...] | None = None):
        if (shape is None) == (input_shape is None):
            raise ValueError(f"InputLayer(shape={shape!r}, input_shape={input_shape!r}): give "
                             "the sample's shape once, as shape=(28, 28)")
        super().__init__(shape if shape is not None else input_shape, batch_size, dtype, name)

    def __repr__(self) -> str:
        return f"InputLayer(shape={self.shape})"
