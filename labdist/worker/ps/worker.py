"""What runs on a parameter-server *worker*: the `ParameterServerWorker` actor, which runs the
functions the coordinator schedules, and the replica context they see.

Workers hold no authoritative copy of anything: inside a scheduled function a variable read
pulls from the variable's parameter server, and `assign*` pushes to it (async mode: applied on
arrival; sync mode: the function's writes are pushed together when it returns, one contribution
per function, as SyncReplicas' apply_gradients). Never imports driver-side code
(docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import os
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import cloudpickle
import numpy as np

from labdist import nest, network, phases
from labdist.collectives import Communicator
from labdist.devices import NUMPY
from labdist.errors import OutOfRangeError, ParameterServerLostError
from labdist.input import InputContext
from labdist.shipping import picklable_error
from labdist.worker import actor_call as remote
from labdist.worker import metrics
from labdist.worker.context import ReplicaContext, enter
from labdist.worker.ps.compressed_push import PushCompression
from labdist.worker.ps.liveness import PING, Unresponsive, watched_call
from labdist.worker.ps.outcome import Ending, Outcome
from labdist.worker.ps.shm_client import ShmPaths
from labdist.worker.step_report import StepLog, StepReporter

# A parameter server that refuses connections this long is gone (Dask's default retries 30 s).
STORE_CONNECT_TIMEOUT_S = 10.0
# A pipelined function waits at most this long for the one sent before it to arrive (it may
# never come: its arguments failed to send), then is queued anyway.
TURN_WAIT_S = 5.0


class Retry(BaseException):
    """Raised inside a scheduled function whose step barrier was released (a worker was lost):
    the coordinator runs the function again later. BaseException, so `except Exception` in a
    user's function does not swallow it."""


@dataclass(frozen=True)
class PerWorkerIterator:
    """A handle to an iterator that lives on every worker: inside a scheduled function it is
    that worker's own iterator (TF's PerWorkerValues of iterators)."""

    dataset_id: str
    iterator_id: int

    def __iter__(self) -> PerWorkerIterator:
        return self

    def __next__(self):
        raise TypeError("a per-worker iterator is read inside scheduled functions: pass it "
                        "to coordinator.schedule(fn, args=(iterator,)) and call next() there")


class WorkerStrategy:
    """What a `ParameterServerStrategy` captured in a scheduled function becomes on the worker:
    `strategy.run(fn, args)` inside a scheduled function runs `fn` there (one replica)."""

    num_replicas_in_sync = 1

    def run(self, fn, args: tuple = (), kwargs: dict | None = None) -> Any:
        return fn(*args, **(kwargs or {}))

    def scope(self):
        return contextlib.nullcontext(self)

    def experimental_local_results(self, value: Any) -> tuple:
        return (value,)


