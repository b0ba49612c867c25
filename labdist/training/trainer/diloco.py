"""Local SGD and DiLoCo on a replica: where the training step decides whether to synchronise.

With `local_steps=H` each replica applies its inner optimizer to its own gradients (its
optimizer state stays its own) for H steps; then the replicas all-reduce their weight change
since the round began (the pseudo-gradient, `anchor - weights`), average it, and the outer
optimizer applies it to the anchor, the weights every replica starts the next round from
(Douillard et al., 2023, Algorithm 1). Outer SGD with learning rate 1 and no momentum is plain
local SGD (the replicas' weights averaged).

The state a round needs lives in variables (`OuterVariables`, made on the driver), so
checkpoints hold it: per weight its anchor and the outer optimizer's slots, and the count of
inner steps since the last synchronisation. Every replica keeps them identical.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from labdist import shipping
from labdist.enums import ReduceOp

WHAT = "DiLoCo's pseudo-gradients"
# the slots every outer optimizer gets, whatever its momentum now: a later switch (the lab's
# momentum slider) then finds its state ready
OUTER_SLOTS = ("velocity",)


class OuterVariables:
    """The driver's variables of local SGD / DiLoCo for some weights (made under the
    strategy's scope): `anchors[i]`, `slots[i]` ({name: Variable}) and the step counter."""

    def __init__(self, weights: list, outer_optimizer: Any = None):
        from labdist.variables import Variable

        self.ids = [w.id for w in weights]
        self.anchors = [Variable(w.numpy(), synchronization="NONE", trainable=False,
                                 name=f"{w.name}/outer_anchor") for w in weights]
        self.slots: list[dict[str, Any]] = [{} for _ in weights]
        self.since = Variable(np.zeros((), np.int64), synchronization="NONE", trainable=False,
                              name="outer/inner_steps_since_sync")
        self.rounds = Variable(np.zeros((), np.int64), synchronization="NONE", trainable=False,
                               name="outer/rounds")
        # 1 once a local step ran: the replicas' inner optimizer states may differ, and must be
        # made one before a synchronous step (see leave_local)
        self.split = Variable(np.zeros((), np.int64), synchronization="NONE", trainable=False,
                              name="outer/inner_state_split")
        self.ensure_slots(outer_optimizer)

    def ensure_slots(self, outer_optimizer: Any) -> None:
        """Make the slots `outer_optimizer` keeps (plus a velocity) that are missing."""
        from labdist.variables import Variable

        for anchor, slots in zip(self.anchors, self.slots, strict=True):
            zeros = np.zeros(anchor.shape, anchor.dtype)
            wanted = dict.fromkeys(OUTER_SLOTS)
            if outer_optimizer is not None:
                wanted.update(dict.fromkeys(outer_optimizer.slots(zeros)))
            for name in wanted:
                if name not in slots:
                    slots[name] = Variable(zeros, synchronization="NONE", trainable=False,
                                           name=f"{anchor.name}/{name}")

    def variables(self) -> dict[str, Any]:
        """Every variable, by a name for checkpoints."""
        out = {f"outer/{v.name}": v for v in self.anchors}
        out.update({f"outer/{v.name}": v for s in self.slots for v in s.values()})
        out["outer/since"] = self.since
        out["outer/rounds"] = self.rounds
        out["outer/split"] = self.split
        return out


shipping.register_state(OuterVariables)  # a custom loop's step stays cached while it holds


class RoundState:
    """On a replica, during one step function: the local copies of `OuterVariables`."""

    def __init__(self, ctx, outer: OuterVariables, shapes: list[tuple]):
        self.ctx = ctx
        self.anchors = [ctx.local_copy(v).reshape(-1) for v in outer.anchors]
        self.slots = [{k: ctx.local_copy(v).reshape(-1) for k, v in s.items()}
                      for s in outer.slots]
        self._since = ctx.local_copy(outer.since)
        self._rounds = ctx.local_copy(outer.rounds)
        self._split = ctx.local_copy(outer.split)
        self.since = int(self._since)
        self.rounds = int(self._rounds)
        self.split = int(self._split)
        self.shapes = shapes

    def pending(self) -> bool:
        """Whether leaving local SGD still has work: a round open, or inner states apart."""
        return bool(self.since or self.split)

    def save(self) -> None:
        """Write the counters back (once per step function: no host sync per step)."""
        self._since[...] = self.since
        self._rounds[...] = self.rounds
        self._split[...] = self.split


