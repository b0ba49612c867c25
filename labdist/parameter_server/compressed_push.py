"""Compressed parameter-server pushes. A worker encodes each update it pushes (assign_add,
assign_sub, gradient: changes, which error feedback can carry over) with its compressor and
keeps what compression dropped, per variable, for its next push; the store decodes a push
before anything else sees it, so locking, staleness and sync steps work as for a plain push.
An `assign` (a whole value) always travels as it is."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from labdist.collectives.compression import Compressor, PowerSGD, initial_q, orthonormal_columns
from labdist.parameter_server.push import Push

COMPRESSIBLE = ("assign_add", "assign_sub", "gradient")


def array_bytes(x: Any) -> int:
    """The array bytes of a payload (arrays, or tuples of them)."""
    if isinstance(x, np.ndarray | np.generic):
        return int(x.nbytes)
    if isinstance(x, list | tuple):
        return sum(array_bytes(v) for v in x)
    if isinstance(x, Packed):
        return array_bytes(x.payload)
    return 0


@dataclass(frozen=True)
class Packed:
    """One compressed update as it travels: the compressor, its payload, and the update's
    shape and dtype (what the store rebuilds)."""

    compressor: Compressor
    payload: Any
    shape: tuple[int, ...]
    dtype: str

    def decode(self) -> np.ndarray:
        like = np.zeros(self.shape, self.dtype)
        if isinstance(self.compressor, PowerSGD):
            p, q = self.payload
            return (p @ q.T).reshape(self.shape).astype(self.dtype, copy=False)
        return self.compressor.decode_sum(np, [self.payload], like)


def unpack(items: list[Push]) -> list[Push]:
    """(store side) A push's items with every compressed update decoded."""
    if not any(isinstance(p.value, Packed) for p in items):
        return items
    return [p.carrying(p.value.decode()) if isinstance(p.value, Packed) else p for p in items]


@dataclass
class Pending:
    """What one push owes error feedback until it is known to have landed, per variable:
    the residual it took, the residual it leaves, PowerSGD's next warm-start factor, and its
    (raw, sent) bytes."""

    taken: dict[int, np.ndarray] = field(default_factory=dict)
    new: dict[int, np.ndarray] = field(default_factory=dict)
    factors: dict[int, np.ndarray] = field(default_factory=dict)
    bytes: dict[int, tuple[int, int]] = field(default_factory=dict)

    def count(self, var_id: int, raw: int, sent: int) -> None:
        had = self.bytes.get(var_id, (0, 0))
        self.bytes[var_id] = (had[0] + raw, had[1] + sent)