class ParameterServerWorker:
    """The Dask actor on each worker: runs scheduled functions on a thread of its own, one
    at a time, in the order the coordinator sent them."""

    def __init__(self, index: int, num_workers: int, stores: list[tuple[str, str]],
                 settings: dict):
        from distributed import get_worker

        worker = get_worker()
        self.index = index
        self.num_workers = num_workers
        self.address = worker.address
        self.stores = stores
        self.sync = settings["mode"] == "sync"
        self.bounded = settings["staleness_bound"] is not None
        self.ps_timeout = settings["ps_timeout"]
        self.delay = 0.0
        self.placement: dict[int, int] = {}
        self.datasets: dict[str, Any] = {}
        self.iterators: dict[tuple[str, int], Any] = {}
        self._loop = worker.loop.asyncio_loop
        self._connection_args = worker.connection_args
        self._rpc = None  # a connection pool of our own, made on the event loop
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"labdist-w{index}")
        self._fn: tuple[bytes | None, Any] = (None, None)
        # one thread runs the functions, one at a time, in the order the coordinator sent
        # them (a pipelined one sends the next while one runs; they may arrive the other way
        # round): the next is queued on that thread, which takes it without a wake-up
        self._submitted: tuple[str, int] = ("", -1)  # (coordinator, the last order queued)
        self._held: dict[tuple[str, int], asyncio.Future] = {}  # arrived before their turn
        metrics.register()  # steps and phases on this worker's /metrics
        self._shm = ShmPaths(index, settings.get("transport", "auto") != "tcp",
                             self._dask_calls, self._probe)
        self.compression = PushCompression()  # its pushes' compressor and residuals
        self.compression.set(settings.get("compression"))
        self._worker = worker
        self._reports: dict[int, tuple[StepLog, StepReporter]] = {}  # per function thread

    async def info(self) -> dict:
        return {"address": self.address, "pid": os.getpid(), "index": self.index}

    async def set_delay(self, seconds: float) -> None:
        self.delay = float(seconds)

    async def set_compression(self, compressor) -> None:
        self.compression.set(compressor)

    async def push_stats(self) -> dict:
        return self.compression.stats()

    async def make_dataset(self, dataset_id: str, fn_bytes: bytes) -> None:
        """Call the per-worker `dataset_fn` here (with an InputContext if it takes one)."""
        fn = cloudpickle.loads(fn_bytes)
        try:
            takes_context = bool(inspect.signature(fn).parameters)
        except (TypeError, ValueError):  # a builtin without a signature: call it bare
            takes_context = False
        ctx = InputContext(self.num_workers, self.index)
        self.datasets[dataset_id] = fn(ctx) if takes_context else fn()

    async def run(self, fn_bytes: bytes, args: tuple, kwargs: dict, placement: dict | None,
                  key: tuple, order: tuple[str, int, int | None] | None = None) -> Outcome:
        """Run a scheduled function; how it ended (OK, ERROR, RETRY or PS_LOST: outcome.py).
        Errors come back as values: a raised one would look like this worker failing.
        `order`: (coordinator, this function's number on this worker, the number it runs
        after, or None when nothing sent before it is still running)."""
        if placement is not None:
            self.placement = placement
        token, seq, after = order if order is not None else ("", -1, None)
        if after is not None and not (self._submitted[0] == token
                                      and self._submitted[1] >= after):
            turn = asyncio.get_running_loop().create_future()  # the one before is not here yet
            self._held[token, seq] = turn
            timer = asyncio.get_running_loop().call_later(
                TURN_WAIT_S, lambda: turn.done() or turn.set_result(None))
            try:
                await turn
            finally:
                timer.cancel()
                self._held.pop((token, seq), None)
        future = self._pool.submit(self._run, fn_bytes, args, kwargs, key)
        if order is not None:
            last = self._submitted[1] if self._submitted[0] == token else -1
            self._submitted = (token, max(last, seq))
            held = self._held.get((token, seq + 1))
            if held is not None and not held.done():
                held.set_result(None)
        return await asyncio.wrap_future(future)

    async def paths(self) -> dict[int, str]:
        """How this worker reaches each parameter server it called: "shm" or "tcp"."""
        return self._shm.paths()

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for _, reporter in list(self._reports.values()):
            reporter.close()
        self._shm.close()
        if self._rpc is not None:
            await self._rpc.close()

    # -- on a function's thread -------------------------------------------------------------
    def _run(self, fn_bytes, args, kwargs, key) -> Outcome:
        ctx = WorkerContext(self, key)
        try:
            fn = self._load(fn_bytes)
            if self.bounded:
                self.call_all([(0, "ssp_begin", (self.index,))])
            args, kwargs = self._resolve(args), self._resolve(kwargs)
            start = phases.now()
            with enter(ctx):
                result = fn(*args, **kwargs)
            ctx.flush()
            stop = phases.now()
            phases.RECORDER.step(start, stop, {"worker": self.index})
            self._step_log().record(start, stop, 0)
            cloudpickle.dumps(result, protocol=5, buffer_callback=lambda _: None)  # can it go?
            return Outcome.ok(result)
        except Retry:
            return Outcome(Ending.RETRY)
        except ParameterServerLostError as e:
            return Outcome(Ending.PS_LOST, message=str(e), ps_index=getattr(e, "ps_index", None),
                           silent_s=getattr(e, "silent_s", None))
        except StopIteration:
            error = OutOfRangeError(f"a per-worker iterator on worker {self.index} is exhausted "
                                    "(its dataset has no more elements)")
            return Outcome.error(error, traceback.format_exc())
        except BaseException as e:  # the function's own error, reported to the driver
            return Outcome.error(picklable_error(e), traceback.format_exc())

    def _step_log(self) -> StepLog:
        """This function thread's log of steps for the Dask dashboard's task stream (each
        thread its own row, and its phases read by thread: worker/step_report.py)."""
        tid = threading.get_ident()
        entry = self._reports.get(tid)
        if entry is None:
            log = StepLog()
            reporter = StepReporter(self._worker, log, "ps", f"ps-worker-{self.index}", tid)
            entry = self._reports[tid] = (log, reporter)
        return entry[0]

    def _load(self, fn_bytes: bytes):
        if fn_bytes != self._fn[0]:
            self._fn = (fn_bytes, cloudpickle.loads(fn_bytes))
        return self._fn[1]

    def _resolve(self, tree: Any) -> Any:
        def local(x):
            if not isinstance(x, PerWorkerIterator):
                return x
            slot = (x.dataset_id, x.iterator_id)
            if slot not in self.iterators:
                if x.dataset_id not in self.datasets:
                    raise ValueError(f"per-worker dataset {x.dataset_id} was not created on "
                                     f"worker {self.index}")
                self.iterators[slot] = iter(self.datasets[x.dataset_id])
            return self.iterators[slot]

        return nest.map_structure(local, tree)

    async def _connect(self):
        if self._rpc is None:
            from distributed.core import ConnectionPool

            self._rpc = await ConnectionPool(connection_args=self._connection_args,
                                             timeout=STORE_CONNECT_TIMEOUT_S)
        return self._rpc

    def _dask_calls(self, calls: list[tuple[int, str, tuple]]) -> list[Any]:
        """Each call's result or exception, over Dask comms, watched (liveness.py)."""
        async def gather():
            rpc = await self._connect()
            return await asyncio.gather(
                *(watched_call(rpc, *self.stores[s], m, *a, timeout=self.ps_timeout)
                  for s, m, a in calls),
                return_exceptions=True)

        return asyncio.run_coroutine_threadsafe(gather(), self._loop).result()

    def _probe(self, shard: int):
        """A liveness check of parameter server `shard` (a concurrent Future)."""
        async def ping():
            return await remote.call(await self._connect(), *self.stores[shard], PING)

        return asyncio.run_coroutine_threadsafe(ping(), self._loop)

    def call_all(self, calls: list[tuple[int, str, tuple]]) -> list[Any]:
        """Call parameter servers concurrently: (shard, method, args) each; raises
        ParameterServerLostError naming a PS that cannot be reached, or that answered nothing
        for `ps_timeout` seconds (worker/ps/liveness.py). A PS on this host is reached over
        shared memory (shm_client.py)."""
        results = self.call_each(calls)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return results

    def call_each(self, calls: list[tuple[int, str, tuple]]) -> list[Any]:
        """As `call_all`, but each call's result or the exception it raises is returned in
        its place (a push needs to know which parameter servers it reached)."""
        results = self._shm.call_all(calls, self.ps_timeout)
        out = []
        for (shard, _, _), r in zip(calls, results, strict=True):
            where = f"parameter server {shard} (worker {self.stores[shard][0]})"
            if isinstance(r, Unresponsive):
                error = ParameterServerLostError(
                    f"{where} answered nothing to worker {self.index} for {r.seconds:g} s")
                error.ps_index, error.silent_s = shard, r.seconds
                r = error
            elif isinstance(r, remote.COMM_ERRORS):
                error = ParameterServerLostError(
                    f"{where} could not be reached from worker {self.index}: "
                    f"{type(r).__name__}: {r}")
                error.ps_index = shard
                r = error
            out.append(r)
        return out


