"""`strategy.reduce` on the driver (SEMANTICS.md §3): pure numpy, no cluster involved."""

from __future__ import annotations

from typing import Any

import numpy as np

from labdist.enums import ReduceOp
from labdist.values import PerReplica


def reduce_per_replica(op: ReduceOp, components: list[Any], axis: int | None) -> np.ndarray:
    arrays = [np.asarray(c) for c in components]
    if axis is None:
        shapes = [a.shape for a in arrays]
        if any(s != shapes[0] for s in shapes):
            listed = ", ".join(f"replica {r} has {s}" for r, s in enumerate(shapes))
            raise ValueError(
                f"strategy.reduce(axis=None) needs equal shapes across replicas, but {listed}; "
                "pass axis=k to reduce along a dimension first"
            )
        total = arrays[0].copy() if len(arrays) == 1 else np.add(arrays[0], arrays[1])
        for a in arrays[2:]:
            total = np.add(total, a)
        return total / len(arrays) if op is ReduceOp.MEAN else total
    for r, a in enumerate(arrays):
        _check_axis(axis, a, f"replica {r}'s value")
    total = _sum_components([a.sum(axis=axis) for a in arrays])
    if op is ReduceOp.SUM:
        return total
    count = sum(a.shape[axis] for a in arrays)
    return total / count  # the mean over every element of every replica along `axis`


def reduce_constant(op: ReduceOp, value: Any, axis: int | None, num_replicas: int) -> Any:
    """A non-distributed value: the same on every replica."""
    if axis is None:
        if op is ReduceOp.MEAN or num_replicas == 1:
            return value
        raise ValueError(
            f"strategy.reduce(SUM, value, axis=None): value={value!r} is not a per-replica "
            f"value, so its sum over {num_replicas} replicas is ambiguous; pass a PerReplica "
            "(e.g. the result of strategy.run) or use ReduceOp.MEAN"
        )
    a = np.asarray(value)
    _check_axis(axis, a, "value")
    if op is ReduceOp.MEAN:
        return a.mean(axis=axis)
    return a.sum(axis=axis) * num_replicas


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


def _sum_components(parts: list[np.ndarray]) -> np.ndarray:
    shapes = [p.shape for p in parts]
    if any(s != shapes[0] for s in shapes):
        raise ValueError(f"strategy.reduce: the replicas' values differ beyond the reduced axis: "
                         f"{shapes}")
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    return total
