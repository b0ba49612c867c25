"""The lab's background loop: one thread owns the run, so the kernel stays free.

Everything reaches it through a queue under one lock (validated configurations, run / pause /
reset, calls that must happen at a boundary); nothing else touches the strategies while it
runs. The newest queued configuration takes effect at the next step boundary, on every replica
at once, and is recorded as an event. Steps run through an *engine* (engines.py: mirrored,
ps_engine.py: parameter servers). A step whose loss or parameters are not finite pauses the
run (state "diverged", divergence.py) until a reset. Switching moves the state explicitly:

- into mirrored ON_WRITE with aggregation other than NONE: the copies are made equal
  (`resync`: their average, or replica 0's copy), so the spread is 0 from the switch on;
  a model's state (batch norm's moving statistics) stays each replica's own;
- into mirrored ON_READ / NONE / ON_WRITE+NONE: each replica keeps its own copy;
- before any of these moves, what the communication modes left open is settled
  (`engine.leave`: a DiLoCo round closed with its outer step, error-feedback residuals sent),
  so the copies that move hold every update once;
- mirrored -> parameter server: the PS starts from the mirrored value (the copies' average or
  replica 0's when they differ); parameter server -> mirrored: every replica loads its value.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from labdist.enums import VariableAggregation, VariableSynchronization
from labdist.lab.batch_stream import BatchStream
from labdist.lab.config import RunConfig, describe_setting
from labdist.lab.divergence import DivergenceError, find
from labdist.lab.engines import Engine, StepRecord
from labdist.lab.history import Event, RunHistory
from labdist.lab.network_link import Link
from labdist.lab.run_items import (
    DivergedItem,
    ErrorItem,
    EventItem,
    PsStatsItem,
    ResetItem,
    RunItem,
)

Sync = VariableSynchronization
Agg = VariableAggregation


def unify(copies: list[np.ndarray], policy: str) -> np.ndarray:
    """One value from the copies: their average, or replica 0's ("first")."""
    return np.mean(copies, axis=0) if policy == "average" else np.array(copies[0])


def unify_parameters(copies: list[np.ndarray], policy: str, trainable: int) -> list[np.ndarray]:
    """Every copy with its first `trainable` elements (the parameters) made one value by
    `policy`; the rest (the model's state, batch norm's moving statistics) stays each
    replica's own, as TensorFlow keeps it (ON_WRITE / NONE)."""
    one = unify([c[:trainable] for c in copies], policy)
    return [np.concatenate([one, np.asarray(c[trainable:])]) for c in copies]


def needs_equal_copies(config: RunConfig) -> bool:
    return (config.kind.is_ps or (config.synchronization is Sync.ON_WRITE
                                   and config.aggregation is not Agg.NONE))


