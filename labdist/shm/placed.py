"""Arrays placed once where the replicas run, so that a training batch travels as row
indices, not rows. On one host the driver writes each array once to a file in /dev/shm; a
replica maps it the first time a batch names it, and a batch's rows (`PlacedRows`) unpickle
on the replica as the rows themselves (a numpy array, copied out of the mapping). Nothing else
changes: the step gets the same arrays it got before, in the same order.

A distributed dataset's elements on the driver are `Rows`: read-only arrays that pickle as
their indices (data/dataset_placement.py places the dataset's arrays).

Placement is only used where every replica reads the driver's file (`readable`, checked once
per `fit` or dataset), and where the arrays take at most a quarter of /dev/shm's free space
(the collectives need the rest). Where some replica does not read it (another host), `fit`
copies its arrays once to every replica's worker with Dask's scatter instead
(`ScatteredArray`), and rows are taken from the worker's copy. LABDIST_PLACE_INPUT=0 turns
all of it off: the batches travel as before. A process keeps the mappings of files that still
exist (the driver removes its files when `fit` ends or the dataset goes), so a worker holds at
most the arrays of the fits and datasets in use.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
from typing import Any

import numpy as np

from labdist.timing import phases

SHM_DIR = "/dev/shm"
PREFIX = "labdist-input-"
ENV = "LABDIST_PLACE_INPUT"

_mapped: dict[tuple, np.ndarray] = {}  # (path, shape, dtype) -> the mapped array, per process


def file_prefix(kind: str) -> str:
    """`kind`-<pid>-: the pid where a process's janitor and the orphan sweep look for it
    (shm/janitor.py, which the callers of `place` start), so a driver
    killed with its files open leaves none behind."""
    return f"{kind}-{os.getpid()}-"


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip() not in ("0", "false", "no", "off")


class _Placed:
    """What both kinds of placed array share (driver side): a shape, and indexing that gives
    `PlacedRows`, which carry indices only."""

    shape: tuple
    source: tuple

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: Any) -> PlacedRows:
        if isinstance(index, slice):
            index = np.arange(self.shape[0])[index]
        return PlacedRows(self.source, np.asarray(index, dtype=np.int64))


class PlacedArray(_Placed):
    """An array written once to a file under /dev/shm (driver side)."""

    def __init__(self, array: np.ndarray):
        array = np.ascontiguousarray(array)
        fd, self.path = tempfile.mkstemp(prefix=file_prefix(PREFIX + "rows"), dir=SHM_DIR)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(memoryview(array).cast("B") if array.size else b"")
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            raise
        self.shape, self.dtype, self.ndim = array.shape, array.dtype, array.ndim
        self.source = (self.path, self.shape, self.dtype.str)

    def close(self) -> None:
        """Remove the file (replicas that mapped it keep their mapping until they drop it)."""
        with contextlib.suppress(OSError):
            os.unlink(self.path)


class ScatteredArray(_Placed):
    """An array copied once to the memory of every replica's worker by Dask's scatter (driver
    side), where the replicas do not share the driver's /dev/shm (other hosts): one key per
    worker (`futures`). A replica takes a batch's rows from the copy its worker holds."""

    def __init__(self, futures: list[Any], array: np.ndarray):
        self._futures = futures
        self.shape, self.dtype, self.ndim = array.shape, array.dtype, array.ndim
        self.source = (DASK, tuple(f.key for f in futures), self.shape, self.dtype.str)

    def close(self) -> None:
        """Let go of the copies (the scheduler drops them once no future holds them)."""
        for future in self._futures:
            with contextlib.suppress(Exception):  # a client already closed
                future.release()


DASK = "dask"  # a source's first item when the array lies in a Dask worker's memory
_store: list[Any] = []  # the worker's data (Worker.data), set by the replica actor: use_store
reads = 0  # rows taken from a worker's copy in this process (tests read it)


def use_store(data: Any) -> None:
    """Where this worker process keeps scattered arrays (a Replica actor sets it)."""
    _store[:] = [data]


class PlacedRows:
    """Rows `index` of a placed array: small to pickle, and an ndarray once unpickled."""

    def __init__(self, source: tuple, index: np.ndarray):
        self.source, self.index = source, index

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, index: slice) -> PlacedRows:
        return PlacedRows(self.source, self.index[index])

    def __reduce__(self):
        return rows, (self.source, self.index)

    def rows(self) -> np.ndarray:
        return rows(self.source, self.index)


class Rows(np.ndarray):
    """Rows of a placed array as the driver hands them to its user (a distributed dataset's
    element): an ordinary read-only ndarray that pickles as its indices, so a replica that
    unpickles it takes the rows from its own mapping. Indexing it and computing with it give
    plain arrays; other views (`.T`, `reshape`) keep the type but, placed nowhere, pickle
    their data like any array."""

    _placed: tuple | None = None  # (source, index) of these very rows, else None
    _owner: Any = None  # keeps the placed file while these rows may still be sent

    def __array_finalize__(self, obj: Any) -> None:
        self._placed = self._owner = None

    def __array_wrap__(self, array, context=None, return_scalar=False):
        """A ufunc's or a reduction's result: a plain array (or scalar), not rows."""
        out = array.view(np.ndarray)
        return out[()] if return_scalar else out

    def __getitem__(self, key):
        """Some of the rows: a plain array, printed and pickled as any other."""
        out = super().__getitem__(key)
        return out.view(np.ndarray) if isinstance(out, np.ndarray) else out

    def __reduce_ex__(self, protocol):
        if self._placed is None:
            return np.asarray(self).__reduce_ex__(protocol)
        return rows, self._placed


