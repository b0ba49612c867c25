"""The replica context: what `ld.get_replica_context()` returns inside `strategy.run`.

It lives with the replica (on its worker) and is found through a thread-local, so variable
handles inside a step function resolve to this replica's copies.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from labdist import aggregation, checks, nest
from labdist.collectives import all_gather, all_reduce
from labdist.collectives.algorithms import gather_segments, reduce_scatter_apply
from labdist.collectives.compressed import compressed_sum
from labdist.enums import ReduceOp, VariableAggregation
from labdist.values import concat_along

_local = threading.local()


def current() -> ReplicaContext | None:
    """The replica context of this thread, or None on the driver / outside a step."""
    return getattr(_local, "ctx", None)


def current_replica() -> Any:
    """The replica (a `ReplicaCore`) whose step runs on this thread: its copies, its
    communicator, its rank. For labdist's own step functions that work on the replica as a
    whole (quorum's healing copy, tests' fingerprints), never the user's: they get the
    context's public methods."""
    ctx = current()
    if ctx is None:
        raise RuntimeError("current_replica() is for step functions: no step runs here")
    return ctx._replica


class _Entered:
    def __init__(self, ctx: ReplicaContext | None):
        self.ctx = ctx
        self.prev: ReplicaContext | None = None

    def __enter__(self):
        self.prev = current()
        _local.ctx = self.ctx
        return self.ctx

    def __exit__(self, *exc):
        _local.ctx = self.prev


def enter(ctx: ReplicaContext | None) -> _Entered:
    return _Entered(ctx)


