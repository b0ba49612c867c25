"""The collective algorithms over the in-process transport double (no cluster: milliseconds),
the transport registry and knob, and the aggregation table."""

from __future__ import annotations

import time

import numpy as np
import pytest

from labdist import aggregation
from labdist.collectives import registry
from labdist.collectives.algorithms import (
    DIRECT_MAX_BYTES,
    all_gather,
    all_reduce,
    gather_segments,
    reduce_scatter_apply,
)
from labdist.collectives.transports.loopback import LoopbackHub
from labdist.collectives.transports.protocol import DEVICE
from labdist.devices import NUMPY
from labdist.enums import ReduceOp, VariableAggregation
from labdist.errors import CollectiveMismatchError, CollectiveTimeoutError

Agg = VariableAggregation
SMALL, LARGE = 1001, DIRECT_MAX_BYTES // 4 + 1001  # float32 elements; LARGE is segmented


def inputs(rank: int, n: int, dtype=np.float32) -> np.ndarray:
    return (np.random.default_rng(rank).standard_normal(n) * 100).astype(dtype)


def reduce_on(hub: LoopbackHub, op, make, kind: str = "all_reduce") -> list:
    return hub.run(lambda c: all_reduce(c, 1, kind, make(c.rank), op, NUMPY))


def assert_same_everywhere(results: list) -> None:
    for r in results:
        assert not isinstance(r, BaseException), r
    first = results[0]
    for r in results[1:]:
        assert len(r) == len(first)
        for a, b in zip(first, r, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("size", [SMALL, LARGE])
@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.MEAN, Agg.ONLY_FIRST_REPLICA])
def test_all_reduce_is_the_rank_order_combination_on_every_rank(op, size):
    hub = LoopbackHub(3)
    results = reduce_on(hub, op, lambda r: [inputs(r, size), np.full((2, 3), r + 1.0)])
    assert_same_everywhere(results)
    row = aggregation.of(op)
    for i, shape in enumerate([(size,), (2, 3)]):
        parts = [inputs(r, size) if i == 0 else np.full((2, 3), r + 1.0) for r in range(3)]
        assert results[0][i].shape == shape
        assert results[0][i].tobytes() == row.combine(parts).tobytes()


