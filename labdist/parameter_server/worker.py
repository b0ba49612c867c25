"""What runs on a parameter-server *worker*: the `ParameterServerWorker` actor, which runs the
functions the coordinator schedules (the context they see: worker_context.py).

Workers hold no authoritative copy of anything: inside a scheduled function a variable read
pulls from the variable's parameter server, and `assign*` pushes to it (async mode: applied on
arrival; sync mode: the function's writes are pushed together when it returns, one contribution
per function, as SyncReplicas' apply_gradients). Never imports driver-side code
(docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import cloudpickle

from labdist import actor_call as remote
from labdist import nest
from labdist.data.distributed import InputContext
from labdist.errors import OutOfRangeError, ParameterServerLostError
from labdist.parameter_server.compressed_push import PushCompression
from labdist.parameter_server.liveness import PING, Unresponsive, watched_call
from labdist.parameter_server.outcome import Ending, Outcome
from labdist.parameter_server.settings import PsSettings
from labdist.parameter_server.shm_client import ShmPaths
from labdist.parameter_server.worker_context import Retry, WorkerContext
from labdist.replica.replica_context import enter
from labdist.shipping import picklable_error
from labdist.timing import phases, prometheus
from labdist.timing.step_report import StepLog, StepReporter

# A parameter server that refuses connections this long is gone (Dask's default retries 30 s).
STORE_CONNECT_TIMEOUT_S = 10.0
# A pipelined function waits at most this long for the one sent before it to arrive (it may
# never come: its arguments failed to send), then is queued anyway.
TURN_WAIT_S = 5.0


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


class ParameterServerWorker:
    """The Dask actor on each worker: runs scheduled functions on a thread of its own, one
    at a time, in the order the coordinator sent them."""

    def __init__(self, index: int, num_workers: int, stores: list[tuple[str, str]],
                 settings: PsSettings):
        from distributed import get_worker

        worker = get_worker()
        self.index = index
        self.num_workers = num_workers
        self.address = worker.address
        self.stores = stores
        self.sync = settings.sync
        self.bounded = settings.bounded
        self.ps_timeout = settings.ps_timeout
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
        prometheus.register()  # steps and phases on this worker's /metrics
        self._shm = ShmPaths(index, settings.transport != "tcp",
                             self._dask_calls, self._probe)
        self.compression = PushCompression()  # its pushes' compressor and residuals
        self.compression.set(settings.compression)
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
            return Outcome(Ending.PS_LOST, message=str(e), ps_index=e.ps_index,
                           silent_s=e.silent_s)
        except StopIteration:
            error = OutOfRangeError(f"a per-worker iterator on worker {self.index} is exhausted "
                                    "(its dataset has no more elements)")
            return Outcome.error(error, traceback.format_exc())
        except BaseException as e:  # the function's own error, reported to the driver
            return Outcome.error(picklable_error(e), traceback.format_exc())

    def _step_log(self) -> StepLog:
        """This function thread's log of steps for the Dask dashboard's task stream (each
        thread its own row, and its phases read by thread: timing/step_report.py)."""
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
        for `ps_timeout` seconds (parameter_server/liveness.py). A PS on this host is reached over
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
