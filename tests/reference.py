"""A single-process reference of docs/semantics.md §2, written from the spec's tables alone.

Like micrograd's tests against PyTorch: labdist's distributed results are compared with what
this tiny model says, for every synchronization x aggregation x operation x context.
"""

from __future__ import annotations

import numpy as np

MODES = ("assign", "assign_add", "assign_sub")


class SpecError(Exception):
    """The spec says this combination raises (ValueError)."""


def _apply(copy, mode, x):
    if mode == "assign":
        return np.asarray(x, dtype=copy.dtype).copy()
    if mode == "assign_add":
        return (copy + x).astype(copy.dtype)
    return (copy - x).astype(copy.dtype)


class RefVariable:
    def __init__(self, initial, n, sync, agg, dtype="float32"):
        self.n, self.agg = n, agg
        self.sync = "ON_WRITE" if sync == "AUTO" else sync
        self.copies = [np.array(initial, dtype=dtype) for _ in range(n)]

    # -- replica context: x[r] is replica r's value --------------------------------------------
    def replica_update(self, mode, xs, constant=False):
        if self.sync == "ON_WRITE" and self.agg != "NONE":
            if constant:
                x = xs[0]
                if self.agg == "SUM" and self.n > 1 and np.any(x):
                    raise SpecError("non-distributed SUM")
                applied = [np.zeros_like(np.asarray(x)) if not np.any(x) else x] * self.n
            elif self.agg == "SUM":
                applied = [sum(np.asarray(x, dtype=np.float64) for x in xs)] * self.n
            elif self.agg == "MEAN":
                applied = [sum(np.asarray(x, dtype=np.float64) for x in xs) / self.n] * self.n
            else:  # ONLY_FIRST_REPLICA
                applied = [xs[0]] * self.n
        else:  # ON_READ, NONE, or aggregation NONE: each copy applies its own value
            applied = list(xs)
        self.copies = [_apply(c, mode, a) for c, a in zip(self.copies, applied, strict=True)]
        return [c.copy() for c in self.copies]

    def diverged(self):
        return any(not np.array_equal(c, self.copies[0]) for c in self.copies)

    # -- cross-replica context ------------------------------------------------------------------
    def read(self):
        if self.sync == "NONE":
            raise SpecError("NONE has no cross-replica value")
        if self.sync == "ON_WRITE" or self.agg == "ONLY_FIRST_REPLICA":
            return self.copies[0]
        if self.agg == "NONE":
            raise SpecError("ON_READ NONE read")
        total = sum(self.copies[1:], self.copies[0])
        return total if self.agg == "SUM" else total / self.n

    def cross_update(self, mode, x):
        if self.sync == "ON_READ" and (
                self.agg == "NONE" or (self.agg == "SUM" and mode != "assign")):
            raise SpecError("not allowed in cross-replica context")
        if self.sync == "ON_READ" and self.agg == "SUM":
            dtype = self.copies[0].dtype
            share = np.trunc(x / self.n) if dtype.kind in "iu" else np.asarray(x) / self.n
            self.copies = [np.asarray(share, dtype=dtype) for _ in self.copies]
        else:
            self.copies = [_apply(c, mode, x) for c in self.copies]
        return None if self.sync == "NONE" else self.read()
