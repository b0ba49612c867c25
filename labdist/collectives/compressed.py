"""The compressed gradient all-reduce, and the per-replica state it keeps.

Where a replica's gradients meet the collective (a communication hook, as in DDP): each
gradient plus this replica's error-feedback residual is compressed, the messages travel to
every peer (one round; PowerSGD: two), every replica decodes and sums them in rank order (so
all end bit-identical), and what compression dropped becomes the new residual:
`sent + residual == gradient + previous residual`, exactly, on every replica.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from labdist.collectives.algorithms import check_signatures, signature
from labdist.collectives.compression import Compressor, PowerSGD, initial_q, orthonormal_columns


class CompressionState:
    """One replica's compressor and what it carries between steps: error-feedback residuals
    and PowerSGD's warm-start factors, keyed by (collective, gradient index, shape)."""

    def __init__(self):
        self.compressor: Compressor | None = None
        self.residuals: dict[tuple, Any] = {}
        self.factors: dict[tuple, Any] = {}
        self.reductions = 0  # compressed all-reduces made

    def set(self, compressor: Compressor | None) -> None:
        """Switch compressors (at a step boundary). Residuals stay: they are gradient not yet
        applied, and go out with the next gradient whatever the compressor (the next
        uncompressed all-reduce sends them in full); PowerSGD's factors are dropped when the
        compressor changes."""
        if compressor != self.compressor:
            self.factors.clear()
        self.compressor = compressor

    def active(self, what: str) -> bool:
        """Whether the next gradient all-reduce of collective `what` must come here: a
        compressor is set, or residuals of `what` are still owed."""
        return self.compressor is not None or any(k[0] == what for k in self.residuals)

    def residual_norm(self) -> float:
        """The 2-norm of every residual together (0.0 with none)."""
        total = 0.0
        for r in self.residuals.values():
            total += float((r * r).sum())
        return math.sqrt(total)


def compressed_sum(comm, seq: int, what: str, arrays: list[Any], state: CompressionState,
                   backend, extras: list[Any] = ()) -> tuple[list[Any], list[Any]]:
    """Sum `arrays` (gradients) over the replicas through `state.compressor`, with error
    feedback; `extras` (small arrays: fit's loss and accuracy) ride along uncompressed in the
    first message. Returns (summed gradients, summed extras), arrays of `backend`."""
    xp = backend.xp
    comp = state.compressor
    keys = [(what, i, tuple(a.shape)) for i, a in enumerate(arrays)]
    if comp is not None:
        for a in arrays:
            comp.check_dtype(a.dtype, what)
    inputs = []
    for key, a in zip(keys, arrays, strict=True):
        r = state.residuals.pop(key, None)
        inputs.append(a + r if r is not None else a)
    state.residuals = {k: v for k, v in state.residuals.items() if k[0] != what}
    if isinstance(comp, PowerSGD):
        summed, sent = _power_sum(comm, seq, what, inputs, keys, comp, state, backend, extras)
    else:
        summed, sent = _one_round(comm, seq, what, inputs, keys, comp, backend, extras)
    if comp is not None:
        state.reductions += 1
        if comp.error_feedback:
            for key, m, (payload, s) in zip(keys, inputs, sent, strict=True):
                if s is not m:
                    state.residuals[key] = comp.residual(xp, m, payload, s)
    return summed[:len(arrays)], summed[len(arrays):]


def _exchange(comm, seq, what, phase, sig_arrays, payload):
    got = comm.exchange(seq, signature(what, sig_arrays), payload, what, phase=phase)
    check_signatures([s for s, _ in got], what)
    return [p for _, p in got]


def _to_host(backend, tree):
    if isinstance(tree, tuple):
        return tuple(backend.to_host(a) for a in tree)
    return backend.to_host(tree)


def _to_device(backend, tree):
    if isinstance(tree, tuple):
        return tuple(backend.to_device(a) for a in tree)
    return backend.to_device(tree)


def _one_round(comm, seq, what, inputs, keys, comp, backend, extras):
    xp = backend.xp
    payloads, sent = [], []
    for key, m in zip(keys, inputs, strict=True):
        if comp is None:  # residuals still owed, no compressor: the plain sum, once
            payloads.append(backend.to_host(m))
            sent.append((None, m))
        else:
            payload, s = comp.encode(xp, m, key)
            payloads.append(_to_host(backend, payload))
            sent.append((payload, s))
    host_extras = [backend.to_host(e) for e in extras]
    got = _exchange(comm, seq, what, 0, inputs, [*payloads, *host_extras])
    summed = []
    for i, m in enumerate(inputs):
        parts = [_to_device(backend, g[i]) for g in got]
        if comp is None:
            out = xp.zeros(m.shape, dtype=m.dtype)
            for p in parts:
                out += p
            summed.append(out)
        else:
            summed.append(comp.decode_sum(xp, parts, m))
    summed.extend(_sum_extras(backend, got, len(inputs), extras))
    return summed, sent


def _sum_extras(backend, got, start, extras):
    out = []
    for j in range(len(extras)):
        total = np.array(got[0][start + j], copy=True)
        for g in got[1:]:
            total += g[start + j]
        out.append(backend.to_device(total))
    return out


def _power_sum(comm, seq, what, inputs, keys, comp: PowerSGD, state, backend, extras):
    """Two rounds: P = sum of M_w Q, orthonormalised; then Q = sum of M_w^T P. The sum is
    P Q^T; replica w sent P Q_w^T, and keeps M_w - P Q_w^T as its residual."""
    xp = backend.xp
    mats, first = {}, []
    for i, (key, m) in enumerate(zip(keys, inputs, strict=True)):
        if comp.compresses(m.shape):
            mat = m.reshape(m.shape[0], -1)
            rank = min(comp.rank, *mat.shape)
            q = state.factors.get(key)
            if q is None:
                q = backend.to_device(initial_q(mat.shape[1], rank, i).astype(m.dtype))
            mats[i] = (mat, q)
            first.append(backend.to_host(mat @ q))
        else:
            first.append(backend.to_host(m))
    host_extras = [backend.to_host(e) for e in extras]
    got = _exchange(comm, seq, what, 0, inputs, [*first, *host_extras])
    summed: list[Any] = [None] * len(inputs)
    sent: list[Any] = [None] * len(inputs)
    ps, second = {}, []
    for i, m in enumerate(inputs):
        total = backend.to_device(np.array(got[0][i], copy=True))
        for g in got[1:]:
            total += backend.to_device(g[i])
        if i in mats:
            p = orthonormal_columns(xp, total)
            ps[i] = p
            q_mine = mats[i][0].T @ p
            second.append(backend.to_host(q_mine))
            sent[i] = (None, (p @ q_mine.T).reshape(m.shape))
        else:
            summed[i] = total
            sent[i] = (None, m)
    if mats:
        got2 = _exchange(comm, seq, what, 1, second, second)
        for j, i in enumerate(sorted(mats)):
            q = backend.to_device(np.array(got2[0][j], copy=True))
            for g in got2[1:]:
                q += backend.to_device(g[j])
            state.factors[keys[i]] = q
            summed[i] = (ps[i] @ q.T).reshape(inputs[i].shape)
    summed.extend(_sum_extras(backend, got, len(inputs), extras))
    return summed, sent