def local_rows(source: tuple, index: np.ndarray | slice, owner: Any = None) -> Rows:
    """The rows `index` of `source` read here (the driver), to be sent as indices: read-only,
    as a tf.data element is immutable, so what a replica reads is what the driver shows. A
    slice of rows is a view of the placed copy (nothing read until it is used). `owner`
    (what removes the file when it goes) is kept alive while the rows are."""
    out = _array(source)[index].view(Rows)
    out._placed, out._owner = (source, index), owner
    out.flags.writeable = False
    return out


def rows(source: tuple, index: np.ndarray | slice) -> np.ndarray:
    """The rows `index` (indices, or a slice) of the placed array `source`, a copy of its own:
    the step may keep or change its rows."""
    out = _array(source)[index]
    return out.copy() if isinstance(index, slice) else out  # fancy indexing copies already


def view(source: tuple, lo: int, hi: int) -> np.ndarray:
    """Rows lo:hi of the placed array `source`, read-only and not copied: for a reader that
    only reads them (fit's step on a replica)."""
    out = _array(source)[lo:hi]
    out.flags.writeable = False
    return out


def _array(source: tuple) -> np.ndarray:
    """The placed array `source` in this process: mapped on first use (one host), or this
    worker's scattered copy."""
    if source[0] == DASK:
        global reads
        reads += 1
        array = _scattered(source)
        if array is None:
            raise RuntimeError(f"this worker holds no copy of the scattered array "
                               f"{source[1][0]!r}; it is there only while the fit that "
                               "scattered it runs")
        return array
    array = _mapped.get(source)
    if array is None:
        path, shape, dtype = source
        for old in [s for s in _mapped if not os.path.exists(s[0])]:
            del _mapped[old]  # its fit ended: drop the mapping
        array = _map(path, tuple(shape), np.dtype(dtype))
        _mapped[source] = array
    return array


def _scattered(source: tuple) -> np.ndarray | None:
    """This worker's copy of a scattered array (one of its keys per worker), if it holds one."""
    data = _store[0] if _store else {}
    for key in source[1]:
        if key in data:
            return data[key]
    return None


def _map(path: str, shape: tuple, dtype: np.dtype) -> np.ndarray:
    """The file as a read-only array, its pages mapped in at once (MAP_POPULATE: one
    system call, not a page fault per 4 KiB as the steps first touch them)."""
    nbytes = int(np.prod(shape)) * dtype.itemsize
    if nbytes == 0:
        return np.empty(shape, dtype)
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), nbytes, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                       prot=mmap.PROT_READ)
    return np.frombuffer(mm, dtype).reshape(shape)


def readable(probes: list[tuple[tuple, str]]) -> bool:
    """Whether this process reads every placed file (and its first bytes match): run on each
    replica before placement is relied on."""
    phases.RECORDER.trained(0)  # labdist's own probe: no training step (labdist_steps_total)
    for source, first in probes:
        if source[0] == DASK:
            if _scattered(source) is None:
                return False
            continue
        path, shape, dtype = source
        try:
            with open(path, "rb") as f:
                if f.read(8).hex() != first:
                    return False
            if os.path.getsize(path) != int(np.prod(shape)) * np.dtype(dtype).itemsize:
                return False
        except OSError:
            return False
    return True


def probe(placed: list[PlacedArray | ScatteredArray]) -> list[tuple[tuple, str]]:
    """What `readable` checks for `placed`, read here (the driver)."""
    out = []
    for p in placed:
        if p.source[0] == DASK:
            out.append((p.source, ""))
            continue
        with open(p.path, "rb") as f:
            out.append((p.source, f.read(8).hex()))
    return out


def close_all(arrays: list[PlacedArray | ScatteredArray]) -> None:
    """Remove the files (or let go of the copies) of `arrays`."""
    for a in arrays:
        a.close()


SHARE_OF_FREE = 0.25  # the most of /dev/shm's free space that placed input may take


def _free_bytes() -> int:
    st = os.statvfs(SHM_DIR)
    return st.f_bavail * st.f_frsize


def place(arrays: list[np.ndarray]) -> list[PlacedArray] | None:
    """Each array written once to /dev/shm; None where that is not possible here."""
    if not enabled() or not os.path.isdir(SHM_DIR):
        return None
    if sum(a.nbytes for a in arrays) > _free_bytes() * SHARE_OF_FREE:
        return None  # leave /dev/shm to the collectives, which need it to run at all
    placed: list[PlacedArray] = []
    try:
        for a in arrays:
            placed.append(PlacedArray(a))
    except OSError:
        close_all(placed)
        return None
    return placed
