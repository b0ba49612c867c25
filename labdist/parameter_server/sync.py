"""Synchronous training on a parameter server (TF's SyncReplicasOptimizer).

Workers push gradients tagged with the global step they read. The first
`replicas_to_aggregate` fresh pushes of a step are accumulated; the one that completes the set
triggers one update with the variables' aggregation and bumps the global step, which releases
the barrier every accepted pusher waits at. A push tagged with an older step (a backup worker
that came late) is dropped as stale. Each push carries how many examples it stands for, so a
MEAN is the mean over examples (aggregation.py). A step that cannot fill up any more (the
last functions of a join, fewer than `replicas_to_aggregate`) is applied as it is by `flush`,
so no barrier waits forever. Everything here runs on the store's event loop.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from labdist.enums import VariableAggregation
from labdist.parameter_server.push import Push

# verdicts of offer()
STALE, DUPLICATE, ACCEPTED, COMPLETE = "dropped", "duplicate", "accepted", "complete"
RELEASED, STARVED = "released", "starved"  # verdicts of wait_barrier besides ACCEPTED



@dataclass(frozen=True)
class StepUpdate:
    """One variable's share of a global step: the accepted pushes' values for it (in key
    order), the examples each stands for, and the aggregation that combines them."""

    var_id: int
    kind: str
    values: list[np.ndarray]
    aggregation: VariableAggregation
    examples: list[float]


# applies one step: a StepUpdate per variable
Update = Callable[[list[StepUpdate]], Awaitable[None]]


class SyncReplicas:
    """The accumulators, barrier and global step of one parameter-server shard."""

    def __init__(self, replicas_to_aggregate: int):
        self.replicas_to_aggregate = replicas_to_aggregate
        self.global_step = 0
        self.applying = False  # the step's set is complete and its update is being applied
        self.readers = 0
        self._pending: list[tuple[tuple, int, list[Push], float]] = []
        self._keys: set[tuple] = set()
        self._waiting: Counter[tuple] = Counter()  # keys of pushers waiting at the barrier
        self._release = 0
        self.live = replicas_to_aggregate  # workers left (told by the coordinator on a loss)
        self._cond: asyncio.Condition | None = None

    @property
    def cond(self) -> asyncio.Condition:
        if self._cond is None:  # made on the event loop that uses it
            self._cond = asyncio.Condition()
        return self._cond

    async def _notify(self) -> None:
        async with self.cond:
            self.cond.notify_all()

    def offer(self, key: tuple, worker: int, step: int | None, items: list[Push],
              examples: float = 1.0) -> str:
        """Take one worker's push for `step` (None: a blind write, fresh by definition).
        `key` names the work that produced it, so a re-run of lost work counts once;
        `examples` weighs it in a MEAN."""
        if step is None:
            step = self.global_step
        if step < self.global_step or (step == self.global_step and self.applying):
            return STALE
        if step > self.global_step:
            raise ValueError(f"a push for global step {step} reached a parameter server at "
                             f"step {self.global_step}: pushes must carry the step they read")
        if key in self._keys:
            return DUPLICATE
        self._keys.add(key)
        self._pending.append((key, worker, items, examples))
        if len(self._pending) >= self.replicas_to_aggregate:
            self.applying = True  # closed: later pushes for this step are stale
            return COMPLETE
        return ACCEPTED

    async def apply(self, update: Update) -> None:
        """Aggregate the accepted pushes (in key order, so results do not depend on arrival)
        and run `update` on one StepUpdate per variable (its first push's kind and aggregation)
        once no read is in progress; then bump the step."""
        batch = sorted(self._pending, key=lambda p: p[0])
        self._pending, self._keys = [], set()
        by_var: dict[int, tuple[Push, list[np.ndarray], list[float]]] = {}
        for _, _, items, examples in batch:
            for push in items:
                first, values, weights = by_var.setdefault(push.var_id, (push, [], []))
                if first.kind != push.kind:
                    self.applying = False  # the step's set is dropped; the step stays open
                    await self._notify()
                    raise ValueError(f"variable #{push.var_id}: workers pushed {first.kind} and "
                                     f"{push.kind} in the same step; every worker must update "
                                     "it alike")
                values.append(push.value)
                weights.append(examples)
        async with self.cond:
            await self.cond.wait_for(lambda: self.readers == 0)
        try:
            await update([StepUpdate(p.var_id, p.kind, values, p.aggregation, weights)
                          for p, values, weights in by_var.values()])
        finally:
            self.global_step += 1
            self.applying = False
            await self._notify()

    @property
    def release_count(self) -> int:
        """How many times waiters were released; a pusher quotes it to `wait_barrier`, so a
        release between its push and its wait is not missed."""
        return self._release

    async def wait_barrier(self, step: int, key: tuple, release: int) -> str:
        """After an accepted push for `step`: wait until that step's update is applied
        (ACCEPTED). A lost worker releases the waiters ("released": their gradient stays in)
        so its work can be re-run by one of them; with fewer workers left than
        `replicas_to_aggregate` no step can fill up again ("starved"). `key` is listed as
        waiting meanwhile (see `waiting`); `release` is `release_count` at the push."""
        self._waiting[key] += 1
        try:
            async with self.cond:
                await self.cond.wait_for(
                    lambda: self.global_step > step or self._release != release
                    or self.live < self.replicas_to_aggregate)
        finally:
            self._waiting[key] -= 1
            if not self._waiting[key]:
                del self._waiting[key]
        if self.global_step > step:
            return ACCEPTED
        return STARVED if self.live < self.replicas_to_aggregate else RELEASED

    def waiting(self) -> dict:
        """What the coordinator needs to tell a stalled step from a slow one: the global step,
        how many pushes it holds, and the keys of the pushers waiting at its barrier."""
        return {"step": self.global_step, "applying": self.applying,
                "pending": len(self._pending), "waiting": list(self._waiting)}

    async def flush(self, step: int, update: Update) -> bool:
        """Apply global step `step`'s pushes now, fewer than `replicas_to_aggregate` (the
        coordinator saw that no more can come); False if the step moved on meanwhile or holds
        nothing. Weighted by examples like any step, so a short step is a short batch."""
        if step != self.global_step or self.applying or not self._pending:
            return False
        self.applying = True  # closed: later pushes for this step are stale
        await self.apply(update)
        return True

    async def release(self, live: int) -> None:
        """A worker was lost (`live` are left): let every waiter go (see wait_barrier and
        begin_read), so the lost work can be re-run."""
        self.live = live
        self._release += 1
        await self._notify()

    async def begin_read(self, step: int | None) -> int | None:
        """Wait until no update is being applied (and, for step-bound work, until the global
        step reached `step`: the barrier), then count a reader in; returns the global step the
        read sees, or None when released while waiting for a step (the work should be
        retried later: it may be waiting for the lost worker's step)."""
        release = self._release
        async with self.cond:
            await self.cond.wait_for(lambda: not self.applying and (
                step is None or self.global_step >= step or self._release != release))
            if step is not None and self.global_step < step:
                return None
            self.readers += 1
        return self.global_step

    async def end_read(self) -> None:
        self.readers -= 1
        if self.readers == 0:
            await self._notify()

