"""The worker's end of the same-host path (shm_wire.py): one channel per parameter server that
shares this host, opened on the first pull or push, and Dask comms for everything else.

A store is on this host when its token file under /dev/shm is readable here and its socket
accepts the token (what the mirrored shm transport's probe/connect decide, with a socket for
the signal); otherwise, when the store has no server (no /dev/shm, no room), or with
transport="tcp", the shard stays on Dask comms for good. A call whose area /dev/shm has no room
for goes over Dask comms, with a warning; so does one made while another thread of this worker
holds the channel. Waits are watched as `liveness.watched_call` watches a Dask call: a PS that
answers neither the call nor a liveness check (`info`, over Dask) for `ps_timeout` is
`Unresponsive`; a killed one closes the socket, which reads as a connection error.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from labdist.parameter_server import shm_wire as wire
from labdist.parameter_server.liveness import POLL_S, PROBE_EVERY_S, Unresponsive
from labdist.shm import area

CONNECT_TIMEOUT_S = 10.0
MIN_AREA = 1 << 20  # the first area's size at least; larger ones grow by a quarter ahead
FALLBACK = object()  # what a channel answers for a call Dask comms must carry instead

log = logging.getLogger(__name__)

Calls = list[tuple[int, str, tuple]]


class Raised:
    """What the store's method raised (the call itself went fine)."""

    def __init__(self, error: BaseException):
        self.error = error


class ShmPaths:
    """Worker `index`'s channels. `dask_calls(calls)` makes calls over Dask comms (a result or
    an exception each); `probe(shard)` starts a liveness check of that PS."""

    def __init__(self, index: int, enabled: bool, dask_calls: Callable[[Calls], list],
                 probe: Callable[[int], concurrent.futures.Future]):
        self.index, self.enabled = index, enabled
        self._dask_calls, self._probe = dask_calls, probe
        self._channels: dict[int, _Channel | None] = {}
        self._prefix = os.path.join(area.SHM_DIR, f"labdist-psw-{index}-{os.getpid()}")
        self._lock = threading.Lock()

    def paths(self) -> dict[int, str]:
        """How each parameter server this worker called is reached: "shm" or "tcp"."""
        return {s: "tcp" if c is None else "shm" for s, c in sorted(self._channels.items())}

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            if channel is not None:
                channel.close()

    def call_all(self, calls: Calls, timeout: float) -> list:
        """Each call's result or exception, as `dask_calls` gives them: pulls, pushes and
        barrier waits to a PS on this host over its channel, everything else over Dask."""
        results: list = [None] * len(calls)
        slow, sent = [], []
        for i, (shard, method, args) in enumerate(calls):
            channel = self._channel(shard) if method in wire.METHODS else None
            if channel is None or not channel.lock.acquire(blocking=False):
                slow.append(i)
                continue
            try:
                channel.send(method, args)
                sent.append((i, channel))
            except area.NoSpace as e:
                channel.lock.release()
                channel.warn(e)
                slow.append(i)
            except OSError as e:  # the PS's end is gone: reported as Dask's would be
                self._drop(shard, channel)
                channel.lock.release()
                results[i] = e
        if slow:
            for i, r in zip(slow, self._dask_calls([calls[i] for i in slow]), strict=True):
                results[i] = r
        for i, channel in sent:
            shard = calls[i][0]
            try:
                results[i] = channel.finish(timeout, lambda s=shard: self._probe(s))
            except BaseException as e:
                self._drop(shard, channel)  # a reply may still come: never read it
                results[i] = e
            finally:
                channel.lock.release()
            if isinstance(results[i], Raised):
                results[i] = results[i].error  # the method's own: the channel is fine
            if results[i] is FALLBACK:
                if channel.refused:
                    self._drop(shard, channel)  # the store cannot map this worker's areas
                results[i] = self._dask_calls([calls[i]])[0]
        return results

    def _drop(self, shard: int, channel: _Channel) -> None:
        channel.close()
        with self._lock:
            if self._channels.get(shard) is channel:
                self._channels[shard] = None

    def _channel(self, shard: int) -> _Channel | None:
        with self._lock:
            if shard in self._channels:
                return self._channels[shard]
            if not self.enabled:
                self._channels[shard] = None
                return None
        channel = None
        probe = self._dask_calls([(shard, "shm_probe", ())])[0]
        if isinstance(probe, tuple):
            channel = _Channel.open(probe, f"{self._prefix}-{shard}", shard)
        with self._lock:
            kept = self._channels.setdefault(shard, channel)
        if channel is not None and kept is not channel:
            channel.close()  # another thread opened one first
        return kept


