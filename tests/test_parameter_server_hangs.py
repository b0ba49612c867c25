"""Parameter-server waits that always end: a closed strategy.

After `strategy.close()` nothing waits for work that will never run: scheduling raises at once
and values scheduled before the close raise from fetch().

Real worker processes on one LocalCluster for the module.
"""

from __future__ import annotations

import time

import pytest
from distributed import Client

import labdist as ld
from labdist.cluster import start_local_cluster


@pytest.fixture(scope="module")
def client():
    cluster = start_local_cluster(3)
    client = Client(cluster, direct_to_workers=True, set_as_default=False)
    yield client
    client.close()
    cluster.close()


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
