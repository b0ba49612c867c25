"""Quorum training (fault_tolerance="quorum"): `fit` goes on after a real `kill -9` of a
worker, every surviving copy bit-identical, and a worker that joins becomes a replica at the
next step boundary with its copies from a live peer (docs/design.md, "Quorum training")."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from cli_workers import cli_cluster, kill

import labdist as ld
from labdist.data.distributed import Batches
from labdist.quorum.healing import fingerprint

pytestmark = pytest.mark.cluster
DIGITS = ld.datasets.digits.load_data()


def digits_model(strategy) -> ld.models.Sequential:
    with strategy.scope():
        model = ld.models.Sequential([
            ld.layers.Dense(256, activation="relu", input_shape=(64,)),
            ld.layers.Dense(10, activation="softmax")])
        model.compile(loss="sparse_categorical_crossentropy", optimizer=ld.optimizers.Adam(),
                      metrics=["accuracy"])
    return model


def fingerprints(strategy) -> set[str]:
    """One digest of every variable copy (weights and optimizer slots) per replica."""
    return set(strategy.experimental_local_results(strategy.run(fingerprint)))


def steps_of(model, strategy, batch_size: int = 64, per_run: int = 1):
    """fit's own path, a run of `per_run` steps at a time (steps_per_execution): (the
    generator of each run's results, the step, how many runs)."""
    (x, y), _ = DIGITS
    model._ensure_ready(x)
    step = model._train_step(y)
    batches = list(Batches((x, y), batch_size, shuffle=True, seed=1))
    groups = [batches[i:i + per_run] for i in range(0, len(batches), per_run)]
    return strategy.train_model_steps(step, groups, 0), step, len(groups)


class KillDuringEpoch(ld.callbacks.Callback):
    """SIGKILLs `pid` `delay` seconds into epoch `epoch` (mid-epoch: between or inside steps)."""

    def __init__(self, epoch: int, pid: int, delay: float = 0.02):
        self.epoch, self.pid, self.delay = epoch, pid, delay
        self.killed_at: float | None = None

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            def later():
                time.sleep(self.delay)
                self.killed_at = time.monotonic()
                kill(self.pid)
            threading.Thread(target=later, daemon=True).start()


class Gaps(ld.callbacks.Callback):
    """Records every membership change with when fit's callbacks heard of it."""

    def __init__(self):
        self.changes = []

    def on_membership_change(self, change):
        self.changes.append((time.monotonic(), change))


