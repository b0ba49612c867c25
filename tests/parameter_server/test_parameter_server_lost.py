"""Lost updates on parameter servers, counted exactly, on real worker processes: an update that
a write built on a value without it replaced (parameter_server/chunked.py has the definition).

Races are made certain, not likely: writers wait for each other through flag variables (blind
assigns, which cannot lose anything) before they write, and a test knob holds each chunk of an
update for a while. Each writer adds a different power of two, so the final value says exactly
whose updates landed on each chunk, and the count can be checked writer by writer.
"""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import pytest
from clusters import local_client

import labdist as ld

CHUNKS, CHUNK = 4, 1024
WRITERS = 3


@pytest.fixture(scope="module")
def client():
    with local_client(4) as client:
        yield client


def wait_for(flags, value: float) -> None:
    """Inside a scheduled function: until every flag holds `value` (bounded)."""
    deadline = time.monotonic() + 60
    while min(float(f.read_value()) for f in flags) < value:
        if time.monotonic() > deadline:
            raise TimeoutError("the other writers never arrived")
        time.sleep(0.002)


def add_race(strategy, rounds: int):
    """WRITERS functions, on as many workers, each adding 2**i to every element of a CHUNKS-chunk
    variable at once, each chunk held 0.2 s. Yields, per round, (the final value of each chunk,
    the worker of each writer, the stats)."""
    with strategy.scope():
        big = ld.Variable(np.zeros(CHUNKS * CHUNK, np.float32), name="big")
        ready = [ld.Variable(0.0, name=f"ready{i}") for i in range(WRITERS)]
    coordinator = ld.ClusterCoordinator(strategy)

    def writer(i, r):
        ready[i].assign(float(r))  # blind: never lost
        wait_for(ready, r)
        big.assign_add(np.full(CHUNKS * CHUNK, 2.0 ** i, np.float32))
        return ld.get_replica_context().worker_index

    for r in range(1, rounds + 1):
        with strategy.scope():
            big.assign(np.zeros(CHUNKS * CHUNK, np.float32))
        strategy.reset_stats()
        strategy.set_chunk_delay(0.2)
        values = [coordinator.schedule(writer, args=(i, r)) for i in range(WRITERS)]
        coordinator.join()
        strategy.set_chunk_delay(0.0)
        chunks = big.numpy().reshape(CHUNKS, CHUNK)
        assert (chunks == chunks[:, :1]).all()  # a chunk is written whole, never mixed
        yield chunks[:, 0].astype(int), [v.fetch() for v in values], strategy.stats()


@pytest.mark.timeout(90)
def test_without_locking_updates_holding_one_chunk_at_once_are_lost_and_counted(client):
    """Three assign_adds hold each chunk at the same time: the last write of a chunk replaces
    the others' effect on it. Every lost update is counted once, and nothing else is."""
    with ld.ParameterServerStrategy(client, num_workers=WRITERS, chunk_size=CHUNK) as s:
        for chunks, workers, stats in add_race(s, rounds=3):
            landed = [{i for i in range(WRITERS) if c >> i & 1} for c in chunks]
            lost = {i for i in range(WRITERS) if any(i not in on for on in landed)}
            assert stats.lost_updates == len(lost)  # exactly the writers short somewhere
            assert stats.lost_per_worker == dict(Counter(workers[i] for i in lost))
            assert stats.updates == 2 * WRITERS  # the flags and the adds
            if lost:
                break  # certain in practice: each update holds a chunk for 0.2 s
    assert lost and stats.interleaved_updates >= 1
    total = 2 ** WRITERS - 1
    # the final value is short by exactly what was lost, chunk by chunk
    assert all(c + sum(2 ** i for i in lost if i not in on) == total
               for c, on in zip(chunks, landed, strict=True))


