"""When a replica's driver is gone: a driver killed with `kill -9` (or whose kernel died) never
calls `Replica.close`, and on an external cluster its replicas' threads, sockets and
shared-memory files would stay until the worker ends, more with each crash.

Two signs, whichever comes first: its lane dropped without the driver's goodbye, or the
worker no longer holds the actor's task (the scheduler released it when the driver's client
went away: the only sign where steps go over actor calls, transport="tcp").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

logger = logging.getLogger("labdist.replica")

HELD_CHECK_S = 1.0  # how often a replica checks that its worker still holds its actor task


class DriverWatch:
    """Calls `vanished(why)` once, on the worker's event loop, when the driver is gone."""

    def __init__(self, worker: Any, key: Any, vanished: Callable[[str], Awaitable[None]]):
        self._worker, self._key, self._vanished = worker, key, vanished
        self._loop: asyncio.AbstractEventLoop = worker.loop.asyncio_loop
        self._task: asyncio.Task | None = None
        self._fired = False
        self._loop.call_soon_threadsafe(self._start)  # made on a worker thread

    def _start(self) -> None:
        if not self._fired:
            self._task = self._loop.create_task(self._check_held())

    async def _check_held(self) -> None:
        while True:
            await asyncio.sleep(HELD_CHECK_S)
            if self._key is not None and self._key not in self._worker.state.tasks:
                self._task = None  # ending on its own: nothing to cancel
                await self._fire("the worker released its actor (the driver's client left)")
                return

    def lane_dropped(self) -> None:
        """From the lane's thread: the driver's connection ended without a goodbye."""
        with contextlib.suppress(RuntimeError):  # the worker's loop already closed
            self._loop.call_soon_threadsafe(
                lambda: self._loop.create_task(self._fire("its lane closed without a goodbye")))

    async def _fire(self, why: str) -> None:
        vanished = self._vanished
        if vanished is None:
            return
        self.stop()
        logger.warning("labdist: the driver of %s is gone (%s); releasing it", self._key, why)
        await vanished(why)

    def stop(self) -> None:
        """Watch no more (the replica is closing); on the event loop. Lets go of the replica
        too: a cycle would keep its shared-memory views (and their files' fds) until the next
        full garbage collection."""
        self._fired, self._vanished = True, None
        if self._task is not None:
            self._task.cancel()
            self._task = None
