"""The step protocol between the driver and its replicas, written once: send a step (or a
resume) to some ranks, gather each one's next StepEvent, and notice replicas that are lost or
late. Two transports carry the requests and events: actor calls through Dask
(`ActorStepChannel`, here) and the direct socket lane (`LaneStepChannel`, cluster/lane.py)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import pickle
from typing import Any, Protocol

from labdist.worker.replica import StepEvent

# A replica still running this long after a peer finished is told about it, so a replica
# waiting for a collective its peer will never make fails now instead of at the timeout.
NOTICE_AFTER_S = 0.2


class Replicas(Protocol):
    """What a step channel needs of its replica group (cluster/replica_group.py)."""

    loop: asyncio.AbstractEventLoop  # where `call` runs

    def lost(self, rank: int) -> bool: ...

    def lost_error(self, rank: int, detail: str) -> BaseException: ...

    def where(self, rank: int) -> str: ...

    async def call(self, rank: int, method: str, *args: Any) -> Any: ...


class StepChannel:
    """Gathering, noticing and telling; a transport subclass sends the requests (`_send`),
    waits for events (`_wait`) and stops waiting for a lost rank (`_drop`)."""

    kind = ""  # which transport: "actor" or "lane"

    def __init__(self, replicas: Replicas):
        self._replicas = replicas

    def exchange(self, run_id: int, method: str, args_per_rank: list[tuple],
                 ranks: list[int]) -> list[StepEvent]:
        """Send `method` ("run" or "resume") to each of `ranks` with its arguments; returns
        each one's next StepEvent.

        A rank whose worker left the cluster gets an error event naming it. When a wait of
        NOTICE_AFTER_S ends with ranks still running, each of them is told the state of every
        peer that reported since the last notice (Replica.peer_state).
        """
        replicas = self._replicas
        events: dict[int, StepEvent] = {}
        pending = self._send(method, args_per_rank, ranks, events)
        try:
            told: set[int] = set()
            first = True
            while len(events) < len(ranks):
                timed_out = self._wait(pending, events, NOTICE_AFTER_S, first)
                first = False
                if len(events) == len(ranks):
                    break
                for r in ranks:
                    if r not in events and replicas.lost(r):  # don't wait for a dead worker
                        self._drop(pending, r)
                        events[r] = StepEvent("error", 0, error=replicas.lost_error(
                            r, "its worker left the cluster"))
                news = [r for r in events if r not in told]
                if timed_out and news and len(events) < len(ranks):
                    told.update(news)
                    self._tell(run_id, [r for r in ranks if r not in events], news, events)
        finally:
            self._end(pending)
        return [events[r] for r in ranks]

    def _tell(self, run_id: int, waiting: list[int], news: list[int],
              events: dict[int, StepEvent]) -> None:
        """Tell each waiting replica how each peer in `news` left the run (best effort)."""
        call = self._replicas.call

        async def tell_all() -> None:
            await asyncio.gather(*(call(w, "peer_state", run_id, r, *_state(events[r]))
                                   for w in waiting for r in news), return_exceptions=True)

        asyncio.run_coroutine_threadsafe(tell_all(), self._replicas.loop).result()

    # -- the transport -------------------------------------------------------------------------
    def _send(self, method: str, args_per_rank: list[tuple], ranks: list[int],
              events: dict[int, StepEvent]) -> Any:
        """Send the requests; a rank that cannot be reached gets its error event in `events`
        now. Returns what `_wait`, `_drop` and `_end` need to know of the requests in flight."""
        raise NotImplementedError

    def _wait(self, pending: Any, events: dict[int, StepEvent], timeout: float,
              first: bool) -> bool:
        """Wait up to `timeout` for events, adding those that came to `events` (the first wait
        of an exchange may wait for them all). Returns whether the whole `timeout` passed
        with ranks still out."""
        raise NotImplementedError

    def _drop(self, pending: Any, rank: int) -> None:
        """Stop waiting for `rank`."""
        raise NotImplementedError

    def _end(self, pending: Any) -> None:
        """The exchange is over (or failed)."""

    def close(self) -> None:
        """Release the transport."""


class ActorStepChannel(StepChannel):
    """Steps as actor calls (Replica.run, Replica.resume) through Dask's comms: issued on the
    client's event loop, their results awaited by the calling thread."""

    kind = "actor"

    def _send(self, method, args_per_rank, ranks, events) -> dict[concurrent.futures.Future, int]:
        call, loop = self._replicas.call, self._replicas.loop
        return {asyncio.run_coroutine_threadsafe(call(r, method, *args), loop): r
                for r, args in zip(ranks, args_per_rank, strict=True)}

    def _wait(self, pending, events, timeout, first) -> bool:
        done, _ = concurrent.futures.wait(
            pending, timeout, concurrent.futures.ALL_COMPLETED if first  # the common case:
            else concurrent.futures.FIRST_COMPLETED)  # everyone answers in one wait
        for future in done:
            rank = pending.pop(future)
            try:
                answer = future.result()  # the event, pickled by the replica (Replica._reply)
                events[rank] = pickle.loads(answer) if isinstance(answer, bytes) else answer
            except Exception as e:  # a lost worker, or an error outside the step itself
                events[rank] = StepEvent("error", 0, error=e)
        return bool(pending) and (first or not done)

    def _drop(self, pending, rank) -> None:
        for future, r in pending.items():
            if r == rank:
                future.cancel()
                del pending[future]
                return


def _state(event: StepEvent) -> tuple[str, Any]:
    """How a replica left the run, as Replica.peer_state tells its peers."""
    if event.kind == "error":
        return "failed", f"{type(event.error).__name__}: {event.error}"
    return event.kind, event.seq
