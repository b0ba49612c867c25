"""The driver's fast lane to a replica: one plain socket per replica for `strategy.run`'s
step requests and events, served by a thread of the Replica actor: `LaneServer` here, with the
framing both ends use; the driver's end is in cluster/lane.py.

A Dask actor call costs the driver a hop into the client's event loop and the worker a hop
through its own, for each replica. The lane is a blocking socket from the thread that calls
`strategy.run` straight to a replica thread. It is opened only where Dask's own comms are
plain TCP (never next to TLS), and a random token must open every connection, so it adds
nothing to what a peer of that cluster could already do. Everything else (variables,
placement, peer notices) still goes through the actor.
"""

from __future__ import annotations

import contextlib
import hmac
import pickle
import secrets
import socket
import struct
import threading
from typing import Any

import cloudpickle

_HEADER = struct.Struct("!Q")


def send_message(sock: socket.socket, payload: bytes) -> None:
    header = _HEADER.pack(len(payload))
    if len(payload) < 65536:  # one write: no Nagle-style stall between header and body
        sock.sendall(header + payload)
    else:
        sock.sendall(header)
        sock.sendall(payload)


def recv_message(sock: socket.socket) -> bytes | None:
    """One whole message, or None when the other side closed the connection."""
    header = _recv_exactly(sock, _HEADER.size)
    if header is None:
        return None
    (n,) = _HEADER.unpack(header)
    body = _recv_exactly(sock, n)
    if body is None:
        raise ConnectionError("the connection closed in the middle of a message")
    return body


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            if got == 0:
                return None
            raise ConnectionError("the connection closed in the middle of a message")
        got += k
    return bytes(buf)


def dumps(obj: Any) -> bytes:
    try:
        return pickle.dumps(obj, protocol=5)
    except Exception:  # closures, lambdas in results: cloudpickle carries them
        return cloudpickle.dumps(obj, protocol=5)


class LaneServer:
    """Runs in the Replica actor: accepts the driver, answers each request (bytes) with the
    bytes `handle` returns for it (the answer, already pickled); `handle` must not raise."""

    def __init__(self, host: str, handle):
        self._handle = handle
        self._listener = socket.create_server((host, 0))
        self.address = (host, self._listener.getsockname()[1])
        self.token = secrets.token_hex(16)
        self._closed = False
        threading.Thread(target=self._serve, daemon=True, name="labdist-lane").start()

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                token = recv_message(conn)
                if token is None or not hmac.compare_digest(token, self.token.encode()):
                    continue
                self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        while True:
            try:
                request = recv_message(conn)
            except OSError:
                return
            if request is None:
                return
            send_message(conn, self._handle(request))

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()

