"""The board between the driver and replicas that run a `fit` epoch on their own
(training/trainer/epoch_plan.py): a small file in /dev/shm that both map. The driver writes one
thing, a stop request (`model.stop_training` set while the epoch runs, or the driver interrupted);
replica 0 writes each group's figures as the group ends. Nobody waits on it: the replicas read the
stop request once a group and the driver polls the figures, so neither side's pace sets the other's.
Only used where the replicas read the driver's /dev/shm (placed input).

Layout, float64: [stop, groups written, ended, started, then one row per group: loss sum,
metric sums..., samples, steps].
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile

import numpy as np

from labdist.shm import janitor, placed

PREFIX = "labdist-board-"
HEAD = 4  # stop, groups written, ended, started


def _mapped(path: str, size: int) -> tuple[mmap.mmap, np.ndarray]:
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), size * 8, flags=mmap.MAP_SHARED,
                       prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return mm, np.frombuffer(mm, np.float64)


class Board:
    """The driver's side: made per `fit`, `reset` before each span, removed by `close`."""

    def __init__(self, groups: int, width: int):
        self.groups, self.width = int(groups), int(width) + 2  # + samples, steps
        size = HEAD + self.groups * self.width
        janitor.ensure(placed.SHM_DIR)  # removes the file if this process is killed
        fd, self.path = tempfile.mkstemp(prefix=placed.file_prefix(PREFIX + "fit"),
                                         dir=placed.SHM_DIR)
        try:
            os.ftruncate(fd, size * 8)
        finally:
            os.close(fd)
        self._mm, self._a = _mapped(self.path, size)

    def reset(self) -> None:
        """Before a span starts (no replica is writing): no stop, no groups."""
        self._a[:] = 0.0

    def request_stop(self) -> None:
        self._a[0] = 1.0

    def written(self) -> int:
        return int(self._a[1])

    def ended(self) -> bool:
        """Whether replica 0 ended the span (its last group and collective done)."""
        return bool(self._a[2])

    def started(self) -> bool:
        """Whether replica 0 began the span: a driver interrupted before it sent the span
        (■ while it prepared it) has nothing to wait for."""
        return bool(self._a[3])

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Groups [start, stop)'s rows (a copy), each written before the count said so."""
        return self._a[HEAD + start * self.width:HEAD + stop * self.width].reshape(
            -1, self.width).copy()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        self._a = None
        with contextlib.suppress(BufferError, ValueError):
            self._mm.close()  # a view still alive keeps the mapping until it goes


class ReplicaBoard:
    """A replica's side, for one span. A board the driver already removed (it was
    interrupted, or died) reads as a stop request: the replicas end at the next group."""

    def __init__(self, path: str | None, width: int, writer: bool):
        self._a = None
        self._writer = writer
        self._width = int(width) + 2
        self.gone = False
        if path is None:
            return
        try:
            size = os.path.getsize(path) // 8
            self._mm, self._a = _mapped(path, size)
        except (OSError, ValueError):
            self.gone = True
            return
        if writer:
            self._a[3] = 1.0  # replica 0 began the span

    def stop_requested(self) -> bool:
        if self._a is None:
            return self.gone
        return bool(self._a[0])

    def record(self, group: int, loss: float, sums, samples: float, steps: int) -> None:
        """Replica 0: group `group`'s figures (its sums over its steps), then the count."""
        if self._a is None or not self._writer:
            return
        at = HEAD + group * self._width
        if at + self._width > len(self._a):
            return
        row = self._a[at:at + self._width]
        row[0] = loss
        row[1:-2] = sums
        row[-2], row[-1] = samples, steps
        self._a[1] = group + 1

    def end(self) -> None:
        """Replica 0: the span is over (every replica ends it in the same collective)."""
        if self._a is not None and self._writer:
            self._a[2] = 1.0

    def close(self) -> None:
        if self._a is not None:
            self._a = None
            with contextlib.suppress(BufferError, ValueError):
                self._mm.close()
