"""Quorum training (`fault_tolerance="quorum"`): `fit` on the replicas alive at each step.

Each run of `steps_per_execution` steps is a transaction. Every replica snapshots its
variables as the run starts (quorum/undo.py). When a replica is lost during a run, either every
survivor finished it (the lost one had sent its share of every collective: the run is
committed) or the survivors all return to the snapshot and run it again among themselves, the
same global batches split over fewer replicas; so no step is lost or applied twice, and every
surviving copy stays bit-identical. Between runs, workers that joined the cluster become
replicas: the group moves to its next membership epoch (quorum/membership.py), the newcomers
receiving every copy from a live peer over the collective transport.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from labdist.data.distributed import shard_group
from labdist.errors import QuorumLostError, ReplicaLostError
from labdist.quorum import membership
from labdist.strategies import failures, regroup
from labdist.values import PerReplica

logger = logging.getLogger("labdist.membership")

FAULT_TOLERANCE = ("none", "quorum")
# How often the survivors try to form the next epoch before giving up (each try loses at
# least one more worker, or fails for a cause of its own, which is raised at once).
MAX_EPOCH_TRIES = 8


@dataclass(frozen=True)
class MembershipChange:
    """One move of a quorum-trained group to its next epoch, as listeners and callbacks
    (`Callback.on_membership_change`) receive it.

    epoch: the new epoch's number (the group a strategy starts with is epoch 0).
    workers: each replica's worker address, in replica order, from now on.
    lost / joined: the workers that left / became replicas with this change.
    step: optimizer steps completed (of this strategy's fits) when it took effect.
    retried: whether a run was undone and run again by the survivors.
    paused_s: seconds from the failed run's start (or the join being noticed) until the new
        epoch was ready to train.
    """

    epoch: int
    workers: tuple[str, ...]
    lost: tuple[str, ...]
    joined: tuple[str, ...]
    step: int
    retried: bool
    paused_s: float

    @property
    def num_replicas(self) -> int:
        return len(self.workers)


class QuorumHost(Protocol):
    """What quorum training needs of the strategy that holds it."""

    id: str

    @property
    def group(self) -> Any: ...  # a DaskReplicaGroup (cluster/dask_group.py)

    def replace_group(self, group: Any) -> None: ...


class Quorum:
    """A mirrored strategy's quorum training, the component it holds (`strategy.quorum`):
    its bounds, the epoch, who listens, and the steps it runs as transactions. It shares the
    strategy's lock and run numbers, and re-forms the group through `replace_group`."""

    def __init__(self, host: QuorumHost, lock: threading.RLock, run_ids: Iterator[int],
                 min_replicas: int, max_replicas: int | None):
        self._host, self._lock, self._run_ids = host, lock, run_ids
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas  # grow back up to this (None: every worker)
        self.epoch = 0
        self.changes: list[MembershipChange] = []
        self._listeners: list[Callable[[MembershipChange], Any]] = []
        self._watch: membership.JoinWatch | None = None
        self._armed_group: Any = None  # the group whose replicas keep an undo log

    def add_listener(self, fn: Callable[[MembershipChange], Any]) -> Callable[[], None]:
        """Call `fn(change)` on every membership change; returns the function that stops it."""
        self._listeners.append(fn)
        return lambda: self._listeners.remove(fn) if fn in self._listeners else None

    def arm(self, group) -> None:
        """Before a run: the group's replicas keep undo logs, and joins are watched."""
        if self._watch is None:
            self._watch = membership.JoinWatch(group.client)
        if self._armed_group is not group:
            membership.keep_undo(group)
            self._armed_group = group

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    def record(self, old_workers: list[str], group, step: int, retried: bool,
               since: float) -> MembershipChange:
        self.epoch += 1
        self._armed_group = group
        change = MembershipChange(
            self.epoch, tuple(group.workers),
            tuple(w for w in old_workers if w not in group.workers),
            tuple(w for w in group.workers if w not in old_workers), step, retried,
            time.monotonic() - since)
        self.changes.append(change)
        logger.warning("labdist: replica group epoch %d: %d replica(s) %s (lost: %s; joined: "
                       "%s) after step %d%s, %.2f s", change.epoch, change.num_replicas,
                       ", ".join(change.workers), ", ".join(change.lost) or "none",
                       ", ".join(change.joined) or "none", step,
                       "; the unfinished run was undone and run again" if retried else "",
                       change.paused_s)
        for fn in list(self._listeners):
            fn(change)
        return change

    def train(self, step: Callable, groups: list[list[tuple]],
              first_iteration: int) -> Iterator[list[tuple[float, float, int]]]:
        """`strategy.train_model_steps` in quorum mode: each group of batches as one transaction
        over the replicas alive at its start (see the module's docstring)."""
        iteration = first_iteration
        for batches in groups:
            with self._lock:
                self._grow(iteration)
                value = self._run_group(step, batches, iteration)
            iteration += len(batches)
            yield value

    def _run_group(self, step: Callable, batches: list[tuple], iteration: int) -> Any:
        def args_for(n: int) -> tuple:
            shards = shard_group(batches, n)
            return (shards[0] if n == 1 else PerReplica(shards), [len(bx) for bx, _ in batches],
                    iteration)

        return self._transaction(step, args_for, iteration)[0]

    def run_step(self, fn: Callable, args_for: Callable[[int], tuple], step: int) -> list[Any]:
        """`strategy.run_transaction` in quorum mode: take in joined workers (a step boundary),
        then run `fn` as one transaction over the replicas alive."""
        with self._lock:
            self._grow(step)
            return self._transaction(fn, args_for, step)

    def _transaction(self, fn: Callable, args_for: Callable[[int], tuple],
                     iteration: int) -> list[Any]:
        """Run `fn(*args_for(n))` on the n replicas alive until a run is committed by every
        survivor; returns the survivors' results in replica order."""
        while True:
            group = self._host.group
            self.arm(group)
            n = group.num_replicas
            args = args_for(n)
            args_r = [regroup.select(args, r, "args", n, self._host.id) for r in range(n)]
            run_id = next(self._run_ids)
            started = time.monotonic()
            events = group.start_step(run_id, fn, args_r, [{}] * n)
            if all(e.kind == "done" for e in events):
                failures.emit_warnings(events)
                return [e.value for e in events]
            lost = membership.lost_in(events, group.workers)
            if not lost:  # the step failed of itself: as without quorum mode
                failures.fail(group, run_id, events)
            survivors = [r for r in range(n) if group.workers[r] not in lost]
            committed = all(events[r].kind == "done" for r in survivors)
            if not committed:
                survivors = _roll_back(group, run_id, survivors, lost)
            self._shrink(survivors, lost, iteration, started, retried=not committed)
            if committed:
                return [events[r].value for r in survivors]

    def _shrink(self, survivors: list[int], lost: set[str], iteration: int, since: float,
                retried: bool) -> None:
        """Move to an epoch of `survivors` (fewer still if more are lost while it forms)."""
        group = self._host.group
        old = list(group.workers)
        keep = list(survivors)
        lost = set(lost)
        for _ in range(MAX_EPOCH_TRIES):
            if len(keep) < self.min_replicas:
                _below_minimum(group, keep, lost, self.min_replicas)
            try:
                new = membership.next_epoch(group, keep, [], next(self._run_ids))
            except membership.EpochFailed as failed:
                if not failed.lost:
                    raise failed.cause from None
                lost |= failed.lost
                keep = [r for r in keep if group.workers[r] not in lost]
                continue
            self._host.replace_group(new)
            self.record(old, new, iteration, retried, since)
            return
        raise ReplicaLostError(f"the replica group could not re-form in {MAX_EPOCH_TRIES} tries; "
                               f"lost: {', '.join(sorted(lost))}")

    def _grow(self, iteration: int) -> None:
        """At a step boundary: take in the workers that joined since the last one."""
        watch = self._watch
        if watch is None:
            return
        heard = watch.take()
        if not heard:
            return
        group = self._host.group
        room = (self.max_replicas or 1 << 30) - group.num_replicas
        joiners = [w for w in group.present_workers() if w not in group.workers][:max(room, 0)]
        if not joiners:
            return
        old = list(group.workers)
        since = min(heard.values())
        keep = list(range(group.num_replicas))
        for _ in range(MAX_EPOCH_TRIES):
            try:
                new = membership.next_epoch(group, keep, joiners, next(self._run_ids))
            except membership.EpochFailed as failed:
                if not failed.lost:
                    raise failed.cause from None
                joiners = [w for w in joiners if w not in failed.lost]
                dead = [r for r in keep if group.workers[r] in failed.lost]
                if dead:  # a replica died while the copy ran: that is a shrink as well
                    keep = [r for r in keep if r not in dead]
                    if len(keep) < self.min_replicas:
                        _below_minimum(group, keep, failed.lost, self.min_replicas)
                if not keep:
                    raise failed.cause from None
                if not joiners and not dead:  # only newcomers were lost: nothing changes
                    return
                continue
            self._host.replace_group(new)
            self.record(old, new, iteration, False, since)
            return
        raise ReplicaLostError(f"the replica group could not take in {', '.join(joiners)} in "
                               f"{MAX_EPOCH_TRIES} tries")

    def add_local_worker(self) -> None:
        """Start one more worker on the strategy's embedded cluster and let the group grow by
        one: it becomes a replica at the next step boundary (a join, as any other)."""
        if self.max_replicas is not None:  # None: every worker already
            self.max_replicas += 1
        try:
            self._host.group.add_local_worker()
        except BaseException:
            self.max_replicas = None if self.max_replicas is None else self.max_replicas - 1
            raise


def _roll_back(group, run_id: int, survivors: list[int], lost: set[str]) -> list[int]:
    """Undo run `run_id` on `survivors`; one lost meanwhile joins `lost` (which this updates)
    and is left out. Returns the survivors that undid it."""
    while survivors:
        try:
            membership.rollback(group, run_id, survivors)
            return survivors
        except Exception:
            gone = membership.vanished(group, [group.workers[r] for r in survivors], 5.0)
            if not gone:
                raise
            lost |= gone
            survivors = [r for r in survivors if group.workers[r] not in gone]
    return survivors  # none left: _shrink names what was lost (below min_replicas)


def _below_minimum(group, keep: list[int], lost: set[str], minimum: int):
    left = [group.workers[r] for r in keep]
    raise QuorumLostError(
        f"quorum training lost worker(s) {', '.join(sorted(lost))}: {len(left)} replica(s) "
        f"left ({', '.join(left) or 'none'}), fewer than min_replicas={minimum}. The "
        "survivors' copies are consistent (the unfinished step was undone): "
        "strategy.recover() re-forms the replicas on them (then save, or call fit again once "
        "workers are back)")
