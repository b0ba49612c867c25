"""Layers as small objects with pure forward/backward functions over explicit parameters.

`build(input_dim, rng)` returns the initial parameters as host arrays (a model stores them in
distributed variables); `forward(xp, params, x, training, rng)` returns the output and a cache;
`backward(xp, params, cache, dy)` returns the input gradient and the parameter gradients
(written into `out`, {name: array}, where given: a training step's persistent buffer).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from labdist import checks, shipping
from labdist.training import activations


class Dense:
    """y = activation(x @ kernel + bias), with Keras' glorot-uniform kernel and zero bias."""

    def __init__(self, units: int, activation: str | None = None,
                 input_shape: tuple[int, ...] | None = None, use_bias: bool = True):
        units = checks.integer("units", units, 1)
        if input_shape is not None and (
                not isinstance(input_shape, tuple) or len(input_shape) != 1
                or isinstance(input_shape[0], bool) or not isinstance(input_shape[0], int)
                or input_shape[0] < 1):
            checks.refuse("input_shape", input_shape, "a 1-tuple of a positive integer, like "
                          "(64,)")
        self.units = units
        self.activation = activations.get(activation)
        self.input_shape = input_shape
        self.use_bias = checks.boolean("use_bias", use_bias)

    def build(self, input_dim: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        checks.array_bytes(f"Dense(units={self.units}) kernel", (input_dim, self.units), 4)
        limit = np.sqrt(6.0 / (input_dim + self.units))
        params = {"kernel": rng.uniform(-limit, limit, (input_dim, self.units))
                  .astype(np.float32)}
        if self.use_bias:
            params["bias"] = np.zeros(self.units, np.float32)
        return params

    def forward(self, xp, params, x, training: bool = False, rng: Any = None):
        z = x @ params["kernel"]
        if self.use_bias:
            z = z + params["bias"]
        a = self.activation.forward(xp, z)
        return a, (x, z, a)

    def backward(self, xp, params, cache, da, input_grad: bool = True, out: dict | None = None):
        """(d loss / d input, {name: d loss / d param}); the first layer of a model passes
        input_grad=False and gets None instead of a gradient nobody uses (a whole matmul)."""
        x, z, a = cache
        return self.backward_linear(xp, params, x, self.activation.backward(xp, z, a, da),
                                    input_grad, out)

    def backward_linear(self, xp, params, x, dz, input_grad: bool = True,
                        out: dict | None = None):
        """From the gradient of the pre-activation `dz` (e.g. softmax + cross-entropy fused);
        with `out`, the parameter gradients are written there (the same bits)."""
        if out is None:
            grads = {"kernel": x.T @ dz}
            if self.use_bias:
                grads["bias"] = dz.sum(axis=0)
        else:
            grads = out
            xp.matmul(x.T, dz, out=out["kernel"])
            if self.use_bias:
                dz.sum(axis=0, out=out["bias"])
        return (dz @ params["kernel"].T if input_grad else None), grads

    def __repr__(self) -> str:
        return f"Dense({self.units}, activation={self.activation.name!r})"


class Dropout:
    """Zeroes a fraction `rate` of inputs while training, scaling the rest by 1 / (1 - rate)."""

    def __init__(self, rate: float):
        self.rate = checks.fraction("rate", rate)

    def build(self, input_dim: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {}

    def forward(self, xp, params, x, training: bool = False, rng: Any = None):
        if not training or self.rate == 0:
            return x, None
        draw = (rng or xp.random).random(x.shape)
        mask = (draw >= self.rate).astype(x.dtype) / (1 - self.rate)
        return x * mask, mask

    def backward(self, xp, params, cache, dy, input_grad: bool = True, out: dict | None = None):
        if not input_grad:
            return None, {}
        return (dy if cache is None else dy * cache), {}

    def __repr__(self) -> str:
        return f"Dropout({self.rate})"


for _cls in (Dense, Dropout):  # a step holding its layers is pickled again only on change
    shipping.register_state(_cls)
