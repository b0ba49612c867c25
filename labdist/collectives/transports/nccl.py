"""NCCL all-reduce between GPU replicas, through the replica backend's NCCL module
(`cupy.cuda.nccl`, or the strict double's CPU stand-in): the device transport.

Bootstrap: every rank's probe says which GPU it is on (host and PCI bus id); rank 0 alone makes
the unique id (`bootstrap`, only when no two replicas share a GPU: NCCL would fail or hang),
and every rank joins with it. NCCL cannot tell that two replicas disagree about a collective
(it would reduce garbage or hang), so the host transport first exchanges the call's signature
(collectives/algorithms.py), with each rank's word on whether its communicator still works;
only data moves through NCCL. Every wait is bounded by the collective timeout: the stream is
polled, with NCCL's async error and the mailbox's news of peers, and on a timeout, a lost peer
or `close()` the communicator is aborted. An aborted communicator cannot be joined again:
every later device all-reduce of the group fails, saying so.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, ClassVar

import numpy as np

from labdist.aggregation import Aggregation
from labdist.collectives.transports.protocol import DEVICE, Endpoint
from labdist.devices import Backend
from labdist.errors import CollectiveTimeoutError, PeerAbortedError

# numpy dtype -> the name of NCCL's data type constant in cupy.cuda.nccl
DTYPES = {
    "int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32",
    "uint32": "NCCL_UINT32", "int64": "NCCL_INT64", "uint64": "NCCL_UINT64",
    "float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64",
}
REMOTE_ERROR = 6  # ncclRemoteError: a peer's process exited or its network failed


def gpu_identity(backend: Backend) -> dict[str, str]:
    """Which GPU this process computes on: its host and the current device's PCI bus id."""
    return {"host": socket.gethostname(), "gpu": backend.cuda.Device().pci_bus_id}


def shared_gpus(probes: list[dict]) -> list[int]:
    """The ranks whose GPU another rank uses too."""
    keys = [(p["host"], p["gpu"]) for p in probes]
    return [r for r, k in enumerate(keys) if keys.count(k) > 1]


def supports(arrays: list[Any], agg: Aggregation) -> bool:
    """Whether NCCL can do this all-reduce as labdist defines it (the host path's result
    dtypes: integer MEANs, float64 there, stay on the host; so do dtypes NCCL lacks)."""
    if not arrays:
        return False
    return all(np.dtype(a.dtype).name in DTYPES and agg.nccl_can(a.dtype) for a in arrays)


