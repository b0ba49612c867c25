"""A CPU test double of `cupy.cuda.nccl` for the strict device: the same calls, the same
collective semantics between processes (over Unix sockets), and the same ways to fail.

As NCCL does: `get_unique_id()` starts a bootstrap root (a thread, until every rank joined)
and its id carries where to find it; `NcclCommunicator(world, id, rank)` blocks until every
rank joined; collectives are queued on a stream and return at once, and complete only when
every rank made the same call, in the same order. A peer that never comes leaves the others
waiting forever (unless aborted); a peer that dies shows as `check_async_error()` raising
ncclRemoteError while its peers still wait; calls whose counts, dtypes or ops differ never
complete and report ncclInvalidUsage there; `destroy()` waits for queued collectives (use
`abort()` to give up on them). Buffers are device pointers of the strict double
(`x.data.ptr`, see cuda.py).
"""

from __future__ import annotations

import secrets
import select
import socket
import struct
import threading
import time
from typing import Any

import numpy as np

from labdist.devices.strict import cuda as strict_cuda

available = True
NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN, NCCL_AVG = range(5)
(NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_UINT32, NCCL_INT64, NCCL_UINT64, NCCL_FLOAT16,
 NCCL_FLOAT32, NCCL_FLOAT64) = range(9)
NCCL_CHAR, NCCL_INT, NCCL_HALF, NCCL_FLOAT, NCCL_DOUBLE = (NCCL_INT8, NCCL_INT32, NCCL_FLOAT16,
                                                          NCCL_FLOAT32, NCCL_FLOAT64)
DTYPES = [np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64, np.float16, np.float32,
          np.float64]
FOLDS = {NCCL_SUM: np.add, NCCL_PROD: np.multiply, NCCL_MAX: np.maximum, NCCL_MIN: np.minimum,
         NCCL_AVG: np.add}
ERRORS = ["ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
          "ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress"]
(ncclSuccess, ncclUnhandledCudaError, ncclSystemError, ncclInternalError, ncclInvalidArgument,
 ncclInvalidUsage, ncclRemoteError, ncclInProgress) = range(len(ERRORS))
MAGIC = b"labdist-nccl-double:"
INIT_TIMEOUT_S = 60.0  # bootstrap gives up (ncclSystemError) after this, as NCCL's does
BOOTSTRAP_THREAD = "labdist-nccl-bootstrap"
_HEADER = struct.Struct("<qiiiiqq")  # seq, kind, dtype, op, root, count, payload bytes
ALL_REDUCE, BROADCAST, ALL_GATHER, REDUCE_SCATTER = range(4)
KINDS = ["allReduce", "broadcast", "allGather", "reduceScatter"]


_calls = [0]  # collectives queued in this process, for tests that check NCCL was used


def calls() -> int:
    """How many collectives this process has queued on the double so far."""
    return _calls[0]


class NcclError(RuntimeError):
    """cupy's `cupy.cuda.nccl.NcclError`: `.status` is the ncclResult_t code."""

    def __init__(self, status: int, detail: str = ""):
        self.status = status
        super().__init__(f"{ERRORS[status]}: {detail}" if detail else ERRORS[status])


def get_version() -> int:
    return 22304


def get_unique_id() -> tuple[int, ...]:
    """A fresh id; starts the bootstrap root that the ranks of one communicator meet at."""
    token = secrets.token_hex(12)
    listener = _listen(f"{token}-root")
    threading.Thread(target=_bootstrap_root, args=(listener,), daemon=True,
                     name=BOOTSTRAP_THREAD).start()
    raw = MAGIC + token.encode()
    return tuple(raw.ljust(128, b"\0"))


def _token(comm_id: Any) -> str:
    raw = bytes(int(x) & 0xFF for x in comm_id).rstrip(b"\0")
    if not raw.startswith(MAGIC):
        raise NcclError(ncclInvalidArgument, "not a unique id of this NCCL double")
    return raw[len(MAGIC):].decode()


