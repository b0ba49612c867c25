"""The driver's end of the fast lane (the replica's end and the framing are in replica/lane.py):
one plain socket per replica carrying `strategy.run`'s step requests and events straight from
the calling thread, with no event loop in between."""

from __future__ import annotations

import contextlib
import pickle
import selectors
import socket
import time
from typing import Any

from labdist import interrupts
from labdist.actor_call import unsendable
from labdist.cluster.step_channel import ReplicaCalls, StepChannel, unreadable
from labdist.replica.lane import GOODBYE, READY, dumps, recv_message, send_message
from labdist.replica.step_event import RunStep, StepEvent, StepRequest


class LaneClient:
    """The driver's end of one replica's lane (used by one thread at a time). Connecting and
    the handshake (the token, then the replica's READY) take at most `timeout`; then the socket
    is non-blocking, and a message that started must go on within the lane's IO timeout."""

    def __init__(self, address: tuple[str, int], token: str, timeout: float,
                 local_name: str | None = None):
        self.address = tuple(address)
        deadline = time.monotonic() + timeout
        self.sock = _local(local_name, timeout) or socket.create_connection(self.address,
                                                                           timeout=timeout)
        self.local = self.sock.family == socket.AF_UNIX
        try:
            if not self.local:
                self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock.settimeout(max(deadline - time.monotonic(), 1e-3))
            send_message(self.sock, token.encode())
            if recv_message(self.sock, limit=len(READY)) != READY:
                raise ConnectionRefusedError(f"the replica's lane at {self.address} refused "
                                             "the token")
            self.sock.setblocking(False)
        except BaseException:
            self.sock.close()
            raise

    def send(self, payload: bytes) -> None:
        send_message(self.sock, payload)

    def receive(self) -> Any:
        body = recv_message(self.sock)
        if body is None:
            raise ConnectionError("the replica's lane closed")
        return pickle.loads(body)

    def close(self) -> None:
        """Say goodbye (the replica stays: only a vanished driver sends none), then close."""
        with contextlib.suppress(OSError):
            send_message(self.sock, GOODBYE, timeout=0)  # never waits
        with contextlib.suppress(OSError):
            self.sock.close()


def _local(name: str | None, timeout: float) -> socket.socket | None:
    """A connection to the replica's Unix socket (replica/lane.py), if it is on this host."""
    if name is None:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(name)
        return sock
    except OSError:  # another host (or network namespace): TCP
        sock.close()
        return None


def connect_lanes(ends: list[tuple | None], timeout: float) -> list[LaneClient] | None:
    """A lane to each replica from what its `Replica.lane_open` returned (its TCP address,
    token, and the name of its Unix socket, preferred where it is reached); None when any
    replica has none (Dask's comms use TLS) or not every one is reached within `timeout`."""
    if None in ends:
        return None
    deadline = time.monotonic() + timeout
    lanes: list[LaneClient] = []
    try:
        for address, token, *local in ends:
            lanes.append(LaneClient(address, token, max(deadline - time.monotonic(), 1e-3),
                                    *local))
    except OSError:
        for lane in lanes:
            lane.close()
        return None
    return lanes


class LaneStepChannel(StepChannel):
    """Steps over the lanes: the calling thread writes each replica's request, then waits for
    the events on a selector."""

    kind = "lane"

    def __init__(self, replicas: ReplicaCalls, lanes: list[LaneClient],
                 collective_timeout: float | None = None):
        super().__init__(replicas, collective_timeout)
        self._lanes = lanes
        self._spare: selectors.BaseSelector | None = None  # reused: one epoll, not one a step

    def _selector(self) -> selectors.BaseSelector:
        selector, self._spare = self._spare, None
        return selector if selector is not None else selectors.PollSelector()

    def _send(self, requests, ranks, events) -> selectors.BaseSelector:
        payloads = []
        made: dict[int, bytes] = {}  # ranks given the very same request share one pickle
        for r, request in zip(ranks, requests, strict=True):
            if id(request) not in made:
                try:
                    made[id(request)] = dumps(request)
                except Exception as e:
                    raise unsendable(_name(request), self._replicas.where(r), e) from None
            payloads.append(made[id(request)])
        selector = self._selector()
        try:  # the caller holds interrupts back: every rank gets its request, or none does
            for r, payload in zip(ranks, payloads, strict=True):
                lane = self._lanes[r]
                try:
                    lane.send(payload)
                    selector.register(lane.sock, selectors.EVENT_READ, r)
                except OSError as e:
                    events[r] = StepEvent("error", 0,
                                          error=self._replicas.lost_error(r, repr(e)))
        except BaseException:
            self._end(selector)
            raise
        return selector

    def _wait(self, pending, events, timeout, first) -> bool:
        ready = pending.select(timeout)
        # never half a message (the next read would take the rest for a new one), and a
        # message read always lands in `events` (or the next exchange would read its answer)
        with interrupts.deferred():
            for key, _ in ready:
                events[key.data] = self._receive(key.data)
                pending.unregister(key.fileobj)
        return not ready

    def _receive(self, r: int) -> StepEvent:
        try:
            return self._lanes[r].receive()
        except (OSError, EOFError) as e:
            return StepEvent("error", 0, error=self._replicas.lost_error(r, repr(e)))
        except Exception as e:  # read whole, but not unpicklable here
            return StepEvent("error", 0, error=unreadable(self._replicas.where(r), e))

    def _drop(self, pending, rank) -> None:
        with contextlib.suppress(KeyError, ValueError):
            pending.unregister(self._lanes[rank].sock)

    def _collect(self, kept) -> selectors.BaseSelector:
        selector = self._selector()
        for r in kept:
            selector.register(self._lanes[r].sock, selectors.EVENT_READ, r)
        return selector

    def _end(self, pending) -> None:
        """Keep one emptied selector for the next exchange (close any other)."""
        try:
            for key in list(pending.get_map().values()):
                pending.unregister(key.fileobj)
        except (OSError, ValueError, KeyError):
            pending.close()
            return
        if self._spare is None:
            self._spare = pending
        else:
            pending.close()

    def close(self) -> None:
        if self._spare is not None:
            self._spare.close()
            self._spare = None
        for lane in self._lanes:
            lane.close()


def _name(request: StepRequest) -> str:
    """What the request is, as errors name it: "run" (a step) or "resume" (from merge_call)."""
    return "run" if isinstance(request, RunStep) else "resume"