class NcclTransport:
    """One rank's NCCL communicator; `all_reduce` runs on the replica's step thread, `close`
    may come from another thread at any time."""

    name: ClassVar[str] = "nccl"
    layer: ClassVar[str] = DEVICE
    requirement: ClassVar[str] = "every replica on a GPU of its own, with NCCL (cupy.cuda.nccl)"
    alone: ClassVar[bool] = False
    bootstraps: ClassVar[bool] = True

    def __init__(self, endpoint: Endpoint):
        self.endpoint = endpoint
        self._nccl = endpoint.backend.nccl  # None: this replica has no NCCL
        self.comm = None
        self.broken: str | None = None  # why the communicator was aborted
        self.run = 0
        self._lock = threading.Lock()
        self._busy = False  # a collective is in flight on the step thread

    def probe(self) -> dict | None:
        """Which GPU this replica is on, where it computes on one with NCCL at hand."""
        if self._nccl is None:
            return None
        return gpu_identity(self.endpoint.backend)

    def bootstrap(self, probes: list[dict]) -> tuple | None:
        """On rank 0 only: the unique id every rank joins with; None (no id, no bootstrap
        thread) where two replicas share a GPU."""
        return None if shared_gpus(probes) else self._nccl.get_unique_id()

    def connect(self, probes: list[dict], unique_id: tuple | None = None) -> bool:
        """Join rank 0's communicator: blocks until every rank does (called on all at once).
        A replica sharing its GPU with another cannot; then nobody joins."""
        ep = self.endpoint
        shared = shared_gpus(probes)
        if shared or unique_id is None:
            return bool(shared) and ep.rank not in shared
        if not ep.backend.nccl_spans_hosts and len({p["host"] for p in probes}) > 1:
            return False  # e.g. the double's sockets reach one host only
        try:
            self.comm = self._nccl.NcclCommunicator(ep.world, unique_id, ep.rank)
        except self._nccl.NcclError:
            return False
        return True

    def start_run(self, run: int) -> None:
        self.run = run

    def supports(self, backend: Backend, arrays: list[Any], agg: Aggregation) -> bool:
        return backend is self.endpoint.backend and supports(arrays, agg)

    def all_reduce(self, xp, arrays: list[Any], agg: Aggregation, seq: int = 0,
                   what: str = "all-reduce", states: list[str | None] | None = None
                   ) -> list[Any]:
        """Reduce `arrays` (the same specs on every rank) with one NCCL call per dtype.
        `states`: every rank's `broken`, exchanged with the signatures: if any communicator
        was aborted, every rank raises here instead of waiting for it."""
        gone = [(r, s) for r, s in enumerate(states or []) if s]
        with self._lock:
            if gone or self.comm is None:
                self._abort_locked(gone[0][1] if gone else "the transport was closed")
                raise RuntimeError(self._broken_message(gone, seq, what))
            self._busy = True
            comm = self.comm  # close() may clear self.comm while this runs
        try:
            return self._reduce(comm, xp, arrays, agg, seq, what)
        finally:
            with self._lock:
                self._busy = False

    def _reduce(self, comm, xp, arrays, agg, seq, what) -> list[Any]:
        out: list[Any] = [None] * len(arrays)
        by_dtype: dict[str, list[int]] = {}
        for i, a in enumerate(arrays):
            by_dtype.setdefault(np.dtype(a.dtype).name, []).append(i)
        stream = xp.cuda.get_current_stream()
        for name, idx in by_dtype.items():
            flat = xp.concatenate([xp.ravel(arrays[i]) for i in idx])  # a fresh buffer
            dtype = getattr(self._nccl, DTYPES[name])
            if agg.first_only:
                comm.bcast(flat.data.ptr, flat.size, dtype, 0, stream.ptr)
            else:
                comm.allReduce(flat.data.ptr, flat.data.ptr, flat.size, dtype,
                                    getattr(self._nccl, agg.nccl_op), stream.ptr)
            self._wait(comm, xp, stream, seq, what)
            if agg.divides:
                flat /= self.endpoint.world
            start = 0
            for i in idx:
                size = arrays[i].size
                out[i] = flat[start:start + size].reshape(arrays[i].shape)
                start += size
        return out

    def _wait(self, comm, xp, stream, seq: int, what: str) -> None:
        """Poll the collective to its end, at most the collective timeout; meanwhile watch
        NCCL's async error and the mailbox's news of peers. Any of them aborts."""
        ep = self.endpoint
        event = xp.cuda.Event(disable_timing=True)
        event.record(stream)
        deadline = time.monotonic() + ep.timeout
        pause, polls = 0.0, 0
        while not event.done:
            polls += 1
            if self.broken is not None:  # close() aborted it from another thread
                raise RuntimeError(f"replica {ep.rank}: the NCCL communicator was aborted "
                                   f"during collective #{seq} ({what}): {self.broken}")
            if polls % 16 == 0 or pause:
                self._check(comm, seq, what)
                if time.monotonic() > deadline:
                    others = [r for r in range(ep.world) if r != ep.rank]
                    self.abort(f"collective #{seq} timed out")
                    raise CollectiveTimeoutError(
                        f"collective #{seq} ({what}) waited {ep.timeout:g} s in NCCL on replica "
                        f"{ep.rank} for replica(s) {others}; one of them never reached it or "
                        "stopped in it. The NCCL communicator was aborted, so this strategy's "
                        "device all-reduces cannot go on: close it and start a new one (raise "
                        "collective_timeout= if a step is legitimately this slow).")
            time.sleep(pause)
            if polls > 64:
                pause = min(1e-3, pause * 2 or 1e-5)
        if self.broken is not None:
            raise RuntimeError(f"replica {ep.rank}: the NCCL communicator was aborted during "
                               f"collective #{seq} ({what}): {self.broken}")

    def _check(self, comm, seq: int, what: str) -> None:
        ep = self.endpoint
        try:
            comm.check_async_error()
        except self._nccl.NcclError as e:
            self.abort(f"NCCL error in collective #{seq}: {e}")
            if getattr(e, "status", None) == REMOTE_ERROR:
                raise PeerAbortedError(
                    f"NCCL reported a peer of replica {ep.rank} lost during collective #{seq} "
                    f"({what}): {e}. The communicator was aborted.") from None
            raise RuntimeError(f"NCCL failed on replica {ep.rank} in collective #{seq} "
                               f"({what}): {e}. The communicator was aborted.") from None
        if ep.mailbox is None:
            return
        for r in range(ep.world):
            if r != ep.rank:
                try:
                    ep.mailbox._raise_if_gone(self.run, seq, r, what)
                except Exception:
                    self.abort(f"replica {r} left collective #{seq}")
                    raise

    def _broken_message(self, gone: list[tuple[int, str]], seq: int, what: str) -> str:
        where = "; ".join(f"replica {r}: {s}" for r, s in gone) or f"replica " \
            f"{self.endpoint.rank}: {self.broken}"
        return (f"collective #{seq} ({what}) cannot use NCCL: a communicator of the group was "
                f"aborted ({where}). NCCL cannot be joined again: close this strategy and start "
                "a new one (restore from a checkpoint).")

    def abort(self, why: str) -> None:
        """Give up on the communicator (any collective in flight ends); it stays unusable."""
        with self._lock:
            self._abort_locked(why)

    def _abort_locked(self, why: str) -> None:
        if self.broken is None:
            self.broken = why
        if self.comm is not None:
            self.comm.abort()
            self.comm = None

    def close(self) -> None:
        """Release the communicator: destroyed when idle, aborted while a collective runs
        (destroy would wait for it, maybe forever). Safe from any thread, more than once."""
        with self._lock:
            comm, self.comm = self.comm, None
            if comm is None:
                return
            if self._busy:
                self.broken = self.broken or "the transport was closed during a collective"
                comm.abort()
                return
        try:
            comm.destroy()
        except Exception:  # a communicator with an async error: nothing more to wait for
            comm.abort()
