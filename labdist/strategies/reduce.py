"""`strategy.reduce` on the driver: pure numpy, no cluster involved."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from labdist import aggregation
from labdist.enums import ReduceOp
from labdist.values import PerReplica


def reduce_per_replica(op: ReduceOp, components: list[Any], axis: int | None) -> np.ndarray:
    """Fold the components in replica order with `op`'s row of the aggregation table,
    promoting dtypes as they meet (components need not share one)."""
    agg = aggregation.of(op)
    for r, c in enumerate(components):
        if isinstance(c, dict) or (isinstance(c, tuple) and hasattr(c, "_fields")):
            raise TypeError(
                f"strategy.reduce({op.name}): replica {r}'s component is a {type(c).__name__}, "
                "a structure, not an array; reduce a structure of PerReplica values instead "
                "(what experimental_distribute_values_from_function and strategy.run return)")
    arrays = [np.asarray(c) for c in components]
    for r, (c, a) in enumerate(zip(components, arrays, strict=True)):
        aggregation.check_numeric(c, a.dtype, f"strategy.reduce({op.name}), replica {r}'s value")
    if axis is None:
        shapes = [a.shape for a in arrays]
        if any(s != shapes[0] for s in shapes):
            listed = ", ".join(f"replica {r} has {s}" for r, s in enumerate(shapes))
            raise ValueError(
                f"strategy.reduce(axis=None) needs equal shapes across replicas, but {listed}; "
                "pass axis=k to reduce along a dimension first"
            )
        total = arrays[0].copy() if len(arrays) == 1 else functools.reduce(agg.fold, arrays)
        return agg.finish(total, len(arrays))
    for r, a in enumerate(arrays):
        _check_axis(axis, a, f"replica {r}'s value")
    # dtype=: numpy's add.reduce widens small integers (int32 -> int64); TensorFlow keeps them
    total = _fold_components(agg, [agg.fold.reduce(a, axis=axis, dtype=a.dtype)
                                    for a in arrays])
    # MEAN: over every element of every replica along `axis`
    return agg.finish(total, sum(a.shape[axis] for a in arrays))


def reduce_constant(op: ReduceOp, value: Any, axis: int | None, num_replicas: int) -> Any:
    """A non-distributed value: the same on every replica."""
    agg = aggregation.of(op)
    a = np.asarray(value)
    aggregation.check_numeric(value, a.dtype, f"strategy.reduce({op.name})")
    if axis is None:
        if agg.divides or num_replicas == 1:
            return value
        raise ValueError(
            f"strategy.reduce(SUM, value, axis=None): value={value!r} is not a per-replica "
            f"value, so its sum over {num_replicas} replicas is ambiguous; pass a PerReplica "
            "(e.g. the result of strategy.run) or use ReduceOp.MEAN"
        )
    _check_axis(axis, a, "value")
    if agg.divides:
        return a.mean(axis=axis)
    return agg.fold.reduce(a, axis=axis, dtype=a.dtype) * num_replicas


def reduce_value(op: ReduceOp, value: Any, axis: int | None, num_replicas: int) -> Any:
    if isinstance(value, PerReplica):
        return reduce_per_replica(op, list(value.values), axis)
    return reduce_constant(op, value, axis, num_replicas)


def _check_axis(axis: int, a: np.ndarray, what: str) -> None:
    if not isinstance(axis, int | np.integer) or not -a.ndim <= axis < max(a.ndim, 1):
        raise ValueError(
            f"axis={axis!r} is out of range for {what} of shape {a.shape}; allowed: None or an "
            f"integer in [{-a.ndim}, {a.ndim - 1}]"
        )


def _fold_components(agg, parts: list[np.ndarray]) -> np.ndarray:
    shapes = [p.shape for p in parts]
    if any(s != shapes[0] for s in shapes):
        raise ValueError(f"strategy.reduce: the replicas' values differ beyond the reduced axis: "
                         f"{shapes}")
    return functools.reduce(agg.fold, parts)
