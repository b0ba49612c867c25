"""A distributed dataset's arrays placed once where the replicas run (labdist/shm/placed.py), so
that a custom loop's batches travel as row indices: `for x, y in dist_dataset:
strategy.run(step, args=(x, y))` sends a few hundred bytes per replica and step instead of
its rows, and the driver no longer pickles and sends them while the replicas wait.

Only a dataset of `labdist.batches(...)` over numeric arrays is placed, only by mirrored
replicas on worker processes that all read the driver's /dev/shm (checked once per replica
group), and the copy is taken when the distributed dataset is first iterated: like tf.data,
which copies the arrays into the dataset, a later change to the arrays does not show. The
driver's elements are read from that copy too (read-only), so what a replica gets is what
the driver shows. The files go when the distributed dataset and its elements are garbage
collected, or with the driver (its janitor process removes them even after `kill -9`).
LABDIST_PLACE_INPUT=0 turns placement off."""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from labdist.errors import ReplicaLostError
from labdist.shm import janitor as shm_janitor
from labdist.shm import placed


def readable(strategy: Any, arrays: list) -> bool | None:
    """Whether every replica reads the placed `arrays` where it runs; None when a replica is
    gone (the caller decides what that means)."""
    try:
        return all(strategy.experimental_local_results(
            strategy.run(placed.readable, args=(placed.probe(arrays),))))
    except ReplicaLostError:
        return None


class DatasetPlacement:
    """One distributed dataset's placed copy of its arrays, and the replica group known to
    read it. `sources` is asked at every pass; it places once and probes once per group."""

    def __init__(self, strategy: Any):
        self._strategy = weakref.ref(strategy)
        self._placed: list[placed.PlacedArray] | None = None
        self._group: Any = None  # the replica group that was found to read the copy
        self._refused = False  # placing or reading failed once: this dataset stays unplaced

    def sources(self, arrays: list[Any]) -> list[tuple] | None:
        """The placed copies of `arrays` (their `source`s), or None: the batches travel as
        rows, as before."""
        strategy = self._strategy()
        if (self._refused or strategy is None or strategy.closed
                or not strategy.loops_on_replicas or not placed.enabled()):
            return None
        if not all(isinstance(a, np.ndarray) and not a.dtype.hasobject for a in arrays):
            return None  # placed arrays themselves, or objects: nothing to map
        if self._placed is None:
            shm_janitor.ensure(placed.SHM_DIR)  # removes the files if this process is killed
            self._placed = placed.place(arrays)
            if self._placed is None:
                self._refused = True
                return None
            weakref.finalize(self, placed.close_all, self._placed)
        group = strategy.group
        if self._group is not group:
            try:
                ok = readable(strategy, self._placed)
            except RuntimeError:  # iterated inside merge_call: no probe now, ask next pass
                return None
            if not ok:
                self._refused = True
                placed.close_all(self._placed)
                return None
            self._group = group
        return [p.source for p in self._placed]
