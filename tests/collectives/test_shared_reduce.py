"""The all-reduce of replicas on shared memory (collectives/shared.py): from 64 KiB, more than
two replicas publish their arrays once and each sums its own segment of every peer's copy in
rank order; the results must be bit-identical everywhere and equal to the rank-ordered sum."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_strategy

import labdist as ld
from labdist.collectives import shared

N = 100_003  # 400 KB of float32: over SEGMENT_MIN_BYTES, under the generic threshold


def values(rank: int, step: int) -> np.ndarray:
    """Magnitudes that differ by rank, so a sum in another order rounds differently."""
    rng = np.random.default_rng(1000 * step + rank)
    return (rng.standard_normal(N) * 10.0 ** (3 * rank - 3)).astype(np.float32)


def in_rank_order(parts: list[np.ndarray]) -> np.ndarray:
    total = parts[0].copy()
    for p in parts[1:]:
        total += p
    return total


@pytest.fixture
def mirrored3():
    s = make_strategy("mirrored-3")
    assert s.transport == "shm"
    return s


def test_the_threshold_is_crossed_here():
    assert shared.SEGMENT_MIN_BYTES <= 4 * N < 1 << 20


def test_segments_are_summed_in_rank_order_and_copies_are_identical(mirrored3):
    xs = mirrored3.experimental_distribute_values_from_function(
        lambda c: (values(c.replica_id_in_sync_group, 0),
                   np.arange(5, dtype=np.int64) * (c.replica_id_in_sync_group + 1)))
    out = mirrored3.run(lambda x: ld.get_replica_context().all_reduce("SUM", x), args=(xs,))
    results = mirrored3.experimental_local_results(out)
    expected = in_rank_order([values(r, 0) for r in range(3)])
    assert not np.array_equal(expected, values(2, 0) + values(1, 0) + values(0, 0))  # order shows
    for floats, ints in results:
        assert floats.tobytes() == expected.tobytes()
        np.testing.assert_array_equal(ints, np.arange(5) * 6)


def test_repeated_reductions_read_each_step_s_values(mirrored3):
    """The same layout step after step (parsed once, read again in place), then another."""
    def step(k):
        r = ld.get_replica_context().replica_id_in_sync_group
        arrays = [values(r, k)] + ([values(r, k + 100)] if k % 2 else [])
        return ld.get_replica_context().all_reduce("SUM", arrays)

    for k in range(6):
        results = mirrored3.experimental_local_results(mirrored3.run(step, args=(k,)))
        assert len(results[0]) == 1 + k % 2
        expected = in_rank_order([values(r, k) for r in range(3)])
        for got in results:
            assert got[0].tobytes() == expected.tobytes()
        if k % 2:
            odd = in_rank_order([values(r, k + 100) for r in range(3)])
            assert all(got[1].tobytes() == odd.tobytes() for got in results)


def test_mismatched_shapes_raise_on_every_replica_and_the_group_goes_on(mirrored3):
    xs = mirrored3.experimental_distribute_values_from_function(
        lambda c: np.zeros(N + c.replica_id_in_sync_group, np.float32))
    with pytest.raises(ValueError, match="shapes differ"):
        mirrored3.run(lambda x: ld.get_replica_context().all_reduce("SUM", x), args=(xs,))
    out = mirrored3.run(lambda: ld.get_replica_context().all_reduce("MEAN", np.ones(N)))
    assert all(np.array_equal(r, np.ones(N)) for r in mirrored3.experimental_local_results(out))


def test_owners_are_agreed_and_a_partitioned_update_ends_whole_everywhere(mirrored3):
    """With more replicas than cores only the first `cores` ranks own segments (they sum and
    update them); the others' segments are empty, and every copy still ends identical."""
    import os

    from labdist.replica.replica_context import current, current_replica

    start = np.linspace(-1, 1, N, dtype=np.float32)

    def step():
        ctx = current()
        comm = current_replica().comm
        weights, slots = start.copy(), np.zeros(N, np.float32)

        def apply(i, lo, hi, summed):
            slots[lo:hi] = summed
            weights[lo:hi] -= 0.1 * summed
        grad = values(ctx.replica_id_in_sync_group, 7)
        partitioned = ctx.reduce_apply("apply", [grad], [weights], apply)
        ctx.gather_segments("slots", [slots])
        return comm.host.cores, shared.owners(comm), partitioned, weights, slots

    results = mirrored3.experimental_local_results(mirrored3.run(step))
    cores = min(len(os.sched_getaffinity(0)), 3)
    assert {(min(int(c), 3), int(o), bool(p)) for c, o, p, _, _ in results} == {
        (cores, cores, True)}
    total = in_rank_order([values(r, 7) for r in range(3)])
    for _, _, _, weights, slots in results:
        assert slots.tobytes() == total.tobytes()
        assert weights.tobytes() == (start - np.float32(0.1) * total).tobytes()
