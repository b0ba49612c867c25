"""The step protocol between the driver and its replicas, written once: send a step (or a
resume) to some ranks, gather each one's next StepEvent, and notice replicas that are lost or
late. Two transports carry the requests and events: actor calls through Dask
(`ActorStepChannel`, here) and the direct socket lane (`LaneStepChannel`,
cluster/lane_channel.py)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import pickle
import time
from typing import Any, Protocol

from labdist import interrupts
from labdist.errors import PeerAbortedError, ReplicaUnresponsiveError, UnreadableAnswerError
from labdist.replica.step_event import ResumeStep, RunStep, StepEvent, StepRequest
from labdist.timing import phases

# A replica still running this long after a peer finished is told about it, so a replica
# waiting for a collective its peer will never make fails now instead of at the timeout.
NOTICE_AFTER_S = 0.2
# Once one replica has reported, the others have collective_timeout plus this to report too:
# a live replica waiting on a reported peer is told at once, so only a frozen worker (or a
# step far longer on one replica than on the others) is still silent then.
LATE_MARGIN_S = 5.0
# A notice to a replica is given up after this (a frozen worker never answers one).
TELL_TIMEOUT_S = 1.0
# An interrupted driver waits this long for the step in flight to end on every replica before
# it raises KeyboardInterrupt (■ answers within a second), and the next call waits as long
# again before it tells replicas still in that step that it ended early.
GRACE_S = 0.5

_ENDED_EARLY = ("the driver stopped waiting for this step (strategy.run was interrupted, or a "
                "replica did not answer)")


class ReplicaCalls(Protocol):
    """What a step channel needs of its replica group (cluster/dask_group.py)."""

    loop: asyncio.AbstractEventLoop  # where `call` runs

    def lost(self, rank: int) -> bool: ...

    def lost_error(self, rank: int, detail: str) -> BaseException: ...

    def where(self, rank: int) -> str: ...

    async def call(self, rank: int, method: str, *args: Any) -> Any: ...


class StepChannel:
    """Gathering, noticing, telling and bounding; a transport subclass sends the requests
    (`_send`), waits for events (`_wait`), stops waiting for a rank (`_drop`, `_forget`) and
    waits again for answers an earlier exchange left (`_collect`).

    One thread at a time (the strategy's lock). An exchange that ends before every rank
    answered (a late replica, the driver interrupted) leaves those answers owed; `settle`
    collects them, and releases replicas left in merge_call, before the next work is sent,
    so no exchange ever reads an earlier exchange's answer or finds a replica busy."""

    kind = ""  # which transport: "actor" or "lane"

    def __init__(self, replicas: ReplicaCalls, collective_timeout: float | None = None):
        self._replicas = replicas
        self._timeout = collective_timeout
        # how long the driver waits for a replica once a peer has reported (None: forever)
        self.patience = None if collective_timeout is None else collective_timeout + LATE_MARGIN_S
        self._owed: dict[int, tuple[float, Any]] = {}  # rank -> (asked at, what `_collect` takes)
        self._merging: set[int] = set()  # ranks whose last answer was "merge": they wait
        self._run: tuple[int, list[int]] = (0, [])  # the last run started: id, ranks
        self._told_run = 0  # the last run whose owed replicas were told it ended early

    def step(self, run_id: int, requests: list[StepRequest],
             ranks: list[int]) -> list[StepEvent]:
        """Send each of `ranks` its request (all `RunStep`s, or all `ResumeStep`s); returns
        each one's next StepEvent.

        A rank whose worker left the cluster gets an error event naming it. When a wait of
        NOTICE_AFTER_S ends with ranks still running, each of them is told the state of every
        peer that reported since the last notice (Replica.peer_state). Once one rank has
        reported, the others have `patience` seconds; a rank still silent then gets a
        ReplicaUnresponsiveError event, and its answer is collected by the next `settle`.
        """
        events: dict[int, StepEvent] = {}
        if isinstance(requests[0], RunStep):
            self.settle(ranks)
            self._run = (run_id, list(ranks))
            sent = ranks
        else:  # never to a replica owing an answer: it would read that answer as this one's
            sent = [r for r in ranks if r not in self._owed]
            events = {r: StepEvent("error", 0, error=PeerAbortedError(
                f"{self._replicas.where(r)} is not waiting in merge_call: it has not answered "
                "an earlier request")) for r in ranks if r in self._owed}
            requests = [q for r, q in zip(ranks, requests, strict=True)
                        if r not in self._owed]
        asked = time.monotonic()
        pending: Any = None
        late: list[int] = []
        try:
            try:
                with interrupts.deferred():  # every rank gets its request, or none does
                    pending = self._send(requests, sent, events)
                    phases.driver_sent(run_id)  # the driver's part of the step ends (phases.py)
                    self._merging.difference_update(sent)
                self._gather(run_id, ranks, sent, pending, events, asked, late)
            except KeyboardInterrupt:  # the step in flight ends on every replica, first
                if pending is not None:
                    self._finish_in_flight(pending, sent, events)
                raise
        finally:
            if pending is not None:  # sent: what is still out is owed
                phases.driver_arrived(run_id)
                for r in sent:
                    if r in late or r not in events:  # it owes an answer (late, interrupted)
                        self._owed[r] = (asked, self._drop(pending, r))
                    elif events[r].kind == "merge":
                        self._merging.add(r)
                self._end(pending)
        return [events[r] for r in ranks]

    def _gather(self, run_id, ranks, sent, pending, events, asked, late) -> None:
        """Wait for every rank's event, telling the running ones of their peers' states and
        giving up on late ones (listed in `late`)."""
        told: set[int] = set()
        first, first_report = True, math.inf
        while len(events) < len(ranks):
            timed_out = self._wait(pending, events, NOTICE_AFTER_S, first)
            first = False
            if len(events) == len(ranks):
                break
            self._drop_lost(pending, sent, events)
            now = time.monotonic()
            first_report = min(first_report, now) if events else first_report
            if self.patience is not None and now - first_report > self.patience:
                late.extend(r for r in ranks if r not in events)
                reporter = min(events)
                for r in late:
                    events[r] = StepEvent("error", 0, error=self._late_error(
                        r, now - asked, reporter))
                break
            news = [r for r in events if r not in told]
            if timed_out and news and len(events) < len(ranks):
                told.update(news)
                self._tell(run_id, [r for r in ranks if r not in events],
                           {r: _state(events[r]) for r in news})

    def _finish_in_flight(self, pending, sent, events) -> None:
        """The driver was interrupted while the replicas ran: let the step they are in end on
        every one of them (up to GRACE_S), so the interrupt finds them idle and equal. A step
        longer than that stays owed: the next call's `settle` collects it."""
        deadline = time.monotonic() + GRACE_S
        while any(r not in events for r in sent) and time.monotonic() < deadline:
            self._wait(pending, events, min(NOTICE_AFTER_S, deadline - time.monotonic()),
                       False)
            self._drop_lost(pending, sent, events)

    def settle(self, ranks: list[int] | None = None, release: bool = True) -> None:
        """Before new work for `ranks` (default: all): collect the answers earlier exchanges
        left owed, after telling those replicas their run ended (so their collectives fail at
        once), and (with `release`: before a new run, not while a merge_call function reads
        variables) release replicas left in merge_call with a PeerAbortedError. Waits up to
        `patience` seconds; a rank still silent then raises ReplicaUnresponsiveError (and
        stays owed: the next call tries again)."""
        if not self._owed and not (release and self._merging):
            return
        wanted = set(self._owed) | (self._merging if release else set())
        todo = sorted(wanted if ranks is None else wanted & set(ranks))
        if not todo:
            return
        run_id, run_ranks = self._run
        owed = [r for r in todo if r in self._owed]
        if owed and self._told_run != run_id:  # a step that was interrupted may end by itself
            self._await_owed({r: self._owed[r][1] for r in owed}, time.monotonic() + GRACE_S)
            owed = [r for r in owed if r in self._owed]
        if owed and self._told_run != run_id:
            self._told_run = run_id
            self._tell(run_id, owed, {p: ("failed", _ENDED_EARLY) for p in run_ranks})
        deadline = time.monotonic() + (math.inf if self.patience is None else self.patience)
        while True:
            if release:
                self._release([r for r in todo if r in self._merging])
            waiting = {r: self._owed[r][1] for r in todo if r in self._owed}
            if not waiting:
                return
            self._await_owed(waiting, deadline)
            silent = [r for r in todo if r in self._owed]
            if silent and time.monotonic() >= deadline:
                raise ReplicaUnresponsiveError("; ".join(
                    f"{self._replicas.where(r)} has not answered for "
                    f"{time.monotonic() - self._owed[r][0]:.0f} s" for r in silent)
                    + ": it is still in the step of an earlier strategy.run that ended early "
                    "(interrupted, or failed while it did not answer). Its worker may be frozen "
                    "(stopped, swapping, in a debugger) or stuck in native code, or that step "
                    "is still computing. Nothing new was sent. Call again once it is back (the "
                    f"driver waits up to {self.patience:g} s each time), or close this "
                    "strategy and create a new one")

    def _release(self, ranks: list[int]) -> None:
        """Resume replicas waiting in merge_call with a PeerAbortedError (their answers become
        owed, collected by the caller)."""
        if not ranks:
            return
        events: dict[int, StepEvent] = {}
        error = PeerAbortedError(f"aborted: {_ENDED_EARLY}")
        with interrupts.deferred():  # sent and noted as owed, or not sent
            pending = self._send([ResumeStep(None, error)] * len(ranks), ranks, events)
            self._merging.difference_update(ranks)
            now = time.monotonic()
            for r in ranks:
                if r not in events:  # sent: its answer is owed
                    self._owed[r] = (now, self._drop(pending, r))
            self._end(pending)

    def _await_owed(self, waiting: dict[int, Any], deadline: float) -> None:
        """Wait (until `deadline`) for the owed answers of `waiting`; those that come are no
        longer owed (a "merge" one means the replica waits in merge_call again)."""
        got: dict[int, StepEvent] = {}
        pending = self._collect(waiting)
        try:
            while len(got) < len(waiting) and time.monotonic() < deadline:
                self._wait(pending, got, min(NOTICE_AFTER_S, deadline - time.monotonic()),
                           False)
                self._drop_lost(pending, list(waiting), got)
        finally:
            for r in waiting:
                if r in got:
                    del self._owed[r]
                    if got[r].kind == "merge":
                        self._merging.add(r)
                else:
                    self._owed[r] = (self._owed[r][0], self._drop(pending, r))
            self._end(pending)

    def _drop_lost(self, pending: Any, ranks: list[int], events: dict[int, StepEvent]) -> None:
        """Stop waiting for ranks whose worker left the cluster: an error event each."""
        for r in ranks:
            if r not in events and self._replicas.lost(r):
                self._forget(self._drop(pending, r))
                events[r] = StepEvent("error", 0, error=self._replicas.lost_error(
                    r, "its worker left the cluster"))

    def _late_error(self, rank: int, waited: float, reporter: int
                    ) -> ReplicaUnresponsiveError:
        first = self._replicas.where(reporter)
        return ReplicaUnresponsiveError(
            f"{self._replicas.where(rank)} did not answer for {waited:.0f} s, "
            f"{self.patience:g} s after {first} had reported (collective_timeout="
            f"{self._timeout:g} s plus {LATE_MARGIN_S:g} s): its worker may be frozen "
            "(stopped, swapping, in a debugger) or stuck in native code, or its step computes "
            "far longer than its peers'. The driver stopped waiting for it; the next call "
            f"waits for it to finish that step (up to {self.patience:g} s). If its worker does "
            "not come back, close this strategy and create a new one (once Dask removes a dead "
            "worker, strategy.recover() re-forms the replicas without it)")

    def _tell(self, run_id: int, waiting: list[int], states: dict[int, tuple[str, Any]]) -> None:
        """Tell each waiting replica how each peer in `states` left the run: best effort, sent
        without waiting, and given up after TELL_TIMEOUT_S (a frozen worker never answers)."""
        call = self._replicas.call

        async def tell_all() -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(
                    *(call(w, "peer_state", run_id, r, *state)
                      for w in waiting for r, state in states.items() if r != w),
                    return_exceptions=True), TELL_TIMEOUT_S)

        asyncio.run_coroutine_threadsafe(tell_all(), self._replicas.loop)

    # -- the transport -------------------------------------------------------------------------
    def _send(self, requests: list[StepRequest], ranks: list[int],
              events: dict[int, StepEvent]) -> Any:
        """Send each rank its request (one object for ranks given the very same request); a
        rank that cannot be reached gets its error event in `events` now. Returns what
        `_wait`, `_drop` and `_end` need to know of the requests in flight."""
        raise NotImplementedError

    def _wait(self, pending: Any, events: dict[int, StepEvent], timeout: float,
              first: bool) -> bool:
        """Wait up to `timeout` for events, adding those that came to `events` (the first wait
        of an exchange may wait for them all). Returns whether the whole `timeout` passed
        with ranks still out."""
        raise NotImplementedError

    def _drop(self, pending: Any, rank: int) -> Any:
        """Stop waiting for `rank` here; returns what `_collect` needs to wait for its answer
        later (or `_forget` to give it up)."""
        raise NotImplementedError

    def _forget(self, kept: Any) -> None:
        """Give up an answer `_drop` kept (its replica is lost)."""

    def _collect(self, kept: dict[int, Any]) -> Any:
        """A `pending` for `_wait` on answers `_drop` kept: {rank: what it returned}."""
        raise NotImplementedError

    def _end(self, pending: Any) -> None:
        """The exchange is over (or failed)."""

    def close(self) -> None:
        """Release the transport."""


