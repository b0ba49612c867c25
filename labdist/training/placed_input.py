"""`fit(x, y)`'s data placed once where the replicas run (labdist/placed.py), so that each
step sends row indices instead of rows: the driver no longer pickles and sends every group's
batches, and the replicas no longer wait for them. The batches, their order and their shards
are exactly those of unplaced data (the same `Batches`, holding placed arrays).

Placed data also lets the replicas run the loop: an `EpochPlan` (training/epoch_plan.py) tells
them which batches a span of the epoch holds, and each slices its own shards from it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from labdist import placed
from labdist.collectives.transports import shm_janitor
from labdist.strategies import dataset_placement
from labdist.strategies.base import Strategy


@contextlib.contextmanager
def placed_arrays(strategy: Any, x: np.ndarray, y: np.ndarray) -> Iterator[tuple[Any, Any]]:
    """(x, y) as placed arrays while the block runs, where the strategy's mirrored replicas
    all read the driver's /dev/shm; else scattered to their workers' memory (other hosts);
    else (x, y) as given. The files and copies go when the block ends."""
    if (type(strategy).train_model_steps is not Strategy.train_model_steps
            or strategy.num_replicas_in_sync < 2):
        yield x, y  # in-process replicas, or parameter servers (their own input path)
        return
    if not placed.enabled():
        yield x, y
        return
    shm_janitor.ensure(placed.SHM_DIR)  # removes the files if this process is killed
    for place in (placed.place, strategy.scatter_input):  # one host, else Dask's scatter
        arrays = place([x, y])
        if arrays is None:
            continue
        try:
            readable = dataset_placement.readable(strategy, arrays)
            if readable:
                yield arrays[0], arrays[1]
                return
        finally:
            for a in arrays:
                a.close()
        if readable is None:
            break
    yield x, y  # neither (or a replica is gone)