def local_step(ctx, optimizer, grads: list, params: list, slots: list[dict], step: int,
               state: RoundState, owned: bool = False, squares: list | None = None) -> None:
    """One inner step on this replica alone, closing the round after `local_steps` of them.
    `grads` are the mirrored step's (this replica's share of the global batch's gradient):
    scaled by the replica count, the sum over replicas of one inner step is the mirrored
    step, so H = 1 with outer SGD(1) is mirrored training. `owned`: the gradients are the
    caller's own to overwrite (fit's, not a user's arrays). `squares` (per gradient, None
    where it has none): this replica's squared slices (fit's, owned), scaled by n * n as
    the slices they square are by n."""
    n = ctx.num_replicas_in_sync
    squares = squares if squares is not None else [None] * len(grads)

    def update() -> None:
        for p, g, s, sq in zip(params, grads, slots, squares, strict=True):
            g = g.reshape(-1)
            if owned:
                g *= n  # the step's own gradient: scaled in place, no temporary
            else:
                g = g * n
            if sq is not None:
                sq *= n * n
            optimizer.apply(ctx.xp, p, g, s, step, sq)

    inner_step(ctx, state, params, update)


def inner_step(ctx, state: RoundState, params: list, update: Callable[[], None],
               apart: bool = True, before_close: Callable[[], None] | None = None) -> bool:
    """The round around one inner step, whoever computes it (`fit`'s optimizers, the lab's
    plain SGD): a round starts from the weights as they are now, `update()` moves this
    replica's `params` alone, and after `local_steps` inner steps the round closes
    (`before_close()` first, for a caller that measures the round). `apart`: the inner
    optimizer has state of its own (slots) that leaving local SGD must make one again.
    Returns whether a round closed."""
    settings = ctx.local_sgd
    if state.since == 0:
        for anchor, p in zip(state.anchors, params, strict=True):
            anchor[...] = p
    update()
    state.since += 1
    if apart:
        state.split = 1
    ctx.communication.inner_steps += 1
    if state.since < settings.local_steps:
        return False
    if before_close is not None:
        before_close()
    close_round(ctx, settings.outer_optimizer, params, state)
    return True


def close_round(ctx, outer, params: list, state: RoundState) -> None:
    """All-reduce the pseudo-gradients (compressed if a compressor is set), apply the outer
    step to the anchors, and start every replica's next round from them."""
    xp, n = ctx.xp, ctx.num_replicas_in_sync
    deltas = [(a - p).reshape(shape)
              for a, p, shape in zip(state.anchors, params, state.shapes, strict=True)]
    state.rounds += 1
    rounds = state.rounds
    names = list(outer.slots(np.zeros(1, np.float32))) if outer is not None else []

    def update(j, lo, hi, summed):
        mean = summed / n
        if outer is None:  # plain local SGD: the average of the replicas' weights
            state.anchors[j][lo:hi] -= mean
        else:
            outer.apply(xp, state.anchors[j][lo:hi], mean,
                        {k: state.slots[j][k][lo:hi] for k in names}, rounds)

    sharded = ctx.reduce_apply(WHAT, deltas, state.anchors, update, gradients=len(deltas))
    used = [state.slots[j][k] for j in range(len(params)) for k in names]
    if sharded and used:  # each rank stepped its segment of the outer state
        ctx.gather_segments(f"{WHAT}: the outer optimizer's slots", used)
    for p, anchor in zip(params, state.anchors, strict=True):
        p[...] = anchor
    state.since = 0
    ctx.communication.outer_steps += 1


def leave_local(ctx, params: list, slots: list[dict], state: RoundState) -> None:
    """Local SGD was turned off: close a round in progress with the last outer optimizer,
    and average the inner optimizer's state, which each replica kept for itself, so the
    synchronous steps that follow start from one state."""
    if state.since:
        closing = ctx.communication.closing
        close_round(ctx, None if closing is None else closing.outer_optimizer, params, state)
    inner = [a for d in slots for a in d.values()]
    if inner and state.split:
        for a, mean in zip(inner, ctx.reduce_arrays("the inner optimizer's state", inner,
                                                    ReduceOp.MEAN), strict=True):
            a[...] = mean
    state.split = 0


def finish_round(outer: OuterVariables, weights: list, slots: list[dict]) -> None:
    """A step of its own (end of `fit`): close a round in progress, so the replicas hold one
    model for evaluate, save and get_weights (and, where local SGD was turned off meanwhile,
    make the inner optimizer state one, as `leave_local` does)."""
    from labdist.replica.replica_context import current

    ctx = current()
    state = RoundState(ctx, outer, [w.shape for w in weights])
    params = [ctx.local_copy(w).reshape(-1) for w in weights]
    if ctx.local_sgd is None:
        if state.pending():
            leave_local(ctx, params, [{k: ctx.local_copy(v).reshape(-1) for k, v in d.items()}
                                      for d in slots], state)
            state.save()
    elif state.since:
        close_round(ctx, ctx.local_sgd.outer_optimizer, params, state)
        state.save()