class Runner:
    """Drives one run on a background thread; see the module docstring."""

    def __init__(self, pool, model, spec, batches: BatchStream, config: RunConfig,
                 history: RunHistory):
        self.pool, self.model, self.spec = pool, model, spec
        self.batches = batches
        self.config = config
        self.history = history
        self.n = pool.num_replicas
        self.completed = 0  # steps finished (recorded)
        self.state = "starting"
        self.error: BaseException | None = None
        self.divergence: DivergenceError | None = None  # set until a reset
        self._cv = threading.Condition()
        self._changes: list[tuple[RunConfig, float, int]] = []  # (config, asked at, steps then)
        self._applying: RunConfig | None = None  # taken off the queue, being applied
        self._calls: list[tuple[Callable, Future]] = []
        self._budget = 0
        self._closing = False
        self._next_at = 0.0
        self._submitted = 0  # steps handed to the engine (ahead of `completed` while in flight)
        self._settled = False  # the thread waits for work, with nothing in flight
        self._listeners: list[Callable[[RunItem], None]] = []
        self.engine: Engine | None = None
        self.link = Link()  # the modelled network on the cluster's workers
        self._thread = threading.Thread(target=self._loop, name="labdist-lab", daemon=True)
        self._thread.start()

    # -- what the Lab calls (any thread; never blocks on training) ---------------------------
    def enqueue(self, config: RunConfig, requested: float) -> None:
        """Queue a validated configuration (the newest queued one wins at the boundary)."""
        with self._cv:
            self._changes.append((config, requested, self.completed))
            self._cv.notify_all()

    def add_steps(self, steps: int | None) -> None:
        with self._cv:
            if self.divergence is not None:
                raise DivergenceError(self.divergence.step, self.divergence.where)
            self._budget = -1 if steps is None else (max(self._budget, 0) + steps)
            self.error = None if self.state == "failed" else self.error
            if self.state in ("idle", "failed"):
                self.state = "running"
            self._cv.notify_all()

    def pause(self) -> None:
        with self._cv:
            self._budget = 0
            self._cv.notify_all()

    def call(self, fn: Callable[[], Any]) -> Future:
        """Run `fn` on the runner thread at the next boundary."""
        future: Future = Future()
        with self._cv:
            if self._closing:
                raise RuntimeError("this lab is closed")
            self._calls.append((fn, future))
            self._cv.notify_all()
        return future

    def wait(self, timeout: float | None = None) -> bool:
        """Until no steps are left and nothing is queued (True), or `timeout` (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while self._busy():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def close(self, timeout: float = 60.0) -> None:
        with self._cv:
            self._closing = True
            self._budget = 0
            self._cv.notify_all()
        self._thread.join(timeout)

    def subscribe(self, callback: Callable[[RunItem], None]) -> None:
        """`callback(item)` on the runner thread for each record / event / reset; it must
        only enqueue (the UI's publisher does the work)."""
        with self._cv:
            self._listeners = [*self._listeners, callback]

    def unsubscribe(self, callback: Callable[[RunItem], None]) -> None:
        with self._cv:
            if callback in self._listeners:  # ==: a bound method is made anew on each access
                listeners = list(self._listeners)
                listeners.remove(callback)
                self._listeners = listeners

    @property
    def open_ended(self) -> bool:
        """Whether the run trains until paused (run() without steps)."""
        return self._budget < 0

    @property
    def closing(self) -> bool:
        """Whether close() was called (the thread may still be finishing)."""
        return self._closing

    def pending_config(self) -> RunConfig:
        """The config once everything queued is applied (what new changes build on)."""
        with self._cv:
            if self._changes:
                return self._changes[-1][0]
            # taken off the queue, not applied yet: still what new changes build on
            return self._applying or self.config

    # -- the thread ---------------------------------------------------------------------------
    def _busy(self) -> bool:
        if self.state == "diverged":  # paused, once what was in flight has landed (async PS)
            return not self._settled
        return (self.state in ("starting", "running") or bool(self._changes)
                or bool(self._calls)) and self.state != "closed"

    def _emit(self, item: RunItem) -> None:
        for callback in self._listeners:  # a list replaced, never changed, on (un)subscribe
            callback(item)

    def _loop(self) -> None:
        while True:
            with self._cv:
                idle = not (self._changes or self._calls or self._closing or self._budget)
            if idle and self.engine is not None:  # paused: what is in flight lands now
                self._safely(lambda: self._records(self.engine.drain()))
            with self._cv:
                while not (self._changes or self._calls or self._closing or self._budget):
                    if self.state not in ("failed", "closed", "diverged"):
                        self.state = "idle"
                    self._settled = True  # nothing in flight: what `wait` waits for
                    self._cv.notify_all()
                    self._cv.wait()
                self._settled = False
                changes, self._changes = self._changes, []
                self._applying = changes[-1][0] if changes else None
                calls, self._calls = self._calls, []
                closing = self._closing
            if changes or calls or closing:  # a boundary: nothing in flight past here
                self._safely(lambda: self._records(self.engine.drain() if self.engine
                                                   else []))
            if changes:
                try:
                    self._safely(self._apply, changes)
                finally:
                    with self._cv:
                        self._applying = None
            for fn, future in calls:  # run even after a failure above: a caller waits on each
                try:
                    future.set_result(fn())
                except BaseException as e:
                    future.set_exception(e)
            # held while the thread waits, they would keep their callers (a lab) reachable
            calls = fn = future = changes = None
            if closing:
                self._finish_close()
                return
            if self._budget and not self._pace():
                self._safely(self._step)

    def _safely(self, fn: Callable, *args: Any) -> None:
        """What raises stops the run (state "failed", the error kept and sent); the lab and
        the loop stay usable."""
        try:
            fn(*args)
        except BaseException as error:
            with self._cv:
                self.error, self._budget, self.state = error, 0, "failed"
            self._emit(ErrorItem(f"{type(error).__name__}: {error}"))

    def _pace(self) -> bool:
        """With a pace, wait for the next step's time (a change or command wakes us); True
        when woken early."""
        if self.config.pace <= 0:
            return False
        left = self._next_at - time.monotonic()
        if left > 0:
            with self._cv:
                self._cv.wait_for(lambda: self._changes or self._calls or self._closing
                                  or not self._budget, timeout=left)
            if time.monotonic() < self._next_at:
                return True
        self._next_at = max(self._next_at, time.monotonic()) + 1.0 / self.config.pace
        return False

    def _step(self) -> None:
        with self._cv:
            self.state = "running"
        self._submitted += 1
        records = self.engine.submit(self.config, self.batches.next(), self._submitted)
        with self._cv:
            if self._budget > 0:
                self._budget -= 1
            last = self._budget == 0
        if last:
            records += self.engine.drain()
        self._membership()
        self._records(records)
        stats = self.engine.stats(force=last)
        if stats is not None:
            self._emit(PsStatsItem(step=self.completed, kind=self.config.kind.value,
                                   use_locking=self.config.use_locking, **stats))

    def _membership(self) -> None:
        """Quorum mode: log each replica lost or taken in during the step as an event, and
        resize what is per replica (the delays) to the replicas that go on."""
        for change, before in self.engine.take_changes():
            n = change.num_replicas
            texts = [f"replica {before.index(w)} lost at step {change.step}; {n} replica"
                     f"{'s' if n != 1 else ''} go{'es' if n == 1 else ''} on"
                     for w in change.lost]
            texts += [f"replica {change.workers.index(w)} joined at step {change.step}; {n} "
                      "replicas" for w in change.joined]
            self.n = self.pool.num_replicas = n
            if change.joined:  # a new worker process starts at full speed
                self.link.configure(self.config, self.engine, force=True)
            with self._cv:
                self.config = _resized(self.config, n)
                self._changes = [(_resized(c, n), t, s) for c, t, s in self._changes]
            now = time.time()
            event = Event(change.step, "; ".join(texts), {"replicas": (len(before), n)},
                          now - change.paused_s, now, change.step,
                          lost=tuple(before.index(w) for w in change.lost),
                          joined=tuple(change.workers.index(w) for w in change.joined))
            self.history.events.append(event)
            self._emit(_event_item(event))

    def _records(self, records: list[StepRecord]) -> None:
        """Number the steps in the order they finished (async PS: not the order they were
        started), record and send them; the first that is not finite pauses the run."""
        for record in records:
            if record.contributions:
                self.completed += 1
            record.step = self.completed
            self._emit(self.history.add(record))
            if record.contributions and self.divergence is None:
                where = find(record, self.spec, self.config.kind.is_ps)
                if where is not None:
                    self._diverged(DivergenceError(record.step, where))

    def _diverged(self, error: DivergenceError) -> None:
        with self._cv:
            self.divergence = self.error = error
            self._budget, self.state = 0, "diverged"
            self._cv.notify_all()
        self.history.diverged_at = error.step
        self._emit(DivergedItem.of(error))

    def _finish_close(self) -> None:
        if self.engine is not None:
            with contextlib.suppress(Exception):  # a cluster already gone has no link left
                self.link.close(self.engine)
        with self._cv:
            self.state = "closed"
            self._calls, calls = [], self._calls
            self._cv.notify_all()
        for _, future in calls:
            future.set_exception(RuntimeError("this lab is closed"))

    # -- boundaries ---------------------------------------------------------------------------
    def start(self, config: RunConfig) -> None:
        """(runner thread) The first engine, from the model's initial parameters, with the
        communication modes' state fresh on every engine (residuals, DiLoCo rounds)."""
        self.config = config
        self.engine = self.pool.engine(config.strategy_key, self.model, self.spec)
        self.pool.fresh()
        init = self.spec.initial(self.model)
        self.engine.use(config, self._copies_for(config, [init] * self.n))
        self.link.configure(config, self.engine)

    def _copies_for(self, config: RunConfig, copies: list[np.ndarray]) -> list[np.ndarray]:
        if config.kind.is_ps:
            return [unify(copies, config.resync)]
        if needs_equal_copies(config):
            if len(copies) == self.n and self.spec.trainable < self.spec.size:
                return unify_parameters(copies, config.resync, self.spec.trainable)
            return [unify(copies, config.resync)] * self.n
        if len(copies) == 1:  # from a parameter server: every replica loads its value
            return copies * self.n
        return copies

    def _apply(self, changes: list[tuple[RunConfig, float, int]]) -> None:
        old, new = self.config, changes[-1][0]
        diff = new.changes_from(old)
        if not diff:
            return
        moved = (new.strategy_key != old.strategy_key or (new.synchronization, new.aggregation)
                 != (old.synchronization, old.aggregation))
        if moved:
            self.engine.leave(old)  # a DiLoCo round closed, residuals sent: nothing left behind
            before = self.engine.copies()
            engine = self.pool.engine(new.strategy_key, self.model, self.spec)
            after = self._copies_for(new, before)
            engine.use(new, after)
            self.engine = engine
        else:
            self.engine.configure(new)
        self.link.configure(new, self.engine)
        self.config = new
        self._next_at = 0.0
        text = "; ".join(f"{k} {_shown(k, a)} → {_shown(k, b)}" for k, (a, b) in diff.items())
        event = Event(self.completed, text, diff, min(t for _, t, _ in changes), time.time(),
                      min(s for *_, s in changes))
        self.history.events.append(event)
        self._emit(_event_item(event))
        if moved:  # the copies right after the switch: a row at the same step
            values = np.stack([np.asarray(c) for c in after]) if len(after) == self.n \
                else np.tile(after[0], (self.n, 1))
            self._records([StepRecord(self.completed, new.kind, [float("nan")] * self.n,
                                      [0] * self.n, values, contributions=0)])

    def reset(self) -> None:
        """(runner thread, from a call) Back to the initial parameters at step 0 (a diverged
        run too), and the communication modes' state with them (`start`)."""
        self.batches.reset()
        self.history.clear()
        self.completed = self._submitted = 0
        with self._cv:
            self.divergence = None
            if self.state == "diverged":
                self.error, self.state = None, "idle"
        self.start(self.config)
        self._emit(ResetItem())


def _resized(config: RunConfig, n: int) -> RunConfig:
    """`config` with one delay per replica of `n` (a lost replica's dropped, a new one's 0)."""
    delays = tuple(config.delays[:n]) + (0.0,) * max(0, n - len(config.delays))
    return config if delays == config.delays else dataclasses.replace(config, delays=delays)


def _event_item(event: Event) -> EventItem:
    """What subscribers get of an applied change: its values plain (enum names, lists)."""
    return EventItem(step=event.step, text=event.text,
                     changes={k: [_plain(a), _plain(b)] for k, (a, b) in event.changes.items()},
                     requested=event.requested, applied=event.applied,
                     requested_step=event.requested_step, lost=event.lost,
                     joined=event.joined)


def _shown(name: str, value: Any) -> Any:
    """An event text's value: in the controls' units where a setting has one."""
    described = describe_setting(name, value)
    return _plain(value) if described is None else described


def _plain(value: Any) -> Any:
    if isinstance(value, Sync | Agg):
        return value.name
    if isinstance(value, tuple):
        return list(value)
    return value