def _listen(name: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind("\0labdist-nccl-" + name)  # abstract: gone with the process, no file to clean
    s.listen(64)
    return s


def _connect(name: str, deadline: float) -> socket.socket:
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect("\0labdist-nccl-" + name)
            return s
        except (FileNotFoundError, ConnectionRefusedError):
            s.close()
            if time.monotonic() > deadline:
                raise NcclError(ncclSystemError, f"bootstrap: nobody listens at {name}") from None
            time.sleep(0.01)


def _recv_exact(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise NcclError(ncclRemoteError, "bootstrap: a peer closed its connection")
        data += chunk
    return data


def _bootstrap_root(listener: socket.socket) -> None:
    """Collect every rank's (rank, world), then tell each the others are listening."""
    listener.settimeout(INIT_TIMEOUT_S)
    conns: dict[int, socket.socket] = {}
    try:
        world = None
        while world is None or len(conns) < world:
            conn, _ = listener.accept()
            conn.settimeout(INIT_TIMEOUT_S)
            rank, world = struct.unpack("<ii", _recv_exact(conn, 8))
            conns[rank] = conn
        for conn in conns.values():
            conn.sendall(b"go")
    except (OSError, NcclError):
        pass  # ranks that joined see their bootstrap fail
    finally:
        for conn in conns.values():
            conn.close()
        listener.close()


_group = threading.local()


def groupStart() -> None:  # cupy's names
    _group.depth = getattr(_group, "depth", 0) + 1


def groupEnd() -> None:
    if getattr(_group, "depth", 0) == 0:
        raise NcclError(ncclInvalidUsage, "groupEnd without groupStart")
    _group.depth -= 1


class _Op:
    """One queued collective on one rank (what a stream holds: `.done`, `.progress()`)."""

    def __init__(self, comm: NcclCommunicator, header: tuple, payload: bytes, finish):
        self.comm, self.header, self.payload, self.finish = comm, header, payload, finish
        self.seq, self.done = header[0], False

    def progress(self) -> None:
        if not self.done:
            self.comm.progress()


class NcclCommunicator:
    """`cupy.cuda.nccl.NcclCommunicator(ndev, commId, rank)` between processes."""

    def __init__(self, ndev: int, commId: Any, rank: int):
        if not 0 <= rank < ndev:
            raise NcclError(ncclInvalidArgument, f"rank {rank} of {ndev}")
        self._world, self._rank = int(ndev), int(rank)
        token = _token(commId)
        self._lock = threading.RLock()
        self._peers: dict[int, socket.socket] = {}
        self._out: dict[int, bytearray] = {}
        self._in: dict[int, bytearray] = {}
        self._frames: dict[tuple[int, int], tuple[tuple, bytes]] = {}  # (seq, peer) -> frame
        self._ops: list[_Op] = []
        self._seq = 0
        self._error: NcclError | None = None
        self._state = "open"  # "aborted", "destroyed"
        deadline = time.monotonic() + INIT_TIMEOUT_S
        listener = _listen(f"{token}-{rank}")
        try:
            root = _connect(f"{token}-root", deadline)
            with root:
                root.sendall(struct.pack("<ii", rank, ndev))
                root.settimeout(INIT_TIMEOUT_S)
                _recv_exact(root, 2)  # every rank listens now
            for p in range(rank):
                s = _connect(f"{token}-{p}", deadline)
                s.sendall(struct.pack("<i", rank))
                self._peers[p] = s
            listener.settimeout(INIT_TIMEOUT_S)
            while len(self._peers) < ndev - 1:
                conn, _ = listener.accept()
                conn.settimeout(INIT_TIMEOUT_S)
                self._peers[struct.unpack("<i", _recv_exact(conn, 4))[0]] = conn
        except OSError as e:
            self._close_sockets()
            raise NcclError(ncclSystemError, f"bootstrap failed: {e}") from None
        finally:
            listener.close()
        for p, s in self._peers.items():
            s.setblocking(False)
            self._out[p], self._in[p] = bytearray(), bytearray()

    # -- what cupy offers --------------------------------------------------------------------
    def rank_id(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._world

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream) -> None:
        parts_at = self._parts_at(recvbuf, count, datatype)
        fold = FOLDS[op]

        def finish(parts):
            out = parts_at()
            acc = parts[0].copy()
            for p in parts[1:]:
                fold(acc, p, out=acc)
            if op == NCCL_AVG:
                acc = acc // self._world if acc.dtype.kind in "iu" else acc / self._world
            out[...] = acc
        self._enqueue(ALL_REDUCE, sendbuf, count, count, datatype, op, -1, stream, finish)

    def bcast(self, buff, count, datatype, root, stream) -> None:
        self.broadcast(buff, buff, count, datatype, root, stream)

    def broadcast(self, sendbuff, recvbuff, count, datatype, root, stream) -> None:
        parts_at = self._parts_at(recvbuff, count, datatype)

        def finish(parts):
            parts_at()[...] = parts[root]
        send = count if self._rank == root else 0
        self._enqueue(BROADCAST, sendbuff, count, send, datatype, -1, root, stream, finish)

    def allGather(self, sendbuf, recvbuf, count, datatype, stream) -> None:
        parts_at = self._parts_at(recvbuf, count * self._world, datatype)

        def finish(parts):
            parts_at()[...] = np.concatenate(parts)
        self._enqueue(ALL_GATHER, sendbuf, count, count, datatype, -1, -1, stream, finish)

    def reduceScatter(self, sendbuf, recvbuf, recvcount, datatype, op, stream
                      ) -> None:
        parts_at = self._parts_at(recvbuf, recvcount, datatype)
        lo, fold = self._rank * recvcount, FOLDS[op]

        def finish(parts):
            acc = parts[0][lo:lo + recvcount].copy()
            for p in parts[1:]:
                fold(acc, p[lo:lo + recvcount], out=acc)
            parts_at()[...] = acc / self._world if op == NCCL_AVG else acc
        self._enqueue(REDUCE_SCATTER, sendbuf, recvcount, recvcount * self._world, datatype,
                      op, -1, stream, finish)

    def check_async_error(self) -> None:
        """Raise the error a collective ran into (a peer gone, calls that differ), if any."""
        self.progress()
        if self._error is not None:
            raise self._error

    def abort(self) -> None:
        """Give up: queued collectives end (unfinished), the communicator is unusable."""
        with self._lock:
            if self._state == "open":
                self._state = "aborted"
            self._end_ops()

    def destroy(self) -> None:
        """Wait for queued collectives, as ncclCommDestroy does, then release."""
        while True:
            with self._lock:
                if self._state != "open" or not self._ops:
                    self._state = "destroyed"
                    self._end_ops()
                    return
            time.sleep(1e-3)
            self.progress()
            if self._error is not None:
                self.abort()
                raise self._error

    commDestroy = destroy

    # -- the engine --------------------------------------------------------------------------
    def _parts_at(self, recvbuf: int, count: int, datatype: int):
        strict_cuda.buffer_at(recvbuf, count, DTYPES[datatype])  # an illegal address fails now
        return lambda: strict_cuda.buffer_at(recvbuf, count, DTYPES[datatype])

    def _enqueue(self, kind, sendbuf, count, send_count, datatype, op, root, stream, finish):
        if self._state != "open":
            raise NcclError(ncclInvalidArgument, f"the communicator was {self._state}")
        if not 0 <= datatype < len(DTYPES):
            raise NcclError(ncclInvalidArgument, f"datatype {datatype}")
        payload = strict_cuda.buffer_at(sendbuf, send_count, DTYPES[datatype]).tobytes()
        with self._lock:
            _calls[0] += 1
            self._seq += 1
            header = (self._seq, kind, datatype, op, root, count, len(payload))
            frame = _HEADER.pack(*header) + payload
            for p in self._peers:
                self._out[p] += frame
            op_ = _Op(self, header, payload, finish)
            self._ops.append(op_)
        strict_cuda.stream_at(stream).enqueue(op_)
        self.progress()

    def progress(self) -> None:
        """Move bytes that can move now; finish the collectives whose messages are all in."""
        with self._lock:
            if self._state != "open" or not self._peers:
                self._finish_ready()
                return
            socks = {s: p for p, s in self._peers.items()}
            want_write = [s for s, p in socks.items() if self._out[p]]
            readable, writable, _ = select.select(list(socks), want_write, [], 0)
            for s in writable:
                p = socks[s]
                try:
                    sent = s.send(self._out[p])
                    del self._out[p][:sent]
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError as e:
                    self._lost(p, e)
            for s in readable:
                self._read(socks[s], s)
            self._finish_ready()

    def _read(self, p: int, s: socket.socket) -> None:
        try:
            data = s.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._lost(p, e)
            return
        if not data:
            self._lost(p, "connection closed")
            return
        buf = self._in[p]
        buf += data
        while len(buf) >= _HEADER.size:
            header = _HEADER.unpack_from(buf)
            end = _HEADER.size + header[-1]
            if len(buf) < end:
                break
            self._frames[(header[0], p)] = (header, bytes(buf[_HEADER.size:end]))
            del buf[:end]

    def _lost(self, p: int, why: Any) -> None:
        if self._error is None:
            self._error = NcclError(
                ncclRemoteError, f"peer rank {p}: remote process exited or there was a network "
                f"error ({why})")
        self._peers.pop(p).close()

    def _finish_ready(self) -> None:
        while self._ops and self._state == "open":
            op = self._ops[0]
            got = [self._frames.get((op.seq, p)) for p in range(self._world) if p != self._rank]
            if any(f is None for f in got) or any(self._out[p] for p in self._peers):
                return
            mine = op.header[:6]
            differ = [f[0][:6] for f in got if f[0][:6] != mine]
            if differ:
                if self._error is None:
                    self._error = NcclError(ncclInvalidUsage, (
                        f"collective #{op.seq}: this rank called {_describe(mine)}, a peer "
                        f"{_describe(differ[0])}"))
                return  # NCCL would hang or reduce garbage: the double hangs
            frames = iter(got)
            op.finish([np.frombuffer(op.payload if p == self._rank else next(frames)[1],
                                     dtype=DTYPES[mine[2]]) for p in range(self._world)])
            for p in range(self._world):
                self._frames.pop((op.seq, p), None)
            self._ops.pop(0)
            op.done = True

    def _end_ops(self) -> None:
        for op in self._ops:
            op.done = True
        self._ops.clear()
        self._frames.clear()
        self._close_sockets()

    def _close_sockets(self) -> None:
        for s in self._peers.values():
            s.close()
        self._peers.clear()


def _describe(header: tuple) -> str:
    _, kind, dtype, op, root, count = header[:6]
    return (f"{KINDS[kind]}(count={count}, dtype={np.dtype(DTYPES[dtype]).name}, op={op}, "
            f"root={root})")
