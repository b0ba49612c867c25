"""The replicas run fit's loop (training/trainer/fit_loop.py): an epoch from one dispatch where the
data is placed, the same steps as the driver sending each group, Keras' batch hooks and its
rule for `stop_training`, and errors as before."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import cloudpickle
import numpy as np
import pytest

import labdist as ld
from labdist.shm import placed
from labdist.training.trainer.epoch_plan import EpochPlan
from labdist.training.trainer.fit_loop import implements_batch_hooks

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Faulty runs on the workers


def data(n=203, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, 20), dtype=np.float32), rng.integers(0, 3, n)


def model(strategy, spe=3, optimizer=None, layer=None):
    with strategy.scope():
        m = ld.models.Sequential([
            (layer or ld.layers.Dense)(16, activation="relu", input_shape=(20,)),
            ld.layers.Dropout(0.2),
            ld.layers.Dense(3, activation="softmax")])
        m.compile(loss="sparse_categorical_crossentropy",
                  optimizer=optimizer or ld.optimizers.Adam(0.01), metrics=["accuracy"],
                  steps_per_execution=spe)
    return m


class Hooks(ld.callbacks.Callback):
    """Records the batch hooks; stops at the first group end at or after batch `stop_at`."""

    def __init__(self, stop_at=None):
        self.stop_at, self.calls = stop_at, []

    def on_train_batch_begin(self, batch, logs=None):
        self.calls.append(("begin", batch))

    def on_train_batch_end(self, batch, logs=None):
        self.calls.append(("end", batch, dict(logs)))
        if self.stop_at is not None and batch >= self.stop_at:
            self.model.stop_training = True


def runs(strategy) -> int:
    """The strategy's run counter (each strategy.run takes the next number)."""
    return next(strategy._run_ids)


def train(monkeypatch, strategy, place: bool, callbacks=(), epochs=2, **kw):
    monkeypatch.setenv(placed.ENV, "1" if place else "0")
    x, y = data()
    m = model(strategy, **kw)
    before = runs(strategy)
    history = m.fit(x, y, batch_size=16, epochs=epochs, callbacks=list(callbacks), verbose=0)
    return m, history, runs(strategy) - before - 1


def same_weights(a, b) -> bool:
    return all(u.tobytes() == v.tobytes() for u, v in zip(a.get_weights(), b.get_weights(),
                                                          strict=True))


def test_replicas_run_whole_epochs_with_exactly_the_driver_s_steps(monkeypatch, mirrored2):
    driver, h_driver, sent_driver = train(monkeypatch, mirrored2, place=False)
    loop, h_loop, sent_loop = train(monkeypatch, mirrored2, place=True)
    assert h_loop.history == h_driver.history  # the same floats, every log
    assert same_weights(loop, driver)  # Adam's slots and dropout's masks alike
    assert loop._iterations == driver._iterations == 2 * 13
    assert sent_driver == 2 * 5  # 13 batches in groups of 3: 5 runs an epoch
    assert sent_loop == 1 + 2  # the placement check, then one run an epoch
    for v in loop.weights:
        a, b = mirrored2.experimental_local_results(v)
        assert a.tobytes() == b.tobytes()


def test_batch_hooks_get_a_group_each_with_running_logs(monkeypatch, mirrored2):
    seen = {}
    for place in (False, True):
        hooks = Hooks()
        m, history, _ = train(monkeypatch, mirrored2, place, [hooks], epochs=1)
        seen[place] = (hooks.calls, m.get_weights(), history.history)
    calls = seen[True][0]
    assert [c[:2] for c in calls] == [
        ("begin", 0), ("end", 2), ("begin", 3), ("end", 5), ("begin", 6), ("end", 8),
        ("begin", 9), ("end", 11), ("begin", 12), ("end", 12)]
    assert calls[-1][2] == {k: v[0] for k, v in seen[True][2].items()}  # the epoch's logs
    assert calls == seen[False][0]
    assert all(a.tobytes() == b.tobytes() for a, b in zip(seen[True][1], seen[False][1],
                                                          strict=True))


@pytest.mark.parametrize("stop_at, steps", [(0, 3), (4, 6), (5, 6), (6, 9), (12, 13)])
def test_stop_training_in_a_batch_hook_ends_after_that_group(monkeypatch, mirrored2, stop_at,
                                                            steps):
    """Keras: stop_training set in on_train_batch_end(k) ends the epoch after the group that
    ended with batch k; later epochs do not start."""
    results = []
    for place in (False, True):
        m, history, _ = train(monkeypatch, mirrored2, place, [Hooks(stop_at)], epochs=3)
        assert m._iterations == steps
        assert len(history.epoch) == 1
        results.append(m)
    assert same_weights(*results)


