"""`Conv2D`: Keras' 2-D convolution over channels-last images, as a matrix product of the
gathered windows (im2col) with the kernel, so the heavy work is one matmul each way."""

from __future__ import annotations

from typing import Any

import numpy as np

from labdist import checks
from labdist.training import activations, regularizers
from labdist.training.layers import windows
from labdist.training.layers.base import (
    Layer,
    Shape,
    check_input_shape,
    glorot_uniform,
    pair,
    penalties,
    penalties_config,
)


class Conv2D(Layer):
    """y = activation(conv(x, kernel) + bias) on (batch, height, width, channels) inputs, the
    kernel shaped (rows, cols, in_channels, filters) as TensorFlow's; 'valid' or 'same'
    padding with TensorFlow's output sizes."""

    def __init__(self, filters: int, kernel_size: int | tuple[int, int],
                 strides: int | tuple[int, int] = (1, 1), padding: str = "valid",
                 activation: str | None = None, use_bias: bool = True,
                 input_shape: tuple[int, int, int] | None = None,
                 kernel_regularizer: Any = None, bias_regularizer: Any = None):
        self.filters = checks.integer("filters", filters, 1)
        self.kernel_regularizer = regularizers.get(kernel_regularizer, "kernel_regularizer")
        self.bias_regularizer = regularizers.get(bias_regularizer, "bias_regularizer")
        self.kernel_size = pair("kernel_size", kernel_size)
        self.strides = pair("strides", strides)
        self.padding = windows.check_padding(padding)
        self.activation = activations.get(activation)
        self.use_bias = checks.boolean("use_bias", use_bias)
        self.input_shape = check_input_shape(input_shape, 3, "(28, 28, 1)")

    def _geometry(self, input_shape: Shape) -> windows.Geometry:
        return windows.for_images(self, input_shape, self.kernel_size, self.strides, self.padding)

    def output_shape(self, input_shape: Shape) -> Shape:
        return (*self._geometry(input_shape).out, self.filters)

    def regularizers(self) -> dict[str, Any]:
        return penalties(self)

    def param_shapes(self, input_shape: Shape) -> dict[str, Shape]:
        self._geometry(input_shape)
        shapes = {"kernel": (*self.kernel_size, input_shape[2], self.filters)}
        if self.use_bias:
            shapes["bias"] = (self.filters,)
        return shapes

    def build(self, input_shape: Shape, rng: np.random.Generator) -> dict[str, np.ndarray]:
        shape = self.param_shapes(input_shape)["kernel"]
        checks.array_bytes(f"{self!r} kernel", shape, 4)
        area = self.kernel_size[0] * self.kernel_size[1]
        params = {"kernel": glorot_uniform(rng, shape, area * input_shape[2],
                                           area * self.filters)}
        if self.use_bias:
            params["bias"] = np.zeros(self.filters, np.float32)
        return params

    def forward(self, xp, params, x, training: bool = False, rng: Any = None,
                state: dict | None = None):
        g = self._geometry(x.shape[1:])
        cols = windows.gather(xp, x, g)  # (n, oh, ow, kh, kw, c)
        rows = cols.reshape(-1, cols[0, 0, 0].size)
        z = rows @ params["kernel"].reshape(rows.shape[1], self.filters)
        if self.use_bias:
            z += params["bias"]
        z = z.reshape(len(x), *g.out, self.filters)
        a = self.activation.forward(xp, z)
        return a, (rows, z, a, x.shape, g)

    def backward(self, xp, params, cache, da, input_grad: bool = True, out: dict | None = None):
        rows, z, a, shape, g = cache
        dz = self.activation.backward(xp, z, a, da).reshape(-1, self.filters)
        kernel = params["kernel"].reshape(rows.shape[1], self.filters)
        if out is None:
            grads = {"kernel": (rows.T @ dz).reshape(params["kernel"].shape)}
            if self.use_bias:
                grads["bias"] = dz.sum(axis=0)
        else:
            grads = out
            xp.matmul(rows.T, dz, out=out["kernel"].reshape(kernel.shape))
            if self.use_bias:
                dz.sum(axis=0, out=out["bias"])
        if not input_grad:
            return None, grads
        dcols = (dz @ kernel.T).reshape(shape[0], *g.out, *self.kernel_size, shape[3])
        return windows.scatter(xp, dcols, g, shape), grads

    def get_config(self) -> dict[str, Any]:
        return {"filters": self.filters, "kernel_size": list(self.kernel_size),
                **penalties_config(self), "strides": list(self.strides), "padding": self.padding,
                "activation": self.activation.name, "use_bias": bool(self.use_bias),
                "input_shape": list(self.input_shape) if self.input_shape else None}

    def __repr__(self) -> str:
        return (f"Conv2D({self.filters}, {self.kernel_size}, strides={self.strides}, "
                f"padding={self.padding!r}, activation={self.activation.name!r})")
