"""What a replica's step thread waits on: the jobs and merge_call answers that actor calls
queue, and, once the driver's lane is handed over (replica/lane.py), the lane's socket itself.

With the lane read by the step thread, a `strategy.run` request wakes that one thread, which
runs the step and writes the answer. Before, the lane's thread woke, queued the job for the
step thread, slept on its future and woke again to answer: three wake-ups a step per replica
instead of one, which with more replicas than cores cost ~60 µs of CPU each and a
context switch on a core another replica needed.

Queued items always come first; the socket is looked at when no item waits. A queue item
rings a socketpair, so one `select` covers both sources.
"""

from __future__ import annotations

import contextlib
import pickle
import queue
import selectors
import socket
from typing import Any

from labdist.errors import ReplicaLostError
from labdist.replica.lane import DROPPED, read_request, send_message
from labdist.replica.step_event import ResumeStep

LANE = object()  # what `next` returns when the lane has a request to read


class StepInbox:
    """Two queues (jobs, resumes) and the optional lane; `next(queue)` waits on one queue and
    the lane. Only the step thread reads; any thread may `put`, `attach` or `detach`."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.resumes: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self.lane: socket.socket | None = None  # the driver's connection, read here only
        self._incoming: socket.socket | None = None  # handed over, not yet taken up
        self._drop_lane = False  # detach asked (by `detach`, from another thread)

    def put(self, box: queue.SimpleQueue, item: Any) -> None:
        box.put(item)
        self._ring()

    def attach(self, conn: socket.socket) -> None:
        """Hand the driver's connection (authenticated, non-blocking) to the step thread."""
        self._incoming = conn
        self._ring()

    def detach(self) -> None:
        """Stop reading the lane (the step thread closes it at its next wake-up)."""
        self._drop_lane = True
        self._ring()

    def next(self, box: queue.SimpleQueue) -> Any:
        """The next item of `box`, or LANE when the lane has a request and `box` is empty."""
        while True:
            self._take_up()
            with contextlib.suppress(queue.Empty):
                return box.get_nowait()
            for key, _ in self._selector.select():
                if key.fileobj is self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        while self._wake_r.recv(4096):
                            pass
                elif key.fileobj is self.lane and box.empty():
                    return LANE

    def current(self) -> socket.socket | None:
        """The lane (a handed-over one taken up, a detached one closed first), if any."""
        self._take_up()
        return self.lane

    def close_lane(self) -> None:
        """The lane ended (goodbye, closed by the driver, or detached): on the step thread."""
        lane, self.lane = self.lane, None
        if lane is not None:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._selector.unregister(lane)
            with contextlib.suppress(OSError):
                lane.close()

    def close(self) -> None:
        self.close_lane()
        self._refuse_incoming()
        self._selector.close()
        for s in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                s.close()

    def _take_up(self) -> None:
        if self._drop_lane:
            self._drop_lane = False
            self.close_lane()
            self._refuse_incoming()
        elif self._incoming is not None:
            self.close_lane()  # one lane at a time
            self.lane, self._incoming = self._incoming, None
            self._selector.register(self.lane, selectors.EVENT_READ)

    def _refuse_incoming(self) -> None:
        incoming, self._incoming = self._incoming, None
        if incoming is not None:
            with contextlib.suppress(OSError):
                incoming.close()

    def _ring(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):  # full: it wakes anyway
            self._wake_w.send(b"\0")


def serve_lane(inbox: StepInbox, handle, dropped) -> None:
    """Answer the lane's waiting request with `handle(request)` (which runs the step here);
    when the driver's connection ended, close it (and call `dropped()` unless it said
    goodbye)."""
    request = read_request(inbox.lane)
    if isinstance(request, str):
        _ended(inbox, request == DROPPED, dropped)
        return
    answer = handle(request)
    if inbox.lane is None:  # the step's merge_call found the lane ended
        return
    try:
        send_message(inbox.lane, answer)
    except OSError:
        _ended(inbox, True, dropped)


def merge_by_lane(inbox: StepInbox, answer: bytes, dropped) -> tuple[Any, Any]:
    """Send a merge event (pickled) on the lane and wait for the driver's resume there (or
    for a resume queued by an actor call: `abandon`'s error); returns (value, error)."""
    lost = ReplicaLostError("the driver's lane closed while this step waited in merge_call")
    conn = inbox.current()
    if conn is None:  # detached (the replica is closing)
        return None, lost
    try:
        send_message(conn, answer)
    except OSError:
        _ended(inbox, True, dropped)
        return None, lost
    got = inbox.next(inbox.resumes)
    if got is not LANE:
        return got
    request = read_request(inbox.lane)
    if isinstance(request, str):
        _ended(inbox, request == DROPPED, dropped)
        return None, lost
    message = pickle.loads(request)
    if not isinstance(message, ResumeStep):
        return None, RuntimeError(
            f"the driver sent {type(message).__name__} to a replica waiting in merge_call")
    return message.value, message.error


def _ended(inbox: StepInbox, vanished: bool, dropped) -> None:
    inbox.close_lane()
    if vanished and dropped is not None:
        dropped()
