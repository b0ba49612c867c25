"""When a `strategy.run` goes wrong on some replicas: stop the others and raise the root
cause (a lost or silent replica before its peers' timeouts), or name how the replicas' paths
differed."""

from __future__ import annotations

import warnings
from typing import Any

from labdist.data.feeds import uneven_pipelines
from labdist.errors import (
    CollectiveMismatchError,
    PeerAbortedError,
    ReplicaLostError,
    ReplicaUnresponsiveError,
    UnreadableAnswerError,
)


def fail(group: Any, run_id: int, events: list, pipelines: bool = False) -> None:
    """Some replicas failed or diverged: stop the rest, then raise the root cause (or,
    where input lived on the replicas and only some ran out, pipelines' lengths)."""
    errors = [e for e in events if e.kind == "error"]
    uneven = pipelines and uneven_pipelines(events)
    if uneven:
        error, note = uneven, None
    elif errors:  # a lost or silent replica explains its peers' timeouts: it comes first
        root = min(errors, key=lambda e: (
            not e.root_cause,
            not isinstance(e.error, ReplicaLostError | ReplicaUnresponsiveError),
            events.index(e)))
        rank = events.index(root)
        error = root.error
        note = f"raised on {group.where(rank)}"
        if not isinstance(error, Exception):  # never end the driver (sys.exit in a step)
            error = RuntimeError(f"the step function raised {error!r}")
    else:
        steps = ", ".join(
            f"replica {r}: " + (f"merge_call at collective #{e.seq}" if e.kind == "merge"
                                else f"finished after {e.seq} collective(s)")
            for r, e in enumerate(events))
        error = CollectiveMismatchError(
            f"replicas took different paths in strategy.run ({steps}); every replica must "
            "make the same merge_call and collective calls in the same order")
        note = None
    abort(group, run_id, events, error)
    if note and note not in getattr(error, "__notes__", ()):
        error.add_note(note)
    raise error


def abort(group: Any, run_id: int, events: list, error: BaseException) -> None:
    """Release replicas blocked in merge_call, so the group is usable again. A replica whose
    answer could not be read may be one of them: it is told too (a replica that is not
    waiting answers with an error, and is left alone)."""
    waiting = [r for r, e in enumerate(events)
               if e.kind == "merge" or isinstance(e.error, UnreadableAnswerError)]
    while waiting:
        aborted = [None] * len(events)
        for r in waiting:
            aborted[r] = PeerAbortedError(f"aborted: {type(error).__name__}: {error}")
        events = group.resume(run_id, [None] * len(events), aborted, ranks=waiting)
        waiting = [r for r, e in zip(waiting, events, strict=True) if e.kind == "merge"]


def emit_warnings(events: list, stacklevel: int = 3) -> None:
    """The warnings the replicas raised during a run, each once however many replicas
    raised it, at the caller of `strategy.run`."""
    seen = set()
    for e in events:
        for message, category in e.warnings:
            if (message, category) not in seen:
                seen.add((message, category))
                warnings.warn(message, category, stacklevel=stacklevel)