class ActorStepChannel(StepChannel):
    """Steps as actor calls (Replica.step) through Dask's comms: issued on the client's event
    loop, their results awaited by the calling thread."""

    kind = "actor"

    def _send(self, requests, ranks, events) -> dict[concurrent.futures.Future, int]:
        call, loop = self._replicas.call, self._replicas.loop
        return {asyncio.run_coroutine_threadsafe(call(r, "step", request), loop): r
                for r, request in zip(ranks, requests, strict=True)}

    def _wait(self, pending, events, timeout, first) -> bool:
        done, _ = concurrent.futures.wait(
            pending, timeout, concurrent.futures.ALL_COMPLETED if first  # the common case:
            else concurrent.futures.FIRST_COMPLETED)  # everyone answers in one wait
        with interrupts.deferred():  # an answer taken off `pending` lands in `events`
            for future in done:
                rank = pending.pop(future)
                try:
                    answer = future.result()  # the event, pickled by the replica
                except Exception as e:  # a lost worker, or an error outside the step itself
                    events[rank] = StepEvent("error", 0, error=e)
                    continue
                try:
                    events[rank] = pickle.loads(answer) if isinstance(answer, bytes) else answer
                except Exception as e:  # read whole, but not unpicklable here
                    events[rank] = StepEvent("error", 0, error=unreadable(
                        self._replicas.where(rank), e))
        return bool(pending) and (first or not done)

    def _drop(self, pending, rank) -> concurrent.futures.Future | None:
        for future, r in pending.items():
            if r == rank:
                del pending[future]
                return future
        return None

    def _forget(self, kept) -> None:
        if kept is not None:
            kept.cancel()

    def _collect(self, kept) -> dict[concurrent.futures.Future, int]:
        return {future: r for r, future in kept.items() if future is not None}


def unreadable(where: str, error: Exception) -> UnreadableAnswerError:
    """The error of an answer that arrived whole but does not unpickle here."""
    return UnreadableAnswerError(f"the answer of {where} cannot be unpickled on the driver: "
                                 f"{type(error).__name__}: {error}")


def _state(event: StepEvent) -> tuple[str, Any]:
    """How a replica left the run, as Replica.peer_state tells its peers."""
    if event.kind == "error":
        return "failed", f"{type(event.error).__name__}: {event.error}"
    return event.kind, event.seq
