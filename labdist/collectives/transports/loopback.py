"""The test double: N ranks as threads of one process, exchanging through one condition
variable, so the collective algorithms can be tested in milliseconds without a cluster (as
httpx's MockTransport stands in for the network). A rank can be made late, or left out to
play a peer that never comes; waits time out as on a cluster. Not in the registry: a replica
group's workers are separate processes.
"""

from __future__ import annotations

import pickle
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

from labdist.collectives.communicator import Communicator
from labdist.collectives.transports.protocol import HOST, Endpoint
from labdist.errors import CollectiveMismatchError, CollectiveTimeoutError, PeerAbortedError


class LoopbackHub:
    """The shared medium of `world` in-process ranks."""

    def __init__(self, world: int, timeout: float = 2.0):
        self.world = world
        self.timeout = timeout
        self._cond = threading.Condition()
        self._messages: dict[tuple, Any] = {}  # (run, seq, phase, src, dst) -> pickled message
        self._gone: dict[int, str | None] = {}  # rank -> its error, None if it returned
        self._runs = 0

    def communicators(self) -> list[Communicator]:
        peers = [f"loopback://{r}" for r in range(self.world)]
        comms = []
        for r in range(self.world):
            endpoint = Endpoint("loopback", r, peers, self.timeout)
            comms.append(Communicator(endpoint, LoopbackTransport(endpoint, self)))
        return comms

    def run(self, fn: Callable[[Communicator], Any], ranks: list[int] | None = None,
            delays: dict[int, float] | None = None) -> list[Any]:
        """`fn(comm)` on each of `ranks` (default: all) at once, each on its own thread, after
        its delay; returns each rank's result or the exception it raised, in rank order.
        Ranks left out never come."""
        ranks = list(range(self.world)) if ranks is None else ranks
        comms = self.communicators()
        results: dict[int, Any] = {}
        with self._cond:  # a fresh run: what the last one left behind is ignored
            self._runs += 1
            self._gone.clear()
            self._messages.clear()
        run = self._runs

        def body(r: int) -> None:
            time.sleep((delays or {}).get(r, 0.0))
            comms[r].start_run(run)
            try:
                results[r] = fn(comms[r])
                ending = None
            except Exception as e:
                results[r] = e
                ending = f"{type(e).__name__}: {e}"
            with self._cond:
                self._gone[r] = ending
                self._cond.notify_all()

        threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in ranks]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return [results[r] for r in ranks]


class LoopbackTransport:
    """One rank's side of a LoopbackHub. Messages are pickled on the way, so ranks never share
    arrays (as over a real transport) and payloads that could not travel fail here too."""

    name: ClassVar[str] = "loopback"
    layer: ClassVar[str] = HOST
    requirement: ClassVar[str] = "every rank in this process"
    alone: ClassVar[bool] = True
    bootstraps: ClassVar[bool] = False
    last_arrival: float | None = None
    reads_in_place: ClassVar[bool] = False
    cores: int = 1

    def __init__(self, endpoint: Endpoint, hub: LoopbackHub):
        self.endpoint = endpoint
        self.hub = hub
        self.run = 0

    def probe(self) -> int:
        return self.endpoint.rank

    def connect(self, probes: list[Any]) -> bool:
        return True

    def start_run(self, run: int) -> None:
        self.run = run

    def exchange(self, seq, phase, sig, payload, what, per_peer) -> list[tuple[Any, Any]]:
        me, world, hub = self.endpoint.rank, self.endpoint.world, self.hub
        others = [r for r in range(world) if r != me]
        deadline = time.monotonic() + self.endpoint.timeout
        with hub._cond:
            for r in others:
                message = (sig, payload[r] if per_peer else payload)
                hub._messages[(self.run, seq, phase, me, r)] = pickle.dumps(message, protocol=5)
            hub._cond.notify_all()
            keys = {r: (self.run, seq, phase, r, me) for r in others}
            while missing := [r for r in others if keys[r] not in hub._messages]:
                for r in (r for r in missing if r in hub._gone):
                    _raise_gone(r, hub._gone[r], seq, what)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise CollectiveTimeoutError(
                        f"collective #{seq} ({what}) waited {self.endpoint.timeout:g} s for "
                        f"replica(s) {missing}; they never reached it")
                hub._cond.wait(remaining)
            got = {r: pickle.loads(hub._messages.pop(keys[r])) for r in others}
        got[me] = (sig, payload[me] if per_peer else payload)
        return [got[r] for r in range(world)]

    def close(self) -> None:
        pass


def _raise_gone(rank: int, error: str | None, seq: int, what: str) -> None:
    """A peer's function ended without this message: as the mailbox reports it."""
    if error is not None:
        raise PeerAbortedError(f"replica {rank} failed while this replica waited in "
                               f"collective #{seq} ({what}): {error}")
    raise CollectiveMismatchError(
        f"replicas took different paths: replica {rank} finished its step function, but this "
        f"replica is waiting in collective #{seq} ({what})")
