"""Activations: forward(xp, z) -> a, and backward(xp, z, a, da) -> dz."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple


class Activation(NamedTuple):
    name: str
    forward: Callable
    backward: Callable


def _linear_backward(xp, z, a, da):
    return da


def _relu_forward(xp, z):
    return xp.maximum(z, 0)


def _relu_backward(xp, z, a, da):
    return da * (z > 0)


def _sigmoid_forward(xp, z):
    return 1 / (1 + xp.exp(-z))


def _sigmoid_backward(xp, z, a, da):
    return da * a * (1 - a)


def _tanh_backward(xp, z, a, da):
    return da * (1 - a * a)


def _softmax_forward(xp, z):
    e = xp.exp(z - z.max(axis=-1, keepdims=True))  # shifted: no overflow
    return e / e.sum(axis=-1, keepdims=True)


def _softmax_backward(xp, z, a, da):
    return a * (da - (da * a).sum(axis=-1, keepdims=True))


ACTIVATIONS = {
    "linear": Activation("linear", lambda xp, z: z, _linear_backward),
    "relu": Activation("relu", _relu_forward, _relu_backward),
    "sigmoid": Activation("sigmoid", _sigmoid_forward, _sigmoid_backward),
    "tanh": Activation("tanh", lambda xp, z: xp.tanh(z), _tanh_backward),
    "softmax": Activation("softmax", _softmax_forward, _softmax_backward),
}


def get(name: str | None) -> Activation:
    """The activation called `name` (None means linear)."""
    key = "linear" if name is None else name
    if not isinstance(key, str) or key.lower() not in ACTIVATIONS:
        raise ValueError(
            f"activation={name!r} is not supported; allowed: None, {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[key.lower()]
