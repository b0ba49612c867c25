"""Is a Dask scheduler there? Asked with one bounded look before a Client is made for an
address, because Dask's Client waits without end on some things that are not a scheduler (an
HTTP server such as the dashboard on :8787, a port that accepts and stays silent) and reads
random bytes as a frame length ("Unable to allocate 3.07 EiB").

A Dask server speaks first: right after accepting a connection it writes its handshake, a
frame whose 8-byte length comes first. So the probe connects, reads, and judges what came:
Dask's handshake, nothing at all, an HTTP reply (asked for once the peer stayed silent for a
while: an HTTP server waits for a request), or something else. It never writes to a peer
that already spoke, and its whole look, connecting included, takes at most the timeout.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import time

from labdist.errors import ClusterConnectionError

_LENGTH = struct.Struct("Q")  # how Dask's TCP comm frames a message (distributed/comm/tcp.py)
HANDSHAKE_MAX_BYTES = 1 << 20  # a Dask handshake is a few hundred bytes
HANDSHAKE_MARK = b"pickle-protocol"  # a key every Dask handshake carries
GREETING_WAIT_S = 2.0  # silence this long, and the peer is asked whether it speaks HTTP
HTTP_QUESTION = b"HEAD / HTTP/1.0\r\n\r\n"
STREAM_SCHEMES = ("tcp", "tls", "ws", "wss")  # over a TCP connection: looked at
HINT = ("start one with `dask scheduler` and pass the address it prints (port 8786 unless "
        "told otherwise; 8787 is its dashboard)")


def probe_scheduler(address: str, timeout: float) -> None:
    """Return if a Dask server answers at `address` (tcp://HOST:PORT) within `timeout` s;
    otherwise raise ClusterConnectionError naming the address and what answered instead."""
    from distributed.comm.addressing import parse_address, parse_host_port

    scheme, location = parse_address(address)
    if scheme not in STREAM_SCHEMES:
        return  # ucx, inproc: not a TCP port to look at
    host, port = parse_host_port(location)
    deadline = time.monotonic() + timeout
    what = _look(host, port, scheme, deadline, timeout)
    if what is not None:
        raise ClusterConnectionError(f"no Dask scheduler at {address}: {what}; {HINT}")


def _look(host: str, port: int, scheme: str, deadline: float, timeout: float) -> str | None:
    """What answered, in words, or None for a Dask server (or, for schemes other than tcp,
    anything that accepts: their first words are TLS's or the WebSocket's)."""
    try:
        sock = socket.create_connection((host, port), timeout=max(deadline - time.monotonic(),
                                                                  0.001))
    except TimeoutError:
        return f"nothing accepted a connection within {timeout:g} s"
    except OSError as e:
        return f"nothing accepts connections there ({e.strerror or type(e).__name__})"
    with sock:
        if scheme != "tcp":
            return None
        sock.setblocking(False)
        return _judge(sock, deadline, timeout)


def _judge(sock: socket.socket, deadline: float, timeout: float) -> str | None:
    got = bytearray()
    asked = False
    greeting_by = time.monotonic() + min(GREETING_WAIT_S, timeout / 2)
    while True:
        if got.startswith(b"HTTP/"):
            if b"\n" in got or len(got) >= 80:
                return _describe(got, "an HTTP server answered")
        elif len(got) >= _LENGTH.size:
            (n,) = _LENGTH.unpack_from(got)
            if not 0 < n <= HANDSHAKE_MAX_BYTES:
                return _describe(got, "it answered with bytes that are not a Dask handshake")
            if len(got) >= _LENGTH.size + n:
                if HANDSHAKE_MARK in got:
                    return None
                return _describe(got, "it answered with a message that is not a Dask "
                                      "handshake")
        now = time.monotonic()
        if not got and not asked and now >= greeting_by and now < deadline:
            asked = True  # silent so far: a Dask server would have spoken; HTTP waits
            with contextlib.suppress(OSError):  # it may have closed meanwhile
                sock.send(HTTP_QUESTION)
            continue
        if now >= deadline:
            if got:
                return _describe(got, f"it sent {len(got)} bytes, then nothing, in {timeout:g} s")
            return (f"it accepted a connection but said nothing in {timeout:g} s (a Dask "
                    "scheduler greets at once)")
        until = greeting_by if not got and not asked else deadline
        readable, _, _ = select.select([sock], [], [], max(until - now, 0))
        if not readable:
            continue
        try:
            chunk = sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            continue
        except OSError as e:
            return f"the connection failed ({e.strerror or type(e).__name__})"
        if not chunk:
            if got:
                return _describe(got, "it answered, then closed the connection")
            return "it accepted a connection, then closed it without a word"
        got += chunk


def _describe(got: bytes, what: str) -> str:
    """`what`, with the first line of what came where it is text (an HTTP status line, a
    banner), else its first bytes in hex."""
    first = bytes(got[:80]).split(b"\r\n")[0].split(b"\n")[0]
    if first and all(32 <= b < 127 for b in first):
        return f"{what} ({first.decode()!r})"
    return f"{what} (first bytes {bytes(got[:8]).hex(' ')})"
