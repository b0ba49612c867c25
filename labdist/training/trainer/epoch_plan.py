"""A span of a `fit` epoch as the replicas run it on their own: `EpochPlan` says which
batches of the pass it holds, and each replica slices its shards of them from the placed x
and y (labdist/shm/placed.py) exactly as the driver would have (`Batches`, then `shard_bounds`):
the same global batches, in the same order, for the same seed. Runs on the replicas too, so
it imports nothing of the driver's."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from labdist.data.distributed import Batches, pass_order, shard_bounds
from labdist.shm import placed


@dataclass(frozen=True)
class EpochPlan:
    """What replicas need to run a span of a `fit` epoch on their own (steps.TrainStep with a
    plan): where x and y lie (placed), the pass's order key (`Batches.next_pass_key`), the
    global batch size, `steps_per_execution`, which batches of the pass this span covers,
    the step number before its first step, and the board (training/trainer/loop_board.py). A few
    hundred bytes however large the data: each replica slices its shards itself, exactly as
    `fit`'s driver slices them (`Batches`, then `shard_bounds`)."""

    x: tuple  # PlacedArray.source
    y: tuple
    samples: int
    key: tuple | None
    batch_size: int
    steps_per_execution: int
    first_batch: int
    batches: int  # in this span
    first_iteration: int
    board: str | None = None

    def groups(self) -> list[range]:
        """The span's groups of batch numbers (of the pass), `steps_per_execution` each."""
        end = self.first_batch + self.batches
        return [range(b, min(b + self.steps_per_execution, end))
                for b in range(self.first_batch, end, self.steps_per_execution)]

    def total(self, batch: int) -> int:
        """Samples in global batch `batch` (the last one may be short)."""
        return min(self.batch_size, self.samples - batch * self.batch_size)

    def shard(self, batch: int, rank: int, num_replicas: int) -> tuple[np.ndarray, np.ndarray]:
        """Replica `rank`'s rows (x, y) of global batch `batch`: the rows the driver would have
        sent (placed.rows of the same indices, a copy; in a pass in order, a read-only view
        of the placed rows instead: the step only reads them, and no copy is made)."""
        start = batch * self.batch_size
        bounds = shard_bounds(self.total(batch), num_replicas)
        if self.key is None:  # samples in order: the shard is a range of rows
            lo, hi = start + bounds[rank], start + bounds[rank + 1]
            return placed.view(self.x, lo, hi), placed.view(self.y, lo, hi)
        index = _order(self.samples, self.key)[start:start + self.batch_size]
        mine = index[bounds[rank]:bounds[rank + 1]]
        return placed.rows(self.x, mine), placed.rows(self.y, mine)


_orders: dict[tuple, np.ndarray] = {}  # (samples, key) -> the pass's order, one per process


def _order(samples: int, key: tuple | None) -> np.ndarray:
    """A pass's order, drawn once per process and pass (a plan per group reuses it)."""
    found = _orders.get((samples, key))
    if found is None:
        _orders.clear()
        found = _orders[(samples, key)] = pass_order(samples, key)
    return found


def epoch_plan(data: tuple, batches: Batches, steps_per_execution: int,
               first_iteration: int, board: str | None) -> EpochPlan | None:
    """The plan of the next pass of `batches` over all of it, where `data` is placed (else
    None: the batches travel from the driver). Starts the pass, as iterating would."""
    x, y = data
    if not (isinstance(x, placed.PlacedArray) and isinstance(y, placed.PlacedArray)):
        return None
    return EpochPlan(x.source, y.source, len(x), batches.next_pass_key(),
                     batches.global_batch_size, steps_per_execution, 0, len(batches),
                     first_iteration, board)
