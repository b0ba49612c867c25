"""A replica's input from a `distribute_datasets_from_function` pipeline that lives on its
worker (labdist/data/pipelines.py has the rules; data/feeds.py moves the pipelines)."""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Iterator
from typing import Any

import numpy as np

from labdist.data.distributed import Feed, input_ended
from labdist.data.pipelines import END, chunk_for, empty_like
from labdist.replica import replica_context as context


class _Position:
    """A pipeline's iterator on a replica, and what the replica has learnt from it."""

    __slots__ = ("iterator", "taken", "template")

    def __init__(self, iterator: Iterator[Any]):
        self.iterator, self.taken, self.template = iterator, 0, None


class PipelineFeed(Feed):
    """A replica's input from a pipeline that lives on its worker under `key`. The driver sends
    the pipeline (pickled once there) until the replica has used it, then None; a pipeline
    already here is never replaced (its position is kept).

    `shared`: every replica holds a copy of the one pipeline and keeps batch k*N + rank of step
    k. Otherwise the pipeline is this replica's own; `lengths` (each replica's declared
    `len()`, or None) tell how long the others run, else one all-reduce per step does."""

    __slots__ = ("drop", "key", "lengths", "num_replicas", "pipeline", "rank", "shared")

    def __init__(self, key: str, pipeline: bytes | None, rank: int, num_replicas: int,
                 shared: bool, lengths: list[int] | None, drop: bool):
        self.key, self.pipeline, self.rank = key, pipeline, rank
        self.num_replicas, self.shared, self.lengths, self.drop = \
            num_replicas, shared, lengths, drop

    def take(self, step, steps, feeds):
        position = feeds.get(self.key)
        if position is None:
            if self.pipeline is None:
                raise RuntimeError(f"this replica does not hold input pipeline {self.key}; "
                                   "the driver sends it again with the next call")
            position = feeds[self.key] = _Position(iter(pickle.loads(self.pipeline)))
        n = self.num_replicas
        if self.shared and hasattr(position.iterator, "skip") and \
                hasattr(position.iterator, "empty"):
            batch = self._skipping(position)
        elif self.shared:
            chunk = list(itertools.islice(position.iterator, n))
            batch = chunk_for(chunk, self.rank, n, self.drop)
        else:
            batch = self._own(position)
        if batch is END:
            raise input_ended(step, steps)
        position.taken += 1
        return batch

    def _skipping(self, position: _Position) -> Any:
        """The shared pipeline's step, making only this replica's batch (`ld.batches`)."""
        n, rank, iterator = self.num_replicas, self.rank, position.iterator
        before = iterator.skip(rank)
        mine = next(iterator, END) if before == rank else END
        after = iterator.skip(n - rank - 1) if mine is not END else 0
        count = before + (mine is not END) + after
        if count == 0 or (self.drop and count < n):
            return END
        return iterator.empty() if mine is END else mine

    def _own(self, position: _Position) -> Any:
        batch = next(position.iterator, END)
        has = batch is not END
        if has and position.template is None:
            position.template = batch
        if self.lengths is not None:
            live = sum(length > position.taken for length in self.lengths)
        else:
            live = int(context.current().all_reduce("SUM", np.int32(has)))
        if live == 0 or (self.drop and live < self.num_replicas):
            return END
        if has:
            return batch
        if position.template is None:
            raise ValueError(f"distribute_datasets_from_function: replica {self.rank}'s input "
                             "pipeline has no batch at all while others still have some; "
                             "its empty batch is made from its own earlier batches, so each "
                             "pipeline needs at least one")
        return empty_like(position.template, "distribute_datasets_from_function")