def test_kill_one_of_three_mid_fit(tmp_path):
    (x, y), (x_val, y_val) = DIGITS
    with cli_cluster(tmp_path, 3) as cluster, ld.MultiWorkerMirroredStrategy(
            cluster.address, fault_tolerance="quorum", min_replicas=1,
            collective_timeout=20) as strategy:
        model = digits_model(strategy)
        victim = strategy.workers[1]
        killer = KillDuringEpoch(3, cluster.pid_of(victim))
        heard = Gaps()
        epochs = 12
        started = time.monotonic()
        history = model.fit(x, y, epochs=epochs, batch_size=64, verbose=0,
                            validation_data=(x_val, y_val), callbacks=[killer, heard])
        assert killer.killed_at is not None and killer.killed_at > started
        batches = epochs * -(-len(x) // 64)
        assert model._iterations == batches  # no step lost, none applied twice
        assert history.history["val_accuracy"][-1] >= 0.95
        [change] = strategy.membership_changes
        assert change.lost == (victim,) and victim not in strategy.workers
        assert strategy.num_replicas_in_sync == 2 == change.num_replicas
        assert change.paused_s <= 3.0
        assert heard.changes and heard.changes[0][1] == change
        assert heard.changes[0][0] - killer.killed_at <= 3.0  # the measured pause
        assert len(fingerprints(strategy)) == 1


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_survivors_stay_bit_identical_every_step(tmp_path, transport):
    """The lost replica is stopped, then killed, while the others wait for it inside a step:
    the survivors undo that step and run it again among themselves (steps and collectives
    over the socket lane and shared memory, or over Dask comms alone)."""
    with cli_cluster(tmp_path, 3) as cluster, ld.MultiWorkerMirroredStrategy(
            cluster.address, fault_tolerance="quorum", collective_timeout=20,
            transport=transport) as strategy:
        model = digits_model(strategy)
        pid = cluster.pid_of(strategy.workers[2])
        gen, _, total = steps_of(model, strategy)
        done = 0
        gaps = []
        last = time.monotonic()
        for out in gen:
            assert [n for _, _, n in out] == [min(64, len(DIGITS[0][0]) - 64 * done)]
            done += 1
            now = time.monotonic()
            gaps.append(now - last)
            assert len(fingerprints(strategy)) == 1, f"copies differ after step {done}"
            last = time.monotonic()
            if done == 5:
                os.kill(pid, signal.SIGSTOP)  # the next step waits for it in a collective
                threading.Timer(0.5, kill, (pid,)).start()
        assert done == total
        [change] = strategy.membership_changes
        assert change.retried and change.step == 5 and strategy.num_replicas_in_sync == 2
        assert max(gaps) <= 3.0


def test_a_joining_worker_becomes_a_replica_within_two_steps(tmp_path):
    with cli_cluster(tmp_path, 2) as cluster, ld.MultiWorkerMirroredStrategy(
            cluster.address, fault_tolerance="quorum", collective_timeout=20) as strategy:
        model = digits_model(strategy)
        heard = []
        strategy.add_membership_listener(heard.append)
        gen, step, total = steps_of(model, strategy)
        done, listed_at, new = 0, None, None
        for _ in gen:
            done += 1
            if done == 3:  # training waits here until the scheduler lists the new worker
                before = set(cluster.workers())
                cluster.add_workers(1)
                listed_at, [new] = done, set(cluster.workers()) - before
            if new is not None and new in strategy.workers:
                break
            assert done < total
        [change] = heard
        assert change.joined == (new,) and strategy.num_replicas_in_sync == 3
        assert change.step - listed_at <= 2
        assert len(fingerprints(strategy)) == 1
        for var in [*step.variables(), *(v for d in step.slot_variables() for v in d.values())]:
            copies = strategy.experimental_local_results(var)
            assert all(np.array_equal(copies[0], c) for c in copies[1:])
            assert all(c.tobytes() == copies[0].tobytes() for c in copies)
        for _ in gen:  # and it trains on with three replicas
            done += 1
        assert done == total and len(fingerprints(strategy)) == 1


def test_embedded_cluster_shrinks_then_grows_back():
    """MirroredStrategy's own LocalCluster: its nanny restarts the killed worker, which the
    next fit takes in again (a replacement is a joining worker)."""
    (x, y), (x_val, y_val) = DIGITS
    with ld.MirroredStrategy(num_replicas=3, fault_tolerance="quorum", min_replicas=2,
                             collective_timeout=20) as strategy:
        model = digits_model(strategy)
        pids = strategy.experimental_local_results(strategy.run(os.getpid))
        victim = strategy.workers[2]
        model.fit(x, y, epochs=6, batch_size=64, verbose=0,
                  callbacks=[KillDuringEpoch(2, pids[2])])
        assert victim not in strategy.workers
        deadline = time.monotonic() + 60
        while len(strategy.client.scheduler_info(n_workers=-1)["workers"]) < 3:
            assert time.monotonic() < deadline, "the nanny did not restart the worker"
            time.sleep(0.1)
        history = model.fit(x, y, epochs=8, initial_epoch=6, batch_size=64, verbose=0,
                            validation_data=(x_val, y_val))
        assert model._iterations == 8 * -(-len(x) // 64)
        assert strategy.num_replicas_in_sync == 3
        lost, joined = strategy.membership_changes
        assert lost.lost == (victim,) and len(joined.joined) == 1
        assert history.history["val_accuracy"][-1] >= 0.95
        assert len(fingerprints(strategy)) == 1


def test_a_run_of_several_steps_is_undone_and_run_again_whole(tmp_path):
    """steps_per_execution=5: the replicas had applied some of a run's steps when a peer was
    lost; the survivors undo all of them and run the five again."""
    with cli_cluster(tmp_path, 3) as cluster, ld.MultiWorkerMirroredStrategy(
            cluster.address, fault_tolerance="quorum", collective_timeout=20) as strategy:
        model = digits_model(strategy)
        victim = strategy.workers[1]
        pid = cluster.pid_of(victim)
        gen, _, total = steps_of(model, strategy, per_run=5)
        done = steps = 0
        for out in gen:
            done += 1
            steps += len(out)
            assert len(fingerprints(strategy)) == 1
            if done == 2:  # killed after its first steps of the next run
                threading.Timer(0.003, kill, (pid,)).start()
        assert done == total and steps == -(-len(DIGITS[0][0]) // 64)
        [change] = strategy.membership_changes
        assert change.lost == (victim,) and strategy.num_replicas_in_sync == 2
