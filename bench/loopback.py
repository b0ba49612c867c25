"""Raw loopback TCP between two processes: the bandwidth ceiling for anything that moves arrays
between two worker processes on this host (used by bench_core.py as a baseline).

`TcpPeer.stream` times one direction; `TcpPeer.exchange` times both directions at once, which is
what two replicas exchanging halves of an all-reduce need. On a 2-core machine the exchange is
slower per direction (about 2/3 of one-way, measured): every byte costs a kernel copy on each
side, and both sides now send and receive at once.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import selectors
import socket
import time

import numpy as np

STREAM, EXCHANGE = 1, 2  # TCP peer requests: send me n bytes / send n bytes each way at once


def _tcp_peer(port: int, max_bytes: int) -> None:
    """Child process: serve STREAM and EXCHANGE requests (16-byte header: n, kind) until n=0."""
    data = memoryview(np.ones(max_bytes, np.uint8))  # touched pages, not the shared zero page
    inbox = memoryview(np.ones(max_bytes, np.uint8))
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            header = inbox[:16]
            _recv_into(sock, header)
            n, kind = int.from_bytes(header[:8], "little"), int.from_bytes(header[8:], "little")
            if n == 0:
                return
            if kind == STREAM:
                sock.sendall(data[:n])
            else:
                _send_while_receiving(sock, data[:n], inbox[:n])
                sock.sendall(b"!")  # everything arrived here too


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    """Fill `view` from `sock`, in place (no per-call allocation, as a tuned transport would)."""
    got = 0
    while got < len(view):
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("TCP peer closed the connection")
        got += k


def _send_while_receiving(sock: socket.socket, out: memoryview, into: memoryview) -> None:
    """Both directions at once, as two replicas exchanging halves do: one thread, non-blocking
    socket, as an event-loop transport works (no thread start-up inside the timed region)."""
    sent = got = 0
    sock.setblocking(False)
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
            while got < len(into):
                for _, mask in selector.select():
                    if mask & selectors.EVENT_WRITE and sent < len(out):
                        with contextlib.suppress(BlockingIOError):
                            sent += sock.send(out[sent:])
                        if sent == len(out):
                            selector.modify(sock, selectors.EVENT_READ)
                    if mask & selectors.EVENT_READ:
                        with contextlib.suppress(BlockingIOError):
                            k = sock.recv_into(into[got:])
                            if k == 0:
                                raise ConnectionError("TCP peer closed the connection")
                            got += k
            if sent < len(out):
                sock.setblocking(True)
                sock.sendall(out[sent:])
    finally:
        sock.setblocking(True)


class TcpPeer:
    """A second process exchanging bytes with this one over loopback TCP: the raw-bandwidth
    ceiling for anything that moves arrays between two worker processes on this host."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.data = memoryview(np.ones(max_bytes, np.uint8))  # preallocated and touched
        self.inbox = memoryview(np.ones(max_bytes + 1, np.uint8))
        with socket.create_server(("127.0.0.1", 0)) as server:
            port = server.getsockname()[1]
            self.process = mp.get_context("spawn").Process(
                target=_tcp_peer, args=(port, max_bytes), daemon=True)
            self.process.start()
            server.settimeout(60)
            self.sock, _ = server.accept()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _request(self, n: int, kind: int) -> None:
        self.sock.sendall(n.to_bytes(8, "little") + kind.to_bytes(8, "little"))

    def stream(self, n: int) -> float:
        """Seconds from request to the last of `n` bytes landing in the preallocated buffer."""
        t0 = time.perf_counter()
        self._request(n, STREAM)
        _recv_into(self.sock, self.inbox[:n])
        return time.perf_counter() - t0

    def exchange(self, n: int) -> float:
        """Seconds until `n` bytes went each way at the same time (the peer acks receipt)."""
        t0 = time.perf_counter()
        self._request(n, EXCHANGE)
        _send_while_receiving(self.sock, self.data[:n], self.inbox[:n + 1])
        return time.perf_counter() - t0

    def close(self) -> None:
        try:
            self._request(0, STREAM)
            self.process.join(timeout=10)
        finally:
            self.sock.close()
            if self.process.is_alive():
                self.process.terminate()
