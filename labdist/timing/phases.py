"""Where a process's time goes: spans of named phases in a bounded ring buffer, always on.

Every replica, parameter-server worker and parameter server records into its process's
`RECORDER`: a step's start and end, a collective's wait (arrived, peers not yet) and data
movement, an optimizer apply, a PS pull or push and its lock wait, waiting for input; the
driver records its own part of each step between the requests it sends (`DriverTurn`). One
span is one `deque.append` of a tuple (wall-clock seconds, the clock every process shares up
to a measured offset) and a histogram bucket counted; nothing is formatted or sent until
someone asks (`snapshot`, which finds the window asked for by bisection: the ring is in the
order spans ended). The buffer keeps the last `CAPACITY` spans, so a long run stays bounded.
`compute` is what a step's time is when no other phase covers it, derived, not recorded.
"""

from __future__ import annotations

import bisect
import math
import os
import threading
import time
import zlib
from collections import deque
from contextlib import contextmanager
from typing import Any

from labdist import checks

PHASES = ("compute", "wait", "comm", "apply", "pull", "push", "lock", "input", "driver")
STEP = "step"  # the span a step's phases lie in (its remainder is `compute`)
DRIVER = "driver"  # the driver's own part of its steps (`DriverTurn`)
CAPACITY = 1 << 16  # spans kept per process: the last ones, for a long run

# upper bounds (seconds) of the phase histograms' buckets, the last one open
BUCKETS = (1e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
           10.0, math.inf)

ORDER_SLACK_S = 1.0  # spans are appended within this of their end: the ring is that sorted
now = time.time


def _end(span: tuple) -> float:
    return span[2]


