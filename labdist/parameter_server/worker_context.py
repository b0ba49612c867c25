"""What a function scheduled on a parameter-server worker sees: `ld.get_replica_context()`
as one replica whose variable reads pull from the parameter servers and whose writes push to
them (async: applied on arrival; sync: the function's writes pushed together when it
returns), and the stand-in strategy its merge_calls get."""

from __future__ import annotations

import contextlib
import math
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from labdist import network
from labdist.collectives import Communicator
from labdist.devices import NUMPY
from labdist.parameter_server.push import Push
from labdist.replica.replica_context import ReplicaContext
from labdist.timing import phases

if TYPE_CHECKING:
    from labdist.parameter_server.worker import ParameterServerWorker


class Retry(BaseException):
    """Raised inside a scheduled function whose step barrier was released (a worker was lost):
    the coordinator runs the function again later. BaseException, so `except Exception` in a
    user's function does not swallow it."""


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
        self._pending: list[Push] = []  # sync mode: this function's writes
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

    def push(self, items: list[Push], step: int | None = None, key: tuple | None = None,
              want: bool = False, barrier: bool = True, examples: float | None = None
              ) -> tuple[set[str], dict[int, np.ndarray]]:
        """Send updates (push.py) to their variables' parameter servers; returns the PSs'
        verdicts ("applied", "accepted", "dropped", ...) and, with `want`, values.
        Sync: then wait at the barrier of every PS whose step the push left open (all pushes
        first, so a waiting function has no push still on its way: what lets the coordinator
        tell a stalled step); `barrier=False` for step-bound work, whose next pull waits
        instead. `examples` weighs the push in a MEAN (default: `set_num_examples`, else 1)."""
        if self._executor.delay > 0:  # the straggler knob: this worker computes slowly
            time.sleep(self._executor.delay)
        by_shard = self._shards([p.var_id for p in items])
        compression = self._executor.compression
        items, owed = compression.encode(items)  # as they travel (compressed_push)
        weight = self._examples if examples is None else float(examples)
        key = key or self._key
        calls = []
        for shard, ids in by_shard.items():
            mine = [p for p in items if p.var_id in ids]
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
                compression.abort(owed, [p.var_id for p in items])
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
                network.delay(sum(np.asarray(p.value).nbytes for p in items),
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
        item = Push(var.id, mode, np.array(arr, copy=True), var.aggregation)
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