@pytest.mark.timeout(60)
def test_with_locking_every_update_lands_and_none_is_counted_lost(client):
    with ld.ParameterServerStrategy(client, num_workers=WRITERS, chunk_size=CHUNK,
                                    use_locking=True) as s:
        chunks, _, stats = next(add_race(s, rounds=1))
    np.testing.assert_array_equal(chunks, 2 ** WRITERS - 1)
    assert stats.lost_updates == 0 and stats.lost_per_worker == {}
    assert stats.updates == 2 * WRITERS and stats.interleaved_updates == 0


@pytest.mark.timeout(90)
@pytest.mark.parametrize("use_locking", [False, True])
def test_read_then_assign_loses_what_landed_in_between_even_with_locking(client, use_locking):
    """The classic lost update: two functions read x, then both assign(read + 1). The second
    assign overwrites the first, which its read never saw; use_locking (mutual exclusion of
    updates, not of a read and a later write) does not prevent it, and both ways it is
    counted."""
    rounds = 3
    with ld.ParameterServerStrategy(client, num_workers=2, use_locking=use_locking) as s:
        with s.scope():
            x = ld.Variable(0.0, name="x")
            ready = [ld.Variable(0.0, name=f"ready{i}") for i in range(2)]
        coordinator = ld.ClusterCoordinator(s)

        def increment(i, r):
            seen = x.read_value()
            ready[i].assign(float(r))
            wait_for(ready, r)  # both have read before either writes
            x.assign(seen + 1.0)

        for r in range(1, rounds + 1):
            for i in range(2):
                coordinator.schedule(increment, args=(i, r))
            coordinator.join()
        stats = s.stats()
        final = float(x.numpy())
    assert final == rounds  # one of each round's two increments landed
    assert stats.lost_updates == rounds  # ... and the other is counted lost
    assert final + stats.lost_updates == 2 * rounds
    assert sum(stats.lost_per_worker.values()) == rounds
    assert f"lost updates: {rounds}" in str(stats)


@pytest.mark.timeout(60)
def test_updates_that_all_land_count_none_lost(client):
    """Not fooled: a function overwriting its own update, a read-modify-write from a fresh read,
    a blind assign after others' updates, and additive updates racing from stale reads all
    lose nothing, and nothing is counted."""
    with ld.ParameterServerStrategy(client, num_workers=2, chunk_size=4) as s:
        with s.scope():
            x = ld.Variable(np.zeros(16, np.float32), name="x")
            ready, done = ld.Variable(0.0, name="ready"), ld.Variable(0.0, name="done")
        coordinator = ld.ClusterCoordinator(s)

        def own(k):
            seen = x.read_value()
            x.assign_add(np.ones(16, np.float32))  # overwritten by this same function next
            x.assign(seen + 2.0)
            return k

        for k in range(6):  # one at a time: every read is fresh
            assert coordinator.schedule(own, args=(k,)).fetch() == k

        def stale_add(i, r):  # function 0's read goes stale while function 1 adds: none lost
            if i == 0:
                x.read_value()
                ready.assign(float(r))
                wait_for([done], r)
            else:
                wait_for([ready], r)
            x.assign_add(np.ones(16, np.float32))
            if i == 1:
                done.assign(float(r))

        for r in range(1, 4):
            for i in range(2):
                coordinator.schedule(stale_add, args=(i, r))
            coordinator.join()
        fresh = coordinator.schedule(lambda: x.assign(x.read_value() + 1.0)).fetch()
        np.testing.assert_array_equal(fresh, 12.0 + 6.0 + 1.0)
        coordinator.schedule(lambda: x.assign(np.full(16, 7.0, np.float32))).fetch()  # blind
        stats = s.stats()
        final = x.numpy()
    np.testing.assert_array_equal(final, 7.0)
    assert stats.lost_updates == 0 and stats.lost_per_worker == {}
    assert stats.updates == 6 * 2 + 3 * (2 + 2) + 2
    assert stats.max_staleness >= 1  # the stale reads really were stale
