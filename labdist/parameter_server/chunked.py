"""One variable on a parameter server: its value in chunks, each chunk with version stamps.

Updates are applied chunk by chunk. Without locking they work in place, so concurrent updates
interleave and a read (which never takes a lock) can see an update half applied: a *torn read*.
The stamps make that visible instead of silent: every chunk counts the updates that started and
finished on it, and a read compares the stamps it saw before and after copying.
With locking, updates to one variable run one at a time and each is built on a copy that is
published whole, so a read (still lock-free) sees the value before or after an update, never
in between.

*Lost updates* are counted too. An update is lost when a write built on a value that did not
contain it replaces its effect, on the whole variable or on some of its chunks. Each lost
update counts once; one its own function overwrites is not lost (a function may rewrite what
it wrote):

- a read-modify-write across a pull and a push (with or without locking: the lock is only
  mutual exclusion between updates): an `assign` pushed by a function that read the variable
  first overwrites the updates of others that landed after that read — its `basis`, the updates
  whole in the read (so an update the read saw half applied counts as lost). A blind `assign`
  (the function never read the variable) overwrites by definition: nothing is lost.
  `assign_add`, `assign_sub` and gradients apply to the current value, so a stale read loses
  nothing (that is staleness, counted apart).
- without locking, in place: each chunk is read, computed and written back, and two updates
  can hold one chunk at once; the later write replaces the earlier one's effect on that chunk.
  (A `+=` on the live chunk would not avoid it: numpy releases the GIL inside the ufunc, so
  the two would race element by element and lose parts of each other without a trace.)

With locking and only additive updates or gradients, nothing can be lost, and none is counted.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable

import numpy as np

from labdist.timing import phases

HISTORY = 256  # finished updates remembered per variable, to name what an assign overwrites
CHUNK_HISTORY = 32  # writes remembered per chunk until no update is in flight (few overlap)

# fn(target, slots, lo, hi, step): write the update of elements [lo, hi) into `target` (and
# each slot's into slots[name]), which hold those elements' current values.
ChunkFn = Callable[[np.ndarray, dict[str, np.ndarray], int, int, int], None]


class Kernel:
    """How one update changes each chunk of a variable (and of its optimizer slots)."""

    def __init__(self, kind: str, fn: ChunkFn, slots: dict[str, np.ndarray]):
        self.kind = kind
        self.reads = kind != "assign"  # whether the new value depends on the current one
        self.slots = slots  # flat slot arrays, updated with the variable
        self._fn = fn

    def __call__(self, target: np.ndarray, slots: dict[str, np.ndarray], lo: int, hi: int,
                 step: int) -> None:
        self._fn(target, slots, lo, hi, step)


class _Update:
    """One update of a variable as the lost-update count sees it: whose, and whether lost."""

    __slots__ = ("lost", "owner")

    def __init__(self, owner: Hashable | None):
        self.owner = owner
        self.lost = False


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
        self._done: deque[tuple[int, _Update]] = deque(maxlen=HISTORY)  # (completed, update)
        # chunk -> (finished stamp, update) of its writes since no update was in flight
        self._writes: dict[int, deque[tuple[int, _Update]]] = {}

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
    def read(self, out: np.ndarray | None = None) -> tuple[np.ndarray, int, bool]:
        """(a copy of the value, updates whole in it, whether the copy may be torn); `out`:
        copy into this array (a worker's shared-memory area) instead of a new one.

        tuple(list) is one C call under the GIL, so each stamp snapshot is consistent; the copy
        between them may overlap a writer, which then shows in the stamps."""
        data, stamps = self._snap
        before = tuple(stamps)
        if out is None:
            value = data.copy()
        else:
            np.copyto(out, data)
            value = out
        after = tuple(stamps)
        started, finished = before[0::2], before[1::2]
        torn = before != after or started != finished or min(finished) != max(finished)
        return value, min(finished), torn

    # -- updates ----------------------------------------------------------------------------
    def update(self, kernel: Kernel, locking: bool, delay: float = 0.0,
               owner: Hashable | None = None, basis: int | None = None
               ) -> tuple[bool, int, list[Hashable | None]]:
        """Apply `kernel` to every chunk in order (each chunk but the last held `delay`
        seconds, a test and lab knob). `owner`: who pushed it (what it overwrites of the same
        owner's is not lost); `basis`: the updates whole in the read it was computed from.

        Returns (whether another update of this variable was in flight when this one began —
        they interleaved; how many updates had finished when it began — with locking, once
        it held the lock: the staleness of a gradient is measured from it; the owners of the
        updates this one made lost, each named once, None where not known)."""
        record = _Update(owner)
        if locking:
            asked = phases.now()
            with self._write_lock:
                phases.RECORDER.add("lock", asked, phases.now())
                return self._copy_on_write(kernel, delay, record, basis)
        return self._in_place(kernel, delay, record, basis)

    def _begin(self, kernel: Kernel, record: _Update, basis: int | None
               ) -> tuple[bool, int, int, list]:
        """Under _meta. With a basis, an assign overwrites what finished since its read."""
        self.in_flight += 1
        self.started += 1
        lost = (_lose(self._done, basis, record)
                if basis is not None and not kernel.reads else [])
        return self.in_flight > 1, self.completed, self.started, lost

    def _end(self, record: _Update) -> None:
        """Under _meta."""
        self.in_flight -= 1
        self.completed += 1
        self._done.append((self.completed, record))
        if not self.in_flight:
            self._writes.clear()  # no update is left that could overwrite them unseen

    def _in_place(self, kernel: Kernel, delay: float, record: _Update, basis: int | None):
        data, stamps = self._snap
        flat = data.reshape(-1)
        with self._meta:
            overlapped, prior, step, lost = self._begin(kernel, record, basis)
        last = len(self.bounds) - 1
        ended = False
        try:
            for k, (lo, hi) in enumerate(self.bounds):
                with self._meta:
                    stamps[2 * k] += 1
                    # the chunk's writes this update's value is built on: those there now, or
                    # for an assign those whole in its read (None: a blind write)
                    seen = stamps[2 * k + 1] if kernel.reads else basis
                try:
                    if kernel.reads:
                        target = flat[lo:hi].copy()
                        slots = {name: s[lo:hi].copy() for name, s in kernel.slots.items()}
                    else:
                        target, slots = np.empty(hi - lo, flat.dtype), {}
                    kernel(target, slots, lo, hi, step)
                    if delay and k < last:
                        time.sleep(delay)  # holding the chunk: another update may read it
                except BaseException:
                    with self._meta:
                        stamps[2 * k + 1] += 1
                    raise
                with self._meta:
                    flat[lo:hi] = target
                    for name, part in slots.items():
                        kernel.slots[name][lo:hi] = part
                    stamps[2 * k + 1] += 1
                    if seen is not None and (log := self._writes.get(k)):
                        lost += _lose(log, seen, record)
                    self._writes.setdefault(k, deque(maxlen=CHUNK_HISTORY)).append(
                        (stamps[2 * k + 1], record))
                    if k == last:  # finished with its last chunk's write: reads see it whole
                        self._end(record)
                        ended = True
        finally:
            if not ended:
                with self._meta:
                    self._end(record)
        return overlapped, prior, lost

    def _copy_on_write(self, kernel: Kernel, delay: float, record: _Update, basis: int | None):
        with self._meta:
            overlapped, prior, step, lost = self._begin(kernel, record, basis)
        data, stamps = self._snap
        new = data.copy()
        flat = new.reshape(-1)
        last = len(self.bounds) - 1
        try:
            for k, (lo, hi) in enumerate(self.bounds):
                kernel(flat[lo:hi], {name: s[lo:hi] for name, s in kernel.slots.items()},
                       lo, hi, step)
                if delay and k < last:
                    time.sleep(delay)
            version = max(stamps[1::2]) + 1
            self._snap = (new, [version] * len(stamps))  # published whole
        finally:
            with self._meta:
                self._end(record)
        return overlapped, prior, lost


def _lose(log: Iterable[tuple[int, _Update]], since: int, record: _Update
          ) -> list[Hashable | None]:
    """Mark lost the updates in `log` ((stamp, update), oldest first) stamped after `since`,
    except `record`'s owner's own; the owners of those newly lost. Where the log no longer
    reaches back to `since` (a full history), the updates beyond it count, owner unknown."""
    lost: list[Hashable | None] = []
    oldest = None
    for stamp, other in reversed(log):
        if stamp <= since:
            oldest = None
            break
        oldest = stamp
        mine = other.owner is not None and other.owner == record.owner
        if not mine and not other.lost:
            other.lost = True
            lost.append(other.owner)
    if oldest is not None and isinstance(log, deque) and len(log) == log.maxlen:
        lost += [None] * (oldest - since - 1)
    return lost


def make_kernel(kind: str, source: np.ndarray, optimizer=None,
                slots: dict[str, np.ndarray] | None = None, step: int | None = None) -> Kernel:
    """The chunk kernel of an update: assign / assign_add / assign_sub of `source`, or the
    optimizer's rule with gradient `source` (and the slots as its state). `step` overrides
    the variable's own update count (sync mode: the global step)."""
    src = np.ascontiguousarray(source).reshape(-1)
    if kind == "assign":
        def fn(target, _slots, lo, hi, _):
            target[...] = src[lo:hi]
    elif kind == "assign_add":
        def fn(target, _slots, lo, hi, _):
            target += src[lo:hi]
    elif kind == "assign_sub":
        def fn(target, _slots, lo, hi, _):
            target -= src[lo:hi]
    elif kind == "gradient":
        def fn(target, chunk_slots, lo, hi, own_step):
            optimizer.apply(np, target, src[lo:hi], chunk_slots,
                            own_step if step is None else step)
    else:
        raise ValueError(f"kind={kind!r}; allowed: assign, assign_add, assign_sub, gradient")
    flat_slots = {name: s.reshape(-1) for name, s in (slots or {}).items()}
    return Kernel(kind, fn, flat_slots if kind == "gradient" else {})