class _Channel:
    """One worker's socket to one store, and the area its arrays travel through."""

    @classmethod
    def open(cls, probe: tuple[str, str, str], prefix: str, shard: int) -> _Channel | None:
        path, token_path, token = probe
        if not area.can_reach([(token_path, token)]):
            return None  # another host (or another /dev/shm)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(CONNECT_TIMEOUT_S)
            sock.connect(path)
            wire.send_token(sock, token)
            if wire.recv(sock) != "ok":
                raise ConnectionError("the parameter server refused the token")
            sock.settimeout(None)
        except (OSError, EOFError) as e:
            sock.close()
            log.info("labdist: parameter server %d over Dask comms: %s", shard, e)
            return None
        return cls(sock, prefix, shard)

    def __init__(self, sock: socket.socket, prefix: str, shard: int):
        self.sock, self.prefix, self.shard = sock, prefix, shard
        self.lock = threading.Lock()  # one call at a time
        self.area: area.Mapping | None = None
        self._unlinked = True  # whether the area's file is gone (the store mapped it)
        self._request: tuple = ()
        self._warned = False
        self.refused = False  # the store could not map the area: Dask comms from now on

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        if self.area is not None:
            self._unlink()
            self.area.close()
            self.area = None

    def warn(self, error: OSError) -> None:
        if not self._warned:
            self._warned = True
            log.warning("labdist: parameter server %d: a call went over Dask comms (%s)",
                        self.shard, error)

    # -- one call -------------------------------------------------------------------------------
    def send(self, method: str, args: tuple) -> None:
        if method == "push":
            args = self._upload(args)
        self._request = (method, args)
        self._send()

    def _send(self) -> None:
        where = None if self.area is None else (self.area.path, self.area.size)
        wire.send(self.sock, (*self._request, where))

    def _upload(self, args: tuple) -> tuple:
        """Write the pushed arrays into the area; the message's pushes name where they lie
        (`InArea`). Values that do not fit (compressed, objects) travel in the message."""
        worker, items, *rest = args
        arrays = [p.value if wire.fits(p.value) else None for p in items]  # copyto: any layout
        refs, need = wire.place([(a.shape, a.dtype) for a in arrays if a is not None])
        self._ensure(need)
        out, refs = [], iter(refs)
        for push, a in zip(items, arrays, strict=True):
            if a is None:
                out.append(push)
                continue
            ref = next(refs)
            np.copyto(wire.view(self.area.bytes, ref), a)
            out.append(push.carrying(wire.InArea(ref)))
        return (worker, out, *rest)

    def _ensure(self, need: int) -> None:
        if self.area is not None and self.area.size >= need:
            return
        new = area.create(self.prefix, "-data", max(MIN_AREA, wire.aligned(need * 5 // 4)))
        if self.area is not None:
            self._unlink()
            self.area.close()
        self.area, self._unlinked = new, False

    def _unlink(self) -> None:
        if not self._unlinked:
            self._unlinked = True
            with contextlib.suppress(OSError):
                os.unlink(self.area.path)

    def finish(self, timeout: float, probe: Callable[[], concurrent.futures.Future]) -> Any:
        """The call's result, its error as `Raised`, or FALLBACK; raises what broke."""
        while True:
            status, value = self._wait(timeout, probe)
            self._unlink()  # the store has mapped the area by now: no file to leave behind
            if status == "ok":
                return self._result(value)
            if status == "error":
                return Raised(value)
            if status == "grow":  # a pull larger than the area: a larger one, and again
                try:
                    self._ensure(value)
                except area.NoSpace as e:
                    self.warn(e)
                    return FALLBACK
                self._send()
                continue
            self.refused = True  # "nomap": the store could not map the area
            return FALLBACK

    def _result(self, value: Any) -> Any:
        method, args = self._request
        if method != "pull" or value is None:
            return value
        refs, versions, at = value
        values = {v: wire.view(self.area.bytes, ref).copy()
                  for v, ref in zip(args[0], refs, strict=True)}
        return values, versions, at

    def _wait(self, timeout: float, probe: Callable[[], concurrent.futures.Future]) -> tuple:
        """The reply, watched as liveness.watched_call watches a Dask call."""
        tick = min(POLL_S, timeout / 4)
        probe_every = min(PROBE_EVERY_S, timeout / 4)
        heard = probed = time.monotonic()
        pending: concurrent.futures.Future | None = None
        try:
            while True:
                ready, _, _ = select.select([self.sock], [], [], tick)
                if ready:
                    try:
                        return wire.recv(self.sock)
                    except EOFError as e:
                        raise ConnectionResetError(str(e)) from None
                now = time.monotonic()
                if pending is not None and pending.done():
                    if not pending.cancelled() and pending.exception() is None:
                        heard = now  # it answered: alive, the call is only waiting
                    pending = None
                if now - heard >= timeout:
                    raise Unresponsive(timeout)
                if pending is None and now - probed >= probe_every:
                    probed = now
                    pending = probe()
        finally:
            if pending is not None and not pending.done():
                pending.cancel()
