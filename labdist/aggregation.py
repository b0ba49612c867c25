"""The aggregation modes in one table, keyed by `VariableAggregation` / `ReduceOp` name.

Every path that combines replicas' values (host collectives, NCCL, `strategy.reduce`, variable
reads, a sync parameter server) asks its row here, so a mode means the same thing everywhere
and a new mode is one new row (plus its enum member).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from labdist.enums import ReduceOp, VariableAggregation


@dataclass(frozen=True)
class Aggregation:
    """One mode. Values always combine in rank order, so every replica gets the same bits."""

    name: str
    fold: np.ufunc | None = None  # combines two values (np.add); None: values are not folded
    first_only: bool = False  # the result is rank 0's value (a broadcast)
    divides: bool = False  # the fold's result is divided by the number of values (MEAN)
    nccl_op: str | None = None  # cupy.cuda.nccl's op for `fold` (first_only: a broadcast)

    @property
    def reduces(self) -> bool:
        """Whether many values make one (NONE leaves each replica its own)."""
        return self.fold is not None or self.first_only

    def combine(self, parts: list[Any], out: np.ndarray | None = None) -> np.ndarray:
        """Combine host arrays given in rank order; with `out` (of `result_dtype`), in there.

        The fold accumulates in place, in the dtype of the first two parts' result.
        """
        if not self.reduces:
            raise ValueError(f"aggregation {self.name} does not combine values")
        if self.first_only or len(parts) == 1:  # a copy: parts may be views of a peer's area
            acc = np.array(parts[0], copy=True) if out is None else _copy_into(out, parts[0])
            if self.first_only:
                return acc
        else:  # a ufunc of 0-d arrays gives a scalar: make it an array we can fold into
            acc = np.asarray(self.fold(parts[0], parts[1], out=out))
        for p in parts[2:]:
            self.fold(acc, p, out=acc)
        if self.divides:
            acc = acc / len(parts) if out is None else np.true_divide(acc, len(parts), out=acc)
        return acc

    def finish(self, total: Any, count: int) -> Any:
        """What a fold of `count` values becomes (MEAN divides it)."""
        return total / count if self.divides else total

    def result_dtype(self, dtype: Any) -> np.dtype:
        """The dtype `combine` gives for parts of `dtype` (the MEAN of integers is float64)."""
        return _result_dtype(self, np.dtype(dtype))

    def keeps_dtype(self, dtype: Any) -> bool:
        """Whether combining values of `dtype` gives `dtype` again (a variable can hold it)."""
        return not self.reduces or self.result_dtype(dtype) == np.dtype(dtype)

    def nccl_can(self, dtype: Any) -> bool:
        """Whether NCCL gives what `combine` gives for `dtype`. NCCL keeps the dtype, so modes
        that change it (integer MEAN) stay on the host path."""
        return (self.nccl_op is not None or self.first_only) and self.keeps_dtype(dtype)

    def ps_values(self, arrays: list[np.ndarray], weights: list[float] | None = None
                  ) -> list[np.ndarray]:
        """What a sync parameter server applies to a variable for the workers' values (in key
        order): each in turn (NONE), the first, or one combined value of the variable's dtype.

        `weights`: how many examples each value stands for. MEAN is then the mean over
        examples, not over workers (what MirroredStrategy computes when shards differ in
        size); equal or all-zero weights give the plain mean. Other modes ignore them."""
        if not self.reduces:
            return list(arrays)
        if self.first_only:
            return [arrays[0]]
        dtype = np.asarray(arrays[0]).dtype
        if not self.keeps_dtype(dtype):
            raise ValueError(f"aggregation {self.name} of {dtype.name} values: the result "
                             f"would be {self.result_dtype(dtype).name}, not {dtype.name}")
        if self.divides and weights is not None and len(set(weights)) > 1 and sum(weights) > 0:
            return [_weighted_mean(arrays, weights, dtype)]
        return [self.combine(arrays, out=np.empty_like(arrays[0]))]


def check_numeric(value: Any, dtype: Any, what: str) -> None:
    """Only numbers combine across replicas: numpy would happily "sum" strings (concatenate
    them) or booleans (a logical or), which no replica asked for. TensorFlow refuses both."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iufc":
        return
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise TypeError(
        f"{what}: {shown} of type {type(value).__name__} (dtype {dtype}) cannot be combined "
        "across replicas; allowed: numbers and numeric arrays (int, uint, float, complex). "
        "Cast booleans first (x.astype('int32')); return other objects from the step "
        "instead (strategy.run gives one per replica)")


def _weighted_mean(arrays: list[np.ndarray], weights: list[float], dtype: np.dtype
                   ) -> np.ndarray:
    """sum(w * a) / sum(w), accumulated in (at least) float64 in key order, stored as `dtype`."""
    wide = np.result_type(dtype, np.float64)
    acc = np.zeros(np.shape(arrays[0]), wide)
    for a, w in zip(arrays, weights, strict=True):
        if w:
            acc += np.multiply(a, w, dtype=wide)
    acc /= sum(weights)
    return acc.astype(dtype, copy=False)


def _copy_into(out: np.ndarray, value: Any) -> np.ndarray:
    np.copyto(out, value)
    return out


TABLE: dict[str, Aggregation] = {
    "NONE": Aggregation("NONE"),
    "SUM": Aggregation("SUM", fold=np.add, nccl_op="NCCL_SUM"),
    "MEAN": Aggregation("MEAN", fold=np.add, divides=True, nccl_op="NCCL_SUM"),
    "ONLY_FIRST_REPLICA": Aggregation("ONLY_FIRST_REPLICA", first_only=True),
}


def of(mode: VariableAggregation | ReduceOp | str, parameter: str = "aggregation"
       ) -> Aggregation:
    """The row of `mode`: an enum member, or a name of one (parsed case-insensitively)."""
    if not isinstance(mode, VariableAggregation | ReduceOp):
        mode = VariableAggregation.parse(mode, parameter)
    return TABLE[mode.name]


@functools.cache
def _result_dtype(agg: Aggregation, dtype: np.dtype) -> np.dtype:
    """Worked out once per (mode, dtype): collectives ask on every call."""
    return agg.combine([np.empty(0, dtype)] * 2).dtype
