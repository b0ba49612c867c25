"""Compressed gradient all-reduce over the in-process transport double, against numpy
references written here: fp16/bf16 rounding, top-k's k values and indices, one PowerSGD
power-iteration step, error feedback's bookkeeping, and the bytes that travel."""

from __future__ import annotations

import math

import numpy as np
import pytest

from labdist.collectives import compression
from labdist.collectives.compressed import CompressionState, compressed_sum
from labdist.collectives.compression import (
    BF16,
    FP16,
    PowerSGD,
    TopK,
    initial_q,
    parse,
)
from labdist.collectives.transports.loopback import LoopbackHub
from labdist.devices import NUMPY

WORLD = 3


def grads(rank: int, step: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng((rank, step))
    return [rng.standard_normal((40, 30)).astype(np.float32),
            rng.standard_normal(30).astype(np.float32)]


def run_steps(compressor, steps: int, world: int = WORLD, make=grads):
    """Each rank's (summed results per step, its state, its communicator) after `steps`."""
    hub = LoopbackHub(world)

    def body(comm):
        state = CompressionState()
        state.set(compressor)
        out = []
        for step in range(steps):
            summed, _ = compressed_sum(comm, step + 1, "grads", make(comm.rank, step), state,
                                       NUMPY)
            out.append(summed)
        return out, state, comm

    results = hub.run(body)
    for r in results:
        assert not isinstance(r, BaseException), r
    return results


def assert_identical(results) -> None:
    for out, _, _ in results[1:]:
        for step_a, step_b in zip(results[0][0], out, strict=True):
            for a, b in zip(step_a, step_b, strict=True):
                assert a.tobytes() == b.tobytes()


def bf16_reference(a: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even to 8 mantissa bits, computed with float64 arithmetic."""
    a = a.astype(np.float64)
    out = np.zeros_like(a)
    nz = a != 0
    exp = np.floor(np.log2(np.abs(a[nz])))
    ulp = 2.0 ** (exp - 7)
    out[nz] = np.round(a[nz] / ulp) * ulp  # np.round rounds half to even
    return out.astype(np.float32)


@pytest.mark.parametrize("compressor,rounding", [
    (FP16(error_feedback=False), lambda a: a.astype(np.float16).astype(np.float32)),
    (BF16(error_feedback=False), bf16_reference),
])
def test_half_precision_sum_is_the_sum_of_the_rounded_inputs(compressor, rounding):
    results = run_steps(compressor, 1)
    assert_identical(results)
    for i in range(2):
        expected = np.zeros_like(grads(0)[i])
        for r in range(WORLD):
            expected += rounding(grads(r)[i])
        np.testing.assert_array_equal(results[0][0][0][i], expected)


def test_bf16_reference_agrees_on_ties():
    # 1 + 2^-8 lies halfway between two bfloat16 values: it rounds to the even one (1.0)
    a = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -2.5], np.float32)
    results = run_steps(BF16(error_feedback=False), 1, world=1, make=lambda r, s: [a])
    np.testing.assert_array_equal(results[0][0][0][0], [1.0, 1 + 2 ** -6, -2.5])


@pytest.mark.parametrize("compressor", [FP16(), BF16(), TopK(0.05), PowerSGD(2)])
def test_error_feedback_sent_plus_residual_is_the_true_gradient(compressor):
    steps = 6
    results = run_steps(compressor, steps)
    assert_identical(results)
    true_total = [sum(grads(r, s)[i].astype(np.float64) for r in range(WORLD)
                      for s in range(steps)) for i in range(2)]
    sent_total = [sum(results[0][0][s][i].astype(np.float64) for s in range(steps))
                  for i in range(2)]
    residual_total = [np.zeros_like(t) for t in true_total]
    for _, state, _ in results:
        for (what, i, shape), r in state.residuals.items():
            assert what == "grads" and r.shape == shape
            residual_total[i] += r
    for i in range(2):
        np.testing.assert_allclose(sent_total[i] + residual_total[i], true_total[i],
                                   rtol=1e-5, atol=1e-5)
    # compression did drop something along the way (the matrix: biases travel whole in PowerSGD)
    assert np.abs(true_total[0] - sent_total[0]).max() > 1e-4


def test_topk_sends_exactly_k_values_and_their_indices():
    ratio = 0.01
    results = run_steps(TopK(ratio, error_feedback=False), 1)
    assert_identical(results)
    sizes = [40 * 30, 30]
    ks = [max(1, math.ceil(ratio * n)) for n in sizes]
    assert ks == [12, 1]
    # each replica sends k int32 indices + k float32 values per gradient to each peer
    for _, _, comm in results:
        assert comm.sent_bytes == sum(k * (4 + 4) for k in ks) * (WORLD - 1)
    expected = [np.zeros(n, np.float32) for n in sizes]
    for r in range(WORLD):
        for i, g in enumerate(grads(r)):
            flat = g.reshape(-1)
            top = np.argsort(-np.abs(flat), kind="stable")[:ks[i]]
            expected[i][top] += flat[top]
    for i in range(2):
        got = results[0][0][0][i].reshape(-1)
        np.testing.assert_array_equal(got, expected[i])


@pytest.mark.parametrize("kind", ["normal", "heavy tail", "ties at the threshold",
                                  "a misleading sample"])
def test_topk_of_a_big_gradient_keeps_exactly_the_k_largest(kind):
    """Gradients of hundreds of thousands of values take top-k's sampled-threshold path;
    whatever the values' spread (or ties where the sample's threshold falls, and the full
    partition's fallback), what is sent is k values, each as large as anything left out."""
    rng = np.random.default_rng(5)
    n, ratio = 784 * 512, 0.01
    g = rng.standard_normal(n).astype(np.float32)
    if kind == "heavy tail":
        g = (g ** 5).astype(np.float32)
    elif kind == "ties at the threshold":
        g = np.where(rng.random(n) < 0.05, 1.0, 0.0).astype(np.float32) * rng.choice([-1, 1], n)
    elif kind == "a misleading sample":  # only the sampled places are large: fewer than k
        ratio = 0.02  # values clear the sample's threshold, so the full partition runs
        g[np.random.default_rng(n).integers(0, n, compression.SAMPLE)] = 10.0
    compressor = TopK(ratio, error_feedback=False)
    (idx, values), _ = compressor.encode(np, g, 0)
    k = math.ceil(ratio * n)
    assert idx.dtype == np.int32 and len(idx) == len(np.unique(idx)) == k
    np.testing.assert_array_equal(values, g[idx])
    left = np.ones(n, bool)
    left[idx] = False
    assert np.abs(values).min() >= np.abs(g[left]).max()
    expected = np.sort(np.abs(g))[n - k:]  # numpy, written here: the k largest magnitudes
    np.testing.assert_array_equal(np.sort(np.abs(values)), expected)


def test_topk_of_a_big_gradient_on_the_strict_device_double():
    """The sampled path keeps to device arrays (the strict double refuses host conversions
    as cupy does) and picks the same k values as on the host."""
    from labdist.devices.strict.backend import STRICT

    g = np.random.default_rng(6).standard_normal(784 * 512).astype(np.float32)
    compressor = TopK(0.01, error_feedback=False)
    (idx, values), _ = compressor.encode(STRICT.xp, STRICT.to_device(g), 0)
    (host_idx, _), _ = compressor.encode(np, g, 0)
    assert set(STRICT.to_host(idx).tolist()) == set(host_idx.tolist())
    np.testing.assert_array_equal(STRICT.to_host(values), g[STRICT.to_host(idx)])


def test_topk_ratio_one_is_the_plain_sum():
    results = run_steps(TopK(1.0), 1)
    for i in range(2):
        np.testing.assert_allclose(results[0][0][0][i], sum(grads(r)[i] for r in range(WORLD)),
                                   rtol=1e-6, atol=1e-6)
        for residual in results[0][1].residuals.values():
            assert np.abs(residual).max() == 0


@pytest.mark.parametrize("rank", [1, 3])
def test_powersgd_one_step_matches_a_numpy_power_iteration(rank):
    results = run_steps(PowerSGD(rank, error_feedback=False), 1)
    assert_identical(results)
    ms = [grads(r)[0].astype(np.float64) for r in range(WORLD)]
    q0 = initial_q(30, rank, 0)
    p = sum(m @ q0 for m in ms)
    basis, _ = np.linalg.qr(p)  # an independent orthonormalisation (signs may differ)
    q = sum(m.T @ basis for m in ms)
    expected = basis @ q.T
    np.testing.assert_allclose(results[0][0][0][0], expected, rtol=1e-4, atol=1e-4)
    # the bias (a vector) travels uncompressed: its plain sum
    np.testing.assert_allclose(results[0][0][0][1], sum(grads(r)[1] for r in range(WORLD)),
                               rtol=1e-6, atol=1e-6)
    # bytes: P (40 x r) and Q (30 x r) float32, plus the 30-float bias, to each peer
    for _, _, comm in results:
        assert comm.sent_bytes == ((40 + 30) * rank + 30) * 4 * (WORLD - 1)


def test_plain_fp16_bytes_are_half():
    results = run_steps(FP16(), 1)
    for _, _, comm in results:
        assert comm.sent_bytes == (40 * 30 + 30) * 2 * (WORLD - 1)


def test_switching_to_none_sends_the_residuals_once():
    hub = LoopbackHub(2)

    def body(comm):
        state = CompressionState()
        state.set(TopK(0.01))
        g = [np.arange(100, dtype=np.float32) + comm.rank]
        first, _ = compressed_sum(comm, 1, "g", g, state, NUMPY)
        state.set(None)
        assert state.active("g") and not state.active("other")  # residuals are owed
        second, _ = compressed_sum(comm, 2, "g", g, state, NUMPY)
        assert not state.active("g")
        return first[0] + second[0]

    results = hub.run(body)
    total = 2 * (2 * np.arange(100, dtype=np.float32) + 1)
    for r in results:
        np.testing.assert_allclose(r, total)


@pytest.mark.parametrize("value,allowed", [
    (lambda: TopK(0), "(0, 1]"), (lambda: TopK(1.5), "(0, 1]"),
    (lambda: TopK(float("nan")), "(0, 1]"), (lambda: PowerSGD(0), ">= 1"),
    (lambda: PowerSGD(1.5), ">= 1"), (lambda: parse("int8"), "'none', 'fp16'"),
])
def test_bad_compressor_arguments_are_refused(value, allowed):
    with pytest.raises(ValueError, match="is not allowed") as info:
        value()
    assert allowed in str(info.value)


@pytest.mark.parametrize("compressor", [FP16(), BF16(), TopK(0.5), PowerSGD(1)])
def test_integer_gradients_are_refused_before_anything_changes(compressor):
    hub = LoopbackHub(1)

    def body(comm):
        state = CompressionState()
        state.set(compressor)
        with pytest.raises(ValueError, match="int32.*allowed: floating-point"):
            compressed_sum(comm, 1, "g", [np.ones((4, 4), np.int32)], state, NUMPY)
        return state.residuals, comm.sent_bytes

    [(residuals, sent)] = hub.run(body)
    assert residuals == {} and sent == 0
