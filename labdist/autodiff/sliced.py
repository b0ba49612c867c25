"""`SlicedGradient`: a gradient that came as one slice per lookup (an `Embedding` table's,
TensorFlow's IndexedSlices), kept dense, with the sum of its slices' squares beside it.

Keras 3's Adam, Adagrad and RMSprop square such a gradient slice by slice, so a row looked up
twice adds two squares to its second moment, not the square of the sum. The tape hands the
table's gradient out as this array (numpy replicas); `apply_gradients` finds `squared` on it
and gives it to the second moments. Anything computed from it (`g * 0.5`, a clip) is a plain
gradient again: its squares would no longer be the slices' own.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class SlicedGradient(np.ndarray):
    """The dense gradient (each row the sum of its lookups' slices), with `squared`: per
    element, the sum of the slices' squares (None once the array was computed on)."""

    squared: Any

    def __new__(cls, dense: np.ndarray, squared: np.ndarray) -> SlicedGradient:
        out = np.asarray(dense).view(cls)
        out.squared = squared
        return out

    def __array_finalize__(self, obj: Any) -> None:
        self.squared = None  # a view or a result: no longer the slices' own gradient

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """Arithmetic gives plain arrays (a scaled gradient's squares are not the slices')."""
        plain = tuple(np.asarray(x) if isinstance(x, SlicedGradient) else x for x in inputs)
        if "out" in kwargs:
            kwargs["out"] = tuple(np.asarray(x) if isinstance(x, SlicedGradient) else x
                                  for x in kwargs["out"])
        return getattr(ufunc, method)(*plain, **kwargs)

    def astype(self, dtype, *args, **kwargs) -> np.ndarray:
        """The same gradient in `dtype`, its squares too (the tape casts to the variable's)."""
        dense = np.asarray(self).astype(dtype, *args, **kwargs)
        if self.squared is None:
            return dense
        return SlicedGradient(dense, np.asarray(self.squared).astype(dtype))

    def __reduce__(self):
        return (_rebuild, (np.asarray(self), self.squared))


def _rebuild(dense: np.ndarray, squared: Any) -> Any:
    return dense if squared is None else SlicedGradient(dense, squared)


def squares_of(gradient: Any) -> Any:
    """The slices' summed squares a gradient carries (None: square the gradient itself)."""
    return gradient.squared if isinstance(gradient, SlicedGradient) else None


def add(a: Any, b: Any) -> Any:
    """Two gradients of one value summed (a table used twice): sliced when both are."""
    sa, sb = squares_of(a), squares_of(b)
    total = a + b  # a plain array (SlicedGradient's arithmetic drops the squares)
    if sa is None or sb is None:
        return total
    return SlicedGradient(total, sa + sb)
