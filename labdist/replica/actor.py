"""A replica: the variable copies of one member of a replica group and the thread that runs
its step functions.

`ReplicaCore` is plain Python (used in-process by OneDeviceStrategy and the default strategy);
`Replica` is the Dask actor that holds one core on a worker. Step functions run on the core's
own step thread, so a step can block in `merge_call` or a collective while the worker's event
loop keeps receiving peer messages and driver calls.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from labdist import autodiff, nest
from labdist.data.distributed import run_steps
from labdist.devices import Backend, get_backend
from labdist.errors import ReplicaLostError
from labdist.quorum.replica_side import QuorumSide
from labdist.quorum.undo import UndoLog
from labdist.replica import memory
from labdist.replica.communication_state import Communication
from labdist.replica.inbox import LANE, StepInbox, merge_by_lane, serve_lane
from labdist.replica.lane_end import LaneEnd
from labdist.replica.lifetime import DriverWatch, logger
from labdist.replica.loaded import LoadedFunctions
from labdist.replica.replica_context import ReplicaContext, enter
from labdist.replica.step_event import (
    ResumeStep,
    RunStep,
    StepEvent,
    StepRequest,
    encode,
    step_error,
)
from labdist.replica.transport_choice import TransportChoice
from labdist.shipping import picklable_error, unpack
from labdist.shm import placed
from labdist.timing import phases, prometheus
from labdist.timing.step_report import StepLog, StepReporter

__all__ = ["Replica", "ReplicaCore", "StepEvent"]


class ReplicaCore:
    """Variable copies (as `backend` arrays) plus a step thread. Not tied to Dask."""

    def __init__(self, rank: int, world: int, backend: Backend, comm, copy_results: bool = False,
                 step_log: StepLog | None = None):
        self.rank = rank
        self.world = world
        self.backend = backend
        self.comm = comm
        self.copy_results = copy_results
        self.values: dict[int, Any] = {}
        self.diverged: set[int] = set()
        self.feeds: dict[str, Any] = {}  # input pipelines that live here (labdist.data.distributed)
        self.communication = Communication(comm)  # local SGD / compression settings, counters
        self.inbox = StepInbox()  # jobs and resumes from actor calls; the lane, once handed
        self._lane: tuple | None = None  # (handle, encode, dropped) while the lane is served
        self._by_lane = False  # the running step came by the lane: merge_call answers there
        self._event: Future | None = None
        self.steps = step_log  # where the dashboard's reports come from, if anywhere
        self.undo: UndoLog | None = None  # quorum training: each run's starting state
        # the strategy this replica serves where it lives in the driver's process (a weak
        # reference, set by OneDeviceStrategy): its steps' `ld.get_strategy()`
        self.owner: Callable[[], Any] | None = None
        self._thread = threading.Thread(target=self._step_loop, daemon=True,
                                        name=f"labdist-replica-{rank}")
        self._thread.start()
        self.thread_id: int = self._thread.ident

    def strategy(self) -> Any:
        """The in-process strategy this replica serves (None on a worker, or once it is
        gone: its steps then see a stand-in)."""
        return None if self.owner is None else self.owner()

    # -- variable copies ------------------------------------------------------------------------
    def create(self, var_id: int, host: np.ndarray) -> None:
        self.values[var_id] = self.backend.xp.array(host)  # always a copy of the host value
        self.diverged.discard(var_id)

    def delete(self, var_ids: list[int]) -> None:
        for i in var_ids:
            self.values.pop(i, None)

    def copy_of(self, var_id: int, name: str = "variable") -> Any:
        try:
            return self.values[var_id]
        except KeyError:
            raise ValueError(
                f"Variable {name!r} has no copy on replica {self.rank}: it was created under "
                "another strategy (or that strategy was closed)"
            ) from None

    def read(self, var_id: int) -> np.ndarray:
        return np.array(self.backend.to_host(self.copy_of(var_id)), copy=True)

    def write(self, var_id: int, mode: str, host: np.ndarray | None, want: bool) -> Any:
        """Cross-replica write of a value the driver already validated."""
        copy = self.copy_of(var_id)
        value = self.backend.to_device(host)
        if mode == "assign":
            copy[...] = value
        elif mode == "assign_add":
            copy += value
        elif mode == "assign_sub":
            copy -= value
        else:
            raise ValueError(f"mode={mode!r}; allowed: assign, assign_add, assign_sub")
        return self.read(var_id) if want else None

    # -- steps ----------------------------------------------------------------------------------
    def start_step(self, run_id: int, fn, args: tuple, kwargs: dict, steps: int = 1) -> Future:
        """Queue `fn` on the step thread (`steps` times over, each step taking the next element
        of its input feeds); the future resolves with its first StepEvent."""
        if self._event is not None:
            raise RuntimeError(f"replica {self.rank} is still running an earlier step")
        self._event = Future()
        event = self._event
        self.inbox.put(self.inbox.jobs, (run_id, fn, args, kwargs, steps))
        return event

    def resume(self, value: Any = None, error: BaseException | None = None) -> Future:
        """Hand the result of merge_call to the waiting step; resolves with its next event."""
        event = self._event
        if event is None:
            raise RuntimeError(f"replica {self.rank} is not waiting in merge_call")
        self.inbox.put(self.inbox.resumes, (value, error))
        return event

    def merge(self, seq: int, fn, args: tuple, kwargs: dict) -> Any:
        """Called on the step thread by ReplicaContext.merge_call: report, then wait."""
        event = StepEvent("merge", seq, (fn, self.to_host(args), self.to_host(kwargs)))
        if self._by_lane:
            _, encode_event, dropped = self._lane
            answer = encode_event(event)
            value, error = ((None, answer) if isinstance(answer, TypeError)
                            else merge_by_lane(self.inbox, answer, dropped))
        else:
            self._signal(event, next_event=Future())
            value, error = self.inbox.resumes.get()
        if error is not None:
            raise error
        return self.to_device(unpack(value, f"the merge_call result sent to replica "
                                            f"{self.rank}"))

    def update(self, fn, args: tuple, kwargs: dict) -> Any:
        """`extended.update`: run `fn` here with updates writing only this replica's copy."""
        ctx = ReplicaContext(self, run_id=-1, mode="update", strategy=self.strategy())
        try:
            with enter(ctx):
                result = fn(*self.to_device(args), **self.to_device(kwargs))
        except Exception:
            raise
        except BaseException as e:  # sys.exit() must not end the worker, nor the driver
            raise step_error(e, f"replica {self.rank}", "extended.update's function") from None
        return self.to_host(result)

    def stop(self) -> None:
        self.inbox.put(self.inbox.jobs, None)

    def attach_lane(self, conn, handle, encode_event, dropped) -> None:
        """Serve the driver's lane on the step thread (replica/inbox.py): `handle(raw)`
        answers a request (running its step right there), `encode_event` pickles a merge
        event, `dropped()` reports a driver gone without a goodbye."""
        self._lane = (handle, encode_event, dropped)
        self.inbox.attach(conn)

    def run_now(self, run_id: int, fn, args: tuple, kwargs: dict, steps: int = 1
                ) -> StepEvent:
        """Run a step that came by the lane, on the step thread (the caller); its merge_calls
        answer on the lane. Returns its last event."""
        self._by_lane = True
        try:
            return self._run_job((run_id, fn, args, kwargs, steps))
        finally:
            self._by_lane = False

    def abandon(self, error: BaseException, timeout: float) -> bool:
        """The driver is gone: a step waiting in (or yet to reach) merge_call fails with
        `error`, the thread ends. Whether it ended within `timeout` (a step still computing
        or in a collective may take up to its collective timeout)."""
        self.inbox.put(self.inbox.resumes, (None, error))
        self.stop()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _step_loop(self) -> None:
        inbox = self.inbox
        while True:
            job = inbox.next(inbox.jobs)
            if job is LANE:
                serve_lane(inbox, self._lane[0], self._lane[2])
                continue
            if job is None:
                inbox.close()
                return
            self._signal(self._run_job(job), next_event=None)

    def _run_job(self, job: tuple) -> StepEvent:
        """One queued or lane step, start to end: its last event."""
        run_id, fn, args, kwargs, steps = job
        if self.undo is not None:
            self.undo.keep(self.values, run_id)
        self.comm.start_run(run_id)
        ctx = ReplicaContext(self, run_id, strategy=self.strategy())
        start = time.time()
        try:
            with enter(ctx):
                result = run_steps(fn, args, kwargs, steps, self.feeds, self.to_device)
            event = StepEvent("done", ctx._seq, self.to_host(result), warnings=ctx.warnings)
        except BaseException as e:  # reported to the driver, which re-raises it
            event = StepEvent("error", ctx._seq, error=step_error(e, f"replica {self.rank}"),
                              warnings=ctx.warnings, remote_traceback=traceback.format_exc())
        stop = time.time()
        phases.RECORDER.step(start, stop, {"rank": self.rank, "run": run_id}, steps or 1)
        if self.steps is not None:
            self.steps.record(start, stop, ctx._seq)
        return event

    def _signal(self, event: StepEvent, next_event: Future | None) -> None:
        current, self._event = self._event, next_event
        current.set_result(event)

    # -- host <-> device at the replica's boundary -------------------------------------------
    def to_device(self, tree: Any) -> Any:
        backend = self.backend

        def move(x):
            return backend.to_device(x) if isinstance(x, np.ndarray) else x

        return nest.map_structure(move, tree)

    def to_host(self, tree: Any) -> Any:
        backend, copy = self.backend, self.copy_results

        def move(x):
            x = autodiff.unwrap(x)  # a value a tape recorded leaves the step as its array
            if backend.is_array(x) or isinstance(x, np.ndarray):
                host = backend.to_host(x)
                return np.array(host, copy=True) if copy else host
            return x

        return nest.map_structure(move, tree)