class Recorder:
    """A process's spans: (name, start, end, thread id, args or None), plus running totals that
    outlive the ring (Prometheus's histograms and counters: labdist/timing/prometheus.py)."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.spans: deque[tuple[str, float, float, int, dict | None]] = deque(maxlen=capacity)
        # training steps taken here since the process started (the ring drops old spans):
        # a run counts the batches its training loop reported (`trained`), else its
        # `steps`; `runs` counts the step functions themselves (a fit epoch can be one run)
        self.steps = 0
        self.runs = 0
        self._trained: dict[int, int] = {}  # thread -> training steps reported in its run
        self.collective_bytes = 0  # array bytes this process sent in collectives
        self.histograms: dict[str, list] = {}  # phase -> [count per BUCKETS bucket..., sum]
        self._covered: dict[int, float] = {}  # thread -> seconds of phases in its open step
        self._lock = threading.Lock()
        self.enabled = True  # off only to measure what recording costs (bench/bench_time.py)

    def _record(self, name: str, start: float, end: float, tid: int, args: dict | None,
                steps: int = 1) -> None:
        if not self.enabled:
            return
        self.spans.append((name, start, end, tid, args))
        seconds = end - start
        with self._lock:
            if name == STEP:  # a run ended: its training steps (see `step`)
                self.runs += 1
                trained = self._trained.pop(tid, None)
                self.steps += steps if trained is None else trained
                name, seconds = "compute", max(seconds - self._covered.pop(tid, 0.0), 0.0)
            else:
                self._covered[tid] = self._covered.get(tid, 0.0) + seconds
            hist = self.histograms.get(name) or self._histogram(name)
            hist[bisect.bisect_left(BUCKETS, seconds)] += 1
            hist[-1] += seconds

    def _histogram(self, name: str) -> list:
        hist = self.histograms[name] = [0] * len(BUCKETS) + [0.0]
        return hist

    def histogram_copies(self) -> dict[str, list]:
        """phase -> [count per BUCKETS bucket..., sum of seconds], a consistent copy."""
        with self._lock:
            return {name: list(h) for name, h in self.histograms.items()}

    def add(self, name: str, start: float, end: float, args: dict | None = None) -> None:
        self._record(name, start, end, threading.get_ident(), args)

    def step(self, start: float, end: float, args: dict | None = None, steps: int = 1
             ) -> None:
        """A run of a step function ended: `steps` training steps, unless its loop reported
        how many batches it trained (`trained`)."""
        self._record(STEP, start, end, threading.get_ident(), args, steps)

    def trained(self, batches: int) -> None:
        """A training loop inside the current run took `batches` optimizer steps (0: the run
        is labdist's own probe, not a training step)."""
        tid = threading.get_ident()
        with self._lock:
            self._trained[tid] = self._trained.get(tid, 0) + batches

    def span(self, name: str, args: dict | None = None) -> _Span:
        """`with RECORDER.span("input"):` records the body as one span of `name`."""
        return _Span(self, name, args)

    def collective(self, start: float, arrived: float | None, end: float, args: dict) -> None:
        """One collective's exchange: `wait` from our arrival until the last peer's message
        arrived (`arrived`; None: the transport cannot tell, all of it is `comm`), then
        `comm` until the data is ours. Both under one lock: this runs for every message."""
        if not self.enabled:
            return
        tid = threading.get_ident()
        split = start if arrived is None else min(max(arrived, start), end)
        spans, histograms = self.spans, self.histograms
        with self._lock:
            if split > start:
                spans.append(("wait", start, split, tid, args))
                hist = histograms.get("wait") or self._histogram("wait")
                hist[bisect.bisect_left(BUCKETS, split - start)] += 1
                hist[-1] += split - start
            spans.append(("comm", split, end, tid, args))
            hist = histograms.get("comm") or self._histogram("comm")
            hist[bisect.bisect_left(BUCKETS, end - split)] += 1
            hist[-1] += end - split
            self._covered[tid] = self._covered.get(tid, 0.0) + (end - start)
            self.collective_bytes += args.get("bytes", 0)

    def clear(self) -> None:
        self.spans.clear()

    def ended_since(self, since: float) -> list[tuple]:
        """The spans that ended at or after `since`: only those are looked at one by one."""
        spans = list(self.spans)  # one copy at C speed: step threads may append meanwhile
        if since <= 0:
            return spans
        # the ring is in the order spans ended (each is appended as it ends): bisect
        cut = bisect.bisect_left(spans, since - ORDER_SLACK_S, key=_end)
        return [s for s in spans[cut:] if s[2] >= since]

    def snapshot(self, since: float = 0.0) -> dict[str, Any]:
        """The spans that ended after `since`, with `compute` filled in, plus what identifies
        this process and its threads (for one track per process and thread)."""
        spans = self.ended_since(since)
        return {"pid": os.getpid(), "now": now(), "steps": self.steps,
                "threads": {t.ident: t.name for t in threading.enumerate()},
                "spans": spans + compute_spans(spans)}


class _Span:
    """A context manager for one span, lighter than a generator-based one (it runs per step)."""

    __slots__ = ("args", "name", "recorder", "start")

    def __init__(self, recorder: Recorder, name: str, args: dict | None) -> None:
        self.recorder, self.name, self.args = recorder, name, args

    def __enter__(self) -> None:
        self.start = now()

    def __exit__(self, *exc: object) -> None:
        self.recorder._record(self.name, self.start, now(), threading.get_ident(), self.args)


def compute_spans(spans: list[tuple]) -> list[tuple]:
    """Each step's time that no other phase of its thread covers, as `compute` spans."""
    by_thread: dict[int, list[tuple]] = {}
    for s in spans:
        if s[0] != STEP:
            by_thread.setdefault(s[3], []).append(s)
    for inner in by_thread.values():
        inner.sort(key=lambda s: s[1])
    out = []
    for name, start, end, tid, args in spans:
        if name != STEP:
            continue
        at = start
        for s in by_thread.get(tid, ()):
            if s[2] <= start or s[1] >= end:
                continue
            if s[1] > at:
                out.append(("compute", at, s[1], tid, args))
            at = max(at, s[2])
        if end > at:
            out.append(("compute", at, end, tid, args))
    return out


RECORDER = Recorder()


class DriverTurn:
    """The driver's own part of the steps it sends, on one thread: open from a run's start (or
    the moment a previous exchange's answers arrived) until its next request is sent to the
    replicas; the time in between, waiting for the replicas, is theirs. One `driver` span per
    stretch, args `run` (the run whose request ended it) and `after` (the run whose answers
    began it). A few clock reads per exchange: no cost per replica or per step."""

    __slots__ = ("after", "start")

    def __init__(self) -> None:
        self.start: float | None = now()
        self.after: int | None = None

    def sent(self, run: int) -> None:
        if self.start is not None:
            args = {"run": run} if self.after is None else {"run": run, "after": self.after}
            RECORDER.add(DRIVER, self.start, now(), args)
        self.start = None

    def arrived(self, run: int) -> None:
        self.start, self.after = now(), run

    def close(self) -> None:
        """The end of the stretch since the last answers (nothing if no request was sent)."""
        if self.start is not None and self.after is not None:
            RECORDER.add(DRIVER, self.start, now(), {"after": self.after})
        self.start = None


_turns = threading.local()  # the calling thread's DriverTurn, while one is open


@contextmanager
def driving():
    """The body is the driver's loop (a `fit`, one `run`): its exchanges with the replicas
    record `driver` spans between them. Nested, the outermost turn goes on: a `run` inside
    `fit` leaves its last stretch open through fit's bookkeeping until fit's next request."""
    turn = getattr(_turns, "turn", None)
    if turn is not None:
        yield turn
        return
    turn = _turns.turn = DriverTurn()
    try:
        yield turn
    finally:
        _turns.turn = None
        turn.close()


def driver_sent(run: int) -> None:
    """A request of run `run` left for the replicas (called by the driver's step channel)."""
    turn = getattr(_turns, "turn", None)
    if turn is not None:
        turn.sent(run)


def driver_arrived(run: int) -> None:
    """The answers to run `run`'s request are all in (called by the driver's step channel)."""
    turn = getattr(_turns, "turn", None)
    if turn is not None:
        turn.arrived(run)


def snapshot(since: float = 0.0) -> dict[str, Any]:
    """This process's recorded spans (run on a worker by `client.run`)."""
    return RECORDER.snapshot(since)


def flow_id(worker: int, key: Any) -> int:
    """The id that ties a PS push to the apply it caused (a trace's flow arrow)."""
    def plain(x):  # a key that crossed Dask's msgpack comes back with lists for tuples
        return tuple(plain(v) for v in x) if isinstance(x, list | tuple) else x
    return zlib.crc32(repr((worker, plain(key))).encode())  # the same in every process


def clock() -> float:
    """This process's wall clock (for the driver's offset measurement)."""
    return now()


def set_capacity(spans: int) -> int:
    """Keep the last `spans` spans in this process from now on (the most recent ones carry
    over); returns the previous capacity."""
    checks.integer("spans", spans, 1)
    previous = RECORDER.spans.maxlen or CAPACITY
    RECORDER.spans = deque(RECORDER.spans, maxlen=spans)
    return previous


def set_enabled(on: bool) -> bool:
    """Record (True, the default) or not, in this process; returns the previous setting. Off
    exists to measure recording's own cost: the timeline, traces and metrics need it on."""
    previous, RECORDER.enabled = RECORDER.enabled, bool(on)
    return previous
