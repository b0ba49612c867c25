"""A worker killed during `fit`: a clear error naming it, then `fit` again with
BackupAndRestore resumes from the last finished epoch on the workers present (docs/design.md,
Reliability; issue 3)."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

import labdist as ld


class KillWorkerAfterEpoch(ld.callbacks.Callback):
    def __init__(self, epoch: int, pid: int):
        self.epoch, self.pid, self.fired = epoch, pid, False

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.epoch and not self.fired:
            self.fired = True
            os.kill(self.pid, signal.SIGKILL)
            time.sleep(0.5)


def test_fit_resumes_after_a_killed_worker(tmp_path):
    (x, y), (x_val, y_val) = ld.datasets.digits.load_data()
    with ld.MirroredStrategy(num_replicas=2, collective_timeout=20) as strategy:
        with strategy.scope():
            model = ld.models.Sequential([
                ld.layers.Dense(256, activation="relu", input_shape=(64,)),
                ld.layers.Dense(10, activation="softmax")])
            model.compile(loss="sparse_categorical_crossentropy",
                          optimizer=ld.optimizers.Adam(), metrics=["accuracy"])
        pids = strategy.experimental_local_results(strategy.run(os.getpid))
        lost = strategy.workers[1]
        backup = ld.callbacks.BackupAndRestore(str(tmp_path / "backup"))
        killer = KillWorkerAfterEpoch(1, pids[1])  # after epoch 1's backup is written
        with pytest.raises(ld.ReplicaLostError, match=lost.replace(".", r"\.")):
            model.fit(x, y, epochs=6, batch_size=64, verbose=0, callbacks=[backup, killer])
        assert (tmp_path / "backup" / "checkpoint").exists()
        saved = np.load(tmp_path / "backup" / (tmp_path / "backup" / "checkpoint")
                        .read_text())["weight/dense_0/kernel"]

        history = model.fit(x, y, epochs=6, batch_size=64, verbose=0,
                            validation_data=(x_val, y_val), callbacks=[backup, killer])
        assert history.epoch == [2, 3, 4, 5]  # resumed after the last finished epoch
        assert lost not in strategy.workers and strategy.num_replicas_in_sync >= 1
        assert history.history["val_accuracy"][-1] >= 0.95
        assert not (tmp_path / "backup").exists()  # a completed fit removes its backup
        assert not np.array_equal(saved, model.get_weights()[0])
        for v in (v for w in model._weights for v in w.values()):  # copies agree again
            copies = strategy.experimental_local_results(v)
            assert all(np.array_equal(copies[0], c) for c in copies[1:])


def test_recovered_replicas_get_the_modes_in_force_not_the_constructors():
    """The compressor and local SGD settings switched since the strategy was made are what
    the re-formed replicas use after `recover()`."""
    with ld.MirroredStrategy(num_replicas=2, collective_timeout=20,
                             compression="fp16") as strategy:
        strategy.compression = ld.compression.TopK(0.05)
        strategy.set_local_sgd(4)
        pids = strategy.experimental_local_results(strategy.run(os.getpid))
        os.kill(pids[1], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while not strategy.recover():
            assert time.monotonic() < deadline, "the lost replica was never noticed"
            time.sleep(0.2)

        def modes():
            ctx = ld.get_replica_context()
            return ctx.compression, ctx.local_sgd.local_steps

        got = strategy.experimental_local_results(strategy.run(modes))
        assert got and all(m == (ld.compression.TopK(0.05), 4) for m in got)


def test_a_round_left_open_by_turning_local_sgd_off_closes_with_its_outer_step_after_recover():
    """Local SGD with outer SGD(0.5): two inner steps of +1, then local SGD off, then a worker
    lost and `recover()`. The re-formed replicas get the last local-SGD settings, so the first
    synchronous step closes the open round with its outer step (+2 x 0.5) before its own +1:
    every update counted once, with the outer step it was owed (plain averaging: 3)."""
    with ld.MirroredStrategy(num_replicas=2, collective_timeout=20, local_steps=4,
                             outer_optimizer=ld.optimizers.SGD(0.5)) as strategy:
        with strategy.scope():
            w = ld.Variable(np.zeros(4, np.float32), name="w")
            optimizer = ld.optimizers.SGD(1.0)
            optimizer.build([w])

        def step():  # the gradients sum to -1: +1 a synchronous step, +1 an inner one
            n = ld.get_replica_context().num_replicas_in_sync
            optimizer.apply_gradients([(np.full(4, -1.0 / n, np.float32), w)])

        strategy.run(step)
        strategy.run(step)
        strategy.set_local_sgd(None)
        pids = strategy.experimental_local_results(strategy.run(os.getpid))
        os.kill(pids[1], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while not strategy.recover():
            assert time.monotonic() < deadline, "the lost replica was never noticed"
            time.sleep(0.2)
        strategy.run(step)
        for copy in strategy.experimental_local_results(w):
            np.testing.assert_allclose(copy, np.full(4, 2.0))
        stats = strategy.communication_stats()
        assert all(s["outer_steps"] == 1 and s["synced_steps"] == 1 for s in stats)
