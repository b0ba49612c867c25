"""The store's end of the same-host path (shm_wire.py): a Unix socket under /dev/shm, one
thread per connected worker, which serves that worker's pulls, pushes and barrier waits.

Nothing about what a call means changes; only how the bytes travel. Each request calls the
store's own methods: async mode's pull and push (`pull_now`, `push_now`) right on the
connection's thread, where the store's pool would have run them (the same lock-free reads,
locking rules, stamps and counters); sync mode's on the store's event loop (`pull`, `push`,
`wait_step`), where SyncReplicas lives. Pulled values are copied once, by the store's read,
into the worker's area; pushed arrays are read in place from it (sync mode copies them, since
a step holds them after the reply). A worker that dies closes its socket: its thread ends and
unmaps its area. The socket and token files are named after this process (shm_area's orphan
sweep removes them if it is killed) and removed on close.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import secrets
import socket
import threading
from typing import Any

import numpy as np

from labdist.parameter_server import shm_wire as wire
from labdist.shipping import picklable_error
from labdist.shm import area

HANDSHAKE_TIMEOUT_S = 10.0  # a connection that shows no token by then is dropped
LOOP_POLL_S = 0.5  # how often a call waiting on the event loop checks for close

log = logging.getLogger(__name__)


class Grow(Exception):
    """The worker's area is too small for the reply: it makes one of `nbytes` and asks again."""

    def __init__(self, nbytes: int):
        super().__init__(nbytes)
        self.nbytes = nbytes


class ShmServer:
    """One store's listener and its connections. `probe`: (socket path, token path, token)."""

    @classmethod
    def start(cls, store: Any, loop: asyncio.AbstractEventLoop) -> ShmServer | None:
        """A server for `store`, or None where /dev/shm cannot hold one (then workers use
        Dask comms)."""
        if not area.available():
            return None
        area.remove_orphans()
        try:
            return cls(store, loop)
        except OSError as e:
            log.warning("labdist: parameter server %d serves over Dask comms only: %s",
                        store.index, e)
            return None

    def __init__(self, store: Any, loop: asyncio.AbstractEventLoop):
        self.store, self.loop = store, loop
        self.token = secrets.token_hex(16)
        prefix = os.path.join(area.SHM_DIR, f"labdist-pss-{store.index}-{os.getpid()}")
        self._control = area.create(prefix, "-token", len(self.token))
        self._control.bytes[:] = np.frombuffer(self.token.encode(), np.uint8)
        self.path = self._control.path.removesuffix("-token") + "-sock"
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._listener.bind(self.path)
            os.chmod(self.path, 0o600)
            self._listener.listen(64)
        except BaseException:
            self._listener.close()
            self._unlink()
            raise
        self.probe = (self.path, self._control.path, self.token)
        self._closed = False
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True,
                         name=f"labdist-ps{store.index}-shm").start()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conns, self._conns = list(self._conns), set()
        for sock in (self._listener, *conns):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked on it
            sock.close()
        self._unlink()
        self._control.close()

    def _unlink(self) -> None:
        for path in (self.path, self._control.path):
            with contextlib.suppress(OSError):
                os.unlink(path)

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True,
                             name=f"labdist-ps{self.store.index}-shm-conn").start()

    # -- one worker's connection --------------------------------------------------------------
    def _serve(self, conn: socket.socket) -> None:
        mapping: area.Mapping | None = None
        try:
            conn.settimeout(HANDSHAKE_TIMEOUT_S)
            if not wire.token_matches(conn, self.token):
                return
            conn.settimeout(None)
            wire.send(conn, "ok")
            while not self._closed:
                method, args, where = wire.recv(conn)
                if where is not None and (mapping is None or mapping.path != where[0]):
                    try:
                        new = area.Mapping(where[0], where[1], create=False)
                    except OSError as e:  # the worker takes Dask comms for this call
                        wire.send(conn, ("nomap", f"{type(e).__name__}: {e}"))
                        continue
                    if mapping is not None:
                        mapping.close()
                    mapping = new
                try:
                    reply = ("ok", self._handle(method, args, mapping))
                except Grow as g:
                    reply = ("grow", g.nbytes)
                except BaseException as e:  # the method's own error, raised on the worker
                    reply = ("error", picklable_error(e))
                wire.send(conn, reply)
        except (OSError, EOFError, ValueError, TypeError):
            pass  # the worker left (or was never ours): its thread ends
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()
            if mapping is not None:
                mapping.close()

    def _handle(self, method: str, args: tuple, mapping: area.Mapping | None) -> Any:
        store = self.store
        if method == "pull":
            var_ids, step = args
            refs, need = wire.place(store.specs(var_ids))
            if mapping is None or need > mapping.size:
                raise Grow(need)
            outs = [wire.view(mapping.bytes, r) for r in refs]
            if store.sync is None:
                got = store.pull_now(var_ids, outs)
            else:
                got = self._on_loop(store.pull(var_ids, step, outs))
            return None if got is None else (refs, got[1], got[2])
        if method == "push":
            worker, items, basis, step, key, want, examples = args
            copy = store.sync is not None  # a step holds its pushes past this reply
            items = [p.carrying(_array(mapping, p.value, copy))
                     if isinstance(p.value, wire.InArea) else p for p in items]
            if store.sync is None:
                return store.push_now(worker, items, basis, key, want)
            return self._on_loop(store.push(worker, items, basis, step, key, want, examples))
        if method == "wait_step":
            return self._on_loop(store.wait_step(*args))
        raise ValueError(f"method {method!r} does not travel over shared memory")

    def _on_loop(self, coro) -> Any:
        """Run one of the store's coroutines on its event loop, as a Dask call would."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        while True:
            try:
                return future.result(timeout=LOOP_POLL_S)
            except concurrent.futures.TimeoutError:
                if self._closed:
                    future.cancel()
                    raise ConnectionError("the parameter server closed") from None


def _array(mapping: area.Mapping | None, where: wire.InArea, copy: bool) -> np.ndarray:
    """A pushed array that lies in the worker's area (read-only here; `copy`: a copy)."""
    if mapping is None:
        raise ConnectionError("a push named an area this connection never mapped")
    value = wire.view(mapping.bytes, where.ref)
    if copy:
        return value.copy()
    value = value.view()
    value.flags.writeable = False
    return value
