"""The strict double's `xp.cuda`: the parts of `cupy.cuda` labdist uses (streams, events,
devices, the runtime's device listing; array.py adds `nccl`, the NCCL double of
nccl.py), so the code behind `xp.cuda` runs on a machine without a GPU.

Work on the double's device is synchronous (numpy) except NCCL collectives, which are queued
on a stream as on a GPU: `Stream.synchronize()` / `Event.synchronize()` block until they
finish (forever, if a peer never comes), `Stream.done` / `Event.done` poll. Devices follow
CUDA_VISIBLE_DEVICES as CUDA does: device 0 of a worker started with CUDA_VISIBLE_DEVICES=3 is
pretend GPU 3, whose PCI bus id says so. Without it the process sees
LABDIST_STRICT_GPUS pretend GPUs (default 1).

Device pointers (`x.data.ptr`) are the host addresses of the arrays' numpy buffers; the double
remembers which arrays handed one out (`register` / `buffer_at`), so a collective can only
touch live arrays, and a pointer to anything else raises as CUDA does on an illegal address.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import weakref
from typing import Any

import numpy as np

ENV_GPUS = "LABDIST_STRICT_GPUS"


class CUDARuntimeError(RuntimeError):
    """cupy's `cupy.cuda.runtime.CUDARuntimeError`."""


# -- devices --------------------------------------------------------------------------------------
def visible() -> list[str]:
    """The pretend GPUs this process sees, as CUDA_VISIBLE_DEVICES entries (physical ids)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip()]
    return [str(i) for i in range(int(os.environ.get(ENV_GPUS, "1") or 0))]


def _pci_bus_id(physical: str) -> str:
    if physical.isdigit():
        return f"0000:{0x10 + int(physical):02x}:00.0"
    return f"0000:{abs(hash(physical)) % 0xef + 0x10:02x}:00.0"  # a UUID entry


class Device:
    """`cupy.cuda.Device`: `Device()` is the current device (0 here)."""

    def __init__(self, device: int | None = None):
        self.id = 0 if device is None else int(device)
        if not 0 <= self.id < len(visible()):
            raise CUDARuntimeError("cudaErrorInvalidDevice: invalid device ordinal")

    @property
    def pci_bus_id(self) -> str:
        return _pci_bus_id(visible()[self.id])

    @property
    def compute_capability(self) -> str:
        return "90"

    def use(self) -> None:
        pass

    def synchronize(self) -> None:
        get_current_stream().synchronize()

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc) -> None:
        pass


class _Runtime:
    """`cupy.cuda.runtime`, as far as labdist asks it."""

    CUDARuntimeError = CUDARuntimeError

    @staticmethod
    def getDeviceCount() -> int:
        return len(visible())

    @staticmethod
    def getDeviceProperties(device: int) -> dict[str, Any]:
        Device(device)
        return {"name": b"labdist strict double GPU", "pciBusID": 0x10 + device,
                "totalGlobalMem": 1 << 34}


runtime = _Runtime()


# -- streams and events ---------------------------------------------------------------------------
class Stream:
    """`cupy.cuda.Stream`: queued work (NCCL collectives) runs in order; the null stream has
    ptr 0, as in cupy."""

    _ids = itertools.count(1)
    _by_ptr: weakref.WeakValueDictionary[int, Stream] = weakref.WeakValueDictionary()

    def __init__(self, null: bool = False, non_blocking: bool = False, ptds: bool = False):
        self.ptr = 0 if null else next(Stream._ids) << 4
        self._work: list[Any] = []  # queued operations: `.done` / `.progress()`
        self._lock = threading.Lock()
        Stream._by_ptr[self.ptr] = self

    def enqueue(self, op: Any) -> None:
        with self._lock:
            self._work.append(op)

    def pending(self) -> list[Any]:
        with self._lock:
            self._work = [op for op in self._work if not op.done]
            return list(self._work)

    @property
    def done(self) -> bool:
        return all(_progressed(op) for op in self.pending())

    def synchronize(self) -> None:
        _wait_all(self.pending())

    def record(self, event: Event | None = None) -> Event:
        event = Event() if event is None else event
        event.record(self)
        return event

    def __enter__(self) -> Stream:
        _current.stream = self
        return self

    def __exit__(self, *exc) -> None:
        _current.stream = None


_NULL = Stream(null=True)
_current = threading.local()


def get_current_stream() -> Stream:
    return getattr(_current, "stream", None) or _NULL


def stream_at(ptr: int) -> Stream:
    """The stream a `stream.ptr` names (what an NCCL call is given)."""
    stream = Stream._by_ptr.get(int(ptr))
    if stream is None:
        raise CUDARuntimeError(f"cudaErrorInvalidResourceHandle: no stream at {ptr:#x}")
    return stream


class Event:
    """`cupy.cuda.Event`: done once the work queued on its stream before `record` is."""

    def __init__(self, block: bool = False, disable_timing: bool = False,
                 interprocess: bool = False):
        self._work: list[Any] = []

    def record(self, stream: Stream | None = None) -> None:
        self._work = (stream or get_current_stream()).pending()

    @property
    def done(self) -> bool:
        return all(_progressed(op) for op in self._work)

    def synchronize(self) -> None:
        _wait_all(self._work)


def _progressed(op: Any) -> bool:
    op.progress()
    return op.done


def _wait_all(ops: list[Any]) -> None:
    """Block until every op is done, as a stream sync does (no timeout: that is the caller's)."""
    pause = 0.0
    while not all(_progressed(op) for op in ops):
        time.sleep(pause)
        pause = min(1e-3, pause * 2 or 1e-5)


# -- device memory: pointers of live arrays ------------------------------------------------------
class MemoryPointer:
    """`cupy.cuda.MemoryPointer`: `.ptr` is the address of the array's first element."""

    __slots__ = ("_owner", "ptr")

    def __init__(self, owner: np.ndarray):
        self._owner = owner  # keeps the buffer alive while the pointer is held
        self.ptr = register(owner)


_LIVE: dict[int, tuple[weakref.ref, int]] = {}  # id(array) -> (array, its address)
_LIVE_LOCK = threading.Lock()


def register(array: np.ndarray) -> int:
    """Remember `array` as device memory a collective may touch; its address."""
    key = id(array)
    with _LIVE_LOCK:
        if key not in _LIVE:
            _LIVE[key] = (weakref.ref(array, lambda _, key=key: _forget(key)),
                          array.__array_interface__["data"][0])
        return _LIVE[key][1]


def _forget(key: int) -> None:
    with _LIVE_LOCK:
        _LIVE.pop(key, None)


def buffer_at(ptr: int, count: int, dtype: np.dtype) -> np.ndarray:
    """A writable view of `count` elements of `dtype` at device pointer `ptr`, which must lie
    inside one live array that handed out a pointer (else CUDA's illegal address error)."""
    nbytes = int(count) * np.dtype(dtype).itemsize
    with _LIVE_LOCK:
        arrays = [ref() for ref, _ in _LIVE.values()]
    for array in arrays:
        if array is None or not array.flags.c_contiguous:
            continue
        low = array.__array_interface__["data"][0]
        if low <= ptr and ptr + nbytes <= low + array.nbytes:
            raw = array.reshape(-1).view(np.uint8)[ptr - low:ptr - low + nbytes]
            return raw.view(dtype)  # a view: writes land in the array, which it keeps alive
    raise CUDARuntimeError(
        f"cudaErrorIllegalAddress: {nbytes} bytes at {ptr:#x} are not inside a live device "
        "array (was the array freed, or the count wrong?)")

