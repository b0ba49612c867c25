"""What every strategy shares: scope, run (SPMD with merge_call), reduce, local results.

A strategy talks to its replicas through a *replica group* (in-process for OneDeviceStrategy,
Dask actors for the mirrored strategies, parameter servers): the `ReplicaGroup` protocol of
strategies/replica_group.py. Quorum training is a component the strategy holds
(`strategy.quorum`, quorum/training.py), not a part of its class.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from labdist import checks, context, nest, shipping
from labdist.cluster.reaper import Lifetime
from labdist.data.dataset_placement import DatasetPlacement
from labdist.data.distributed import DistributedDataset, InputContext, shard_group
from labdist.data.feeds import Inputs
from labdist.data.pipelines import DatasetsFromFunction, InputOptions
from labdist.enums import InputReplicationMode, ReduceOp
from labdist.errors import (
    ReplicaLostError,
)
from labdist.replica import replica_context
from labdist.replica.captured_strategy import CapturedStrategy, cross_replica_error
from labdist.strategies import failures, regroup
from labdist.strategies.extended import StrategyExtended
from labdist.strategies.reduce import reduce_value
from labdist.strategies.replica_group import ReplicaGroup
from labdist.timing import phases
from labdist.timing.trace import profile
from labdist.values import PerReplica, ValueContext, concat_along
from labdist.variables import Variable

if TYPE_CHECKING:  # quorum training builds on this module: it is never imported from here
    from labdist.quorum.training import MembershipChange, Quorum


class Strategy:
    """The tf.distribute-shaped API over a replica group."""

    # experimental_distribute_values_from_function with one replica: TF 2.21's
    # MirroredStrategy (and MultiWorkerMirroredStrategy) gives a one-component PerReplica,
    # OneDeviceStrategy and the default strategy the plain value. (run and all_gather give
    # the plain value under all of them.)
    _values_per_replica_with_one = False
    # distribute_datasets_from_function: one pipeline per worker, TF's default; True where
    # every replica has a worker of its own (MultiWorkerMirroredStrategy)
    _pipeline_per_replica = False

    def __init__(self, group: ReplicaGroup):
        self._id = uuid.uuid4().hex
        # what this strategy must let go of, even if nobody calls close() (cluster/reaper.py)
        self._lifetime = Lifetime(self, group)
        self._run_ids = itertools.count(1)
        self._closed = False
        self._variable_ids: list[int] = []
        # Everything that talks to the replicas holds this, so threads sharing a strategy (a
        # lab training in the background, the notebook) take turns, whole run by whole run.
        # Reentrant: a merge_call function on the driver reads variables, calls reduce or
        # extended.update while its run holds it.
        self._lock = threading.RLock()
        self._running = False  # a run is in progress (on the thread holding the lock)
        self._updating = False  # an extended.update is (its function pickles the strategy)
        self.extended = StrategyExtended(self)
        self._inputs = Inputs(self, group.remote_input)
        # fault_tolerance="quorum": the component that runs steps as transactions
        self.quorum: Quorum | None = None
        context.register(self)

    # -- basics -----------------------------------------------------------------------------------
    @property
    def group(self) -> ReplicaGroup:
        """The replica group now (re-formed by recover, refresh and quorum epochs)."""
        return self._lifetime.group

    def replace_group(self, group: ReplicaGroup) -> None:
        """The replicas re-formed: `group` replaces the old one (which its successor closed)
        and is told the strategy's modes (`_on_new_group`). The caller holds the lock."""
        self._lifetime.group = group
        self._on_new_group()

    def use_quorum(self, quorum: Quorum) -> None:
        """Train in quorum mode from now on (`fault_tolerance="quorum"`)."""
        self.quorum = quorum
        self._lifetime.also_close(quorum.close)

    @property
    def num_replicas_in_sync(self) -> int:
        return self.group.num_replicas

    @property
    def client(self) -> Any:
        """The distributed.Client that reaches this strategy's replicas (None: they run in
        this process)."""
        return None

    @property
    def dashboard_link(self) -> str | None:
        """The Dask dashboard of the cluster this strategy started (None: none)."""
        return None

    @property
    def local_steps(self) -> int | None:
        """Steps each replica takes on its own between synchronisations (None: every step;
        only mirrored strategies train with local SGD / DiLoCo)."""
        return None

    @property
    def outer_optimizer(self) -> Any:
        """Local SGD / DiLoCo's outer optimizer (None: none)."""
        return None

    @property
    def id(self) -> str:
        """A key unique to this strategy: its variables keep it (`Variable.strategy_id`) to
        find it again (`context.lookup`)."""
        return self._id

    @property
    def closed(self) -> bool:
        """Whether `close()` was called: its replicas, and the variables' copies, are gone."""
        return self._closed

    @contextlib.contextmanager
    def scope(self):
        """Cross-replica context: variables created here get one copy per replica."""
        self._check_open()
        context.enter_scope(self)
        try:
            yield self
        finally:
            context.exit_scope(self)

    def close(self) -> None:
        """Release the replicas, and whatever cluster this strategy started (nothing else)."""
        if not self._closed:
            self._closed = True
            self._lifetime.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_replicas_in_sync={self.group.num_replicas})"

    def __reduce__(self):
        """Captured by a step function: on a replica, a stand-in that refuses cross-replica
        calls with TF's error (on the driver, this strategy again). It records whether it
        travels with this strategy's own step or update function, so that the stand-in tells
        its own `scope()` (refused in a step, fine in an update function) from another
        strategy's ("Mixing different ..."), as TF does. (A function that captures this
        strategy is pickled anew on every call, never cached, so the record is that call's.)"""
        runs_in = "update" if self._updating else "replica" if self._running else None
        return (_rebuild_strategy, (self._id, type(self).__name__, self.num_replicas_in_sync,
                                    runs_in))

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed; create a new strategy")

    def _replicas_lock(self):
        """The lock for a call that talks to the replicas. A step running in this process (a
        OneDeviceStrategy's) does not take it: its run, on the driver's thread, holds it."""
        return contextlib.nullcontext() if replica_context.current() is not None else self._lock

    # -- running steps ----------------------------------------------------------------------
    def run(self, fn: Callable, args: tuple = (), kwargs: dict | None = None, *,
            steps: int = 1) -> Any:
        """Run `fn(*args, **kwargs)` once per replica, concurrently, each on its own worker.

        PerReplica arguments give each replica its component; other arguments go to every
        replica. An iterator of a distributed dataset as an argument stands for its next
        element (each replica's component). `steps=k` runs `fn` k times in this one call
        (TF's loop inside a `tf.function`), each step taking the next element of every
        iterator argument, and returns the last step's results. Returns `fn`'s structure
        with a PerReplica at each leaf (with one replica, the plain value, as TF's), a
        leaf that is None on every replica as None, and a variable as the variable itself.
        """
        self._check_open()
        if replica_context.current() is not None:
            raise RuntimeError("strategy.run cannot be called inside a step function")
        shipping.check_call(fn, args, kwargs)
        steps = checks.integer("steps", steps, 1, meaning="the number of steps this call runs")
        with phases.driving():  # the driver's part of the step: `driver` spans (phases.py)
            with self._lock:
                if self._running:
                    raise RuntimeError("strategy.run cannot be called inside merge_call: the "
                                       "replicas are waiting in this run's merge_call")
                self._running = True
                try:
                    events = self._run(fn, args, kwargs, int(steps))
                finally:
                    self._running = False
            self._emit_warnings(events)
            return self._regroup([e.value for e in events], "the step function's results",
                                 results=True)

    def _run(self, fn: Callable, args: tuple, kwargs: dict | None, steps: int = 1) -> list:
        """Start the step and answer its merge_calls until every replica is done."""
        self._check_open()
        n = self.num_replicas_in_sync
        (args, kwargs), moved = self._inputs.feed((tuple(args), kwargs or {}), steps)
        args_r = regroup.select_all(args, "args", n, self._id)
        kwargs_r = regroup.select_all(kwargs, "kwargs", n, self._id)
        run_id = next(self._run_ids)
        events = self.group.start_step(run_id, fn, args_r, kwargs_r, steps,
                                       self._inputs.forget())
        self._inputs.sent(moved, events)
        while True:
            kinds = {e.kind for e in events}
            if kinds == {"done"}:
                return events
            if kinds == {"merge"} and len({e.seq for e in events}) == 1:
                try:
                    values = self._merge(events)
                    events = self.group.resume(run_id, values, None)
                    self._inputs.sent(moved, events)
                except BaseException as error:  # release the waiting replicas, then raise
                    self._abort(run_id, events, error)
                    raise
                continue
            self._fail(run_id, events, pipelines=bool(moved))

    def _merge(self, events) -> list[Any]:
        """Call the merge_call function here; each replica's part of its result, packed
        (`shipping.pack`): one that cannot travel fails here, before any replica is sent
        anything, and one a replica cannot unpickle fails that replica's step."""
        fn = shipping.driver_object(events[0].value[0])
        args = self._regroup([e.value[1] for e in events], "merge_call args", constants=True)
        kwargs = self._regroup([e.value[2] for e in events], "merge_call kwargs", constants=True)
        with self.scope():
            result = fn(self, *args, **kwargs)
        what = f"the result of the merge_call function {_name(fn)}"
        return [shipping.pack(self._select(result, r, "the merge_call result"),
                              f"{what} for replica {r}") for r in range(len(events))]

    def _fail(self, run_id: int, events, pipelines: bool = False) -> None:
        failures.fail(self.group, run_id, events, pipelines)

    def _emit_warnings(self, events) -> None:
        failures.emit_warnings(events, stacklevel=4)

    def _abort(self, run_id: int, events, error: BaseException) -> None:
        failures.abort(self.group, run_id, events, error)

    # -- values -----------------------------------------------------------------------------------
    def _select(self, tree: Any, rank: int, what: str) -> Any:
        return regroup.select(tree, rank, what, self.num_replicas_in_sync, self._id)

    def _regroup(self, per_rank: list[Any], what: str, constants: bool = False,
                 results: bool = False) -> Any:
        return regroup.regroup(per_rank, what, constants, results)

    def experimental_distribute_values_from_function(self, value_fn: Callable) -> Any:
        """`value_fn(ValueContext)` for each replica, computed on the driver, regrouped as TF
        does: the structure it returns (dicts, lists, tuples, namedtuples keep their type) with
        a PerReplica at each leaf. Every replica's value must have the same structure."""
        if not callable(value_fn):
            raise TypeError(f"value_fn={value_fn!r} is not callable")
        n = self.num_replicas_in_sync
        values = [value_fn(ValueContext(r, n)) for r in range(n)]
        if n == 1 and not self._values_per_replica_with_one:
            return values[0]
        return regroup.regroup_leaves(values, "experimental_distribute_values_from_function's "
                                      "values")

    def experimental_distribute_dataset(self, dataset: Iterable[Any]) -> DistributedDataset:
        """Split each global batch of `dataset` across replicas (ceil-sized chunks, in order)."""
        return DistributedDataset(dataset, self.num_replicas_in_sync, DatasetPlacement(self))

    def distribute_datasets_from_function(
            self, dataset_fn: Callable[[InputContext], Iterable[Any]],
            options: InputOptions | None = None) -> DatasetsFromFunction:
        """Input pipelines made by `dataset_fn(input_context)`, called here on the driver, as
        TF's strategy calls it: once per worker (here: once, shared by the replicas, which take
        its consecutive batches in turn; once per replica for MultiWorkerMirroredStrategy,
        whose replicas each have a worker), or once per replica with
        `InputOptions(experimental_replication_mode=InputReplicationMode.PER_REPLICA)`. Each
        batch is one replica's (per-replica batch size: `input_context.
        get_per_replica_batch_size`). Iterating gives PerReplica batches for `strategy.run`;
        a replica whose input ran out gets an empty batch until every replica's has."""
        if options is not None and not isinstance(options, InputOptions):
            raise TypeError(f"options={options!r} must be None or an ld.InputOptions")
        self._check_open()
        per_replica = self._pipeline_per_replica or (
            options is not None and options.experimental_replication_mode
            is InputReplicationMode.PER_REPLICA)
        return DatasetsFromFunction(dataset_fn, self.num_replicas_in_sync, per_replica)

    def gather(self, value: Any, axis: int) -> Any:
        """Concatenate each replica's component of `value` (a PerReplica, a variable, or a
        structure of them) along `axis` into one host array, in replica order (TF's
        `Strategy.gather`). Components need rank >= 1 and equal shapes except along `axis`;
        a value that is not distributed is returned as it is."""
        if replica_context.current() is not None:
            raise cross_replica_error("gather")
        checks.integer("axis", axis, error=TypeError)

        def one(x):
            if not isinstance(x, PerReplica | Variable):
                return x
            return concat_along(
                [np.asarray(c) for c in self.experimental_local_results(x)], int(axis),
                "strategy.gather")

        return nest.map_structure(one, value)

    def experimental_local_results(self, value: Any) -> tuple:
        """One host value per replica: of a PerReplica (or a structure of them, Python
        numbers kept as they are, as in TF), of a variable's copies, or (value,)."""
        self._check_open()
        if isinstance(value, Variable):
            strategy = context.lookup(value.strategy_id)
            return tuple(strategy.extended.read_copies(
                value.id, range(strategy.num_replicas_in_sync)))
        if isinstance(value, PerReplica):
            return value.values
        leaves, _ = nest.flatten(value)
        if not any(isinstance(x, PerReplica) for x in leaves):
            return (value,)
        n = self.num_replicas_in_sync
        return tuple(regroup.select(value, r, "value", n, self._id, arrays=False)
                     for r in range(n))

    def reduce(self, reduce_op: ReduceOp | str, value: Any, axis: int | None = None) -> Any:
        """Reduce a per-replica value (or a structure of them) to one host value."""
        op = ReduceOp.parse(reduce_op, "reduce_op")
        checks.integer("axis", axis, optional=True, error=TypeError)
        if replica_context.current() is not None:
            raise cross_replica_error("reduce")
        n = self.num_replicas_in_sync

        def one(x):
            if isinstance(x, Variable):
                x = PerReplica(self.experimental_local_results(x))
            return reduce_value(op, x, axis, n)

        return nest.map_structure(one, value)

    # -- time -----------------------------------------------------------------------------
    def trace(self, path: str | os.PathLike) -> contextlib.AbstractContextManager[str]:
        """`with strategy.trace("trace.json"):` records every process's phases while the body
        runs and writes them as a Chrome trace: `ld.profile(path, strategy)`. The path is
        checked on entry, so one that cannot be written fails before any training."""
        self._check_open()
        return profile(path, self)

    # -- training (the seam with labdist.training) ------------------------------------------
    def train_model_steps(self, step: Callable, groups: list[list[tuple]],
                          first_iteration: int) -> Iterator[list[tuple[float, float, int]]]:
        """Train a model's `step` (a `training.steps.TrainStep`) on `groups` of global batches
        (x, y), numbering steps from `first_iteration` + 1; yields, group by group, each step's
        (loss sum, metric sums, samples). `model.fit` calls this where the replicas cannot run
        the loop themselves (`train_model_plan`); strategies differ in where the step runs.
        Here: one `run` per group, every replica on its shard of each batch (in quorum mode,
        each group a transaction over the replicas alive: quorum/training.py)."""
        if self.quorum is not None:
            yield from self.quorum.train(step, groups, first_iteration)
            return
        n = self.num_replicas_in_sync
        iteration = first_iteration
        for group in groups:
            shards = shard_group(group, n)
            out = self.run(step, args=(shards[0] if n == 1 else PerReplica(shards),
                                       [len(bx) for bx, _ in group], iteration))
            iteration += len(group)
            yield self.experimental_local_results(out)[0]

    @property
    def loops_on_replicas(self) -> bool:
        """Whether `train_model_plan` can hand the replicas a span of `fit`'s epoch to run on
        their own: mirrored replicas on worker processes, outside quorum training (each of
        its groups is a transaction the driver commits) and not parameter servers (their
        workers loop as scheduled functions)."""
        return (self.quorum is None and self.num_replicas_in_sync >= 2
                and self.group.runs_steps)

    def scatter_input(self, arrays: list[np.ndarray]) -> list[Any] | None:
        """`arrays` copied once to every replica's worker (`placed.ScatteredArray`), for `fit`
        on replicas that do not share the driver's /dev/shm; None where there are no worker
        processes to copy to, or the copy failed (the batches then travel as before)."""
        return self.group.scatter(arrays)

    def train_model_plan(self, step: Callable, plan: Any) -> tuple[Any, Any]:
        """Run a span of a model's epoch from one dispatch: `step(plan)` on every replica
        (a `training.steps.TrainStep` and its `EpochPlan`), which slice their own batches
        and loop over the span's groups without the driver. Returns replica 0's result (the
        rows of the steps taken, and their samples). Only where `loops_on_replicas`."""
        if not self.loops_on_replicas:
            raise RuntimeError(f"{self!r} does not run training loops on its replicas; "
                               "use train_model_steps")
        return self.experimental_local_results(self.run(step, args=(plan,)))[0]

    def refresh(self) -> bool:
        """Re-form on the cluster's workers if they changed (MultiWorkerMirroredStrategy);
        False: nothing to do. `fit` calls it before training."""
        return False

    def recover(self) -> bool:
        """After a lost worker: re-form the replicas on the workers present, each variable
        taking a surviving replica's copy. Returns False when nothing was lost."""
        with self._lock:
            if not self.group.lost_replicas():
                return False
            self._reform(self.num_replicas_in_sync)
            return True

    def _reform(self, num_replicas: int | None) -> None:
        group = self.group
        lost = set(group.lost_replicas())  # workers the scheduler no longer lists included
        alive = [r for r in range(group.num_replicas) if r not in lost]
        if not alive:
            raise ReplicaLostError("every replica was lost: nothing to carry over; restore "
                                   "from a checkpoint into a new strategy")
        values = {i: group.read(i, [alive[0]])[0] for i in self._variable_ids}
        new = group.reform(num_replicas)
        for var_id, host in values.items():
            new.create(var_id, host)
        self.replace_group(new)

    # -- quorum training (the component in `self.quorum`; plain strategies without it) -------
    @property
    def fault_tolerance(self) -> str:
        """"quorum" (training goes on among the replicas alive) or "none"."""
        return "none" if self.quorum is None else "quorum"

    def run_transaction(self, fn: Callable, args_for: Callable[[int], tuple],
                        step: int = 0) -> list[Any]:
        """Run `fn(*args_for(n))` once on each of the n replicas and return each replica's
        result, in replica order (a list, as `experimental_local_results` gives). For a step
        whose arguments depend on how many replicas share it (the lab's: a global batch
        split in n). In quorum mode the run is a transaction: joined workers are taken in
        first, and a replica lost meanwhile leaves the survivors to finish or redo it
        (`args_for` is called again with fewer), so the list is shorter; `step` is the step
        number membership changes report. Otherwise it is `run`."""
        self._check_open()
        if self.quorum is not None:
            return self.quorum.run_step(fn, args_for, step)
        with self._lock:
            out = self.run(fn, args=args_for(self.num_replicas_in_sync))
        return list(zip(*(self.experimental_local_results(o) for o in out), strict=True)) \
            if isinstance(out, tuple) else list(self.experimental_local_results(out))

    def add_local_replica(self) -> None:
        """Quorum mode on an embedded cluster: start one more worker, which becomes a replica
        at the next step boundary (with its copies from a live peer)."""
        self._check_open()
        if self.quorum is None:
            raise RuntimeError(f"{self!r} is not in quorum mode: only quorum training takes "
                               "in new replicas; use fault_tolerance='quorum'")
        self.quorum.add_local_worker()

    @property
    def membership_changes(self) -> list[MembershipChange]:
        """Quorum training's membership changes so far, oldest first (empty otherwise)."""
        return [] if self.quorum is None else list(self.quorum.changes)

    def add_membership_listener(self, fn: Callable[[MembershipChange], Any]
                                ) -> Callable[[], None]:
        """Call `fn(change)` (a `MembershipChange`) each time quorum training changes the
        replicas; returns the function that stops it. Without quorum mode nothing changes
        them, and `fn` is never called."""
        if not callable(fn):
            raise TypeError(f"fn={fn!r} is not allowed; use a callable")
        if self.quorum is None:
            return lambda: None
        return self.quorum.add_listener(fn)

    def _on_new_group(self) -> None:
        """Hook: the replicas were re-formed (recover, refresh, a quorum epoch); new replicas
        start with nothing but the variables, so a strategy sends them its modes here."""


def _name(fn: Any) -> str:
    """How an error names a function (a partial or callable object: its repr)."""
    qualname = getattr(fn, "__qualname__", None)
    return qualname if isinstance(qualname, str) else repr(fn)


def _rebuild_strategy(strategy_id: str, name: str, num_replicas: int,
                      runs_in: str | None = None) -> Any:
    """A pickled strategy: the strategy itself where it lives (the driver), else the stand-in
    a step function on a replica gets (`runs_in`: the context its own function that this
    one travels with runs in, None where it came with another strategy's)."""
    try:
        return context.lookup(strategy_id)
    except ValueError:
        return CapturedStrategy(name, num_replicas, runs_in)
