"""The parameter servers' same-host path, what both ends share: messages on a Unix socket (a
length, then a pickle) and where arrays lie in a worker's shared-memory area.

A worker and a store on one host talk over a Unix socket under /dev/shm (a few hundred bytes a
call, no event loop on either end) and move arrays through an area the worker owns: it writes
the gradients it pushes there, and the store copies the values a worker pulls there. Only
callers that showed the store's token (in a 0600 file beside the socket) are served.
"""

from __future__ import annotations

import hmac
import math
import pickle
import socket
import struct
from dataclasses import dataclass

import numpy as np

from labdist.shm.area import ALIGN

HEADER = struct.Struct("<Q")
MAX_MESSAGE = 1 << 30  # a length beyond this is a broken stream, not a message
METHODS = ("pull", "push", "wait_step")  # what the path carries; anything else goes over Dask

# an array's place in an area: (offset, shape, dtype.str)
Ref = tuple[int, tuple[int, ...], str]


@dataclass(frozen=True)
class InArea:
    """A pushed array's place in the worker's area, where a `Push` carries it instead of the
    array (which then needs no pickling): the store reads it there. A value that does not
    `fit` travels in the message as it is."""

    ref: Ref


def send_token(sock: socket.socket, token: str) -> None:
    """The first bytes on a connection: raw, so nothing is unpickled before they match."""
    sock.sendall(token.encode())


def token_matches(sock: socket.socket, token: str) -> bool:
    return hmac.compare_digest(_exactly(sock, len(token.encode())), token.encode())


def send(sock: socket.socket, message: object) -> None:
    body = pickle.dumps(message, protocol=5)
    sock.sendall(HEADER.pack(len(body)) + body)


def recv(sock: socket.socket) -> object:
    """The next message; EOFError when the other end closed."""
    (n,) = HEADER.unpack(_exactly(sock, HEADER.size))
    if n > MAX_MESSAGE:
        raise ConnectionError(f"a message of {n} bytes on the parameter-server socket")
    return pickle.loads(_exactly(sock, n))


def _exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise EOFError("the other end closed the parameter-server socket")
        got += k
    return bytes(buf)


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def place(specs: list[tuple[tuple[int, ...], np.dtype]]) -> tuple[list[Ref], int]:
    """Where arrays of these (shape, dtype) go, one after another; and the bytes they need."""
    refs, end = [], 0
    for shape, dtype in specs:
        dtype = np.dtype(dtype)
        refs.append((end, tuple(shape), dtype.str))
        end += aligned(math.prod(shape) * dtype.itemsize)  # math.prod: no ufunc per call
    return refs, end


def view(buffer: np.ndarray, ref: Ref) -> np.ndarray:
    """The array `ref` names in an area's bytes (a view: valid while the area is mapped)."""
    offset, shape, dtype = ref
    dt = np.dtype(dtype)
    n = math.prod(shape) * dt.itemsize
    return buffer[offset:offset + n].view(dt).reshape(shape)


def fits(array: object) -> bool:
    """Whether an array can travel through an area (plain numbers, not objects)."""
    return isinstance(array, np.ndarray) and not array.dtype.hasobject
