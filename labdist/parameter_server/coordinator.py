"""`ClusterCoordinator` (TF2's tf.distribute.coordinator.ClusterCoordinator): schedule
functions onto parameter-server workers, get remote values back, join.

One dispatcher thread per worker takes the next function from a shared queue, runs it on its
worker and waits for the result; a free worker is whichever finishes first, so fast workers do
more. Async `fit` runs `pipelined()`: a second dispatcher per worker sends it the next function
while it runs the last (the worker runs them one at a time), so no worker waits a round trip
to the driver between two; only a worker that keeps pace with the fastest is sent one ahead,
so a straggler never sits on a function a free worker could run (TF's rule: the first free
worker takes it). When a worker dies mid-function, the function goes back into the
queue (in schedule order, so ahead of later work; both of a pipelined worker's) and another
worker runs it (at-least-once: what it pushed before dying stays pushed, as in TF).
A lost parameter server stops everything with an error naming it. Closing (strategy.close())
ends every wait: what had not finished raises, and so does anything asked of it afterwards.
In sync mode, functions that wait at a step barrier no other function will reach (the fifth of
five on two workers) are not left waiting: once nothing is queued and every function in flight
waits at a barrier, that step is applied with what it holds (`join`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from labdist import actor_call as remote
from labdist import nest, shipping
from labdist.errors import ReplicaLostError
from labdist.parameter_server.actors import ParameterServerGroup
from labdist.parameter_server.outcome import Ending, Outcome
from labdist.parameter_server.remote_values import (
    PerWorkerDataset,
    RemoteValue,
    ScheduledFunction,
)

POLL_S = 0.25  # how often a waiting dispatcher checks for lost parameter servers / workers
PIPELINE_DEPTH = 2  # async fit: functions a worker holds (one runs, the next waits there)
# pipelined: a worker is sent its next function early only while its last one took at most
# this many times the fastest worker's last one
PACE_RATIO = 2.0


class Coordinated:
    """What `ClusterCoordinator(strategy)` takes: a strategy whose functions run on
    parameter-server workers. `ParameterServerStrategy` is one; it imports this module, so
    this module names the role instead of importing the class. Besides these two methods a
    coordinated strategy has `mode` ("async" or "sync") and `closed`."""

    mode: str
    closed: bool

    def cluster_coordinator(self) -> ClusterCoordinator:
        """The strategy's one coordinator: made with `ClusterCoordinator.start` on first use,
        and again once the last one was closed."""
        raise NotImplementedError

    def check_arguments(self, args: tuple, kwargs: dict | None) -> tuple[tuple, dict]:
        """Arguments as one worker sees them; raises on a variable of another strategy."""
        raise NotImplementedError


class ClusterCoordinator:
    """`ClusterCoordinator(strategy)`: one per strategy (a second call returns the first)."""

    def __new__(cls, strategy: Coordinated) -> ClusterCoordinator:
        if not isinstance(strategy, Coordinated):
            raise TypeError(f"strategy={strategy!r} is not a ParameterServerStrategy")
        return strategy.cluster_coordinator()

    @classmethod
    def start(cls, strategy: Coordinated, group: ParameterServerGroup) -> ClusterCoordinator:
        """A new coordinator dispatching `strategy`'s functions over `group`'s workers (what
        `strategy.cluster_coordinator()` calls; users call `ClusterCoordinator(strategy)`)."""
        self = super().__new__(cls)
        self._setup(strategy, group)
        return self

    def _setup(self, strategy: Coordinated, group: ParameterServerGroup) -> None:
        # weak: the dispatcher threads hold the coordinator, and must not keep a strategy
        # nobody else holds from being closed (cluster/reaper.py)
        self._strategy = weakref.ref(strategy)
        self._group = group
        self._cv = threading.Condition()
        self._queue: deque[ScheduledFunction] = deque()
        # (worker, slot) -> the function it runs; slot 1 only while pipelined (async fit)
        self._in_flight: dict[tuple[int, int], ScheduledFunction] = {}
        self._pipelined = 0  # how many callers asked for it (`pipelined`)
        self._token = uuid.uuid4().hex  # names this coordinator's order numbers on workers
        self._sent = [0] * self._group.num_workers  # functions sent to each worker so far
        # each worker's time on its last function (from when it could start it to its
        # result), and when that result came: who keeps pace, for pipelining
        self._took: list[float | None] = [None] * self._group.num_workers
        self._free_at = [0.0] * self._group.num_workers
        self._error: BaseException | None = None  # the first function error, for join
        self._fatal: BaseException | None = None  # a lost PS (or every worker): nothing runs
        self._alive = set(range(self._group.num_workers))
        self.lost_workers: list[str] = []
        self._closed = False
        self._sync = strategy.mode == "sync"
        self._keys = itertools.count()
        # async without a staleness bound: a second dispatcher per worker, used while
        # pipelined, keeps the worker's next function waiting on the worker itself
        depth = 1 if self._sync or self._group.bounded else PIPELINE_DEPTH
        self._threads = [threading.Thread(target=self._dispatch, args=(w, slot), daemon=True,
                                          name=f"labdist-coordinator-{w}-{slot}")
                         for w in range(self._group.num_workers) for slot in range(depth)]
        for t in self._threads:
            t.start()

    @property
    def strategy(self) -> Coordinated:
        strategy = self._strategy()
        if strategy is None:
            raise RuntimeError("this ClusterCoordinator's strategy is gone (nothing holds it "
                               "any more): keep a reference to the strategy while you use it")
        return strategy

    # -- the API ------------------------------------------------------------------------------
    def schedule(self, fn: Callable, args: tuple = (), kwargs: dict | None = None
                 ) -> RemoteValue:
        """Queue `fn(*args, **kwargs)` to run on some worker; returns its RemoteValue. Raises
        the error of an earlier function that failed (as TF does), once."""
        self._check_open()
        shipping.check_call(fn, args, kwargs)
        self._raise_pending()
        self.strategy.check_arguments(tuple(args), kwargs)  # no foreign variables
        closure = ScheduledFunction(shipping.dumps(fn), tuple(args), dict(kwargs or {}),
                           ("closure", next(self._keys)))
        with self._cv:
            self._check_open()  # closed meanwhile: nobody would ever run it
            self._queue.append(closure)
            self._cv.notify_all()
        return closure.value

    def join(self) -> None:
        """Wait until every scheduled function has finished; raise the first error one of them
        raised (the rest were cancelled then), or the error that stopped the cluster; once
        closed, the error saying so.

        Sync mode: when the functions do not fill the last step (5 functions, 2 workers
        aggregated: the fifth's gradient has no partner), that step is applied with the
        gradients it holds, weighted by their examples (`set_num_examples`), as a short last
        batch is, and counts one global step: join never waits for a function that will not
        come. It does so only once nothing is queued and every function in flight waits at a
        barrier, so a straggler still computing is waited for, never cut off."""
        while True:
            with self._cv:
                if (not (self._queue or self._in_flight) or self._fatal is not None
                        or self._closed):
                    break
                self._cv.wait(POLL_S)
            self._unstall()
        self._check_open()
        self._unstall()  # a step held only by functions released earlier (a lost worker)
        self._raise_pending()

    @contextlib.contextmanager
    def pipelined(self):
        """While inside, each worker (async mode, no staleness bound) is sent its next
        function while it still runs the last, so it never waits for the driver between two
        (what `fit` uses). Functions still run one at a time on a worker, in arrival order;
        a worker may hold one function a free worker could have taken, so plain `schedule`
        calls outside it keep TF's "the first free worker takes it". A worker is sent one
        ahead only while it keeps pace (its last function took at most PACE_RATIO times the
        fastest worker's): a straggler takes its next function only when it is free."""
        with self._cv:
            if not self._pipelined:  # paces seen before (another fit, another delay) are old
                self._took = [None] * self._group.num_workers
            self._pipelined += 1
            self._cv.notify_all()
        try:
            yield self
        finally:
            with self._cv:
                self._pipelined -= 1

    def drop(self, values: Iterable[RemoteValue], wait: float) -> list[RemoteValue]:
        """Take back the functions of `values` that no worker has started (their RemoteValues
        are cancelled), and wait up to `wait` seconds for those already running to finish
        (sync mode: a step that dropped functions would have filled is applied with the
        gradients that came, as `join` applies a short last step). Returns those still
        running then. What `fit` does when it ends early (■, an error, stop_training)."""
        ids = {id(v) for v in values}
        with self._cv:
            kept: deque[ScheduledFunction] = deque()
            for closure in self._queue:
                if id(closure.value) in ids:
                    closure.cancel()
                else:
                    kept.append(closure)
            self._queue = kept
            running = [c.value for c in self._in_flight.values() if id(c.value) in ids]
            self._cv.notify_all()
        deadline = time.monotonic() + wait
        while running and time.monotonic() < deadline:
            self._unstall()
            concurrent.futures.wait([v.future for v in running],
                                    timeout=min(POLL_S, max(deadline - time.monotonic(), 0)))
            running = [v for v in running if not v.done()]
        return running

    def done(self) -> bool:
        """Whether nothing is queued or running."""
        with self._cv:
            return not self._queue and not self._in_flight

    def fetch(self, values: Any) -> Any:
        """The results of a structure of RemoteValues (other leaves pass through)."""
        return nest.map_structure(
            lambda v: v.fetch() if isinstance(v, RemoteValue) else v, values)

    def create_per_worker_dataset(self, dataset_fn: Callable | Iterable) -> PerWorkerDataset:
        """Call `dataset_fn()` (or `dataset_fn(input_context)`) on every worker; each worker
        keeps its own dataset. An iterable is sent to every worker as it is."""
        self._check_open()
        if not callable(dataset_fn):
            if not isinstance(dataset_fn, Iterable):
                raise TypeError(f"dataset_fn={dataset_fn!r} must be a function returning an "
                                "iterable, or an iterable")
            data = dataset_fn

            def dataset_fn():
                return data
        dataset_id = uuid.uuid4().hex
        fn_bytes = shipping.dumps(dataset_fn)
        with self._cv:
            alive = sorted(self._alive)
        self._group.call_workers(alive, "make_dataset", dataset_id, fn_bytes)
        return PerWorkerDataset(dataset_id)

    @property
    def closed(self) -> bool:
        """Whether it stopped dispatching (closed, or its strategy was)."""
        return self._closed

    def close(self) -> None:
        """Stop dispatching (strategy.close() calls this): functions queued or running raise
        from fetch(), and schedule, join and create_per_worker_dataset raise from now on."""
        with self._cv:
            self._closed = True
            for closure in self._queue:
                closure.set_error(self._unfinished_error())
            self._queue.clear()
            self._cv.notify_all()

    def _check_open(self) -> None:
        if not self._closed:
            return
        if self.strategy.closed:  # a strategy that is gone raises its own error here
            raise RuntimeError(
                f"{self.strategy!r} is closed, and its ClusterCoordinator with it: nothing can "
                "be scheduled or joined any more. Create a new strategy (restore the last "
                "checkpoint into it) and ld.ClusterCoordinator(new_strategy)")
        raise RuntimeError("this ClusterCoordinator is closed: nothing can be scheduled or "
                           "joined any more; ld.ClusterCoordinator(strategy) makes a new one")

    @staticmethod
    def _unfinished_error() -> RuntimeError:
        return RuntimeError(
            "the ClusterCoordinator was closed (strategy.close() closes it) before this "
            "function finished: it ran in part or not at all; schedule it again on a new "
            "strategy's coordinator (restore the last checkpoint first)")

    def _unstall(self) -> None:
        """Sync mode: if nothing is queued and every function in flight waits at a step
        barrier (on some parameter server, after all its pushes landed), no push can complete
        those steps: apply each as it is (SyncReplicas.flush). The parameter servers only flush
        a step still open at the step the coordinator saw. Not after a function failed: join
        raises, and a failed function's write must not be applied."""
        if not self._sync or self._closed:
            return
        with self._cv:
            if self._queue or self._fatal is not None or self._error is not None:
                return
            keys = {c.key for c in self._in_flight.values()}
        try:
            states = self._group.store_call_all("sync_waiting")
            waiting = {tuple(k) for state in states for k in state["waiting"]}
            if not keys <= waiting:
                return  # some function is still computing (or pushing): it may fill the step
            with self._cv:  # still the same functions, and nothing new queued meanwhile
                if self._queue or {c.key for c in self._in_flight.values()} != keys:
                    return
            for i, state in enumerate(states):
                if state["pending"] and not state["applying"]:
                    self._group.store_call(i, "flush_step", state["step"])
        except ValueError as e:  # the step's pushes disagree (SyncReplicas.apply)
            self._fail(e)
        except Exception:  # a lost parameter server: the dispatchers stop everything
            return

    # -- dispatching ------------------------------------------------------------------------
    def _raise_pending(self) -> None:
        with self._cv:
            if self._fatal is not None:
                raise self._fatal
            error, self._error = self._error, None
        if error is not None:
            raise error

    def _dispatch(self, w: int, slot: int) -> None:
        idle_reported = False
        while True:
            with self._cv:
                report_idle = not self._queue and self._group.bounded and not idle_reported
                if not report_idle:
                    while not self._takes_work(w, slot) and self._runnable(w):
                        self._cv.wait()
                    if not self._runnable(w):
                        return
                    closure = self._queue.popleft()
                    # a worker runs what it is sent in order: this one after the function
                    # another of its dispatchers sent just before, if that still runs
                    seq, self._sent[w] = self._sent[w], self._sent[w] + 1
                    busy = any(k[0] == w for k in self._in_flight)
                    order = (self._token, seq, seq - 1 if busy else None)
                    self._in_flight[w, slot] = closure
                    closure.dispatched(self._unstall)
                    sent = time.monotonic()
            if report_idle:  # no work for this worker: it must not hold others back (SSP)
                idle_reported = True
                self._group.worker_idle(w)
                continue
            idle_reported = False
            outcome = self._execute(w, closure, order)
            with self._cv:
                now = time.monotonic()
                self._took[w] = now - max(sent, self._free_at[w])
                self._free_at[w] = now
            if not self._finish(w, slot, closure, outcome):
                return

    def _takes_work(self, w: int, slot: int) -> bool:
        """(Under the lock) whether dispatcher `slot` of worker `w` may take the next
        function: slot 0 always, the others only while pipelined and `w` keeps pace."""
        if not self._queue:
            return False
        return slot == 0 or (self._pipelined > 0 and self._keeps_pace(w))

    def _keeps_pace(self, w: int) -> bool:
        """(Under the lock) whether worker `w`'s last function took at most PACE_RATIO times
        the fastest worker's (unknown before its first: not yet)."""
        took = self._took[w]
        known = [self._took[v] for v in self._alive if self._took[v] is not None]
        return took is not None and took <= PACE_RATIO * min(known)

    def _runnable(self, w: int) -> bool:
        return not self._closed and self._fatal is None and w in self._alive

    def _execute(self, w: int, closure: ScheduledFunction, order: tuple) -> Outcome:
        version, placement = self._group.placement_for(w)
        coro = self._group.call_worker(w, "run", closure.fn_bytes, closure.args,
                                       closure.kwargs, placement, closure.key, order)
        future = asyncio.run_coroutine_threadsafe(coro, self._group.loop)
        while True:
            try:
                outcome: Outcome = future.result(timeout=POLL_S)
            except concurrent.futures.TimeoutError:
                lost = self._group.lost_store()
                if lost is not None:
                    future.cancel()
                    return Outcome(Ending.PS_LOST, self._group.ps_lost_error(lost))
                if self._group.worker_lost(w):
                    future.cancel()
                    return Outcome(Ending.WORKER_LOST)
                if self._closed:
                    future.cancel()
                    return Outcome(Ending.CLOSED)
                continue
            except remote.COMM_ERRORS:
                return Outcome(Ending.WORKER_LOST)
            except Exception as e:  # e.g. arguments that cannot be sent
                return Outcome.error(e)
            self._group.placement_sent(w, version)  # the worker has it now
            if outcome.ending is Ending.PS_LOST:  # the worker's word: make the driver's error
                if outcome.silent_s is not None:  # the PS answered that worker nothing: frozen
                    error = self._group.silent_error(outcome.ps_index, outcome.silent_s,
                                                     f"worker {w}")
                else:
                    lost = self._group.lost_store()
                    error = self._group.ps_lost_error(
                        outcome.ps_index if lost is None else lost, outcome.message)
                return Outcome(Ending.PS_LOST, error)
            return outcome

    def _finish(self, w: int, slot: int, closure: ScheduledFunction, outcome: Outcome
                ) -> bool:
        """Settle one function's outcome; returns whether worker `w` keeps dispatching."""
        ending = outcome.ending
        if self._closed and not outcome.finished:
            ending = Ending.CLOSED  # a lost PS or worker now is the closing cluster: no retry
        if ending is Ending.WORKER_LOST:
            self._lose_worker(w, slot, closure)
            return False
        if ending is Ending.RETRY:  # released from a sync step's barrier: run it again later
            with self._cv:
                if self._error is None and self._runnable(w):
                    self._requeue(closure)
                else:
                    closure.cancel()
                self._in_flight.pop((w, slot), None)
                self._cv.notify_all()
            return True
        if ending is Ending.OK:
            closure.set_result(outcome.value)
        elif ending is Ending.ERROR:
            error = outcome.value
            error.add_note(f"raised by a scheduled function on worker {w} "
                           f"({self._group.worker_addresses[w]})"
                           + (f"; worker traceback:\n{outcome.traceback}"
                              if outcome.traceback else ""))
            closure.set_error(error)
            self._fail(error)
        elif ending is Ending.PS_LOST:
            closure.set_error(outcome.value)
            self._stop(outcome.value)
        else:  # CLOSED
            closure.set_error(self._unfinished_error())
        with self._cv:
            self._in_flight.pop((w, slot), None)
            self._cv.notify_all()
        return outcome.finished

    def _fail(self, error: BaseException) -> None:
        """A function raised: cancel what is queued (TF's behaviour); join raises the error."""
        with self._cv:
            if self._error is None:
                self._error = error
            for closure in self._queue:
                closure.cancel()
            self._queue.clear()
            self._cv.notify_all()
            live = len(self._alive)
        self._group.release_barriers(live)  # sync mode: nobody waits for the failed function

    def _stop(self, error: BaseException) -> None:
        with self._cv:
            if self._fatal is None:
                self._fatal = error
            for closure in self._queue:
                closure.set_error(self._fatal)
            self._queue.clear()
            self._cv.notify_all()

    def _lose_worker(self, w: int, slot: int, closure: ScheduledFunction) -> None:
        """Worker `w` died: its function goes first in the queue for another worker (each of
        its dispatchers requeues its own; the first to see the loss reports it)."""
        with self._cv:
            first = w in self._alive
            self._alive.discard(w)
            if first:
                self.lost_workers.append(self._group.worker_addresses[w])
            self._in_flight.pop((w, slot), None)
            closure.attempts += 1
            self._requeue(closure)
            if not self._alive and self._fatal is None:
                self._fatal = ReplicaLostError(
                    f"every worker of this strategy was lost ({', '.join(self.lost_workers)}); "
                    "close it and start a new one (restore the last checkpoint)")
                for c in self._queue:
                    c.set_error(self._fatal)
                self._queue.clear()
            self._cv.notify_all()
            live = len(self._alive)
        if first:
            self._group.worker_gone(w, live)

    def _requeue(self, closure: ScheduledFunction) -> None:
        """Back into the queue in schedule order (under the lock): older work first, so a
        sync step's lost shard runs before the next steps' work waiting for it."""
        at = next((i for i, c in enumerate(self._queue) if c.seq > closure.seq),
                  len(self._queue))
        self._queue.insert(at, closure)
