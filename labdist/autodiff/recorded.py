"""`Recorded`: an array a `GradientTape` saw being made, and how to send a gradient back.

Reverse-mode differentiation in the micrograd way, over whole arrays: each recorded array
keeps the arrays it was made from (`parents`) and a function that maps the gradient of the
result to the gradients of those parents. Arithmetic goes through numpy's ufunc protocol, so
`x @ w + b`, `np.exp(z)`, `loss * 0.5` record on a host replica (numpy) and on a GPU replica
(cupy) alike: the rules below use only the arrays' own operators and methods.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from labdist.devices import to_host

Backward = Callable[[Any], tuple]


@runtime_checkable
class Watchable(Protocol):
    """What a tape needs of a variable (`ld.Variable` is one): who it is, whether it is
    watched by default, the shape of its gradient, and its value as the tape sees it."""

    strategy_id: str
    id: int
    trainable: bool
    shape: tuple
    dtype: Any

    def read_value(self) -> Any: ...


class Recorded(NDArrayOperatorsMixin):
    """A value on a gradient tape. `data` is the plain array; `source` is the variable a
    leaf was read from (gradients are collected per variable)."""

    __slots__ = ("backward", "data", "parents", "source")
    __array_priority__ = 100

    def __init__(self, data: Any, parents: tuple = (), backward: Backward | None = None,
                 source: Any = None):
        self.data = data
        self.parents = parents
        self.backward = backward
        self.source = source

    # -- what an array answers ------------------------------------------------------------------
    shape = property(lambda self: tuple(self.data.shape))
    dtype = property(lambda self: self.data.dtype)
    ndim = property(lambda self: self.data.ndim)
    size = property(lambda self: self.data.size)

    def __len__(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:
        return f"<recorded {self.data!r}>"

    def __float__(self) -> float:
        return float(self.data)

    def __int__(self) -> int:
        return int(self.data)

    def __bool__(self) -> bool:
        return bool(self.data)

    def __array__(self, dtype=None, copy=None):
        """A host array of the value (what `np.asarray` of a recorded array gives: the
        recording stops there)."""
        return np.asarray(to_host(self.data), dtype=dtype)  # a device array: its host copy

    def numpy(self) -> np.ndarray:
        return self.__array__()

    # -- recorded methods ------------------------------------------------------------------------
    def sum(self, axis=None, keepdims: bool = False, **kwargs) -> Recorded:
        shape = self.shape

        def back(g):
            return (_expand(g, shape, axis, keepdims),)
        return Recorded(self.data.sum(axis=axis, keepdims=keepdims), (self,), back)

    def mean(self, axis=None, keepdims: bool = False, **kwargs) -> Recorded:
        if axis is None:
            count = self.size
        else:
            axes = (axis,) if isinstance(axis, int) else tuple(axis)
            count = int(np.prod([self.shape[a] for a in axes]))
        return self.sum(axis=axis, keepdims=keepdims) * (1.0 / max(count, 1))

    def reshape(self, *shape) -> Recorded:
        before = self.shape
        return Recorded(self.data.reshape(*shape), (self,), lambda g: (g.reshape(before),))

    def transpose(self, *axes) -> Recorded:
        axes = axes[0] if len(axes) == 1 and isinstance(axes[0], tuple | list) else axes
        order = tuple(axes) if axes else tuple(reversed(range(self.ndim)))
        undo = tuple(np.argsort(order))
        return Recorded(self.data.transpose(order), (self,), lambda g: (g.transpose(undo),))

    T = property(lambda self: self.transpose())

    def astype(self, dtype, **kwargs) -> Recorded:
        before = self.dtype
        return Recorded(self.data.astype(dtype), (self,), lambda g: (g.astype(before),))

    def __getitem__(self, index) -> Recorded:
        shape, dtype = self.shape, self.dtype
        index = index.data if isinstance(index, Recorded) else index

        def back(g):
            whole = _zeros_like(g, shape, dtype)
            _scatter_add(whole, index, g)
            return (whole,)
        return Recorded(self.data[index], (self,), back)

    # `loss += penalty` makes a new recorded value (an array written in place has no record)
    def __iadd__(self, other):
        return self + other

    def __isub__(self, other):
        return self - other

    def __imul__(self, other):
        return self * other

    def __itruediv__(self, other):
        return self / other

    # -- ufuncs ----------------------------------------------------------------------------------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method != "__call__" or kwargs.get("out") is not None:
            raise TypeError(f"a GradientTape cannot record np.{ufunc.__name__}.{method} or an "
                            "out= argument: write the result as a new array")
        inputs = tuple(x.read_value() if isinstance(x, Watchable) else x for x in inputs)
        values = [x.data if isinstance(x, Recorded) else x for x in inputs]
        out = ufunc(*values, **kwargs)
        rule = _RULES.get(ufunc.__name__)
        if rule is None:
            if ufunc.__name__ in _NOT_DIFFERENTIABLE:
                return out  # comparisons, signs, floors: no gradient flows through them
            raise TypeError(
                f"a GradientTape cannot differentiate np.{ufunc.__name__}; recorded are "
                f"{', '.join(sorted(_RULES))}, ld.nn and ld.math functions, and models and "
                "losses called on recorded values")
        parents = tuple(inputs)
        shapes = [np.shape(v) for v in values]

        def back(g):
            grads = rule(g, values, out)
            return tuple(None if gi is None else _unbroadcast(gi, s)
                         for gi, s in zip(grads, shapes, strict=True))
        return Recorded(out, parents, back)


def unwrap(value: Any) -> Any:
    """The plain array of a recorded value (anything else as it is)."""
    return value.data if isinstance(value, Recorded) else value


def node(data: Any, parents: tuple, backward: Backward) -> Recorded:
    """A recorded result of a computation the caller differentiates itself (a model's
    layers, a loss): `backward(g)` returns one gradient (or None) per parent."""
    return Recorded(data, parents, backward)


# -- the rules: gradient of the output -> gradients of the inputs --------------------------------
def _matmul(g, v, out):
    a, b = v
    if a.ndim == 1 and b.ndim == 1:
        return g * b, g * a
    if a.ndim == 1:
        return b @ g, a[:, None] * g[None, :] if b.ndim == 2 else None
    if b.ndim == 1:
        return g[..., None] * b, (a.reshape(-1, a.shape[-1]).T @ g.reshape(-1))
    return g @ b.swapaxes(-1, -2), a.swapaxes(-1, -2) @ g


def _power(g, v, out):
    a, b = v
    da = g * b * a ** (b - 1)
    db = None if isinstance(b, int | float) else g * out * _log(a)
    return da, db


def _log(a):
    return np.log(np.where(a > 0, a, 1))


_RULES: dict[str, Callable] = {
    "add": lambda g, v, out: (g, g),
    "subtract": lambda g, v, out: (g, -g),
    "multiply": lambda g, v, out: (g * v[1], g * v[0]),
    "true_divide": lambda g, v, out: (g / v[1], -g * v[0] / (v[1] * v[1])),
    "divide": lambda g, v, out: (g / v[1], -g * v[0] / (v[1] * v[1])),
    "negative": lambda g, v, out: (-g,),
    "positive": lambda g, v, out: (g,),
    "square": lambda g, v, out: (2 * v[0] * g,),
    "sqrt": lambda g, v, out: (g / (2 * out),),
    "exp": lambda g, v, out: (g * out,),
    "log": lambda g, v, out: (g / v[0],),
    "log1p": lambda g, v, out: (g / (1 + v[0]),),
    "tanh": lambda g, v, out: (g * (1 - out * out),),
    "absolute": lambda g, v, out: (g * np.sign(v[0]),),
    "maximum": lambda g, v, out: (g * (v[0] >= v[1]), g * (v[0] < v[1])),
    "minimum": lambda g, v, out: (g * (v[0] <= v[1]), g * (v[0] > v[1])),
    "matmul": _matmul,
    "power": _power,
}
_NOT_DIFFERENTIABLE = {"sign", "floor", "ceil", "rint", "equal", "not_equal", "less",
                       "less_equal", "greater", "greater_equal", "isfinite", "isnan",
                       "logical_and", "logical_or", "logical_not", "floor_divide"}


# -- shapes ----------------------------------------------------------------------------------
def _unbroadcast(g, shape: tuple):
    """Sum a gradient over the axes broadcasting added, back to the input's `shape`."""
    if np.shape(g) == tuple(shape):
        return g
    if not hasattr(g, "sum"):  # a Python number: the input was a scalar too
        return g
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    for axis, n in enumerate(shape):
        if n == 1 and g.shape[axis] != 1:
            g = g.sum(axis=axis, keepdims=True)
    return g


def _expand(g, shape: tuple, axis, keepdims: bool):
    """The gradient of a sum, spread back over the summed axes."""
    if axis is not None and not keepdims:
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        for a in sorted(a % len(shape) for a in axes):
            g = np.expand_dims(g, a)
    return np.broadcast_to(g, shape)


def _zeros_like(g, shape, dtype):
    return np.zeros_like(g, shape=shape, dtype=dtype)  # in g's array module (NEP 18)


def _scatter_add(whole, index, g) -> None:
    np.add.at(whole, index, g)  # cupy's arrays take numpy's ufunc methods too
