"""Report a replica's steps to the Dask scheduler, so its dashboard shows replicas working.

Steps run inside actors (a thread per replica), so Dask sees no tasks and its task stream stays
empty. Each step is one append to a `StepLog` on the hot path; once a second the worker's event
loop merges what was logged into busy spans and sends them as one event (`Worker.log_event`,
over the worker's batched stream: never a round trip per step). `cluster/dashboard.py` turns
the events into rectangles of the scheduler's task stream.
"""

from __future__ import annotations

import itertools
import weakref
from collections import deque
from typing import Any

TOPIC = "labdist-steps"
REPORT_EVERY_S = 1.0
MERGE_GAP_S = 0.05  # steps closer than this are drawn as one busy span


class StepLog:
    """The steps a replica ran since the last report: (start, stop, collectives), wall time
    (the clock the task stream uses). Thread-safe: the step thread appends, the loop takes."""

    def __init__(self) -> None:
        self._pending: deque[tuple[float, float, int]] = deque()

    def record(self, start: float, stop: float, collectives: int) -> None:
        self._pending.append((start, stop, collectives))

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


class StepReporter:
    """Sends a replica's `StepLog` as events every `every` seconds from the worker's loop; stops
    by itself once the log is gone (a replica dropped without `close`)."""

    def __init__(self, worker: Any, log: StepLog, group: str, rank: int, thread: int,
                 every: float = REPORT_EVERY_S) -> None:
        from tornado.ioloop import PeriodicCallback

        self._worker, self._log = worker, weakref.ref(log)
        self._message = {"group": group, "replica": rank, "worker": worker.address,
                         "thread": thread}
        self._reported = 0  # steps reported so far: the number of the next one
        self._callback = PeriodicCallback(self.flush, every * 1000)
        worker.loop.add_callback(self._callback.start)

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
        self._worker.log_event(TOPIC, {**self._message, "spans": spans})

    def close(self) -> None:
        """Stop reporting, after sending the last steps (call on the worker's loop)."""
        self._callback.stop()
        self.flush()
