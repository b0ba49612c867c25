"""`fit`'s epochs on the driver: who runs the loop over the groups of `steps_per_execution`
batches, and when the driver steps in.

- **The replicas run the loop** where `fit`'s data is placed where they read it
  (data/placed_input.py) and the strategy loops on its replicas (mirrored, outside quorum
  training): the driver sends one `EpochPlan` per span and the replicas slice their batches
  and run its groups back to back. Replica 0 writes each group's figures to a board in
  /dev/shm (training/trainer/loop_board.py) that a driver thread reads to move the progress bar and
  to pass on `model.stop_training` set meanwhile (by another thread, or the driver
  interrupted): the replicas agree on it through the gradients' all-reduce and all end after
  the same group. Nobody waits on the board.
- A span is the whole epoch, unless a callback implements a batch hook
  (`on_train_batch_begin` / `on_train_batch_end`, as Keras asks "does any callback need
  batch hooks"): then the driver is needed after every group, so a span is one group, the
  hooks are called around it with the running logs, and `stop_training` set there ends the
  epoch after exactly that group (Keras' rule). `stop_training` set in `on_epoch_begin` ends
  it after the first group, as in Keras.
- **Elsewhere the driver sends each group** (`Strategy.train_model_steps`): data not placed
  (replicas on another host, `LABDIST_PLACE_INPUT=0`), quorum training, parameter servers,
  in-process replicas. The hooks and `stop_training` behave the same (on parameter
  servers, groups already scheduled when it is set still run, as under TF's coordinator).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import numpy as np

from labdist.training.callback_base import Callback
from labdist.training.trainer.epoch_plan import EpochPlan, epoch_plan
from labdist.training.trainer.loop_board import Board

BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end")
POLL_S = 0.05  # how often the driver reads the board: the progress bar's pace (20 Hz)


def implements_batch_hooks(callback: Any) -> bool:
    """Whether `callback` has a batch hook of its own (not `Callback`'s no-op)."""
    for hook in BATCH_HOOKS:
        if hook in getattr(callback, "__dict__", {}):
            return True
        method = getattr(type(callback), hook, None)
        if method is not None and method is not getattr(Callback, hook):
            return True
    return False


class Totals:
    """An epoch's running sums, added step by step in the order of today's steps (so the
    logs are the same floats whoever ran the loop)."""

    def __init__(self, metrics: int):
        self.loss, self.sums, self.seen, self.steps = 0.0, np.zeros(metrics), 0.0, 0

    def add(self, loss: float, sums: np.ndarray, samples: float) -> None:
        self.loss, self.sums, self.seen = self.loss + loss, self.sums + sums, self.seen + samples
        self.steps += 1


class FitLoop:
    """One `fit` call's epochs (a context manager: it owns the board's file)."""

    def __init__(self, model, strategy, callbacks: list, data: tuple, batches,
                 steps_per_epoch: int | None = None):
        self.model, self.strategy, self.callbacks = model, strategy, callbacks
        self.data, self.batches = data, batches
        self.hooks = any(implements_batch_hooks(cb) for cb in callbacks)
        self.spe = model._steps_per_execution
        # an epoch's batches: a whole pass, or `steps_per_epoch` of it, carrying on where the
        # last epoch stopped (Keras 3's epoch iterator): the pass in progress and where in it
        self.per_epoch = min(steps_per_epoch or len(batches), len(batches))
        self.groups = -(-self.per_epoch // self.spe)  # the most an epoch has
        self._next = 0  # the pass's next batch (0: the next epoch starts a new pass)
        self._plan: EpochPlan | None = None  # the pass, where the replicas slice it
        self._pass: list = []  # the pass's batches, where the driver sends them
        self._board: Board | None = None

    def __enter__(self) -> FitLoop:
        return self

    def __exit__(self, *exc) -> None:
        if self._board is not None:
            self._board.close()
            self._board = None

    # -- one epoch ----------------------------------------------------------------------------
    def next_epoch_steps(self) -> int:
        """The steps the next epoch takes (fewer than `steps_per_epoch` where the pass ends)."""
        return min(self.per_epoch, len(self.batches) - self._next)

    def epoch(self, step, bar) -> Totals:
        """Train one epoch (a pass of the batches, or `steps_per_epoch` of them); its
        totals."""
        totals = Totals(len(self.model._metrics))
        first, count = self._next, self.next_epoch_steps()
        if first == 0:  # a new pass (a new order, with shuffle)
            self._plan = None
            if self.strategy.loops_on_replicas:
                self._plan = epoch_plan(self.data, self.batches, self.spe,
                                        self.model._iterations, None)
            self._pass = list(self.batches) if self._plan is None else []
        self._next = 0 if first + count >= len(self.batches) else first + count
        if self._plan is None:
            self._driver_groups(step, self._pass[first:first + count], bar, totals)
            return totals
        plan = dataclasses.replace(self._plan, first_batch=first, batches=count,
                                   first_iteration=self.model._iterations)
        if self.hooks:
            self._plan_groups(step, plan, bar, totals)
        else:
            steps = self.spe if self.model.stop_training else count  # set in on_epoch_begin
            self._free_span(step, plan, min(count, steps), bar, totals)
        return totals

    def _driver_groups(self, step, batches: list, bar, totals: Totals) -> None:
        """Today's path: the driver makes each group's batches and sends them."""
        groups = _chunks(batches, self.spe)
        outputs = iter(self.strategy.train_model_steps(step, groups, self.model._iterations))
        try:
            for g, group in enumerate(groups):
                self._call("on_train_batch_begin", g * self.spe)
                for loss, sums, n in next(outputs):
                    totals.add(loss, sums, n)
                self._group_done(g * self.spe + len(group) - 1, len(group), bar, totals)
                if self.model.stop_training:
                    break
            else:  # let it finish what follows its last group (parameter servers' join)
                if next(outputs, None) is not None:
                    raise RuntimeError("train_model_steps yielded more groups than it got")
        finally:
            close = getattr(outputs, "close", None)
            if close is not None:  # a stop: nothing more is sent
                close()

    def _plan_groups(self, step, plan: EpochPlan, bar, totals: Totals) -> None:
        """A callback has batch hooks: one group a dispatch, the hooks around each (batch
        numbers count from the epoch's first, as Keras' do)."""
        for first in range(0, plan.batches, self.spe):
            span = dataclasses.replace(plan, first_batch=plan.first_batch + first,
                                       batches=min(self.spe, plan.batches - first),
                                       first_iteration=self.model._iterations)
            self._call("on_train_batch_begin", first)
            rows, samples = self.strategy.train_model_plan(step, span)
            self._add_rows(rows, samples, totals)
            self._group_done(first + span.batches - 1, span.batches, bar, totals)
            if self.model.stop_training:
                break

    def _free_span(self, step, plan: EpochPlan, batches: int, bar, totals: Totals) -> None:
        """The replicas run `batches` batches of the pass from one dispatch; a thread
        follows them on the board."""
        if self._board is None:
            self._board = Board(self.groups, 1 + len(self.model._metrics))
        board = self._board
        board.reset()
        span = dataclasses.replace(plan, batches=batches, board=board.path)  # from first_batch
        watch = _Watch(board, self.model, bar, totals)
        watch.start()
        try:
            rows, samples = self.strategy.train_model_plan(step, span)
        except BaseException as error:
            board.request_stop()  # replicas still running end after their group
            if isinstance(error, KeyboardInterrupt):  # let them end it before the next call
                _await_end(board)  # tells them their run ended early (mid-step)
            watch.finish()
            done = board.rows(0, board.written())
            self.model._iterations += int(done[:, -1].sum()) if len(done) else 0
            raise
        watch.finish()
        self._add_rows(rows, samples, totals)
        self.model._iterations += len(samples)
        bar.update(totals.steps, self.model._running_logs(totals.loss, totals.sums,
                                                           max(totals.seen, 1.0)))

    # -- helpers ------------------------------------------------------------------------------
    def _add_rows(self, rows: np.ndarray, samples: np.ndarray, totals: Totals) -> None:
        for row, n in zip(rows.tolist(), samples.tolist(), strict=True):
            totals.add(float(row[0]), np.asarray(row[1:], np.float64), int(n))

    def _group_done(self, last_batch: int, steps: int, bar, totals: Totals) -> None:
        """A group of `steps` steps ended with batch `last_batch` of the epoch."""
        self.model._iterations += steps
        logs = self.model._running_logs(totals.loss, totals.sums, totals.seen)
        bar.update(totals.steps, logs)
        self._call("on_train_batch_end", last_batch, logs)

    def _call(self, hook: str, *args) -> None:
        if not self.hooks:
            return
        for cb in self.callbacks:
            method = getattr(cb, hook, None)
            if method is not None:
                method(*args)


class _Watch:
    """The driver's thread that follows a span on the board: the progress bar, and
    `model.stop_training` set meanwhile passed on as a stop request."""

    def __init__(self, board: Board, model, bar, totals: Totals):
        self.board, self.model, self.bar, self.totals = board, model, bar, totals
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="labdist-fit-watch",
                                        daemon=True)
        self._read = 0
        self._live = [totals.loss, totals.sums.copy(), totals.seen, totals.steps]

    def start(self) -> None:
        self._thread.start()

    def finish(self) -> None:
        self._done.set()
        self._thread.join()

    def _follow(self) -> None:
        asked = False
        while not self._done.wait(POLL_S):
            if not asked and self.model.stop_training:
                self.board.request_stop()
                asked = True
            written = self.board.written()
            if written <= self._read:
                continue
            live = self._live
            for row in self.board.rows(self._read, written):
                live[0] += row[0]
                live[1] = live[1] + row[1:-2]
                live[2] += row[-2]
                live[3] += int(row[-1])
            self._read = written
            if live[2] > 0:
                self.bar.update(live[3], self.model._running_logs(live[0], live[1], live[2]))


def _await_end(board: Board, patience: float = 5.0, start_within: float = 1.0) -> None:
    """After the driver was interrupted: wait (a little) for the replicas to end their span
    at the group boundary they agreed on, so that the next call finds them done. A span
    replica 0 has not begun within `start_within` was most likely never sent (■ came while
    the driver prepared it): no wait; were it sent after all, the board it opens reads as a
    stop request once removed, and the next call's settle collects its answer."""
    began = time.monotonic()
    deadline = began + patience
    while not board.ended() and time.monotonic() < deadline:
        if not board.started() and time.monotonic() - began > start_within:
            return
        time.sleep(0.005)


def _chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]
