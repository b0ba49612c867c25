"""Same-host bulk transport: each replica publishes arrays in a file under /dev/shm that its
peers map and read directly. No socket copies; Dask comms carry only the small control messages
(signatures, "ready"), so ordering, mismatch and timeout handling stay in the mailbox.
Files are named labdist-<group>-<rank>-<pid>-*; those of dead processes are removed on start.

Safe reuse without double buffering: a rank rewrites its area only in a later collective, which
it starts after every peer has told it (by its next message) that it finished reading.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
from typing import Any

import numpy as np

SHM_DIR = "/dev/shm"
ALIGN = 64


def available() -> bool:
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


class _Mapping:
    def __init__(self, path: str, size: int, create: bool):
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            self.mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.path, self.size = path, size
        self.bytes = np.frombuffer(self.mm, dtype=np.uint8)

    def view(self, offset: int, dtype: np.dtype, count: int) -> np.ndarray:
        return self.bytes[offset:offset + count * dtype.itemsize].view(dtype)

    def close(self) -> None:
        self.bytes = None
        with contextlib.suppress(BufferError):  # a view still alive: freed with the process
            self.mm.close()


class SharedArea:
    """This replica's published area (grown on demand) and its read-only maps of peers' areas."""

    def __init__(self, group: str, rank: int):
        _remove_orphans()
        self._prefix = os.path.join(SHM_DIR, f"labdist-{group[:16]}-{rank}-{os.getpid()}")
        self._generation = 0
        self.own: _Mapping | None = None
        self._peers: dict[str, _Mapping] = {}
        self.token = secrets.token_hex(8)
        self.probe_path = f"{self._prefix}-probe"
        with open(self.probe_path, "w") as f:
            f.write(self.token)

    def ensure(self, nbytes: int) -> tuple[str, int]:
        """Make the own area at least `nbytes`; returns (path, size) for the control message."""
        if self.own is None or self.own.size < nbytes:
            size = max(nbytes, 2 * self.own.size if self.own else 0, 1 << 20)
            self._generation += 1
            new = _Mapping(f"{self._prefix}-{self._generation}", size, create=True)
            if self.own is not None:
                os.unlink(self.own.path)  # peers that mapped it keep their mapping
                self.own.close()
            self.own = new
        return self.own.path, self.own.size

    def peer(self, path: str, size: int) -> _Mapping:
        mapping = self._peers.get(path)
        if mapping is None:
            for old in [p for p in self._peers if p.rsplit("-", 1)[0] == path.rsplit("-", 1)[0]]:
                self._peers.pop(old).close()  # that peer grew its area
            mapping = self._peers[path] = _Mapping(path, size, create=False)
        return mapping

    def close(self) -> None:
        for m in self._peers.values():
            m.close()
        self._peers.clear()
        for path in (self.probe_path, self.own.path if self.own else None):
            if path:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        if self.own is not None:
            self.own.close()
            self.own = None


def _remove_orphans() -> None:
    """Areas left by killed workers (their pid is gone) would fill /dev/shm over time."""
    for name in os.listdir(SHM_DIR):
        parts = name.split("-")
        if name.startswith("labdist-") and len(parts) >= 4 and parts[3].isdigit():
            try:
                os.kill(int(parts[3]), 0)
            except ProcessLookupError:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(SHM_DIR, name))
            except PermissionError:
                pass  # alive, someone else's


def can_reach(probes: list[tuple[str, str]]) -> bool:
    """True if every (probe path, token) is readable here: the peers share this /dev/shm."""
    try:
        for path, token in probes:
            with open(path) as f:
                if f.read() != token:
                    return False
    except OSError:
        return False
    return True


def layout(sizes: list[int], start: int = 0) -> tuple[list[int], int]:
    """Byte offsets for blocks of `sizes` bytes from `start`, aligned; and where they end."""
    offsets, end = [], start
    for n in sizes:
        offsets.append(end)
        end += -(-n // ALIGN) * ALIGN
    return offsets, end


def all_reduce_shm(comm, area: SharedArea, seq: int, kind: str, sig: Any,
                   host: list[np.ndarray], op: str, combine) -> list[np.ndarray]:
    """Reduce-scatter + all-gather through shared memory (see module docstring).

    Phase 0: publish the segments other ranks own; tell them where. Each rank reduces its own
    segment from its local data and the peers' areas, into its output and its area.
    Phase 1: tell peers the reduced segments are there; copy theirs into the output.
    """
    from labdist.collectives.algorithms import check_signatures

    world, me = comm.world, comm.rank
    flats = [np.ascontiguousarray(a).reshape(-1) for a in host]
    bounds = [np.linspace(0, f.size, world + 1).astype(int) for f in flats]
    # results may be wider than inputs (the MEAN of integers is float64)
    out_dtypes = [combine(op, [np.zeros(1, f.dtype)] * world).dtype for f in flats]
    in_offsets, in_end = layout([f.nbytes for f in flats])
    out_offsets, end = layout([f.size * d.itemsize for f, d in zip(flats, out_dtypes,
                                                                    strict=True)], in_end)
    where = area.ensure(end)
    own = area.own
    for f, b, off in zip(flats, bounds, in_offsets, strict=True):
        published = own.view(off, f.dtype, f.size)
        for d in range(world):
            if d != me:
                published[b[d]:b[d + 1]] = f[b[d]:b[d + 1]]
    got = comm.exchange(seq, sig, where, kind, phase=0)
    check_signatures([s for s, _ in got], kind)
    peers = {r: area.peer(*got[r][1]) for r in range(world) if r != me}
    outs = []
    for f, b, off, res_off, dtype in zip(flats, bounds, in_offsets, out_offsets, out_dtypes,
                                         strict=True):
        lo, hi = b[me], b[me + 1]
        parts = [f[lo:hi] if r == me else peers[r].view(off, f.dtype, f.size)[lo:hi]
                 for r in range(world)]
        out = np.empty(f.size, dtype=dtype)
        combine(op, parts, out=out[lo:hi])
        own.view(res_off, dtype, f.size)[lo:hi] = out[lo:hi]
        outs.append(out)
    comm.exchange(seq, None, None, kind, phase=1)
    for f, b, res_off, out in zip(flats, bounds, out_offsets, outs, strict=True):
        for r in range(world):
            if r != me:
                out[b[r]:b[r + 1]] = peers[r].view(res_off, out.dtype, f.size)[b[r]:b[r + 1]]
    return [out.reshape(a.shape) for out, a in zip(outs, host, strict=True)]
