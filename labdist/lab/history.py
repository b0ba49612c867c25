"""What a lab run recorded, step by step: losses, tracked values and the replicas' spread, the
events (mode switches) and throughput. `lab.history` is one of these."""

from __future__ import annotations

import threading
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from labdist.lab.engines import StepRecord
from labdist.lab.run_items import StepItem

MIN_SPAN_S = 0.25  # the shortest interval a throughput is measured over


def spread(values: np.ndarray) -> float:
    """Max distance of a copy to the copies' mean (0 when every replica agrees); `values`:
    (replicas, elements)."""
    if len(values) and (values == values[:1]).all():  # exactly 0: the mean of 3 equal
        return 0.0  # copies (0.1 + 0.1 + 0.1) / 3 need not equal them
    with np.errstate(all="ignore"):  # a diverged run: inf / nan, said by the runner
        centred = values - values.mean(axis=0, keepdims=True)
        return float(np.sqrt((centred * centred).sum(axis=1)).max())


def _metric(tracked: list[tuple[float, float]] | None) -> list[float] | None:
    """The loss tracker's results from each replica's (total, count): every replica's partial
    result (its own copies), then the cross-replica one, which an ON_READ / SUM read makes:
    the totals summed over the counts summed."""
    if tracked is None:
        return None
    totals, counts = (np.asarray(c, np.float64) for c in zip(*tracked, strict=True))
    with np.errstate(all="ignore"):  # a replica that counted nothing yet: 0 / 0, nan
        partial = totals / counts
        whole = totals.sum() / counts.sum()
    return [*map(float, partial), float(whole)]


@dataclass
class Event:
    """A change the runner applied at a step boundary."""

    step: int  # steps completed before it took effect
    text: str
    changes: dict[str, tuple[Any, Any]]
    requested: float  # time.time() when the first of its changes was asked for
    applied: float  # time.time() when the runner had applied it
    requested_step: int = 0  # steps completed when it was asked for
    lost: tuple[int, ...] = ()  # quorum mode: replica numbers lost in this change
    joined: tuple[int, ...] = ()  # quorum mode: replica numbers taken in

    @property
    def steps_late(self) -> int:
        """Steps that finished after the request but ran the old way: 0, or 1 (the step that
        was in flight); never more."""
        return self.step - self.requested_step

    @property
    def delay(self) -> float:
        """Seconds from the request to the change being in effect."""
        return self.applied - self.requested


@dataclass
class RunHistory:
    """Per-step columns (`step`, `kind`, `loss` (steps x replicas), `global_loss`, `spread`,
    `tracked[name]` (steps x replicas), `contributions`, `worker` (async PS: whose update the
    step was, else None), `communication` (mirrored with compression / local SGD: what it sent,
    see StepRecord), `sent` (mirrored: array bytes each replica sent, compressed or not, else
    None), `metric` (mirrored: the loss tracker's partial result per replica, then the
    cross-replica one, else None), `time`) and the `events`. A switch adds a row
    (contributions 0) with the copies right after the switch. `diverged_at`: the step a run
    diverged at. The spread measures a copy's first `trainable` elements (the parameters; a
    model's state, batch norm's moving statistics, is each replica's own by design)."""

    track: list[str]
    track_index: list[int]
    trainable: int | None = None  # None: every element is a parameter
    step: list[int] = field(default_factory=list)
    kind: list[str] = field(default_factory=list)
    loss: list[list[float]] = field(default_factory=list)
    global_loss: list[float] = field(default_factory=list)
    spread: list[float] = field(default_factory=list)
    values: list[np.ndarray] = field(default_factory=list)  # (replicas, tracked)
    contributions: list[int] = field(default_factory=list)
    worker: list[int | None] = field(default_factory=list)
    communication: list[dict | None] = field(default_factory=list)
    sent: list[list[int] | None] = field(default_factory=list)
    metric: list[list[float] | None] = field(default_factory=list)
    time: list[float] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    last_values: np.ndarray | None = None  # every parameter of every copy, latest row
    diverged_at: int | None = None
    updates_per_worker: Counter = field(default_factory=Counter)  # async PS updates, by worker
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _recent: deque = field(default_factory=lambda: deque(maxlen=1024), repr=False)
    _by_worker: deque = field(default_factory=lambda: deque(maxlen=4096), repr=False)

    def add(self, record: StepRecord) -> StepItem:
        """Append a record; returns the row as the charts take it."""
        row = StepItem(step=record.step, kind=record.kind, loss=record.losses,
                       global_loss=record.global_loss,
                       spread=spread(record.values[:, :self.trainable]),
                       tracked=record.values[:, self.track_index].T.tolist(),
                       contributions=record.contributions, worker=record.worker,
                       time=record.time, plane=record.values,
                       communication=record.communication, sent=record.sent,
                       metric=_metric(record.tracked))
        with self._lock:
            self.step.append(record.step)
            self.kind.append(record.kind)
            self.loss.append(list(record.losses))
            self.global_loss.append(row.global_loss)
            self.spread.append(row.spread)
            self.values.append(record.values[:, self.track_index].copy())
            self.contributions.append(record.contributions)
            self.worker.append(record.worker)
            self.communication.append(record.communication)
            self.sent.append(record.sent)
            self.metric.append(row.metric)
            self.time.append(record.time)
            if record.worker is not None:
                self.updates_per_worker[record.worker] += 1
                self._by_worker.append((record.worker, record.time))
            self.last_values = record.values.copy()
            if record.contributions:
                self._recent.append(record.time)
        return row

    def steps_per_second(self) -> float:
        """Over the last steps (up to 1024, within 2 s), never over less than `MIN_SPAN_S`: right
        after a reset or a drain, steps finish microseconds apart, and dividing by that gap
        would report tens of thousands of steps a second."""
        with self._lock:
            times = [t for t in self._recent if t >= self._recent[-1] - 2.0] if self._recent \
                else []
        if len(times) < 2:
            return 0.0
        return (len(times) - 1) / max(times[-1] - times[0], MIN_SPAN_S)

    def worker_rates(self, span: float = 2.0) -> dict[int, float]:
        """Async PS: each worker's updates per second over the last `span` seconds of
        updates (a straggler's rate falls alone)."""
        with self._lock:
            if not self._by_worker:
                return {}
            end = self._by_worker[-1][1]
            recent = [(w, t) for w, t in self._by_worker if t >= end - span]
        first = min(t for _, t in recent)
        counts = Counter(w for w, _ in recent)
        return {w: n / max(end - first, MIN_SPAN_S) for w, n in sorted(counts.items())}

    def tracked(self, name: str) -> np.ndarray:
        """(steps, replicas) values of a tracked element."""
        i = self.track.index(name)
        with self._lock:
            return np.array([v[:, i] for v in self.values]).reshape(len(self.values), -1)

    def clear(self) -> None:
        with self._lock:
            for name in ("step", "kind", "loss", "global_loss", "spread", "values",
                         "contributions", "worker", "communication", "sent", "metric",
                         "time", "events"):
                getattr(self, name).clear()
            self._recent.clear()
            self._by_worker.clear()
            self.updates_per_worker.clear()
            self.last_values = None
            self.diverged_at = None

    def __len__(self) -> int:
        return len(self.step)
