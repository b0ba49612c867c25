"""Bounded waits (issue 13, finding 5): a replica whose worker is frozen (a real SIGSTOP) makes
`strategy.run` raise an error naming it soon after its peer reported, not at Dask's worker TTL;
while it stays frozen every call says so within a bound; once it is continued the strategy
works again. And a driver interrupted while replicas run (Ctrl-C in Jupyter) leaves nothing
that breaks the next run. Real worker processes, both step transports."""

from __future__ import annotations

import itertools
import os
import re
import signal
import threading
import time

import pytest
from clusters import local_client

import labdist as ld

TIMEOUT = 2.0  # the strategies' collective_timeout
TRANSPORTS = ["auto", "tcp"]  # steps over the socket lane, and as actor calls
TOKENS = itertools.count(1)


@pytest.fixture(scope="module")
def client():
    with local_client(2) as client:
        yield client


@pytest.fixture(params=TRANSPORTS)
def strategy(request, client):
    s = ld.MirroredStrategy(num_replicas=2, cluster=client, collective_timeout=TIMEOUT,
                            transport=request.param)
    yield s
    s.close()


def all_reduce_step():
    return ld.get_replica_context().all_reduce("SUM", 1.0)


def still_works(s: ld.Strategy) -> None:
    """A run answers with its own values (not an earlier run's, left on the way)."""
    token = next(TOKENS)
    out = s.run(lambda: (token, ld.get_replica_context().all_reduce("SUM", 1.0)))
    assert s.experimental_local_results(out) == ((token, 2.0), (token, 2.0))


@pytest.mark.timeout(90)
def test_a_frozen_replica_is_named_within_the_collective_timeout_plus_a_margin(strategy):
    s = strategy
    pids = s.experimental_local_results(s.run(os.getpid))
    frozen = re.escape(s.workers[1])
    os.kill(pids[1], signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(ld.ReplicaUnresponsiveError,
                           match=rf"replica 1 \(worker {frozen}\) did not answer") as info:
            s.run(all_reduce_step)
        took = time.monotonic() - start
        assert took < 2 * TIMEOUT + 5 + 20  # its peer's collective timeout, then the bound
        assert "collective_timeout=2" in str(info.value)
        start = time.monotonic()
        with pytest.raises(ld.ReplicaUnresponsiveError,
                           match=rf"replica 1 \(worker {frozen}\) .*earlier strategy\.run"):
            s.run(lambda: 1)  # still frozen: said again, within the same bound
        assert time.monotonic() - start < TIMEOUT + 5 + 20
    finally:
        os.kill(pids[1], signal.SIGCONT)
    still_works(s)  # it came back: the old step is collected, and the strategy works


def interrupt_after(seconds: float) -> threading.Timer:
    """A real SIGINT to this process (as Jupyter's interrupt sends) after `seconds`."""
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    return timer


@pytest.mark.timeout(60)
def test_an_interrupted_run_leaves_the_replicas_usable(strategy):
    s = strategy

    def slow_on_one():
        ctx = ld.get_replica_context()
        if ctx.replica_id_in_sync_group == 1:
            time.sleep(1.5)
        return ctx.all_reduce("SUM", 5.0)

    timer = interrupt_after(0.5)
    with pytest.raises(KeyboardInterrupt):
        s.run(slow_on_one)
    timer.join()
    still_works(s)
    still_works(s)


@pytest.mark.timeout(60)
def test_an_interrupted_run_releases_a_replica_left_in_merge_call(strategy):
    s = strategy

    def merge_late_on_one():
        ctx = ld.get_replica_context()
        if ctx.replica_id_in_sync_group == 1:
            time.sleep(1.5)
        return ctx.merge_call(lambda strategy, x: x, args=(1,))

    timer = interrupt_after(0.5)
    with pytest.raises(KeyboardInterrupt):
        s.run(merge_late_on_one)
    timer.join()
    still_works(s)
    assert s.experimental_local_results(s.run(merge_late_on_one)) == (1, 1)