class Replica:
    """The Dask actor holding one replica on its worker (one per worker, pinned by address).
    Its methods are what the driver calls; the parts a feature owns are components it holds:
    the transports being chosen, the fast lane's end, and quorum training's undo and
    handover."""

    def __init__(self, group: str, rank: int, peers: list[str], device: str, timeout: float):
        from distributed import get_worker

        from labdist.collectives import registry
        from labdist.collectives.communicator import Communicator
        from labdist.collectives.plugin import get_plugin
        from labdist.collectives.transports.protocol import Endpoint

        worker = get_worker()
        memory.keep_step_memory()  # also where the worker was started by someone else
        self.group = group
        self.address = worker.address
        self.where = f"replica {rank} (worker {worker.address})"  # for errors
        backend = get_backend(device)
        if len(peers) > 1:
            endpoint = Endpoint(group, rank, peers, timeout, worker,
                                get_plugin(worker).mailbox(group), backend)
            comm = Communicator(endpoint, registry.create(registry.FALLBACK, endpoint))
        else:
            comm = Communicator.local()
        self.core = ReplicaCore(rank, len(peers), backend, comm, step_log=StepLog())
        self._transports = TransportChoice(comm)
        self._quorum = QuorumSide(self.core, self.where)
        prometheus.register()  # steps and phases on this worker's /metrics
        self._fns = LoadedFunctions()
        self._loop: asyncio.AbstractEventLoop = worker.loop.asyncio_loop
        self._reporter = StepReporter(worker, self.core.steps, group, rank,
                                      self.core.thread_id)
        self._worker, self._timeout, self._closed = worker, timeout, False
        self._watch = DriverWatch(worker, worker.get_current_task(), self._driver_gone)
        self._lane = LaneEnd(self.core, self.where, self._watch.lane_dropped, self._load)
        placed.use_store(worker.data)  # where `fit`'s scattered input lies (other hosts)

    async def info(self) -> dict:
        return {"address": self.address, "pid": os.getpid(), "backend": self.core.backend.name,
                "rank": self.core.rank, "device": self.core.backend.describe_device()}

    async def create(self, var_id: int, host: np.ndarray) -> None:
        self.core.create(var_id, host)

    async def delete(self, var_ids: list[int]) -> None:
        self.core.delete(var_ids)

    async def read(self, var_id: int) -> np.ndarray:
        return self.core.read(var_id)

    async def write(self, var_id: int, mode: str, host, want: bool):
        return self.core.write(var_id, mode, host, want)

    # -- steps: one handler, reached by an actor call or by the lane (replica/lane_end.py) ---
    async def step(self, request: StepRequest) -> bytes:
        """Start a step (`RunStep`) or go on from merge_call (`ResumeStep`); the step's next
        event, pickled."""
        return await self._reply(self._step(request))

    async def _reply(self, next_event: Future) -> bytes:
        """The step's next event, pickled for the driver (on the event loop)."""
        while isinstance(answer := encode(await asyncio.wrap_future(next_event), self.where),
                         TypeError):  # merge_call arguments that cannot travel: the step fails
            next_event = self.core.resume(error=answer)
        return answer

    def _step(self, request: StepRequest) -> Future:
        """Start or resume a step for an actor call; the future of its next event, which is an
        error event when that fails (e.g. arguments this worker cannot import)."""
        try:
            match request:
                case RunStep(run_id, fn_ref, args, kwargs, steps):
                    fn = self._load(run_id, fn_ref)
                    return self.core.start_step(run_id, fn, args, kwargs, steps)
                case ResumeStep(value, error):
                    return self.core.resume(value, error)
            raise TypeError(f"{request!r} is no step request")
        except Exception as e:
            failed = Future()
            failed.set_result(StepEvent("error", 0, error=picklable_error(e),
                                        remote_traceback=traceback.format_exc()))
            return failed

    def _load(self, run_id: int, fn_ref: tuple) -> Any:
        """A run's step function; the mailbox drops what earlier runs left behind."""
        mailbox = self.core.comm.mailbox
        if mailbox is not None and mailbox.holds_any():  # else nothing to drop: no hop to
            # the event loop (the mailbox belongs to it), no wake-up there
            self._loop.call_soon_threadsafe(mailbox.start_run, run_id)
        return self._fns.load(fn_ref, self.where, self.core.feeds)

    async def peer_state(self, run_id: int, rank: int, state: str, detail: Any) -> None:
        mailbox = self.core.comm.mailbox
        if mailbox is not None:
            mailbox.peer_state(run_id, rank, state, detail)

    def update(self, fn_bytes: bytes, args: tuple, kwargs: dict) -> Any:
        return self.core.update(self._fns.load_bytes(fn_bytes), args, kwargs)

    # -- the fast lane (replica/lane_end.py) ----------------------------------------------
    async def lane_open(self) -> tuple[tuple[str, int], str, str | None] | None:
        return self._lane.open()

    def lane_close(self) -> None:
        self._lane.close()

    # -- choosing the group's transports (replica/transport_choice.py) ----------------------
    async def transport_probe(self, name: str) -> Any | None:
        return self._transports.probe(name)

    async def transport_bootstrap(self, name: str, probes: list[Any]) -> Any:
        return self._transports.bootstrap(name, probes)

    async def transport_connect(self, name: str, probes: list[Any], *root: Any) -> bool:
        return await self._transports.connect(name, probes, *root)

    async def transport_use(self, names: list[str]) -> None:
        self._transports.use(names)

    # -- quorum training (quorum/replica_side.py) -----------------------------------------
    async def keep_undo(self) -> None:
        self._quorum.keep_undo()

    async def rollback(self, run_id: int) -> bool:
        return self._quorum.rollback(run_id)

    async def handover(self, token: str) -> None:
        self._quorum.handover(token)

    async def adopt(self, token: str) -> int:
        return self._quorum.adopt(token)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._watch.stop()
        self._reporter.close()
        self._transports.use([])
        self.core.comm.close()
        self._lane.close()
        self.core.stop()
        from labdist.collectives.plugin import get_plugin

        get_plugin(self._worker).drop(self.group)

    async def _driver_gone(self, why: str) -> None:
        """Release what `close` does, once the step thread let go (replica/lifetime.py)."""
        error = ReplicaLostError(f"replica {self.core.rank}'s driver is gone ({why})")
        mailbox = self.core.comm.mailbox
        if mailbox is not None:  # a collective its peers will never join ends now
            mailbox.abandon(str(error))
        if not await asyncio.to_thread(self.core.abandon, error, self._timeout + 5):
            logger.warning("labdist: replica %s's step is still running; releasing it anyway",
                           self.core.rank)
        await self.close()
