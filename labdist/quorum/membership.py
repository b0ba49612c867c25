"""Membership epochs of a quorum-trained replica group (the driver's side).

The group's membership is an *epoch*: one `DaskReplicaGroup` (its own group id, so every
collective message carries the epoch it belongs to) that changes only between steps. Moving
to the next epoch keeps the survivors' variable copies in their worker processes (handed from
the old actor to the new one on the same worker, `quorum/handover.py`) and gives a joining
replica its copies from one live peer over the group's collective transport
(`quorum/healing.py`), never through the driver or a disk.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from typing import Any

from labdist.cluster.dask_group import DaskReplicaGroup
from labdist.errors import ReplicaLostError
from labdist.quorum.healing import heal


class JoinWatch:
    """Notes the scheduler's add-worker events as they happen (Dask's "all" topic), so the
    driver learns of a joining worker at the next step boundary without asking the scheduler
    every step. A client has one handler per topic: this one replaces any other handler of
    that topic on the strategy's client while quorum training runs."""

    TOPIC = "all"

    def __init__(self, client: Any):
        self._client = client
        self._lock = threading.Lock()
        self._joined: dict[str, float] = {}  # worker address -> when the driver heard of it
        client.subscribe_topic(self.TOPIC, self._on_event)

    def _on_event(self, event: tuple) -> None:
        _, msg = event
        if isinstance(msg, dict) and msg.get("action") == "add-worker" and msg.get("worker"):
            with self._lock:
                self._joined[msg["worker"]] = time.monotonic()

    def take(self) -> dict[str, float]:
        """The workers that joined since the last call, with when the driver heard of each."""
        with self._lock:
            joined, self._joined = self._joined, {}
        return joined

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._client.unsubscribe_topic(self.TOPIC)


def keep_undo(group: DaskReplicaGroup) -> None:
    """Every replica of `group` snapshots its variables at the start of each run."""
    group.call_each("keep_undo", [()] * group.num_replicas)


def rollback(group: DaskReplicaGroup, run_id: int, ranks: list[int]) -> None:
    """Return `ranks` to their state before run `run_id` (each one that started it)."""
    group.call_each("rollback", [(run_id,)] * len(ranks), ranks)


class EpochFailed(Exception):
    """The next epoch could not form: `lost` names the workers found gone (empty when none
    was, and `cause` is then a failure of its own)."""

    def __init__(self, lost: set[str], cause: BaseException):
        super().__init__(f"the next membership epoch did not form ({type(cause).__name__}: "
                         f"{cause}); lost: {', '.join(sorted(lost)) or 'none'}")
        self.lost = lost
        self.cause = cause


def vanished(group: DaskReplicaGroup, workers: list[str], wait: float) -> set[str]:
    """Which of `workers` the scheduler no longer lists, waiting up to `wait` seconds for it
    to notice one (a killed worker's connection closes at once; a frozen one's does not)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            gone = set(workers) - set(group.present_workers())
        except Exception:  # the scheduler itself: the caller's next call says so
            return set()
        if gone or time.monotonic() >= deadline:
            return gone
        time.sleep(0.05)


def lost_in(events: list, workers: list[str]) -> set[str]:
    """The workers of ranks whose event says their replica was lost."""
    return {workers[r] for r, e in enumerate(events)
            if e.kind == "error" and isinstance(e.error, ReplicaLostError)}


def next_epoch(group: DaskReplicaGroup, keep: list[int], joiners: list[str],
               run_id: int, wait: float = 5.0) -> DaskReplicaGroup:
    """The group of the next epoch: replicas `keep` of `group` (in that order, their copies
    carried over in place) followed by new replicas on the workers `joiners`, which receive
    every copy from the first kept replica over the transport. `group` is closed; the new one
    owns what it owned. When a worker is lost on the way (a kill while forming or healing)
    `group` is left as it was and EpochFailed names what was lost (found within `wait` s)."""
    token = uuid.uuid4().hex
    workers = [group.workers[r] for r in keep] + list(joiners)
    new = None
    try:
        group.call_each("handover", [(token,)] * len(keep), keep)
        new = DaskReplicaGroup(len(workers), group.client, *group.settings, workers=workers)
        new.call_each("adopt", [(token,)] * len(keep), list(range(len(keep))))
        keep_undo(new)
        if joiners:
            n = len(workers)
            joining = list(range(len(keep), n))
            events = new.start_step(run_id, heal, [(0, joining)] * n, [{}] * n)
            failed = [e for e in events if e.kind != "done"]
            if failed:
                lost = lost_in(events, workers)
                raise EpochFailed(lost or vanished(group, workers, wait), failed[0].error)
            # each joiner must now hold exactly its source's copies; the kept replicas may
            # differ from one another by design (ON_READ partial counts, batch norm's
            # ON_WRITE / NONE statistics), which the copy does not touch
            if any(events[j].value != events[0].value for j in joining):
                raise RuntimeError("the healing copy left a joining replica with variables "
                                   "unlike its source's: "
                                   + ", ".join(f"{new.where(r)}: {events[r].value}"
                                               for r in [0, *joining]))
    except EpochFailed:
        if new is not None:
            new.close()
        raise
    except BaseException as error:
        if new is not None:
            new.close()
        lost = vanished(group, workers, wait) if isinstance(error, Exception) else set()
        if lost:
            raise EpochFailed(lost, error) from error
        raise
    new.take_over(group)
    group.close_quickly(keep)
    return new
