"""Telling a frozen parameter server from a busy one: a call to a parameter server (from the
driver or from a worker) that has not returned after a moment is watched with a cheap liveness
call (`info`) to the same actor, repeated while it waits.

A PS whose event loop answers is alive, however long the call itself waits (a sync barrier
held up by a straggler, a staleness-bound wait, a large update on the store's threads), so it
is never declared lost; a PS that answers nothing at all (a SIGSTOPped or hung process, a
machine that vanished from the network) is declared lost `timeout` seconds after it was last
heard from. A killed PS is noticed sooner, by its connection failing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from labdist import actor_call as remote

PROBE_EVERY_S = 1.0  # how often a long call checks that its PS still answers (at most)
POLL_S = 0.25  # how often a waiting call looks at its clock (and the caller's `check`)
PING = "info"  # a method every labdist actor has, answered on its event loop at once


class Unresponsive(Exception):
    """Neither the call nor any liveness check got an answer for `seconds`."""

    def __init__(self, seconds: float):
        super().__init__(f"no answer for {seconds:g} s")
        self.seconds = seconds


async def watched_call(rpc, address: str, key: str, method: str, *args: Any, timeout: float,
                       check: Callable[[], None] | None = None) -> Any:
    """`remote.call(rpc, address, key, method, *args)`, raising `Unresponsive(timeout)` once
    the actor has answered nothing (neither this call nor a liveness check) for `timeout`
    seconds. `check()` runs on every poll and may raise (the caller's own lost test)."""
    loop = asyncio.get_running_loop()
    call = asyncio.ensure_future(remote.call(rpc, address, key, method, *args))
    call.add_done_callback(_retrieve)
    tick = min(POLL_S, timeout / 4)
    probe_every = min(PROBE_EVERY_S, timeout / 4)
    heard = probed = loop.time()
    probe: asyncio.Future | None = None
    try:
        while True:
            await asyncio.wait({call}, timeout=tick)
            if call.done():
                return call.result()
            if check is not None:
                check()
            now = loop.time()
            if probe is not None and probe.done():
                if not probe.cancelled() and probe.exception() is None:
                    heard = now  # it answered: alive, the call is only waiting
                probe = None  # a failed probe is no answer; the next one tries again
            if now - heard >= timeout:
                raise Unresponsive(timeout)
            if probe is None and now - probed >= probe_every:
                probed = now
                probe = asyncio.ensure_future(remote.call(rpc, address, key, PING))
                probe.add_done_callback(_retrieve)
    finally:
        for task in (call, probe):
            if task is not None and not task.done():
                task.cancel()  # Dask closes a cancelled call's connection: none is reused


def _retrieve(task: asyncio.Future) -> None:
    """Mark a task's error as seen (a probe or an abandoned call fails quietly)."""
    if not task.cancelled():
        task.exception()
