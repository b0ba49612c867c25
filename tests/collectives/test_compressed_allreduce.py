"""Compression wired into the mirrored gradient all-reduce on real clusters: shared memory,
Dask comms and the NCCL double (device="strict"), through `optimizer.apply_gradients` and
`fit`; the bytes each replica sends, counted."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import make_strategy

import labdist as ld

SHAPE = (6, 5)


def grads_of(rank: int) -> np.ndarray:
    return (np.random.default_rng(rank).standard_normal(SHAPE) * 3).astype(np.float32)


def one_step(strategy, compressor):
    """One apply_gradients step of SGD(1) with each replica's own gradient; (w0, w1 copies,
    bytes each replica sent during the step)."""
    n = strategy.num_replicas_in_sync
    with strategy.scope():
        w = ld.Variable(np.ones(SHAPE, np.float32), aggregation="MEAN")
    optimizer = ld.optimizers.SGD(1.0)
    before = [s["bytes_sent"] for s in strategy.communication_stats()]
    strategy.compression = compressor
    try:
        def step(g):
            optimizer.apply_gradients([(g, w)])

        strategy.run(step, args=(ld.PerReplica([grads_of(r) for r in range(n)]),))
    finally:
        strategy.compression = None
    after = [s["bytes_sent"] for s in strategy.communication_stats()]
    return strategy.experimental_local_results(w), [a - b for a, b in zip(after, before,
                                                                          strict=True)]


@pytest.mark.parametrize("kind", ["mirrored-2", "mirrored-2-strict", "mirrored-3-tcp"])
def test_fp16_all_reduce_sums_the_rounded_gradients_on_every_transport(kind):
    strategy = make_strategy(kind)
    n = strategy.num_replicas_in_sync
    copies, sent = one_step(strategy, ld.compression.FP16(error_feedback=False))
    expected = np.ones(SHAPE, np.float32)
    total = np.zeros(SHAPE, np.float32)
    for r in range(n):
        total += grads_of(r).astype(np.float16).astype(np.float32)
    expected -= total
    for c in copies:
        np.testing.assert_array_equal(c, expected)
    # each replica sent its 30 half-precision values to each peer, nothing else
    assert sent == [30 * 2 * (n - 1)] * n


@pytest.mark.parametrize("kind", ["mirrored-2", "mirrored-2-strict", "mirrored-3-tcp"])
def test_topk_all_reduce_sends_k_values_and_indices_on_every_transport(kind):
    strategy = make_strategy(kind)
    n = strategy.num_replicas_in_sync
    ratio = 0.1
    copies, sent = one_step(strategy, ld.compression.TopK(ratio, error_feedback=False))
    k = math.ceil(ratio * 30)
    total = np.zeros(30, np.float32)
    for r in range(n):
        flat = grads_of(r).reshape(-1)
        top = np.argsort(-np.abs(flat))[:k]
        total[top] += flat[top]
    for c in copies:
        np.testing.assert_array_equal(c, np.ones(SHAPE, np.float32) - total.reshape(SHAPE))
    assert sent == [k * (4 + 4) * (n - 1)] * n


def test_plain_all_reduce_bytes_are_counted_too(mirrored2):
    copies, sent = one_step(mirrored2, None)
    np.testing.assert_array_equal(copies[0], 1 - (grads_of(0) + grads_of(1)))
    assert sent == [30 * 4] * 2


def test_integer_variables_are_refused_under_compression_before_any_change(mirrored2):
    with mirrored2.scope():
        w = ld.Variable(np.zeros(4, np.int32), aggregation="SUM")
    optimizer = ld.optimizers.SGD(1.0)
    mirrored2.compression = "fp16"
    try:
        with pytest.raises(ValueError, match=r"compression=FP16\(.*dtype int32.*allowed: "
                                             "floating-point"):
            mirrored2.run(lambda: optimizer.apply_gradients([(np.ones(4, np.int32), w)]))
    finally:
        mirrored2.compression = None
    for c in mirrored2.experimental_local_results(w):
        np.testing.assert_array_equal(c, np.zeros(4, np.int32))


@pytest.mark.parametrize("value", ["int8", 3, ld.compression.FP16])
def test_bad_compression_values_are_refused_naming_them(mirrored2, value):
    with pytest.raises(ValueError, match="compression=.* is not allowed; use 'none', 'fp16'"):
        mirrored2.compression = value
    assert mirrored2.compression is None


@pytest.mark.parametrize("kind", ["mirrored-2", "mirrored-2-strict"])
def test_fit_with_compression_keeps_replicas_identical_and_counts_bytes(kind):
    (x, y), _ = ld.datasets.digits.load_data()
    x, y = x[:512], y[:512]
    results = {}
    for name, compressor in [("none", None), ("fp16", "fp16"), ("bf16", "bf16"),
                             ("topk", ld.compression.TopK(0.01)),
                             ("powersgd", ld.compression.PowerSGD(2))]:
        strategy = make_strategy(kind)
        strategy.compression = compressor
        try:
            with strategy.scope():
                model = ld.models.Sequential([ld.layers.Dense(64, activation="relu",
                                                              input_shape=(64,)),
                                              ld.layers.Dense(10, activation="softmax")])
                model.compile(loss="sparse_categorical_crossentropy",
                              optimizer=ld.optimizers.SGD(0.1), metrics=["accuracy"])
            before = strategy.communication_stats()
            model.fit(x, y, epochs=2, batch_size=64, verbose=0)
            after = strategy.communication_stats()
        finally:
            strategy.compression = None
        # what error feedback still holds goes out, in full, with the next plain step
        model.fit(x[:64], y[:64], epochs=1, batch_size=64, verbose=0)
        assert all(s["residual_norm"] == 0 for s in strategy.communication_stats())
        for v in model.weights:
            a, b = strategy.experimental_local_results(v)
            np.testing.assert_array_equal(a, b)
        results[name] = after[0]["bytes_sent"] - before[0]["bytes_sent"]
        if compressor is not None:
            assert after[0]["residual_norm"] > 0
            assert after[0]["compressed_reductions"] - before[0]["compressed_reductions"] == 16
    params = 64 * 64 + 64 + 64 * 10 + 10
    # each step: the gradients (fp32) plus fit's 2 float64 figures and, the replicas running
    # the loop (training/trainer/fit_loop.py), its stop flag (one float64 more)
    assert results["none"] == 16 * (params * 4 + 24)
    assert results["fp16"] == results["bf16"] == 16 * (params * 2 + 24)
    assert results["topk"] < results["none"] / 20
    assert results["powersgd"] < results["none"] / 5
