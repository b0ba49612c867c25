"""Report a replica's steps and their phases to the Dask scheduler, so its dashboard (and
`distributed.performance_report`) shows replicas working and where their time goes.

Steps run inside actors (a thread per replica), so Dask sees no tasks and its task stream stays
empty. Each step is one append to a `StepLog` on the hot path; once a second (or as soon as the
replica has been idle for `IDLE_S`: the end of a `fit`) the worker's event loop merges what was
logged into busy spans, adds each busy span's phases from the phase recorder (phases.py) as
bars, and sends them as one event (`Worker.log_event`, over the worker's batched stream: never
a round trip per step). `timing/dashboard.py` turns the events into rectangles of the
scheduler's task stream.
"""

from __future__ import annotations

import itertools
import time
import weakref
from collections import deque
from typing import Any

from labdist.timing import phases

TOPIC = "labdist-steps"
REPORT_EVERY_S = 1.0
TICK_S = 0.25  # how often the loop looks whether a report is due
IDLE_S = 0.2  # a replica idle this long reports at once (what it ran is over: show it)
MERGE_GAP_S = 0.05  # steps closer than this are drawn as one busy span


class StepLog:
    """The steps a replica ran since the last report: (start, stop, collectives), wall time
    (the clock the task stream uses). Thread-safe: the step thread appends, the loop takes."""

    def __init__(self) -> None:
        self._pending: deque[tuple[float, float, int]] = deque()

    def record(self, start: float, stop: float, collectives: int) -> None:
        self._pending.append((start, stop, collectives))

    def last_stop(self) -> float | None:
        """When the newest step not yet reported ended (None: none). The loop's thread only:
        it alone removes entries."""
        return self._pending[-1][1] if self._pending else None

    def take(self) -> list[tuple[float, float, int]]:
        taken = []
        while True:
            try:
                taken.append(self._pending.popleft())
            except IndexError:
                return taken


def busy_spans(steps: list[tuple[float, float, int]], first: int = 0,
               gap: float = MERGE_GAP_S) -> list[list[float | int]]:
    """Merge consecutive steps into spans [start, stop, first step, steps, collectives]:
    thousands of sub-millisecond steps a second would be invisible (and too many) one by one."""
    spans: list[list[float | int]] = []
    for number, (start, stop, collectives) in zip(itertools.count(first), steps, strict=False):
        if spans and start - spans[-1][1] < gap:
            span = spans[-1]
            span[1] = max(span[1], stop)
            span[3] += 1
            span[4] += collectives
        else:
            spans.append([start, stop, number, 1, collectives])
    return spans


def phase_bars(spans: list[tuple], busy: list[list], thread: int) -> list[list]:
    """Each busy span's phases on `thread`, as bars [phase, start, stop] laid end to end from
    the span's start in the order the phases first occur (`compute` first): each bar as long
    as the seconds that phase took in the span. The order inside one step is the trace
    file's to show; at the dashboard's scale this is where the time went."""
    mine = sorted((s for s in spans if s[3] == thread), key=lambda s: s[1])
    bars: list[list] = []
    at = 0
    for start, stop, *_ in busy:
        while at < len(mine) and mine[at][1] < start:
            at += 1
        stepped, totals = 0.0, {"compute": 0.0}
        while at < len(mine) and mine[at][1] <= stop:
            name, s, e = mine[at][:3]
            if name == phases.STEP:
                stepped += e - s
            else:
                totals[name] = totals.get(name, 0.0) + (e - s)
            at += 1
        totals["compute"] = max(stepped - sum(totals.values()), 0.0)
        t = start
        for name, seconds in totals.items():
            if seconds > 0:
                bars.append([name, t, t + seconds])
                t += seconds
    return bars


class StepReporter:
    """Sends a replica's `StepLog`, with its steps' phase bars, as events from the worker's
    loop: every `every` seconds while it steps, and once it has been idle `IDLE_S`; stops by
    itself once the log is gone (a replica dropped without `close`)."""

    def __init__(self, worker: Any, log: StepLog, group: str, rank: int, thread: int,
                 every: float = REPORT_EVERY_S) -> None:
        from tornado.ioloop import PeriodicCallback

        self._worker, self._log = worker, weakref.ref(log)
        self._message = {"group": group, "replica": rank, "worker": worker.address,
                         "thread": thread}
        self._thread, self._every = thread, every
        self._reported = 0  # steps reported so far: the number of the next one
        self._sent_at = 0.0
        self._callback = PeriodicCallback(self._tick, min(TICK_S, every) * 1000)
        worker.loop.add_callback(self._callback.start)

    def _tick(self) -> None:
        log = self._log()
        if log is None:
            self._callback.stop()
            return
        last = log.last_stop()
        at = time.time()
        if last is not None and (at - self._sent_at >= self._every or at - last >= IDLE_S):
            self.flush()

    def flush(self) -> None:
        """Send what was logged since the last report (nothing when no step ran)."""
        log = self._log()
        if log is None:
            self._callback.stop()
            return
        steps = log.take()
        if not steps:
            return
        spans = busy_spans(steps, first=self._reported)
        self._reported += len(steps)
        self._sent_at = time.time()
        bars = phase_bars(phases.RECORDER.ended_since(steps[0][0]), spans, self._thread)
        self._worker.log_event(TOPIC, {**self._message, "spans": spans, "phases": bars})

    def close(self) -> None:
        """Stop reporting, after sending the last steps (call on the worker's loop)."""
        self._callback.stop()
        self.flush()