class ReplicaContext:
    """One replica's view during one `strategy.run` (or `extended.update`) call.

    mode "replica": a step function; variable updates aggregate across replicas.
    mode "update": `extended.update`; updates write this replica's copy only.
    """

    def __init__(self, replica, run_id: int, mode: str = "replica", merge_handler=None,
                 strategy: Any = None):
        self._replica = replica
        self._run_id = run_id
        self._mode = mode
        self._strategy = strategy  # the strategy itself where its replica is this process
        self._seq = 0
        self._merge_handler = merge_handler
        self.warnings: list[tuple[str, type]] = []
        if mode == "replica":  # the collectives' warnings (a full /dev/shm) join this step's
            replica.comm.endpoint.warnings = self.warnings

    @property
    def replica_id_in_sync_group(self) -> int:
        return self._replica.rank

    @property
    def num_replicas_in_sync(self) -> int:
        return self._replica.world

    @property
    def strategy(self) -> Any:
        """TF's `ctx.strategy` (and `ld.get_strategy()` in a step): the running strategy, as
        a step sees it. In the driver's process (OneDeviceStrategy, the default strategy)
        the strategy itself; on a worker a stand-in answering `num_replicas_in_sync` that
        refuses the cross-replica calls with TF's error (the one object all step long)."""
        if self._strategy is None:
            from labdist.replica.captured_strategy import CapturedStrategy

            self._strategy = CapturedStrategy("the running strategy", self.num_replicas_in_sync,
                                              self._mode)
        return self._strategy

    @property
    def xp(self):
        """The array module of this replica (numpy, cupy, or the strict double)."""
        return self._replica.backend.xp

    def all_reduce(self, reduce_op: ReduceOp | str, value: Any) -> Any:
        """Reduce `value` (a nested structure of arrays/scalars) across replicas, leaf by leaf."""
        op = ReduceOp.parse(reduce_op, "reduce_op")
        leaves, treedef = nest.flatten(value)
        backend = self._replica.backend
        arrays = [self._as_array(v) for v in leaves]
        what = f"all_reduce({op.name}) of {nest.describe(treedef)}"
        for i, (leaf, array) in enumerate(zip(leaves, arrays, strict=True)):
            aggregation.check_numeric(leaf, array.dtype, f"{what}, leaf {i}")
        reduced = all_reduce(self._replica.comm, self.next_seq(), what, arrays, op, backend)
        return nest.unflatten(treedef, reduced)

    def all_gather(self, value: Any, axis: int) -> Any:
        """Every replica's `value` (a nested structure of arrays) concatenated along `axis`,
        in replica order, on every replica (TF's `ReplicaContext.all_gather`). Travels through
        the host: meant for small values (predictions, labels, metrics)."""
        checks.integer("axis", axis, error=TypeError)
        leaves, treedef = nest.flatten(value)
        backend = self._replica.backend
        host = [np.asarray(backend.to_host(self._as_array(v))) for v in leaves]
        parts = self.all_gather_object(f"all_gather of {nest.describe(treedef)}", host)
        gathered = [concat_along([p[i] for p in parts], int(axis), "ctx.all_gather")
                    for i in range(len(host))]
        return nest.unflatten(treedef, [backend.to_device(g) for g in gathered])

    def merge_call(self, merge_fn, args: tuple = (), kwargs: dict | None = None) -> Any:
        """Run `merge_fn(strategy, *args)` once, on the driver, with every replica's args
        gathered into PerReplica values; each replica gets the result (its own component of a
        PerReplica result)."""
        seq = self.next_seq()
        if self._merge_handler is not None:
            return self._merge_handler(merge_fn, args, kwargs or {})
        return self._replica.merge(seq, merge_fn, args, kwargs or {})

    def __repr__(self) -> str:
        return (
            f"ReplicaContext(replica_id_in_sync_group={self.replica_id_in_sync_group}, "
            f"num_replicas_in_sync={self.num_replicas_in_sync})"
        )

    # -- the replica-step API (variables.py, training's steps) ----------------------------
    @property
    def backend(self):
        """This replica's array backend (numpy host replica, cupy device replica, ...)."""
        return self._replica.backend

    @property
    def mode(self) -> str:
        """"replica" inside strategy.run, "update" inside extended.update."""
        return self._mode

    def local_copy(self, variable) -> Any:
        """This replica's copy of `variable` itself (not a snapshot): in-place writes to it
        change the replica's value, which is how optimizer steps update weights."""
        return self._replica.copy_of(variable.id, variable.name)

    def apply_update(self, variable, mode: str, value: Any, read_value: bool) -> Any:
        """`variable.assign*` inside a step: written into this replica's copy by the
        variable's synchronization and aggregation. Parameter-server workers override this
        to push to the variable's parameter server instead."""
        result = variable.replica_update(self, mode, value)
        return result if read_value else None

    def is_diverged(self, variable) -> bool:
        """Whether `variable`'s copies were found to differ (ON_WRITE + aggregation NONE)."""
        return variable.id in self._replica.diverged

    def mark_diverged(self, variable) -> None:
        self._replica.diverged.add(variable.id)

    def next_seq(self) -> int:
        """The number of this replica's next collective in the step (the same on every
        replica that takes the same path)."""
        self._seq += 1
        return self._seq

    def _as_array(self, v: Any) -> Any:
        backend = self._replica.backend
        if backend.is_array(v):
            return v
        if isinstance(v, np.ndarray) and backend.is_device:
            raise TypeError(
                "a host numpy array reached a collective on a device replica; "
                "move it with ctx.xp.asarray(x) first"
            )
        return backend.to_device(v)

    def reduce_arrays(self, what: str, arrays: list[Any], op: ReduceOp | VariableAggregation
                      ) -> list[Any]:
        """All-reduce arrays of this replica's backend (variables' ON_WRITE updates)."""
        return all_reduce(
            self._replica.comm, self.next_seq(), what, arrays, op, self._replica.backend
        )

    def reduce_apply(self, what: str, arrays: list[Any], targets: list[Any], apply,
                     gradients: int = 0) -> bool:
        """Summed gradients applied segment by segment (collectives.reduce_scatter_apply).
        The first `gradients` arrays are gradients: they go through this replica's compressor
        (with its error feedback) when one is set, the rest travel as they are."""
        comm = self._replica.comm
        if gradients and comm.compression.active(what):
            summed, extras = compressed_sum(comm, self.next_seq(), what, arrays[:gradients],
                                            comm.compression, self._replica.backend,
                                            arrays[gradients:])
            for i, s in enumerate([*summed, *extras]):
                apply(i, 0, s.size, s.reshape(-1))
            return False
        return reduce_scatter_apply(self._replica.comm, self.next_seq(), what, arrays, targets,
                                    apply, self._replica.backend)

    def persistent_buffer(self, key: Any, n: int, dtype: Any) -> Any:
        """A flat array of `n` `dtype` elements on this replica's device, the same one each
        time `key` asks (its contents are the caller's): buffers a training step reuses every
        step instead of allocating them."""
        return self._replica.comm.persistent(key, n, dtype, self.xp)

    def background(self):
        """A thread of this replica's own (an executor: one task at a time, in order) for
        collectives that overlap its computation; the step thread makes none meanwhile."""
        return self._replica.comm.background()

    @property
    def compression(self):
        """The compressor of this replica's gradient all-reduce (None: plain)."""
        return self._replica.comm.compression.compressor

    @property
    def local_sgd(self):
        """This replica's local-SGD / DiLoCo settings (None: synchronise every step)."""
        return self._replica.communication.local_sgd

    @property
    def communication(self):
        """This replica's communication modes and their counters
        (replica/communication_state.py)."""
        return self._replica.communication

    @property
    def bytes_sent(self) -> int:
        """Array bytes this replica has sent to its peers so far, every collective."""
        return self._replica.comm.sent_bytes

    def gather_segments(self, what: str, arrays: list[Any]) -> None:
        """Make arrays that each rank updated only in its own segment whole again."""
        gather_segments(self._replica.comm, self.next_seq(), what, arrays)

    def all_gather_object(self, what: str, obj: Any) -> list[Any]:
        """Every replica's small host object, in rank order."""
        return all_gather(self._replica.comm, self.next_seq(), what, obj)

    def warn(self, message: str, category: type) -> None:
        """A warning raised on the driver when the step returns (once per message)."""
        self.warnings.append((message, category))
