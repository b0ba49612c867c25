"""The replica context: what `ld.get_replica_context()` returns inside `strategy.run`.

It lives with the replica (on its worker) and is found through a thread-local, so variable
handles inside a step function resolve to this replica's copies.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from labdist import nest
from labdist.collectives import all_gather, all_reduce
from labdist.collectives.algorithms import gather_segments, reduce_scatter_apply
from labdist.enums import ReduceOp, VariableAggregation

_local = threading.local()


def current() -> ReplicaContext | None:
    """The replica context of this thread, or None on the driver / outside a step."""
    return getattr(_local, "ctx", None)


class _Entered:
    def __init__(self, ctx: ReplicaContext | None):
        self.ctx = ctx

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

    def __init__(self, replica, run_id: int, mode: str = "replica", merge_handler=None):
        self._replica = replica
        self._run_id = run_id
        self._mode = mode
        self._seq = 0
        self._merge_handler = merge_handler
        self.warnings: list[tuple[str, type]] = []

    @property
    def replica_id_in_sync_group(self) -> int:
        return self._replica.rank

    @property
    def num_replicas_in_sync(self) -> int:
        return self._replica.world

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
        reduced = all_reduce(self._replica.comm, self._next_seq(), what, arrays, op, backend)
        return nest.unflatten(treedef, reduced)

    def merge_call(self, merge_fn, args: tuple = (), kwargs: dict | None = None) -> Any:
        """Run `merge_fn(strategy, *args)` once, on the driver, with every replica's args
        gathered into PerReplica values; each replica gets the result (its own component of a
        PerReplica result)."""
        seq = self._next_seq()
        if self._merge_handler is not None:
            return self._merge_handler(merge_fn, args, kwargs or {})
        return self._replica.merge(seq, merge_fn, args, kwargs or {})

    def __repr__(self) -> str:
        return (
            f"ReplicaContext(replica_id_in_sync_group={self.replica_id_in_sync_group}, "
            f"num_replicas_in_sync={self.num_replicas_in_sync})"
        )

    # -- for variables.py --------------------------------------------------------------------
    def _next_seq(self) -> int:
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

    def _reduce_arrays(self, what: str, arrays: list[Any], op: ReduceOp | VariableAggregation
                       ) -> list[Any]:
        return all_reduce(
            self._replica.comm, self._next_seq(), what, arrays, op, self._replica.backend
        )

    def _reduce_apply(self, what: str, arrays: list[Any], targets: list[Any], apply) -> bool:
        """Summed gradients applied segment by segment (collectives.reduce_scatter_apply)."""
        return reduce_scatter_apply(self._replica.comm, self._next_seq(), what, arrays, targets,
                                    apply, self._replica.backend)

    def _gather_segments(self, what: str, arrays: list[Any]) -> None:
        gather_segments(self._replica.comm, self._next_seq(), what, arrays)

    def _gather(self, what: str, obj: Any) -> list[Any]:
        return all_gather(self._replica.comm, self._next_seq(), what, obj)

    def _warn(self, message: str, category: type) -> None:
        self.warnings.append((message, category))
