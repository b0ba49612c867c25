"""Quorum training when more goes wrong: two workers killed at once, fewer than min_replicas
left, a joining worker killed while the next epoch forms, the peer being copied from killed as
the copy begins. Each ends consistent (every copy bit-identical) or with an error naming what
was lost, within the existing timeouts."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from cli_workers import cli_cluster, kill
from test_quorum import DIGITS, KillDuringEpoch, digits_model, fingerprints, steps_of

import labdist as ld

pytestmark = pytest.mark.cluster


def test_two_killed_at_once(tmp_path):
    with cli_cluster(tmp_path, 3) as cluster, ld.MultiWorkerMirroredStrategy(
            cluster.address, fault_tolerance="quorum", collective_timeout=20) as strategy:
        model = digits_model(strategy)
        victims = strategy.workers[1:]
        pids = [cluster.pid_of(w) for w in victims]
        gen, _, total = steps_of(model, strategy)
        done = 0
        for _ in gen:
            done += 1
            if done == 4:
                for pid in pids:
                    kill(pid)
        assert done == total
        assert strategy.num_replicas_in_sync == 1
        lost = {w for c in strategy.membership_changes for w in c.lost}
        assert lost == set(victims)
        assert len(fingerprints(strategy)) == 1


def test_below_min_replicas_names_the_lost_worker(tmp_path):
    (x, y), _ = DIGITS
    with cli_cluster(tmp_path, 2) as cluster, ld.MultiWorkerMirroredStrategy(
            cluster.address, fault_tolerance="quorum", min_replicas=2,
            collective_timeout=20) as strategy:
        model = digits_model(strategy)
        victim = strategy.workers[0]
        killer = KillDuringEpoch(1, cluster.pid_of(victim))
        started = time.monotonic()
        with pytest.raises(ld.QuorumLostError, match=victim.replace(".", r"\.")) as info:
            model.fit(x, y, epochs=30, batch_size=64, verbose=0, callbacks=[killer])
        assert "min_replicas=2" in str(info.value)
        assert time.monotonic() - started < 20  # no timeout was waited for
        survivor = strategy.workers[1]
        assert survivor in str(info.value)  # what is left is named too
        deadline = time.monotonic() + 30  # recover() re-forms on the workers Dask lists
        while victim in cluster.workers():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert strategy.recover()  # the survivor's copies carry on
        assert strategy.workers == [survivor]
        assert len(model.get_weights()) == 4


def test_a_joiner_killed_while_the_epoch_forms(tmp_path):
    """The new worker is frozen as soon as it registers and killed half a second later, while
    the driver takes it in (its replica starting, or receiving the copy): training goes on
    with the replicas it had, all bit-identical."""
    with cli_cluster(tmp_path, 2) as cluster, ld.MultiWorkerMirroredStrategy(
            cluster.address, fault_tolerance="quorum", collective_timeout=20) as strategy:
        model = digits_model(strategy)
        gen, _, total = steps_of(model, strategy)
        done = 0
        for _ in gen:
            done += 1
            if done == 3:
                before = set(cluster.workers())
                [proc] = cluster.add_workers(1)
                os.kill(proc.pid, signal.SIGSTOP)
                threading.Timer(0.5, kill, (proc.pid,)).start()
                joiner = (set(cluster.workers()) - before).pop()
        assert done == total
        assert joiner not in strategy.workers and strategy.num_replicas_in_sync == 2
        assert strategy.membership_changes == []  # the replicas it had never changed
        assert len(fingerprints(strategy)) == 1


def test_the_source_of_the_copy_killed(tmp_path):
    """Replica 0, the peer a joiner copies from, is frozen when the join is noticed and killed
    half a second later: the copy comes from the next survivor instead."""
    with cli_cluster(tmp_path, 2) as cluster, ld.MultiWorkerMirroredStrategy(
            cluster.address, fault_tolerance="quorum", collective_timeout=20) as strategy:
        model = digits_model(strategy)
        source = strategy.workers[0]
        pid = cluster.pid_of(source)
        gen, _, total = steps_of(model, strategy)
        done = 0
        for _ in gen:
            done += 1
            if done == 3:
                before = set(cluster.workers())
                cluster.add_workers(1)
                joiner = (set(cluster.workers()) - before).pop()
                os.kill(pid, signal.SIGSTOP)
                threading.Timer(0.5, kill, (pid,)).start()
        assert done == total
        assert source not in strategy.workers and joiner in strategy.workers
        assert strategy.num_replicas_in_sync == 2
        assert len(fingerprints(strategy)) == 1
        lost = {w for c in strategy.membership_changes for w in c.lost}
        joined = {w for c in strategy.membership_changes for w in c.joined}
        assert lost == {source} and joined == {joiner}


def test_killed_between_fits_is_left_behind_by_the_next():
    """A worker killed while no step runs: the next fit's first step finds it lost and the
    survivors train on (the embedded cluster's nanny may bring a replacement in later)."""
    (x, y), _ = DIGITS
    with ld.MirroredStrategy(num_replicas=3, fault_tolerance="quorum",
                             collective_timeout=20) as strategy:
        model = digits_model(strategy)
        model.fit(x, y, epochs=1, batch_size=64, verbose=0)
        pids = strategy.experimental_local_results(strategy.run(os.getpid))
        victim = strategy.workers[0]
        kill(pids[0])
        model.fit(x, y, epochs=2, batch_size=64, verbose=0)
        assert model._iterations == 3 * -(-len(x) // 64)  # 1 epoch, then 2
        first = strategy.membership_changes[0]
        assert first.lost == (victim,)
        assert len(fingerprints(strategy)) == 1
