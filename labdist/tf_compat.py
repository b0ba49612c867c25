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
