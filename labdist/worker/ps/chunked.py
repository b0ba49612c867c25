"""One variable on a parameter server: its value in chunks, each chunk with version stamps.

Updates are applied chunk by chunk. Without locking they work in place, so concurrent updates
interleave and a read (which never takes a lock) can see an update half applied: a *torn read*.
The stamps make that visible instead of silent: every chunk counts the updates that started and
finished on it, and a read compares the stamps it saw before and after copying.
With locking, updates to one variable run one at a time and each is built on a copy that is
published whole, so a read (still lock-free) sees the value before or after an update, never
in between.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

# kernel(flat_target, lo, hi, step): apply one update to elements [lo, hi) of the flat value
Kernel = Callable[[np.ndarray, int, int, int], None]


class ChunkedValue:
    """The authoritative copy of one variable, split in chunks of `chunk_size` elements."""

    def __init__(self, host: np.ndarray, chunk_size: int):
        data = np.array(host, copy=True, order="C")
        n = data.size
        self.bounds = [(lo, min(lo + chunk_size, n)) for lo in range(0, max(n, 1), chunk_size)]
        # (data, stamps): stamps[2k] = updates started on chunk k, stamps[2k + 1] = finished.
        # One attribute, so a reader takes both from the same publication.
        self._snap: tuple[np.ndarray, list[int]] = (data, [0] * (2 * len(self.bounds)))
        self._meta = threading.Lock()  # writers' bookkeeping only; readers never take it
        self._write_lock = threading.Lock()  # use_locking: one update at a time
        self.in_flight = 0
        self.started = 0  # updates begun: the optimizer's step count for this variable
        self.completed = 0  # updates finished

    @property
    def shape(self) -> tuple[int, ...]:
        return self._snap[0].shape

    @property
    def size(self) -> int:
        return self._snap[0].size

    @property
    def dtype(self) -> np.dtype:
        return self._snap[0].dtype

    @property
    def num_chunks(self) -> int:
        return len(self.bounds)

    def array(self) -> np.ndarray:
        """The live array (for optimizer slots, which only the variable's updates touch)."""
        return self._snap[0]

    # -- reads: never a lock ----------------------------------------------------------------
    def read(self) -> tuple[np.ndarray, int, bool]:
        """(a copy of the value, updates whole in it, whether the copy may be torn).

        tuple(list) is one C call under the GIL, so each stamp snapshot is consistent; the copy
        between them may overlap a writer, which then shows in the stamps."""
        data, stamps = self._snap
        before = tuple(stamps)
        value = data.copy()
        after = tuple(stamps)
        started, finished = before[0::2], before[1::2]
        torn = before != after or started != finished or min(finished) != max(finished)
        return value, min(finished), torn

    # -- updates ----------------------------------------------------------------------------
    def update(self, kernel: Kernel, locking: bool, delay: float = 0.0) -> tuple[bool, int]:
        """Apply `kernel` to every chunk in order (sleeping `delay` between chunks, a test and
        lab knob). Returns (whether another update of this variable was in flight when this
        one began — they interleaved, how many updates had finished when it began — with
        locking, once it held the lock: the staleness of a gradient is measured from it)."""
        if locking:
            with self._write_lock:
                return self._copy_on_write(kernel, delay)
        return self._in_place(kernel, delay)

    def _begin(self) -> tuple[bool, int, int]:
        with self._meta:
            self.in_flight += 1
            self.started += 1
            return self.in_flight > 1, self.completed, self.started

    def _end(self) -> None:
        with self._meta:
            self.in_flight -= 1
            self.completed += 1

    def _in_place(self, kernel: Kernel, delay: float) -> tuple[bool, int]:
        data, stamps = self._snap
        flat = data.reshape(-1)
        overlapped, prior, step = self._begin()
        last = len(self.bounds) - 1
        try:
            for k, (lo, hi) in enumerate(self.bounds):
                with self._meta:
                    stamps[2 * k] += 1
                try:
                    kernel(flat, lo, hi, step)
                finally:
                    with self._meta:
                        stamps[2 * k + 1] += 1
                if delay and k < last:
                    time.sleep(delay)
        finally:
            self._end()
        return overlapped, prior

    def _copy_on_write(self, kernel: Kernel, delay: float) -> tuple[bool, int]:
        overlapped, prior, step = self._begin()
        data, stamps = self._snap
        new = data.copy()
        flat = new.reshape(-1)
        last = len(self.bounds) - 1
        try:
            for k, (lo, hi) in enumerate(self.bounds):
                kernel(flat, lo, hi, step)
                if delay and k < last:
                    time.sleep(delay)
            version = max(stamps[1::2]) + 1
            self._snap = (new, [version] * len(stamps))  # published whole
        finally:
            self._end()
        return overlapped, prior


def make_kernel(kind: str, source: np.ndarray, optimizer=None,
                slots: dict[str, np.ndarray] | None = None, step: int | None = None) -> Kernel:
    """The chunk kernel of an update: assign / assign_add / assign_sub of `source`, or the
    optimizer's rule with gradient `source` (slots updated in place, chunk by chunk). `step`
    overrides the variable's own update count (sync mode: the global step)."""
    src = np.ascontiguousarray(source).reshape(-1)
    if kind == "assign":
        def kernel(flat, lo, hi, _):
            flat[lo:hi] = src[lo:hi]
    elif kind == "assign_add":
        def kernel(flat, lo, hi, _):
            flat[lo:hi] += src[lo:hi]
    elif kind == "assign_sub":
        def kernel(flat, lo, hi, _):
            flat[lo:hi] -= src[lo:hi]
    elif kind == "gradient":
        flat_slots = {name: s.reshape(-1) for name, s in (slots or {}).items()}

        def kernel(flat, lo, hi, own_step):
            optimizer.apply(np, flat[lo:hi], src[lo:hi],
                            {name: s[lo:hi] for name, s in flat_slots.items()},
                            own_step if step is None else step)
    else:
        raise ValueError(f"kind={kind!r}; allowed: assign, assign_add, assign_sub, gradient")
    return kernel