class _ReplicaView:
    """The replica a variable handle sees inside a scheduled function: one replica, host
    arrays, and copies that come from the parameter servers."""

    rank = 0
    world = 1
    backend = NUMPY

    def __init__(self, ctx: WorkerContext):
        self._ctx = ctx
        self.comm = Communicator.local()
        self.diverged: set[int] = set()

    def copy_of(self, var_id: int, name: str = "variable") -> np.ndarray:
        return self._ctx.pull([var_id], name=name)[var_id]


class WorkerContext(ReplicaContext):
    """`ld.get_replica_context()` inside a scheduled function (one replica per worker, as in
    TF's ParameterServerStrategy), plus the pull / push calls variables and fit use."""

    def __init__(self, executor: ParameterServerWorker, key: tuple):
        super().__init__(_ReplicaView(self), run_id=0,
                         merge_handler=lambda fn, args, kw: fn(WorkerStrategy(), *args, **kw))
        self._executor = executor
        self._key = key
        self._versions: dict[int, int] = {}  # var_id -> the version its last pull saw
        self._steps: dict[int, int] = {}  # shard -> the global step its last pull saw
        self._pending: list[tuple] = []  # sync mode: this function's writes
        self._examples = 1.0  # sync mode: what this function's writes weigh in a MEAN

    @property
    def worker_index(self) -> int:
        """Which worker runs this function (0 .. num_workers - 1)."""
        return self._executor.index

    def _shards(self, var_ids, names: dict[int, str] | None = None) -> dict[int, list[int]]:
        by_shard: dict[int, list[int]] = {}
        for v in var_ids:
            shard = self._executor.placement.get(v)
            if shard is None:
                name = (names or {}).get(v, f"#{v}")
                raise ValueError(f"Variable {name!r} does not live on this strategy's parameter "
                                 "servers: create it under the strategy's scope()")
            by_shard.setdefault(shard, []).append(v)
        return by_shard

    def pull(self, var_ids, step: int | None = None, name: str | None = None
              ) -> dict[int, np.ndarray]:
        """Read variables from their parameter servers (one call per PS, concurrently); with
        `step` (sync), wait until the global step reaches it."""
        by_shard = self._shards(var_ids, {var_ids[0]: name} if name else None)
        calls = [(s, "pull", (ids, step)) for s, ids in by_shard.items()]
        values: dict[int, np.ndarray] = {}
        with phases.RECORDER.span("pull", {"worker": self.worker_index}):
            start = phases.now()
            replies = self._executor.call_all(calls)
            if network.CURRENT is not None and None not in replies:  # a modelled link
                network.delay(sum(a.nbytes for got, _, _ in replies for a in got.values()),
                              phases.now() - start)
        if None in replies:  # released from a step's barrier (a worker was lost): not yet
            raise Retry()
        for (shard, _, _), (got, versions, at) in zip(calls, replies, strict=True):
            values.update(got)
            self._versions.update(versions)
            self._steps[shard] = at
        return values

    def set_num_examples(self, num_examples: float) -> None:
        """Sync mode: this function's writes to MEAN variables stand for `num_examples`
        examples, so a step averages over examples, not functions (as MirroredStrategy does
        when shards differ in size). Default 1 per function: equal weights. SUM, NONE and
        ONLY_FIRST_REPLICA variables, and async mode, ignore it."""
        if isinstance(num_examples, bool) or not isinstance(num_examples, int | float | np.number) \
                or not math.isfinite(num_examples) or num_examples < 0:
            raise ValueError(f"num_examples={num_examples!r} is not allowed; use a finite "
                             "number >= 0 (how many examples this function's writes stand for)")
        self._examples = float(num_examples)

    def push(self, items: list[tuple], step: int | None = None, key: tuple | None = None,
              want: bool = False, barrier: bool = True, examples: float | None = None
              ) -> tuple[set[str], dict[int, np.ndarray]]:
        """Send (var_id, kind, array, aggregation) items to their parameter servers; returns
        the PSs' verdicts ("applied", "accepted", "dropped", ...) and, with `want`, values.
        Sync: then wait at the barrier of every PS whose step the push left open (all pushes
        first, so a waiting function has no push still on its way: what lets the coordinator
        tell a stalled step); `barrier=False` for step-bound work, whose next pull waits
        instead. `examples` weighs the push in a MEAN (default: `set_num_examples`, else 1)."""
        if self._executor.delay > 0:  # the straggler knob: this worker computes slowly
            time.sleep(self._executor.delay)
        by_shard = self._shards([item[0] for item in items])
        compression = self._executor.compression
        items, owed = compression.encode(items)  # as they travel (compressed_push)
        weight = self._examples if examples is None else float(examples)
        key = key or self._key
        calls = []
        for shard, ids in by_shard.items():
            mine = [item for item in items if item[0] in ids]
            basis = {v: self._versions[v] for v in ids if v in self._versions}
            at = step if step is not None else self._steps.get(shard)
            calls.append((shard, "push", (self.worker_index, mine, basis, at, key, want,
                                          weight)))
        statuses, values, waits = set(), {}, []
        with phases.RECORDER.span("push", {"worker": self.worker_index,
                                           "flow": phases.flow_id(self.worker_index, key)}):
            start = phases.now()
            try:
                replies = self._executor.call_each(calls)
            except BaseException:
                compression.abort(owed, [item[0] for item in items])
                raise
            # error feedback counts a push once it landed; a PS it did not reach gets its
            # residuals back as they were (a retry starts from them)
            for (shard, _, _), r in zip(calls, replies, strict=True):
                landed = not isinstance(r, BaseException)
                (compression.commit if landed else compression.abort)(owed, by_shard[shard])
            for r in replies:
                if isinstance(r, BaseException):
                    raise r
            if network.CURRENT is not None:  # a modelled link: no faster than it
                network.delay(sum(np.asarray(item[2]).nbytes for item in items),
                              phases.now() - start)
        for (shard, _, _), r in zip(calls, replies, strict=True):
            values.update(r["values"] or {})
            if barrier and r.get("wait") is not None:
                wait_step, release = r["wait"]
                waits.append((shard, "wait_step", (wait_step, key, release)))
            else:
                statuses.add(r["status"])
        if waits:  # sync: at the barrier until the step's gradients are in (a peer's wait)
            with phases.RECORDER.span("wait", {"worker": self.worker_index, "kind": "barrier"}):
                statuses.update(self._executor.call_all(waits))
        if "starved" in statuses:
            raise RuntimeError(
                "sync mode: fewer workers are left than replicas_to_aggregate, so no step can "
                "gather enough gradients from scheduled functions any more; use backup workers "
                "(total_num_replicas > replicas_to_aggregate) or restore the last checkpoint "
                "into a new strategy")
        return statuses, values

    def apply_update(self, var, mode: str, value: Any, read_value: bool) -> Any:
        """`assign*` in a scheduled function: pushed to the variable's parameter server
        (async: applied on arrival; sync: sent with the function's other writes when it
        returns, one contribution per function)."""
        arr = var.prepare_update(mode, value, NUMPY)
        item = (var.id, mode, np.array(arr, copy=True), var.aggregation.name)
        if self._executor.sync:
            self._pending.append(item)  # pushed with the function's other writes at its end
            return None
        _, values = self.push([item], want=read_value)
        return values.get(var.id) if read_value else None

    def flush(self) -> None:
        """Push the writes a sync-mode function buffered (called when it returns)."""
        if self._pending:
            items, self._pending = self._pending, []
            self.push(items)

    def __repr__(self) -> str:
        return f"WorkerContext(worker_index={self.worker_index}, num_replicas_in_sync=1)"


