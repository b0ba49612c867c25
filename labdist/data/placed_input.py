"""`fit(x, y)`'s data placed once where the replicas run (labdist/shm/placed.py), so that each
step sends row indices instead of rows: the driver no longer pickles and sends every group's
batches, and the replicas no longer wait for them. The batches, their order and their shards
are exactly those of unplaced data (the same `Batches`, holding placed arrays).

Placed data also lets the replicas run the loop: an `EpochPlan` (training/trainer/epoch_plan.py)
tells them which batches a span of the epoch holds, and each slices its own shards from it.

The copies in /dev/shm outlive the `fit` that made them while x lives: `fit` called again on
the same arrays (a notebook's "a few more epochs") takes them again once a compare has shown
that x and y still hold what was copied (comparing costs about a sixth of copying again)."""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np

from labdist.data import dataset_placement
from labdist.shm import janitor, placed


@contextlib.contextmanager
def placed_arrays(strategy: Any, x: np.ndarray, y: np.ndarray) -> Iterator[tuple[Any, Any]]:
    """(x, y) as placed arrays while the block runs, where the strategy's mirrored replicas
    all read the driver's /dev/shm; else scattered to their workers' memory (other hosts);
    else (x, y) as given. Scattered copies go when the block ends; files in /dev/shm are kept
    for the next `fit` on the same arrays while x lives (module doc)."""
    if not strategy.group.runs_steps or strategy.num_replicas_in_sync < 2:
        yield x, y  # in-process replicas, or parameter servers (their own input path)
        return
    if not placed.enabled():
        yield x, y
        return
    janitor.ensure(placed.SHM_DIR)  # removes the files if this process is killed
    for in_shm in (True, False):  # one host, else Dask's scatter
        arrays = KEPT.take([x, y]) if in_shm else strategy.scatter_input([x, y])
        if arrays is None:
            continue
        readable = None
        try:
            readable = dataset_placement.readable(strategy, arrays)
            if readable:
                yield arrays[0], arrays[1]
                return
        finally:
            if in_shm:
                KEPT.give_back(arrays, keep=bool(readable))
            else:
                placed.close_all(arrays)  # scattered copies go with the fit
        if readable is None:
            break
    yield x, y  # neither (or a replica is gone)


class Kept:
    """The placed copies of the last `fit`'s x and y, kept for the next `fit` on the same
    arrays while the first of them lives. A copy a running `fit` uses is closed only once
    that `fit` gives it back (two fits may run at once, from two threads)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._key: list | None = None  # the kept arrays' layouts (address, shape, ...)
        self._arrays: list | None = None
        self._users: dict[int, int] = {}  # id(placed arrays) -> fits using them

    def take(self, arrays: list[np.ndarray]) -> list[placed.PlacedArray] | None:
        """Placed copies of `arrays`, in use until `give_back`: the kept ones when they hold
        these very arrays' bytes, else new ones (kept instead of the old)."""
        key = [_layout(a) for a in arrays]
        with self._lock:
            kept = self._arrays
            if kept is not None and self._key == key and all(
                    same(a, placed.view(p.source, 0, len(p)))
                    for a, p in zip(arrays, kept, strict=True)):
                self._users[id(kept)] = self._users.get(id(kept), 0) + 1
                return kept
            self._drop()
            new = placed.place(arrays)
            if new is None:
                return None
            self._key, self._arrays = key, new
            self._users[id(new)] = 1
        root = arrays[0]
        while isinstance(root.base, np.ndarray):
            root = root.base
        weakref.finalize(root, self._forget, new)  # x gone: nobody can pass it again
        return new

    def give_back(self, arrays: list, keep: bool) -> None:
        """A `fit` is done with `arrays`; `keep=False`: not worth keeping (unreadable)."""
        with self._lock:
            left = self._users.pop(id(arrays), 1) - 1
            if left:
                self._users[id(arrays)] = left
            if not keep and self._arrays is arrays:
                self._key = self._arrays = None
            if not left and self._arrays is not arrays:
                placed.close_all(arrays)

    def _forget(self, arrays: list) -> None:
        with self._lock:
            if self._arrays is arrays:
                self._drop()

    def _drop(self) -> None:
        """Stop keeping the current copies (closed now, or when their last fit ends)."""
        old, self._key, self._arrays = self._arrays, None, None
        if old is not None and id(old) not in self._users:
            placed.close_all(old)


KEPT = Kept()


def _layout(a: np.ndarray) -> tuple:
    return a.__array_interface__["data"][0], a.shape, a.strides, a.dtype.str


def same(a: np.ndarray, b: np.ndarray, block: int = 1 << 18) -> bool:
    """Whether `a` and `b` (same shape and dtype, `b` contiguous) hold the same bytes:
    compared a block at a time, so no temporary as large as the arrays is made."""
    a, b = np.ascontiguousarray(a).reshape(-1), b.reshape(-1)
    if a.nbytes % 8 == 0:  # compared as 8-byte words: the bytes, whatever the dtype
        a, b = a.view(np.uint64), b.view(np.uint64)
    else:
        a, b = a.view(np.uint8), b.view(np.uint8)
    equal = np.empty(min(block, len(a)), bool)
    for i in range(0, len(a), block):
        n = min(block, len(a) - i)
        if not np.equal(a[i:i + n], b[i:i + n], out=equal[:n]).all():
            return False
    return True
