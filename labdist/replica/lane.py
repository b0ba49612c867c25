"""The driver's fast lane to a replica: one plain socket per replica for `strategy.run`'s
step requests and events, served by a thread of the Replica actor: `LaneServer` here, with the
framing both ends use; the driver's end is in cluster/lane_channel.py.

A Dask actor call costs the driver a hop into the client's event loop and the worker a hop
through its own, for each replica. The lane is a socket from the thread that calls
`strategy.run` straight to a replica thread. It is opened only where Dask's own comms are
plain TCP (never next to TLS), and a random token must open every connection, so it adds
nothing to what a peer of that cluster could already do. Everything else (variables,
placement, peer notices) still goes through the actor.

Anyone on the host can connect to the lane's port, so before a connection has shown the token
it gets a few bytes and a few seconds, and never holds up another: one thread multiplexes the
listener, the connections still to authenticate and the driver's. Sockets are non-blocking;
once a message has started, each part of it must come within IO_TIMEOUT_S.
"""

from __future__ import annotations

import contextlib
import hmac
import pickle
import secrets
import select
import selectors
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import cloudpickle

_HEADER = struct.Struct("!Q")
TOKEN_MAX_BYTES = 64  # before authentication a longer message closes the connection
HANDSHAKE_TIMEOUT_S = 5.0  # an unauthenticated connection has this long to show the token
HANDSHAKES_MAX = 32  # connections authenticating at once; a new one closes the oldest
IO_TIMEOUT_S = 60.0  # once a message has started, each part of it must come within this
READY = b"ready"  # the replica's answer to the right token
GOODBYE = b""  # the driver closes the lane on purpose (a vanished driver sends none)


def family_of(host: str) -> socket.AddressFamily:
    """IPv4 or IPv6, as `host` (a worker's address: 127.0.0.1, ::1, a name) resolves."""
    return socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0][0]


def send_message(sock: socket.socket, payload: bytes, timeout: float | None = None) -> None:
    """Header and body in one system call (sendmsg, no copy): the reader wakes once, to a
    whole message, where a header sent alone woke it to wait again for the body."""
    header = _HEADER.pack(len(payload))
    try:
        sent = sock.sendmsg([header, payload])
    except BlockingIOError:  # a non-blocking socket whose buffer is full
        sent = 0
    if sent < len(header):
        _send_all(sock, header[sent:], timeout)
        sent = len(header)
    if sent - len(header) < len(payload):
        _send_all(sock, memoryview(payload)[sent - len(header):], timeout)


def recv_message(sock: socket.socket, limit: int | None = None,
                 timeout: float | None = None) -> bytes | None:
    """One whole message, or None when the other side closed the connection. Over `limit`
    bytes is refused before anything is allocated for it."""
    header = _recv_exactly(sock, _HEADER.size, timeout)
    if header is None:
        return None
    (n,) = _HEADER.unpack(header)
    if limit is not None and n > limit:
        raise ConnectionError(f"a message of {n} bytes came where at most {limit} may")
    body = _recv_exactly(sock, n, timeout) if n else b""
    if body is None:
        raise ConnectionError("the connection closed in the middle of a message")
    return body


def _send_all(sock: socket.socket, data: bytes, timeout: float | None) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[sock.send(view):]
        except BlockingIOError:  # a non-blocking socket whose buffer is full
            _wait(sock, select.POLLOUT, timeout)


def _recv_exactly(sock: socket.socket, n: int, timeout: float | None) -> bytes | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        try:
            k = sock.recv_into(view[got:], n - got)
        except BlockingIOError:  # nothing yet on a non-blocking socket
            _wait(sock, select.POLLIN, timeout)
            continue
        if k == 0:
            if got == 0:
                return None
            raise ConnectionError("the connection closed in the middle of a message")
        got += k
    return bytes(buf)


def _wait(sock: socket.socket, events: int, timeout: float | None) -> None:
    """Only on the slow path: the usual message is there when the caller asks."""
    timeout = IO_TIMEOUT_S if timeout is None else timeout
    poller = select.poll()
    poller.register(sock, events)
    if not poller.poll(timeout * 1000):
        raise TimeoutError(f"the lane's peer stalled {timeout:g} s in the middle of a message")


def dumps(obj: Any) -> bytes:
    try:
        return pickle.dumps(obj, protocol=5)
    except Exception:  # closures, lambdas in results: cloudpickle carries them
        return cloudpickle.dumps(obj, protocol=5)


