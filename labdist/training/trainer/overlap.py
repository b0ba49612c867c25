"""DDP's overlap, as a switch: the gradients of every layer but the first are summed and
applied on a thread of the replica's own while the first layer's backward still computes.

Off unless LABDIST_OVERLAP_BACKWARD=1 on the workers: measured on 2 cores with 2 replicas
(docs/benchmarks.md, issue 26) it does not pay, because the collective's copying and summing
has no idle core to run on and, for the usual MLP, the first layer holds almost all the bytes
and is the one computed last. Every rank makes the same two collectives in the same order
(an empty shard's rank included), and each element is still summed in rank order and updated
once, so the copies stay bit-identical with the switch on or off.
"""

from __future__ import annotations

import contextlib
import os

ENV = "LABDIST_OVERLAP_BACKWARD"


def enabled() -> bool:
    """Whether this process overlaps (read on the worker, where the step runs)."""
    return os.environ.get(ENV, "") == "1"


class Buckets:
    """Two buckets of one replica's gradient all-reduce: the later layers' (started as soon
    as the backward pass has made them: the step calls the object with each layer it
    finished) and the first layer's with fit's loss and accuracy (`finish`)."""

    def __init__(self, ctx, what: str, optimizer, names: list[tuple], grads: list,
                 params: list, slots: list[dict], first_step: int, apply):
        self.ctx, self.what, self.optimizer = ctx, what, optimizer
        self.apply = apply  # steps.apply_summed: sums a bucket and applies the optimizer
        self.later = [j for j, (i, _) in enumerate(names) if i > 0]
        self.first = [j for j, (i, _) in enumerate(names) if i == 0]
        self.grads, self.params, self.slots = grads, params, slots  # persistent views
        self.step = first_step
        self._pending = None

    @classmethod
    def make(cls, ctx, what, optimizer, names, out, params, slots, first_step, apply):
        """Buckets where the switch is on and they can work (gradients in a persistent
        buffer, later layers with weights, a plain all-reduce); else None."""
        if (not enabled() or out is None or ctx.compression is not None
                or ctx.local_sgd is not None or not any(i > 0 for i, _ in names)):
            return None
        grads = [out[i][k] for i, k in names]
        return cls(ctx, what, optimizer, names, grads, params, slots, first_step, apply)

    def __call__(self, layer: int) -> None:
        """The backward pass finished `layer`: from layer 1 down, the later bucket is whole."""
        if layer == 1 and self._pending is None:
            self._pending = self.ctx.background().submit(self._later, self.step)

    def abandon(self) -> None:
        """The step failed after the later bucket left: wait for its collective (the peers
        take part in it too), so that no collective of this step is still running when the
        next one starts."""
        pending, self._pending = self._pending, None
        if pending is not None:
            with contextlib.suppress(Exception):
                pending.result()

    def _later(self, step: int) -> bool:
        pick = self.later
        return self.apply(self.ctx, f"{self.what} (later layers)", self.optimizer,
                            [self.grads[j] for j in pick], [self.params[j] for j in pick],
                            [self.slots[j] for j in pick], step)

    def finish(self, rider: tuple) -> bool:
        """Wait for the later bucket (run it here if the backward never signalled: an empty
        shard), then sum and apply the first layer's; whether either was partitioned."""
        pending, self._pending = self._pending, None
        sharded = pending.result() if pending is not None else self._later(self.step)
        pick = self.first
        sharded |= self.apply(self.ctx, self.what, self.optimizer,
                              [self.grads[j] for j in pick], [self.params[j] for j in pick],
                              [self.slots[j] for j in pick], self.step, rider=rider)
        self.step += 1
        return sharded
