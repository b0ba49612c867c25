"""`strategy.run_transaction(fn, args_for, step)`: one step whose arguments are built for the
replicas alive (the lab's path into quorum training). Without quorum mode it is `run`; with
it, a replica killed inside the step leaves the survivor to redo it with arguments built for
fewer replicas, and the step's update lands exactly once."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from cli_workers import cli_cluster, kill

import labdist as ld
from labdist.data.distributed import shard_bounds
from labdist.values import PerReplica

pytestmark = pytest.mark.cluster


def counter(v):
    """A step adding 1 to `v` (MEAN of the replicas' 1s) that returns (rank, shard, the items
    of every shard (an all-reduce: the survivor waits there for a lost peer), v after);
    made here, so it travels by value (the workers cannot import this test module)."""
    def count_step(shard, pause):
        ctx = ld.get_replica_context()
        time.sleep(float(pause))
        items = ctx.all_reduce("SUM", np.float64(len(shard)))
        v.assign_add(np.float64(1.0), read_value=False)
        return (ctx.replica_id_in_sync_group, list(shard), float(np.asarray(items)),
                float(np.asarray(v.read_value())))
    return count_step


def splitter(calls: list[int], pause: float = 0.0):
    """args_for: the items 0..5 over n replicas, recording each n asked for."""
    def args_for(n: int) -> tuple:
        calls.append(n)
        b = shard_bounds(6, n)
        return (PerReplica([list(range(b[r], b[r + 1])) for r in range(n)]), pause)
    return args_for


def test_without_quorum_it_is_run(mirrored2):
    with mirrored2.scope():
        v = ld.Variable(np.float64(0.0), aggregation=ld.VariableAggregation.MEAN)
    calls: list[int] = []
    results = mirrored2.run_transaction(counter(v), splitter(calls))
    assert mirrored2.fault_tolerance == "none" and calls == [2]
    assert results == [(0, [0, 1, 2], 6.0, 1.0), (1, [3, 4, 5], 6.0, 1.0)]
    with pytest.raises(RuntimeError, match="not in quorum mode"):
        mirrored2.add_local_replica()


def test_a_replica_killed_inside_the_step_leaves_the_survivor_to_redo_it(tmp_path):
    with cli_cluster(tmp_path, 2) as cluster, ld.MultiWorkerMirroredStrategy(
            cluster.address, fault_tolerance="quorum", collective_timeout=20) as strategy:
        with strategy.scope():
            v = ld.Variable(np.float64(0.0), aggregation=ld.VariableAggregation.MEAN)
        step = counter(v)
        calls: list[int] = []
        assert strategy.run_transaction(step, splitter(calls), 0)[1][3] == 1.0
        victim = strategy.workers[1]
        threading.Timer(0.3, kill, (cluster.pid_of(victim),)).start()
        results = strategy.run_transaction(step, splitter(calls, pause=1.0), 1)
        assert calls[1:] == [2, 1]  # built again for the one survivor
        assert results == [(0, [0, 1, 2, 3, 4, 5], 6.0, 2.0)]  # applied once, not twice
        (change,) = strategy.membership_changes
        assert change.lost == (victim,) and change.step == 1 and change.retried
        with pytest.raises(RuntimeError, match="did not start"):
            strategy.add_local_replica()  # an external cluster: add a dask worker to it
