"""Parameter-server waits that always end: a closed strategy, and a frozen parameter server.

After `strategy.close()` nothing waits for work that will never run: scheduling raises at once
and values scheduled before the close raise from fetch(). A parameter server whose process is
SIGSTOPped (it neither dies nor answers) is declared lost after `ps_timeout` seconds, naming
it, whether the driver or a worker was waiting for it; one that answers its liveness checks is
never declared lost, however long a call waits (a sync barrier held up by a straggler).

Real worker processes on one LocalCluster for the module; a stopped process is always
SIGCONTed in a `finally`, so nothing is left stopped.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import time

import numpy as np
import pytest
from clusters import local_client

import labdist as ld

PS_TIMEOUT = 2.0


@pytest.fixture(scope="module")
def client():
    with local_client(3) as client:
        yield client


def pid_of(client, address: str) -> int:
    return client.run(os.getpid, workers=[address])[address]


@contextlib.contextmanager
def stopped(client, address: str):
    """SIGSTOP the worker process at `address` for the block; SIGCONT it whatever happens."""
    pid = pid_of(client, address)
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


# -- closed -------------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_after_close_nothing_waits_and_everything_says_closed(client):
    strategy = ld.ParameterServerStrategy(client, num_workers=2)
    with strategy.scope():
        v = ld.Variable(0.0)
    coordinator = ld.ClusterCoordinator(strategy)

    def slow():
        time.sleep(1.0)
        v.assign_add(1.0)

    running = [coordinator.schedule(slow) for _ in range(2)]
    queued = [coordinator.schedule(slow) for _ in range(4)]
    time.sleep(0.3)  # the first two are running on the workers
    strategy.close()
    for value in running + queued:  # each ends, with the reason
        with pytest.raises(RuntimeError, match="closed .*before this function finished"):
            value.fetch()
    closed = r"ParameterServerStrategy\(.*\) is closed"
    with pytest.raises(RuntimeError, match=closed + r".*new strategy.*ClusterCoordinator"):
        coordinator.schedule(lambda: 1)
    with pytest.raises(RuntimeError, match=closed):
        coordinator.join()
    with pytest.raises(RuntimeError, match=closed):
        coordinator.create_per_worker_dataset([1, 2])
    with pytest.raises(RuntimeError, match=closed):
        strategy.run(lambda: 1)
    with pytest.raises(RuntimeError, match=closed):
        ld.ClusterCoordinator(strategy)


@pytest.mark.timeout(60)
def test_a_closed_coordinator_says_how_to_get_a_new_one(client):
    with ld.ParameterServerStrategy(client, num_workers=2) as strategy:
        coordinator = ld.ClusterCoordinator(strategy)
        assert coordinator.schedule(lambda: 7).fetch() == 7
        coordinator.close()
        with pytest.raises(RuntimeError, match=r"ClusterCoordinator is closed.*"
                                               r"ld\.ClusterCoordinator\(strategy\)"):
            coordinator.schedule(lambda: 1)
        fresh = ld.ClusterCoordinator(strategy)
        assert fresh is not coordinator
        assert fresh.schedule(lambda: 8).fetch() == 8


# -- frozen -------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [0, -1.0, float("nan"), "5", True, None])
def test_ps_timeout_must_be_a_positive_number(value):
    with pytest.raises(ValueError, match=rf"ps_timeout={re.escape(repr(value))}.*positive"):
        ld.ParameterServerStrategy(num_workers=1, ps_timeout=value)


def assert_names_the_frozen_ps(error, ps: str) -> None:
    text = str(error)
    assert f"parameter server 0 (worker {ps})" in text, text
    assert "stopped answering" in text and f"for {PS_TIMEOUT:g} s" in text, text
    assert "restore the last checkpoint" in text and "ps_timeout" in text, text


@pytest.mark.timeout(60)
def test_a_frozen_ps_stops_the_workers_with_an_error_naming_it(client):
    strategy = ld.ParameterServerStrategy(client, num_workers=2, ps_timeout=PS_TIMEOUT)
    try:
        with strategy.scope():
            v = ld.Variable(np.zeros(4, np.float32))
        coordinator = ld.ClusterCoordinator(strategy)

        def step():
            v.assign_add(np.ones(4, np.float32))
            time.sleep(0.05)

        for _ in range(4):
            coordinator.schedule(step)
        coordinator.join()
        ps = strategy.parameter_servers[0]
        with stopped(client, ps):
            values = [coordinator.schedule(step) for _ in range(50)]
            start = time.monotonic()
            with pytest.raises(ld.ParameterServerLostError) as info:
                coordinator.join()
            waited = time.monotonic() - start
            assert_names_the_frozen_ps(info.value, ps)
            assert "worker" in str(info.value).split("stopped answering")[1]  # who noticed
            assert waited < PS_TIMEOUT + 20  # bounded: not Dask's worker TTL (minutes)
            with pytest.raises(ld.ParameterServerLostError, match=re.escape(ps)):
                values[-1].fetch()
            start = time.monotonic()
            with pytest.raises(ld.ParameterServerLostError, match="stopped answering"):
                v.numpy()  # the driver knows too: at once, not after another timeout
            assert time.monotonic() - start < PS_TIMEOUT
            start = time.monotonic()
            strategy.close()  # does not wait for the frozen PS
            assert time.monotonic() - start < 10
    finally:
        strategy.close()


@pytest.mark.timeout(60)
def test_a_frozen_ps_fails_the_drivers_own_calls(client):
    strategy = ld.ParameterServerStrategy(client, num_workers=2, ps_timeout=PS_TIMEOUT)
    try:
        with strategy.scope():
            v = ld.Variable(1.0)
        assert float(v.numpy()) == 1.0
        ps = strategy.parameter_servers[0]
        with stopped(client, ps):
            start = time.monotonic()
            with pytest.raises(ld.ParameterServerLostError) as info:
                strategy.stats()
            assert time.monotonic() - start < PS_TIMEOUT + 20
            assert_names_the_frozen_ps(info.value, ps)
            assert "the driver heard nothing" in str(info.value)
            start = time.monotonic()
            strategy.close()
            assert time.monotonic() - start < 10
    finally:
        strategy.close()


@pytest.mark.timeout(60)
def test_a_ps_that_answers_is_never_declared_lost_however_long_a_call_waits(client):
    """Sync mode with a straggler: the other worker's push waits at the barrier for longer than
    ps_timeout; then an update applied slowly chunk by chunk on the PS's threads keeps both
    pushes waiting as long. The PS answers its liveness checks meanwhile, so both finish."""
    timeout = 1.0
    with ld.ParameterServerStrategy(client, num_workers=2, mode="sync", ps_timeout=timeout,
                                    chunk_size=1) as strategy:
        with strategy.scope():
            v = ld.Variable(np.zeros(6, np.float32))
        coordinator = ld.ClusterCoordinator(strategy)

        def step():
            v.assign_add(np.ones(6, np.float32))
            return ld.get_replica_context().worker_index

        def two_steps() -> float:
            start = time.monotonic()
            values = [coordinator.schedule(step) for _ in range(2)]
            coordinator.join()
            assert sorted(value.fetch() for value in values) == [0, 1]
            return time.monotonic() - start

        strategy.set_worker_delay(1, 3 * timeout)
        assert two_steps() > 3 * timeout  # the barrier did wait that long
        strategy.set_worker_delay(1, 0)
        strategy.set_chunk_delay(0.5)  # six chunks: the step's update takes 3 s to apply
        assert two_steps() > 2 * timeout
        strategy.set_chunk_delay(0)
        assert strategy.stats().global_step == 2  # both steps applied, nothing lost


def test_ps_timeout_can_be_infinite(client):
    with ld.ParameterServerStrategy(client, num_workers=2, ps_timeout=math.inf) as strategy:
        assert strategy.ps_timeout == math.inf
        assert ld.ClusterCoordinator(strategy).schedule(lambda: 3).fetch() == 3
