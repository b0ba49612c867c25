"""The shared-memory all-reduce at 3, 5 and 8 replicas (more replicas than this machine's cores:
only the first `cores` ranks own segments): sizes that the owners do not divide, several
arrays and dtypes in one call, layouts that change from call to call in one step (each slot's
message description written again only when it changed), a non-contiguous input and MEAN.
Every replica must end bit-identical to numpy's sum in rank order."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import close_shared_strategies, make_strategy

import labdist as ld
from labdist.collectives import shared
from labdist.replica.replica_context import current_replica


def values(rank: int, seed: int, n: int) -> np.ndarray:
    """Magnitudes that differ by rank, so a sum in another order rounds differently."""
    rng = np.random.default_rng(1000 * seed + rank)
    return (rng.standard_normal(n) * 10.0 ** (rank % 4 * 2 - 3)).astype(np.float32)


def arrays_for(rank: int, seed: int, j: int) -> list[np.ndarray]:
    """Call j of a step: one odd-sized float32 array (layout A), or a float64 array, a tiny
    int64 one and a strided float32 view (layout B)."""
    if j % 2 == 0:
        return [values(rank, seed + j, 100_003)]
    return [values(rank, seed + j, 33_331).astype(np.float64),
            np.arange(7, dtype=np.int64) * (rank + 1),
            values(rank, seed + j + 50, 2 * 50_001)[::2]]


def in_rank_order(parts: list[np.ndarray]) -> np.ndarray:
    total = np.array(parts[0], copy=True)
    for p in parts[1:]:
        total += p
    return total


@pytest.fixture(scope="module", autouse=True)
def _close_the_large_groups():
    """13 worker processes only this module uses: closed after it, not at the session's end."""
    yield
    close_shared_strategies("mirrored-5", "mirrored-8")


@pytest.mark.parametrize("n", [3, 5, 8])
def test_many_replicas_end_bit_identical_to_the_rank_order_sum(n):
    strategy = make_strategy(f"mirrored-{n}")
    assert strategy.transport == "shm"

    def step(seed):
        ctx = ld.get_replica_context()
        r = ctx.replica_id_in_sync_group
        got = [ctx.all_reduce("SUM", arrays_for(r, seed, j)) for j in range(4)]
        got.append(ctx.all_reduce("MEAN", values(r, seed + 9, 100_003)))
        comm = current_replica().comm
        return got, shared.owners(comm), shared.shared_reads(comm)

    for seed in (0, 100):  # a second step: the same layouts again, read in place
        results = strategy.experimental_local_results(strategy.run(step, args=(seed,)))
        owners = {int(o) for _, o, _ in results}
        assert len(owners) == 1 and {bool(s) for _, _, s in results} == {True}
        for j in range(4):
            parts = [arrays_for(r, seed, j) for r in range(n)]
            expected = [in_rank_order([p[i] for p in parts]) for i in range(len(parts[0]))]
            if j == 0:  # the order shows in the bits: a reversed sum rounds differently
                assert not np.array_equal(expected[0], in_rank_order(
                    [p[0] for p in reversed(parts)]))
            for got, _, _ in results:
                assert len(got[j]) == len(expected)
                for a, e in zip(got[j], expected, strict=True):
                    assert a.dtype == e.dtype and a.shape == e.shape
                    assert a.tobytes() == e.tobytes()
                    assert a.flags.writeable  # a fresh array, not a view of a peer's area
        mean = in_rank_order([values(r, seed + 9, 100_003) for r in range(n)])
        np.true_divide(mean, n, out=mean)
        for got, _, _ in results:
            assert got[4].tobytes() == mean.tobytes()
