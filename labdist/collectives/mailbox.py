"""Where peer messages wait until their collective asks for them. Lives on a worker's event loop.

Messages are keyed by (run id, sequence number, phase, source rank): a message can never be
taken by the wrong collective (or the wrong phase of a two-phase one), and messages of an
aborted run are dropped when the next run starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from labdist.errors import (
    CollectiveMismatchError,
    CollectiveTimeoutError,
    PeerAbortedError,
    ReplicaLostError,
)


class Mailbox:
    """One replica's inbox for one replica group. Used from the event loop only."""

    def __init__(self) -> None:
        self._messages: dict[tuple[int, int, int, int], tuple[Any, Any]] = {}
        self._wakeups: dict[tuple[int, int, int], asyncio.Event] = {}
        # (run, rank) -> ("done", n_collectives) | ("merge", seq) | ("failed", error text)
        self._peer_states: dict[tuple[int, int], tuple[str, Any]] = {}
        self._abandoned: str | None = None  # why every wait ends now: the driver is gone
        self._arrived: dict[tuple[int, int, int, int], float] = {}  # wall time of each message
        self.last_arrival = 0.0  # when the last message of the latest `collect` arrived

    def put(self, run: int, seq: int, phase: int, src: int, sig: Any, payload: Any) -> None:
        self._messages[(run, seq, phase, src)] = (sig, payload)
        self._arrived[(run, seq, phase, src)] = time.time()
        event = self._wakeups.get((run, seq, phase))
        if event is not None:
            event.set()

    def peer_state(self, run: int, rank: int, state: str, detail: Any) -> None:
        """Told by the driver: peer `rank` has left the collective stream of `run`."""
        self._peer_states[(run, rank)] = (state, detail)
        for key, event in self._wakeups.items():
            if key[0] == run:
                event.set()

    def abandon(self, why: str) -> None:
        """The driver is gone: a collective waiting here (or on shared memory, which asks
        `_raise_if_gone`) ends now, not at its timeout, so the replica can let go at once."""
        self._abandoned = why
        for event in self._wakeups.values():
            event.set()

    def holds_any(self) -> bool:
        """Whether anything is kept that a new run could drop (safe from any thread: a
        message that arrives after this said no belongs to the new run or is dropped at the
        next run's start)."""
        return bool(self._messages or self._peer_states)

    def start_run(self, run: int) -> None:
        """Drop everything left over from earlier runs (an aborted run leaves messages behind)."""
        for key in [k for k in self._messages if k[0] < run]:
            del self._messages[key]
            self._arrived.pop(key, None)
        for key in [k for k in self._peer_states if k[0] < run]:
            del self._peer_states[key]

    async def collect(
        self, run: int, seq: int, phase: int, sources: list[int], timeout: float, what: str
    ) -> dict[int, tuple[Any, Any]]:
        """Wait for one message from each of `sources` for collective `seq` (phase `phase`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        event = self._wakeups.setdefault((run, seq, phase), asyncio.Event())
        try:
            while True:
                missing = [s for s in sources if (run, seq, phase, s) not in self._messages]
                if not missing:
                    self.last_arrival = max(
                        self._arrived.pop((run, seq, phase, s), 0.0) for s in sources)
                    return {s: self._messages.pop((run, seq, phase, s)) for s in sources}
                for s in missing:
                    self._raise_if_gone(run, seq, s, what)
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise CollectiveTimeoutError(
                        f"collective #{seq} ({what}) waited {timeout:g} s for replica(s) "
                        f"{missing}; they never reached it. Raise collective_timeout= on the "
                        "strategy if a step is legitimately this slow."
                    )
                event.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), remaining)
        finally:
            self._wakeups.pop((run, seq, phase), None)

    def _raise_if_gone(self, run: int, seq: int, rank: int, what: str) -> None:
        if self._abandoned is not None:
            raise ReplicaLostError(
                f"collective #{seq} ({what}) stopped waiting for replica {rank}: "
                f"{self._abandoned}")
        state = self._peer_states.get((run, rank))
        if state is None:
            return
        kind, detail = state
        if kind == "failed":
            raise PeerAbortedError(
                f"replica {rank} failed while this replica waited in collective #{seq} ({what}): "
                f"{detail}"
            )
        if kind == "done" and detail < seq:  # its message for `seq` may still be in flight
            raise CollectiveMismatchError(
                f"replicas took different paths: replica {rank} finished its step function after "
                f"{detail} collective(s), but this replica is waiting in collective #{seq} "
                f"({what}). Every replica must make the same collective calls in the same order."
            )
        if kind == "merge" and detail <= seq:
            raise CollectiveMismatchError(
                f"replicas took different paths: replica {rank} is in merge_call (collective "
                f"#{detail}) while this replica is in collective #{seq} ({what})."
            )