class LaneServer:
    """Runs in the Replica actor: accepts the driver (the first connection to show the token),
    answers each request (bytes) with the bytes `handle` returns for it (the answer, already
    pickled); `handle` must not raise. When the driver's connection ends without a goodbye,
    `on_drop` is called (the lane's thread): the driver vanished. The lane serves one driver,
    once. With `hand_off`, the driver's connection goes to it once authenticated, and whoever
    took it reads the requests (`read_request`); this thread only refuses later comers."""

    def __init__(self, host: str, handle: Callable[[bytes], Any],
                 on_drop: Callable[[], None] | None = None,
                 hand_off: Callable[[socket.socket], None] | None = None):
        self._handle, self._on_drop, self._hand_off = handle, on_drop, hand_off
        self._listener = socket.create_server((host, 0), family=family_of(host))
        self._listener.setblocking(False)
        self.address = (host, self._listener.getsockname()[1])
        self._local, self.local_name = _local_listener()
        self.token = secrets.token_hex(16)
        self._wake_r, self._wake_w = socket.socketpair()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, daemon=True, name="labdist-lane")
        self._thread.start()

    @property
    def serving(self) -> bool:
        return self._thread.is_alive()

    def _serve(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._listener, selectors.EVENT_READ, "accept")
        if self._local is not None:
            selector.register(self._local, selectors.EVENT_READ, "accept")
        selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        pending: dict[socket.socket, tuple[float, bytearray]] = {}  # deadline, bytes so far
        driver: socket.socket | None = None
        handed: socket.socket | None = None  # the driver's, handed off: not ours to close
        try:
            while not self._closed:
                now = time.monotonic()
                for conn in [c for c, (deadline, _) in pending.items() if deadline <= now]:
                    _drop(selector, pending, conn)  # too slow to show the token
                timeout = min((d for d, _ in pending.values()), default=now + 3600) - now
                for key, _ in selector.select(max(timeout, 0)):
                    if key.data == "accept":
                        self._accept(selector, pending, key.fileobj)
                    elif key.data == "handshake" and key.fileobj in pending:
                        if self._handshake(selector, pending, key.fileobj) and driver is None:
                            driver = key.fileobj
                            if self._hand_off is not None:
                                handed = driver  # read and closed over there from now on
                                self._hand_off(driver)
                            else:
                                selector.register(driver, selectors.EVENT_READ, "driver")
                        elif key.fileobj not in pending:
                            key.fileobj.close()  # refused, or a second driver
                    elif key.data == "driver" and not self._answer(driver):
                        return
        finally:
            for conn in [*pending, driver, self._listener, self._local, self._wake_r,
                         self._wake_w]:
                if conn is not None and conn is not handed:
                    conn.close()
            selector.close()

    def _accept(self, selector, pending, listener: socket.socket) -> None:
        for _ in range(HANDSHAKES_MAX):
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # e.g. out of file descriptors: try again on the next wake
                return
            conn.setblocking(False)
            if len(pending) >= HANDSHAKES_MAX:
                _drop(selector, pending, next(iter(pending)))  # the oldest
            pending[conn] = (time.monotonic() + HANDSHAKE_TIMEOUT_S, bytearray())
            selector.register(conn, selectors.EVENT_READ, "handshake")

    def _handshake(self, selector, pending, conn: socket.socket) -> bool:
        """Read what came of the token; True once it is complete and right (then `conn` is
        out of `pending`, told READY); a wrong or oversized one takes it out of `pending`."""
        _, got = pending[conn]
        try:
            chunk = conn.recv(_HEADER.size + TOKEN_MAX_BYTES - len(got))
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            chunk = b""
        got += chunk
        size = _HEADER.unpack_from(got)[0] if len(got) >= _HEADER.size else 0
        if chunk and len(got) < _HEADER.size + size and size <= TOKEN_MAX_BYTES:
            return False  # more to come
        selector.unregister(conn)
        del pending[conn]
        token = bytes(got[_HEADER.size:])
        if not chunk or len(token) != size or not hmac.compare_digest(token, self.token.encode()):
            return False
        try:
            if conn.family != socket.AF_UNIX:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            send_message(conn, READY, timeout=HANDSHAKE_TIMEOUT_S)
        except OSError:
            return False
        return True

    def _answer(self, conn: socket.socket) -> bool:
        """Answer one request of the driver; False when its connection ended."""
        ended = answer_one(conn, self._handle)
        if ended == DROPPED and not self._closed and self._on_drop is not None:
            self._on_drop()
        return ended is None

    def close(self) -> None:
        """Stop serving (the lane's thread closes its sockets: it may be mid-answer)."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")


def _local_listener() -> tuple[socket.socket | None, str | None]:
    """A Unix socket in Linux's abstract namespace, for a driver on this host: the same
    protocol and token, at about half the CPU of a loopback TCP connection per message (no
    TCP stack; measured 15 against 28 µs to send 100 KB, 14 against 24 µs a small round
    trip). Abstract names belong to a network namespace, so only a driver that shares this
    one reaches it; elsewhere (or off Linux) (None, None), and drivers use TCP."""
    if not sys.platform.startswith("linux"):
        return None, None
    name = f"\0labdist-lane-{secrets.token_hex(8)}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(name)
        sock.listen(HANDSHAKES_MAX)
        sock.setblocking(False)
    except OSError:
        sock.close()
        return None, None
    return sock, name


ENDED = "goodbye"  # the driver closed its lane on purpose
DROPPED = "dropped"  # the driver's connection ended without a goodbye (or broke)


def answer_one(conn: socket.socket, handle: Callable[[bytes], bytes]) -> str | None:
    """Read one request of the driver and send `handle`'s answer; None, or how the
    connection ended (ENDED, DROPPED)."""
    request = read_request(conn)
    if isinstance(request, str):
        return request
    try:
        send_message(conn, handle(request))
    except OSError:
        return DROPPED
    return None


def read_request(conn: socket.socket) -> bytes | str:
    """One request of the driver, or how the connection ended (ENDED, DROPPED)."""
    try:
        request = recv_message(conn)
    except (OSError, MemoryError):  # reset, stalled mid-message, a length too big
        return DROPPED
    if request is None:
        return DROPPED
    return ENDED if request == GOODBYE else request


def _drop(selector, pending, conn: socket.socket) -> None:
    selector.unregister(conn)
    del pending[conn]
    conn.close()