@pytest.mark.parametrize("size", [7, DIRECT_MAX_BYTES // 8 + 3])
def test_integer_mean_is_float64_and_integer_sum_keeps_its_dtype(size):
    hub = LoopbackHub(2)
    means = reduce_on(hub, ReduceOp.MEAN, lambda r: [np.arange(size, dtype=np.int64) + r])
    assert_same_everywhere(means)
    assert means[0][0].dtype == np.float64
    np.testing.assert_array_equal(means[0][0], np.arange(size) + 0.5)
    sums = reduce_on(hub, ReduceOp.SUM, lambda r: [np.arange(size, dtype=np.int32) + r])
    assert sums[0][0].dtype == np.int32
    np.testing.assert_array_equal(sums[0][0], 2 * np.arange(size) + 1)


def test_aggregation_none_is_not_an_all_reduce_op():
    results = reduce_on(LoopbackHub(2), Agg.NONE, lambda r: [np.ones(2)])
    assert all(isinstance(e, ValueError) and "ONLY_FIRST_REPLICA" in str(e) for e in results)


@pytest.mark.parametrize("size", [SMALL, LARGE])
def test_reduce_scatter_apply_then_gather_segments(size):
    """Large payloads: each rank applies its own segment (returns True) and the others'
    updated segments come back, so every rank ends with the same weights and slots."""
    hub = LoopbackHub(3)
    start = np.linspace(-1, 1, size, dtype=np.float32)

    def step(comm):
        weights, slots = start.copy(), np.zeros(size, np.float32)
        grad = inputs(comm.rank, size)

        def apply(i, lo, hi, summed):
            slots[lo:hi] = summed
            weights[lo:hi] -= 0.1 * summed
        partitioned = reduce_scatter_apply(comm, 1, "apply", [grad], [weights], apply, NUMPY)
        if partitioned:
            gather_segments(comm, 2, "slots", [slots])
        return partitioned, [weights, slots]

    results = hub.run(step)
    assert {p for p, _ in results} == {size == LARGE}
    assert_same_everywhere([w for _, w in results])
    total = aggregation.of(ReduceOp.SUM).combine([inputs(r, size) for r in range(3)])
    weights, slots = results[0][1]
    assert slots.tobytes() == total.tobytes()
    assert weights.tobytes() == (start - np.float32(0.1) * total).tobytes()


def test_all_gather_returns_every_rank_object_in_rank_order():
    results = LoopbackHub(4).run(lambda c: all_gather(c, 1, "gather", {"rank": c.rank}))
    assert results == [[{"rank": r} for r in range(4)]] * 4


@pytest.mark.parametrize("size", [SMALL, LARGE])
@pytest.mark.parametrize(("make", "error", "match"), [
    (lambda r, n: [np.zeros(n + r, np.float32)], ValueError, "shapes differ"),
    (lambda r, n: [np.zeros(n, np.float32 if r else np.float64)], TypeError, "dtypes differ"),
    (lambda r, n: [np.zeros(n, np.float32)] * (r + 1), ValueError, "numbers of values"),
])
def test_mismatches_raise_the_same_error_on_every_rank(make, error, match, size):
    results = reduce_on(LoopbackHub(3), ReduceOp.SUM, lambda r: make(r, size))
    assert all(type(e) is error for e in results), results
    assert len({str(e) for e in results}) == 1 and match in str(results[0])


def test_different_collectives_at_the_same_point_raise_everywhere():
    hub = LoopbackHub(2)
    results = hub.run(lambda c: all_reduce(c, 1, f"collective of rank {c.rank}", [np.ones(2)],
                                           ReduceOp.SUM, NUMPY))
    assert all(isinstance(e, CollectiveMismatchError) for e in results)
    assert len({str(e) for e in results}) == 1


def test_a_missing_peer_times_out_within_the_timeout():
    hub = LoopbackHub(3, timeout=0.3)
    start = time.monotonic()
    results = hub.run(lambda c: all_reduce(c, 1, "sum", [np.ones(4)], ReduceOp.SUM, NUMPY),
                      ranks=[0, 1])
    elapsed = time.monotonic() - start
    assert all(isinstance(e, CollectiveTimeoutError) and "[2]" in str(e) for e in results)
    assert 0.3 <= elapsed < 1.5


def test_a_late_peer_is_waited_for():
    hub = LoopbackHub(2, timeout=2.0)
    results = hub.run(lambda c: all_reduce(c, 1, "sum", [np.ones(3)], ReduceOp.SUM, NUMPY),
                      delays={1: 0.1})
    assert_same_everywhere(results)
    np.testing.assert_array_equal(results[0][0], [2.0, 2.0, 2.0])


def test_a_peer_that_failed_is_reported_not_waited_for():
    hub = LoopbackHub(2, timeout=5.0)

    def step(comm):
        if comm.rank == 1:
            raise KeyError("boom")
        return all_reduce(comm, 1, "sum", [np.ones(3)], ReduceOp.SUM, NUMPY)
    start = time.monotonic()
    first, second = hub.run(step)
    assert "replica 1 failed" in str(first) and "boom" in str(first)
    assert isinstance(second, KeyError) and time.monotonic() - start < 2


class FakeDevice:
    """A device transport double: takes every all-reduce, records what it was given."""

    name, layer, requirement, alone = "fake", DEVICE, "nothing", False
    broken = None

    def __init__(self):
        self.calls = []

    def start_run(self, run) -> None:
        pass

    def supports(self, backend, arrays, agg) -> bool:
        return True

    def all_reduce(self, xp, arrays, agg, seq, what, states):
        self.calls.append(agg.name)
        return [a * 0 + 42 for a in arrays]

    def close(self) -> None:
        pass


def test_device_data_goes_to_the_device_transport_after_the_signatures_agree():
    hub = LoopbackHub(2)
    devices = []

    def step(comm, shapes):
        device = FakeDevice()
        devices.append(device)
        comm.use(device)
        return all_reduce(comm, 1, "sum", [np.ones(shapes[comm.rank])], ReduceOp.MEAN, NUMPY)
    results = hub.run(lambda c: step(c, [3, 3]))
    assert [list(r[0]) for r in results] == [[42, 42, 42]] * 2
    assert [d.calls for d in devices] == [["MEAN"]] * 2
    devices.clear()
    mismatched = hub.run(lambda c: step(c, [3, 4]))
    assert all("shapes differ" in str(e) for e in mismatched)
    assert [d.calls for d in devices] == [[], []]


# -- the knob and the registry -------------------------------------------------------------------
def test_the_knob_values_come_from_the_registry():
    assert registry.knob_values() == ("auto", "shm", "tcp", "nccl")
    assert registry.candidates("auto", "host") == ["shm", "tcp"]
    assert registry.candidates("auto", "device") == ["nccl"]
    assert registry.candidates("tcp", "device") == []  # Dask comms only
    assert registry.candidates("shm", "device") == ["nccl"]
    assert registry.candidates("nccl", "host") == ["shm", "tcp"]
    assert registry.required("nccl", "device") and not registry.required("nccl", "host")
    assert not registry.required("auto", "host")


def test_knob_errors_name_the_parameter_the_value_and_what_is_allowed():
    with pytest.raises(ValueError, match=r"transport='ipc' .*allowed: auto, shm, tcp, nccl"):
        registry.parse("ipc")
    aliases = {"auto": "auto", "ring": "tcp", "nccl": "nccl"}
    assert registry.parse("ring", "communication", aliases) == "tcp"
    with pytest.raises(ValueError, match=r"communication='tcp' .*allowed: auto, ring, nccl"):
        registry.parse("tcp", "communication", aliases)


# -- the aggregation table -----------------------------------------------------------------------
def test_every_enum_member_has_a_row():
    for member in [*VariableAggregation, *ReduceOp]:
        assert aggregation.of(member).name == member.name
    assert aggregation.of("mean") is aggregation.of(ReduceOp.MEAN)
    with pytest.raises(ValueError, match="aggregation='MAX'"):
        aggregation.of("MAX")


def test_result_dtypes_and_what_nccl_can_do():
    mean, add = aggregation.of("MEAN"), aggregation.of("SUM")
    assert mean.result_dtype(np.int32) == np.float64 and mean.result_dtype(np.float16) == np.float16
    assert add.result_dtype(np.int8) == np.int8
    assert mean.nccl_can(np.float32) and not mean.nccl_can(np.int64)
    assert aggregation.of("ONLY_FIRST_REPLICA").nccl_can(np.int64)
    assert not aggregation.of("NONE").nccl_can(np.float32)


def test_what_a_sync_parameter_server_applies():
    a, b = np.array([1.0, 2.0], np.float32), np.array([3.0, 5.0], np.float32)
    assert [list(v) for v in aggregation.of("NONE").ps_values([a, b])] == [[1, 2], [3, 5]]
    assert aggregation.of("ONLY_FIRST_REPLICA").ps_values([a, b])[0] is a
    (total,) = aggregation.of("SUM").ps_values([a, b])
    assert total.dtype == np.float32 and list(total) == [4, 7]
    (mean,) = aggregation.of("MEAN").ps_values([a, b])
    assert list(mean) == [2, 3.5] and list(a) == [1, 2]  # inputs untouched
    with pytest.raises(ValueError, match="MEAN of int64 values"):
        aggregation.of("MEAN").ps_values([np.arange(2), np.arange(2)])


def test_a_sync_parameter_servers_mean_weighs_values_by_their_examples():
    """17 + 16 examples: the mean over examples (what a mirrored step computes), not over
    workers; equal or all-zero weights are the plain mean; SUM ignores the weights."""
    a, b = np.array([1.0, 2.0], np.float32), np.array([3.0, 5.0], np.float32)
    mean = aggregation.of("MEAN")
    (weighted,) = mean.ps_values([a, b], [17, 16])
    assert weighted.dtype == np.float32
    np.testing.assert_allclose(weighted, (17 * a + 16 * b) / 33, rtol=1e-7)
    assert list(mean.ps_values([a, b], [4, 4])[0]) == [2, 3.5]
    assert list(mean.ps_values([a, b], [0, 0])[0]) == [2, 3.5]
    assert list(mean.ps_values([a, b], [0, 5])[0]) == [3, 5]  # an empty shard counts nothing
    assert list(aggregation.of("SUM").ps_values([a, b], [17, 16])[0]) == [4, 7]
