"""Distributed values seen from the driver: `PerReplica` holds one component per replica;
`Mirrored`, one whose components are all the same value."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np


class PerReplica:
    """One value per replica, in replica order (what `strategy.run` returns, and takes)."""

    __slots__ = ("values",)

    def __init__(self, values: Iterable[Any]):
        self.values = tuple(values)

    def __len__(self) -> int:
        return len(self.values)

    def __iter__(self):
        return iter(self.values)

    def __getitem__(self, replica_id: int) -> Any:
        return self.values[replica_id]

    def __repr__(self) -> str:
        inner = ",\n ".join(f"{i}: {v!r}" for i, v in enumerate(self.values))
        return f"{type(self).__name__}:{{\n {inner}\n}}"


class Mirrored(PerReplica):
    """The same value on every replica (TF's `Mirrored`): what `extended.reduce_to` gives for
    a variable or per-replica destination. It goes wherever a PerReplica goes (`run`,
    `extended.update`, a merge_call result: each replica its component, which is that
    value); its components are one host value, not copies of it."""

    __slots__ = ()


class ValueContext:
    """What `experimental_distribute_values_from_function` passes to its function."""

    def __init__(self, replica_id_in_sync_group: int, num_replicas_in_sync: int):
        self.replica_id_in_sync_group = replica_id_in_sync_group
        self.num_replicas_in_sync = num_replicas_in_sync

    def __repr__(self) -> str:
        return (
            f"ValueContext(replica_id_in_sync_group={self.replica_id_in_sync_group}, "
            f"num_replicas_in_sync={self.num_replicas_in_sync})"
        )


def concat_along(parts: list, axis: int, what: str) -> Any:
    """`parts` (one per replica) concatenated along `axis`, with errors that name the replica
    and the shapes; shared by `Strategy.gather` and `ReplicaContext.all_gather`."""
    rank = parts[0].ndim
    if rank == 0:
        raise ValueError(f"{what}: the values are scalars (rank 0); gathering needs rank >= 1 "
                         "(concatenate along an axis)")
    if not 0 <= axis < rank:
        raise ValueError(f"{what}: axis={axis} is out of range for values of rank {rank}; "
                         f"allowed: 0..{rank - 1}")
    for r, p in enumerate(parts):
        if p.ndim != rank or p.shape[:axis] + p.shape[axis + 1:] != \
                parts[0].shape[:axis] + parts[0].shape[axis + 1:]:
            raise ValueError(
                f"{what}: replica {r}'s value has shape {p.shape}, replica 0's "
                f"{parts[0].shape}; they must match except along axis={axis}")
    return np.concatenate(parts, axis=axis)
