"""What a lab's run tells its subscribers (`lab.subscribe`), one class per kind of item.

The runner builds them on its thread and hands them to each callback; the UI's publisher (and
anyone else subscribed) tells them apart by class, never by a "type" string. They flow one way,
lab -> ui; the widgets' JSON messages to the browser are another thing (ui/, widgets/).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from labdist.lab.divergence import DivergenceError


@dataclass(frozen=True, eq=False)  # eq=False: `plane` is an array, == on it is no bool
class StepItem:
    """One history row (`RunHistory.add`), sent so the charts draw a step without reading the
    history back."""

    step: int
    kind: str  # Kind.value of the engine that ran it
    loss: list[float]  # per replica / worker (nan: it did not compute this step)
    global_loss: float
    spread: float
    tracked: list[list[float]]  # per tracked value, per replica
    contributions: int  # 0: the row a switch adds (the copies right after it)
    worker: int | None  # async PS: whose update the step was
    time: float  # time.time() when it finished
    plane: np.ndarray  # (replicas, parameters): every copy after the step
    communication: dict | None  # mirrored with a communication mode on (see StepRecord)
    sent: list[int] | None  # mirrored: array bytes each replica sent its peers
    # mirrored: the loss tracker (a `Mean`, ON_READ / SUM) since the epoch began: each
    # replica's partial result, then the cross-replica one (the copies' totals summed over
    # their counts); None elsewhere
    metric: list[float] | None = None


@dataclass(frozen=True)
class EventItem:
    """A change the runner applied at a step boundary (a `history.Event`), with its values
    plain (enum names, lists) so the charts can label it."""

    step: int
    text: str
    changes: dict[str, list[Any]]  # setting -> [old, new]
    requested: float  # time.time() when the first of its changes was asked for
    applied: float  # time.time() when the runner had applied it
    requested_step: int
    lost: tuple[int, ...] = ()  # quorum mode: replica numbers lost (the charts name them)
    joined: tuple[int, ...] = ()  # quorum mode: replica numbers taken in


@dataclass(frozen=True)
class PsStatsItem:
    """The parameter servers' counters since the current engine started, sent now and then
    (not every step): the staleness chart and its note."""

    step: int  # steps completed when they were read
    kind: str  # Kind.value: "ps_async" or "ps_sync"
    use_locking: bool
    staleness: dict[int, int]  # staleness -> updates
    torn_reads: int
    lost_updates: int
    updates: int
    dropped: int  # stale pushes dropped (sync with backup workers)
    reads: int


@dataclass(frozen=True)
class DivergedItem:
    """The run paused on a step that was not finite: the panel's banner and marks."""

    step: int
    where: str  # the replica (or worker) and the value, in words
    text: str  # the whole message, advice included

    @classmethod
    def of(cls, error: DivergenceError) -> DivergedItem:
        return cls(error.step, error.where, str(error))


@dataclass(frozen=True)
class ErrorItem:
    """Something raised on the runner's thread and stopped the run: the log says what."""

    error: str  # "TypeName: message"


@dataclass(frozen=True)
class ResetItem:
    """The run went back to step 0: every chart starts over."""


RunItem = StepItem | EventItem | PsStatsItem | DivergedItem | ErrorItem | ResetItem
