"""Compressors for the gradient all-reduce: what each replica sends instead of its full
gradient, and how the replicas' messages are summed again. Worker side, any array module.

Each compressor is a small picklable description (`FP16()`, `BF16()`, `TopK(ratio)`,
`PowerSGD(rank)`) that the strategy hands its replicas; `compressed.py` runs the exchange and
keeps, per replica, what compression dropped (the error-feedback residual) to add to the next
gradient. Every lossy compressor has error feedback on unless `error_feedback=False`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from labdist import checks

FLOATS = ("float16", "float32", "float64")


@dataclass(frozen=True)
class Compressor:
    """What every compressor shares: error feedback (on by default: all of them lose bits)."""

    error_feedback: bool = True

    name = "compressor"

    def check_dtype(self, dtype: Any, what: str) -> None:
        """Refuse a gradient this compressor cannot carry (integers: there is no rounding
        or low-rank version of a count)."""
        if np.dtype(dtype).name not in FLOATS:
            raise ValueError(
                f"compression={self!r} cannot compress {what} of dtype {np.dtype(dtype).name}; "
                f"allowed: floating-point gradients ({', '.join(FLOATS)}), or "
                "compression='none'")

    # one-round compressors: encode (payload, what this replica effectively sent) and decode
    def encode(self, xp, m, key) -> tuple[Any, Any]:
        raise NotImplementedError

    def decode_sum(self, xp, payloads: list, like) -> Any:
        raise NotImplementedError

    def residual(self, xp, m, payload, sent) -> Any:
        """What compression dropped from `m`, given what `encode` returned."""
        return m - sent


def _halves_sum(xp, payloads, like, to_float):
    out = xp.zeros(like.shape, dtype=like.dtype)
    for p in payloads:  # rank order: every replica adds in the same order, bit-identical
        out += to_float(xp, p)  # widened inside the add: exact, and no temporary array
    return out


@dataclass(frozen=True)
class FP16(Compressor):
    """Send IEEE half precision (2 bytes a value). Values beyond ±65504 become infinite."""

    name = "fp16"

    def encode(self, xp, m, key):
        half = m.astype(xp.float16)
        return half, half  # what was sent, as m - half widens it exactly

    def decode_sum(self, xp, payloads, like):
        return _halves_sum(xp, payloads, like, lambda xp, p: p)


def bf16_bits(xp, a):
    """float -> bfloat16 as uint16 bits, rounded to nearest even (numpy has no bfloat16)."""
    u = xp.ascontiguousarray(a.astype(xp.float32, copy=False)).view(xp.uint32)  # read only
    bits = u >> 16  # one temporary, worked in place: this runs on every gradient, every step
    bits &= xp.uint32(1)
    bits += xp.uint32(0x7FFF)
    bits += u  # wraps as uint32 arithmetic does, the same as (u + rounding)
    bits >>= 16
    return bits.astype(xp.uint16)


def bf16_value(xp, bits):
    """bfloat16 bits (uint16) -> float32."""
    return (bits.astype(xp.uint32) << 16).view(xp.float32)


@dataclass(frozen=True)
class BF16(Compressor):
    """Send bfloat16 (2 bytes a value: float32's range, 8 bits of mantissa)."""

    name = "bf16"

    def encode(self, xp, m, key):
        bits = bf16_bits(xp, m)
        return bits, bf16_value(xp, bits)

    def decode_sum(self, xp, payloads, like):
        return _halves_sum(xp, payloads, like, bf16_value)


SAMPLE = 4096  # magnitudes sampled to guess top-k's threshold
_samples: dict[int, np.ndarray] = {}


def largest(xp, mags, k: int):
    """The indices of the `k` largest of `mags` (1-D, >= 0), in no particular order. A full
    `argpartition` of a big gradient was most of top-k's cost; a threshold guessed from a
    sample (where about 2k values lie above it) leaves a few thousand candidates to
    partition instead. Exact: every value above the threshold is a candidate, and when fewer
    than k are (an unlucky sample) the full partition runs."""
    n = mags.size
    if n < 16 * SAMPLE or 8 * k > n:
        return xp.argpartition(mags, n - k)[n - k:]
    picks = _samples.get(n)
    if picks is None:  # fixed per size: the same work on every replica and every step
        picks = _samples[n] = np.random.default_rng(n).integers(0, n, SAMPLE)
    sample = mags[picks if xp is np else xp.asarray(picks)]
    at = SAMPLE - 1 - (2 * k * SAMPLE) // n
    threshold = xp.partition(sample, at)[at]
    candidates = xp.flatnonzero(mags >= threshold)
    c = candidates.size
    if c < k:
        return xp.argpartition(mags, n - k)[n - k:]
    return candidates[xp.argpartition(mags[candidates], c - k)[c - k:]]


@dataclass(frozen=True, init=False)
class TopK(Compressor):
    """Send the k = ceil(ratio * size) largest-magnitude values of each gradient and their
    indices (int32); the rest stays in the residual."""

    ratio: float = 0.01
    name = "topk"

    def __init__(self, ratio: float = 0.01, error_feedback: bool = True):
        ratio = checks.number("ratio", ratio, 0.0, 1.0, low_open=True)
        object.__setattr__(self, "ratio", ratio)
        object.__setattr__(self, "error_feedback", checks.boolean("error_feedback",
                                                                  error_feedback))

    def k(self, size: int) -> int:
        return min(size, max(1, math.ceil(self.ratio * size)))

    def encode(self, xp, m, key):
        flat = m.reshape(-1)
        k = self.k(flat.size)
        if k == flat.size:
            idx = xp.arange(flat.size, dtype=xp.int32)
        else:
            idx = largest(xp, xp.abs(flat), k).astype(xp.int32)
        return (idx, flat[idx]), None  # what was sent: those k values, zeros elsewhere

    def residual(self, xp, m, payload, sent):
        kept = m.reshape(-1).copy()  # m - sent, without building `sent`: exact
        kept[payload[0]] = 0
        return kept.reshape(m.shape)

    def decode_sum(self, xp, payloads, like):
        out = xp.zeros(like.size, dtype=like.dtype)
        for idx, values in payloads:  # indices are unique within one replica's message
            out[idx] += values
        return out.reshape(like.shape)


@dataclass(frozen=True, init=False)
class PowerSGD(Compressor):
    """Rank-`rank` approximation of each matrix-shaped gradient by one step of power
    iteration, warm-started from the last step's factor (Vogels et al., 2019). Vectors
    (biases) travel uncompressed, as in PyTorch's PowerSGD hook."""

    rank: int = 1
    name = "powersgd"

    def __init__(self, rank: int = 1, error_feedback: bool = True):
        object.__setattr__(self, "rank", checks.integer("rank", rank, 1))
        object.__setattr__(self, "error_feedback", checks.boolean("error_feedback",
                                                                  error_feedback))

    def compresses(self, shape: tuple) -> bool:
        """Whether a gradient of `shape` is approximated (else it travels as it is)."""
        if len(shape) < 2:
            return False
        n, p = shape[0], math.prod(shape[1:])
        return (n + p) * min(self.rank, n, p) < n * p


def initial_q(cols: int, rank: int, index: int) -> np.ndarray:
    """PowerSGD's first right factor for gradient number `index`: the same on every replica
    (a seeded normal draw), so the first power step agrees without an exchange."""
    return np.random.default_rng((2019, index)).standard_normal((cols, rank))


def orthonormal_columns(xp, p):
    """Gram-Schmidt on the columns of `p` (a few): the same arithmetic on every replica."""
    p = p.copy()
    for j in range(p.shape[1]):
        col = p[:, j]
        for i in range(j):
            col -= (p[:, i] @ col) * p[:, i]
        col /= xp.sqrt(col @ col) + 1e-30
    return p


NAMES = {"none": None, "fp16": FP16, "bf16": BF16}
ALLOWED = ("'none', 'fp16', 'bf16', ld.compression.FP16(), BF16(), TopK(ratio) or "
           "PowerSGD(rank)")


def parse(value: Any, name: str = "compression") -> Compressor | None:
    """A compressor from the knob's value: None or 'none' (plain all-reduce), 'fp16',
    'bf16', or a compressor object."""
    if value is None:
        return None
    if isinstance(value, Compressor):
        return value
    if isinstance(value, str) and value.lower() in NAMES:
        cls = NAMES[value.lower()]
        return None if cls is None else cls()
    checks.refuse(name, value, ALLOWED)
