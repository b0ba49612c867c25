"""The names a TensorFlow program reaches at the top level, so the port rule (`tf.` -> `ld.`)
holds: dtypes (`ld.float32`, ...), `ld.constant`, `ld.cast` and `@ld.function`.

labdist has no graph mode: every step is Python on the replicas' workers, run as written, so
`@ld.function` is a pass-through (with or without TensorFlow's arguments, which it accepts
and ignores). `ld.constant` is a numpy array: what a step receives and returns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

float16, float32, float64 = np.float16, np.float32, np.float64
int8, int16, int32, int64 = np.int8, np.int16, np.int32, np.int64
uint8 = np.uint8
bool_ = np.bool_  # `ld.bool` too (set in labdist/__init__.py: `bool` is a builtin here)


def constant(value: Any, dtype: Any = None) -> np.ndarray:
    """TensorFlow's `tf.constant`: the value as an array (numpy's dtype rules, or `dtype`)."""
    return np.array(value, dtype=dtype)


def cast(x: Any, dtype: Any) -> Any:
    """TensorFlow's `tf.cast`: `x` as `dtype`, in the array module of the replica this runs
    on (numpy on the driver)."""
    from labdist.replica.replica_context import current

    ctx = current()
    return (np if ctx is None else ctx.xp).asarray(x).astype(dtype)


def function(func: Callable | None = None, **tf_arguments: Any) -> Callable:
    """TensorFlow's `@tf.function`, as a pass-through: `@ld.function`,
    `@ld.function(jit_compile=True)` and `ld.function(f)` all give `f` back unchanged (there is
    no graph to trace; the step runs eagerly on every replica, which is also what TensorFlow
    does under `tf.config.run_functions_eagerly(True)`)."""
    if func is None:
        return lambda f: f
    if not callable(func):
        raise TypeError(f"ld.function takes a function; got {func!r}")
    return func


# -- tf.math at the top level: on arrays, variables and values a tape records -----------------
def _value(x: Any) -> Any:
    """A variable's value (recorded on an open tape), else `x` itself."""
    from labdist.variables import Variable

    return x.read_value() if isinstance(x, Variable) else x


def reduce_sum(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    return np.sum(_value(x), axis=axis, keepdims=keepdims)  # a recorded value's own sum


def reduce_mean(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    return np.mean(_value(x), axis=axis, keepdims=keepdims)


def add_n(inputs: list) -> Any:
    """The sum of a non-empty list of same-shaped values (TensorFlow's `tf.add_n`)."""
    inputs = list(inputs)
    if not inputs:
        raise ValueError("add_n takes a non-empty list of values (got an empty one)")
    total = _value(inputs[0])
    for x in inputs[1:]:
        total = total + _value(x)
    return total


def square(x: Any) -> Any:
    return np.square(_value(x))


def sqrt(x: Any) -> Any:
    return np.sqrt(_value(x))


def exp(x: Any) -> Any:
    return np.exp(_value(x))


def log(x: Any) -> Any:
    return np.log(_value(x))


def matmul(a: Any, b: Any) -> Any:
    return np.matmul(_value(a), _value(b))


def maximum(a: Any, b: Any) -> Any:
    return np.maximum(_value(a), _value(b))