class StopAtEpochBegin(ld.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 1:
            self.model.stop_training = True


def test_stop_training_in_on_epoch_begin_runs_one_group(monkeypatch, mirrored2):
    results = []
    for place in (False, True):
        m, history, _ = train(monkeypatch, mirrored2, place, [StopAtEpochBegin()], epochs=3)
        assert m._iterations == 13 + 3  # epoch 0, then the first group of epoch 1 (Keras)
        assert history.epoch == [0, 1]
        results.append(m)
    assert same_weights(*results)


class StopFromAnotherThread(ld.callbacks.Callback):
    """Sets model.stop_training from a thread while the replicas run the epoch."""

    def on_epoch_begin(self, epoch, logs=None):
        threading.Timer(0.3, setattr, (self.model, "stop_training", True)).start()


def test_stop_training_set_meanwhile_stops_every_replica_after_the_same_group(
        monkeypatch, mirrored2):
    monkeypatch.setenv(placed.ENV, "1")
    x, y = data(4000, seed=1)
    m = model(mirrored2, spe=2, optimizer=ld.optimizers.SGD(0.05))
    start = time.perf_counter()
    m.fit(x, y, batch_size=2, epochs=1, callbacks=[StopFromAnotherThread()], verbose=0)
    took = time.perf_counter() - start
    steps = m._iterations
    assert steps < 2000, f"the epoch ran to its end ({took:.1f} s)"
    assert steps % 2 == 0  # at a group boundary
    for v in m.weights:  # both replicas stopped after the same step
        a, b = mirrored2.experimental_local_results(v)
        assert a.tobytes() == b.tobytes()
    # exactly the steps a run told to stop there takes
    monkeypatch.setenv(placed.ENV, "0")
    ref = model(mirrored2, spe=2, optimizer=ld.optimizers.SGD(0.05))
    ref.fit(x, y, batch_size=2, epochs=1, callbacks=[Hooks(steps - 1)], verbose=0)
    assert ref._iterations == steps
    assert same_weights(m, ref)


class Faulty(ld.layers.Dense):
    """Fails on a replica at the step whose shard holds a marked row."""

    def forward(self, xp, params, x, training=False, rng=None):
        if training and len(x) and float(x[:, 0].max()) > 100:
            raise ValueError("a marked row reached the step")
        return super().forward(xp, params, x, training=training, rng=rng)


def test_an_error_on_a_replica_surfaces_with_its_notes(monkeypatch, mirrored2):
    monkeypatch.setenv(placed.ENV, "1")
    x, y = data(64)
    x[40, 0] = 1000.0  # batch 2 of 4 (batch size 16, no shuffle): the third step
    m = model(mirrored2, spe=1, layer=Faulty)
    with pytest.raises(ValueError, match="a marked row") as info:
        m.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    notes = "\n".join(info.value.__notes__)
    assert "raised on" in notes
    assert "model.fit: 2 optimizer step(s)" in notes
    assert m._iterations == 2
    m2 = model(mirrored2, spe=1)  # the strategy goes on
    m2.fit(x[:32], y[:32], batch_size=16, epochs=1, verbose=0)
    assert m2._iterations == 2


def test_the_progress_bar_follows_the_replicas(monkeypatch, mirrored2, capsys):
    monkeypatch.setenv(placed.ENV, "1")
    x, y = data()
    m = model(mirrored2)
    m.fit(x, y, batch_size=16, epochs=1, verbose=1)
    out = capsys.readouterr().out
    assert "13/13" in out and "loss:" in out and "accuracy:" in out


def test_which_callbacks_need_the_driver_each_group():
    class Plain(ld.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            pass

    class Duck:
        def on_train_batch_end(self, batch, logs=None):
            pass

    lam = ld.callbacks.Callback()
    lam.on_train_batch_begin = lambda batch, logs=None: None
    assert not implements_batch_hooks(Plain())
    assert not implements_batch_hooks(ld.callbacks.EarlyStopping())
    assert implements_batch_hooks(Hooks())
    assert implements_batch_hooks(Duck())
    assert implements_batch_hooks(lam)
    assert not implements_batch_hooks(object())


class InterruptSoon(ld.callbacks.Callback):
    """Ctrl-C in the kernel, 0.3 s into the epoch (SIGINT to this process)."""

    def on_epoch_begin(self, epoch, logs=None):
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()


def test_an_interrupted_fit_stops_the_replicas_after_one_more_group(monkeypatch, mirrored2):
    monkeypatch.setenv(placed.ENV, "1")
    x, y = data(60000, seed=2)  # 30000 steps: 15 s and more
    m = model(mirrored2, spe=2, optimizer=ld.optimizers.SGD(0.05))
    with pytest.raises(KeyboardInterrupt):
        m.fit(x, y, batch_size=2, epochs=1, callbacks=[InterruptSoon()], verbose=0)
        time.sleep(5)  # (never reached: the interrupt lands in fit)
    def read():
        return [a.tobytes() for v in m.weights for a in mirrored2.experimental_local_results(v)]

    deadline, last = time.perf_counter() + 4, read()
    while True:  # the replicas stop training soon: their copies stop changing
        time.sleep(0.3)
        now = read()
        if now == last:
            break
        assert time.perf_counter() < deadline, "the replicas still train: no stop reached them"
        last = now
    assert now[0::2] == now[1::2]  # both stopped after the same group
    assert m._iterations < 30000


def test_an_interrupt_before_the_span_is_sent_is_answered_at_once(monkeypatch, mirrored2):
    """■ while the driver still prepares a span (nothing sent yet): the replicas never begin
    it, so the driver has nothing to wait for (it waited its whole 5 s patience for a span
    that never began); the next call trains as usual."""
    monkeypatch.setenv(placed.ENV, "1")
    x, y = data(600, seed=3)
    m = model(mirrored2, spe=2, optimizer=ld.optimizers.SGD(0.05))
    m.fit(x, y, batch_size=20, epochs=1, verbose=0)
    run = mirrored2.run

    def interrupted(fn, args=(), kwargs=None):  # ■ lands before the span's request goes out
        if any(isinstance(a, EpochPlan) for a in args):
            raise KeyboardInterrupt
        return run(fn, args=args, kwargs=kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(mirrored2, "run", interrupted)
        began = time.perf_counter()
        with pytest.raises(KeyboardInterrupt):
            m.fit(x, y, batch_size=20, epochs=1, verbose=0)
        waited = time.perf_counter() - began
    assert waited < 3.0, f"the driver waited {waited:.1f} s for a span never sent"
    h = m.fit(x, y, batch_size=20, epochs=1, verbose=0)
    assert np.isfinite(h.history["loss"][-1])
    copies = [[a.tobytes() for a in mirrored2.experimental_local_results(v)] for v in m.weights]
    assert all(c[0] == c[1] for c in copies)