class PushCompression:
    """(worker side) The compressor of this worker's pushes, its error-feedback residuals
    and PowerSGD factors (per variable), and the bytes its updates took before and after."""

    def __init__(self):
        self.compressor: Compressor | None = None
        self.residuals: dict[int, np.ndarray] = {}
        self.factors: dict[int, np.ndarray] = {}
        self.raw_bytes = 0  # what the pushed updates would have taken uncompressed
        self.sent_bytes = 0  # what they took
        self._lock = threading.Lock()  # a worker runs several functions at once

    def set(self, compressor: Compressor | None) -> None:
        """Switch (residuals stay: they go out with the next push, compressed or not)."""
        with self._lock:
            if compressor != self.compressor:
                self.factors.clear()
            self.compressor = compressor

    def stats(self) -> dict[str, Any]:
        with self._lock:
            norm = float(np.sqrt(sum(float((r * r).sum()) for r in self.residuals.values())))
            return {"raw_bytes": self.raw_bytes, "sent_bytes": self.sent_bytes,
                    "residual_norm": norm}

    def encode(self, items: list[Push]) -> tuple[list[Push], Pending]:
        """A push's items as they travel, and what the push owes error feedback once it is
        known to have landed (`commit`) or not (`abort`). Until then the residuals it used
        are held by the push, not by the worker: a concurrent push does not send them too."""
        pending = Pending()
        with self._lock:
            if self.compressor is None and not self.residuals:
                for p in items:
                    pending.count(p.var_id, array_bytes(p.value), array_bytes(p.value))
                return items, pending
            try:
                return [self._one(pending, p) for p in items], pending
            except BaseException:  # e.g. a dtype the compressor refuses: nothing taken
                for v, r in pending.taken.items():
                    self._add(v, r)
                raise

    def commit(self, pending: Pending, var_ids) -> None:
        """The updates of `var_ids` landed: their new residuals, warm-start factors and bytes
        count."""
        with self._lock:
            for v in var_ids:
                raw, sent = pending.bytes.pop(v, (0, 0))
                self.raw_bytes += raw
                self.sent_bytes += sent
                if v in pending.new:
                    self._add(v, pending.new.pop(v))
                if v in pending.factors:
                    self.factors[v] = pending.factors.pop(v)
                pending.taken.pop(v, None)

    def abort(self, pending: Pending, var_ids) -> None:
        """The updates of `var_ids` did not land (a lost parameter server): the residuals
        they took are owed again, as they were, and PowerSGD's warm-start factors stay as they
        were, so a retry neither loses nor repeats anything and starts where this push did."""
        with self._lock:
            for v in var_ids:
                pending.bytes.pop(v, None)
                pending.new.pop(v, None)
                pending.factors.pop(v, None)
                if v in pending.taken:
                    self._add(v, pending.taken.pop(v))

    def _add(self, var_id: int, residual: np.ndarray) -> None:
        had = self.residuals.get(var_id)  # another push's, committed meanwhile
        self.residuals[var_id] = residual if had is None else had + residual

    def _one(self, pending: Pending, push: Push) -> Push:
        comp = self.compressor
        var_id, kind, a = push.var_id, push.kind, push.value
        if kind not in COMPRESSIBLE:
            pending.count(var_id, a.nbytes, a.nbytes)
            return push
        r = pending.new.pop(var_id, None)  # the same variable written twice in one push
        if r is None:
            r = self.residuals.pop(var_id, None)
            if r is not None:
                pending.taken[var_id] = r
        m = a + r if r is not None else a
        if comp is None:  # residuals still owed: sent in full, once
            pending.count(var_id, a.nbytes, m.nbytes)
            return push.carrying(m)
        comp.check_dtype(m.dtype, f"a parameter-server push ({kind})")
        if isinstance(comp, PowerSGD):
            if not comp.compresses(m.shape):  # vectors travel as they are
                pending.count(var_id, a.nbytes, m.nbytes)
                return push.carrying(m)
            payload, residual = self._power(comp, pending, var_id, m)
        else:
            payload, sent = comp.encode(np, m, var_id)
            residual = comp.residual(np, m, payload, sent)
        if comp.error_feedback:
            pending.new[var_id] = residual
        packed = Packed(comp, payload, tuple(m.shape), m.dtype.str)
        pending.count(var_id, a.nbytes, array_bytes(payload))
        return push.carrying(packed)

    def _power(self, comp: PowerSGD, pending: Pending, var_id: int, m: np.ndarray
               ) -> tuple[tuple, np.ndarray]:
        """One power-iteration step on this worker's own update (no peers to sum with):
        P = orthonormal(M Q), Q' = M^T P; sent (P, Q'), the update ~ P Q'^T. Q' warm-starts
        the variable's next push once this one lands (`commit`)."""
        mat = m.reshape(m.shape[0], -1)
        rank = min(comp.rank, *mat.shape)
        q = pending.factors.get(var_id)  # the same variable written twice in one push
        if q is None:
            q = self.factors.get(var_id)
        if q is None or q.shape != (mat.shape[1], rank):
            q = initial_q(mat.shape[1], rank, var_id).astype(mat.dtype)
        p = orthonormal_columns(np, mat @ q)
        q = mat.T @ p
        pending.factors[var_id] = q
        return (p, q), (mat - p @ q.T).reshape(m.shape)
