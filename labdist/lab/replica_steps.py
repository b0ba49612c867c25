"""What the lab runs on the replicas / parameter-server workers each step. The variables'
own semantics do the synchronizing: `assign_sub` of a mirrored ON_WRITE variable all-reduces
with its aggregation, an ON_READ or NONE one writes the local copy, and inside a parameter-server
function it pushes to the parameter server. Only small host summaries come back.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from labdist.context import get_replica_context
from labdist.devices import to_host

GRADIENTS = "the lab's gradients"  # the communicating step's all-reduce (its residuals' key)


def _summary(ctx, model, variables, state, x, y, lr, rank, skew) -> tuple[Any, int]:
    """Read, compute this shard's loss and gradients (moving the model's state, this
    replica's own copies), update through the variables."""
    xp = ctx.xp
    x = xp.asarray(x)
    if skew and len(x):
        x = x + rank * skew  # this replica's data comes from shifted inputs
    params = {k: v.read_value() for k, v in variables.items()}
    loss, grads = _loss_and_grads(ctx, model, params, state, x, xp.asarray(y))
    for k, v in variables.items():
        v.assign_sub(xp.asarray(lr * grads[k], dtype=v.dtype), read_value=False)
    return loss, len(x)


def _loss_and_grads(ctx, model, params, state: dict[str, Any], x, y):
    """The model's loss and gradients; a model with state (batch norm) moves this replica's
    copies of it in place: ON_WRITE / NONE, nothing combines them."""
    if not state:
        return model.loss_and_grads(ctx.xp, params, x, y)
    local = {k: ctx.local_copy(v) for k, v in state.items()}
    return model.loss_and_grads(ctx.xp, params, x, y, state=local)


def _tracked(ctx, metric, loss, n: int, reset: bool) -> tuple[float, float]:
    """Keras' loss tracker: `metric` (a `Mean`, ON_READ / SUM) adds this replica's loss
    weighted by its samples, into this replica's copies; it starts again with each epoch.
    Returns this replica's (total, count), from which its partial result and, summed over
    the replicas, the cross-replica result follow."""
    if reset:
        metric.reset_state()
    if n:
        metric.update_state(loss, sample_weight=n)
    total, count = (ctx.local_copy(v) for v in metric.variables)  # this replica's own
    return float(to_host(total)), float(to_host(count))


def _flat(variables: dict[str, Any], state: dict[str, Any]) -> np.ndarray:
    """This replica's copy, flat: the parameters, then the state (`ParamSpec`'s order)."""
    return np.concatenate([np.asarray(to_host(v.read_value()), np.float64).reshape(-1)
                           for v in (*variables.values(), *state.values())])


def mirrored_step(variables: dict[str, Any], state: dict[str, Any], metric, model, x, y,
                  lr: float, skew: float, delay: float, average: bool, new_epoch: bool
                  ) -> tuple[float, int, np.ndarray, int, tuple[float, float]]:
    """One replica's step: (loss on its shard, shard size, its copy after the step, flat,
    array bytes it sent its peers: the uncompressed all-reduce a compressor saves against,
    the loss tracker's (total, count) on this replica)."""
    ctx = get_replica_context()
    sent_before = ctx.bytes_sent
    if delay > 0:  # a straggler: the others wait for it in the next collective
        time.sleep(float(delay))
    loss, n = _summary(ctx, model, variables, state, x, y, lr, ctx.replica_id_in_sync_group,
                       skew)
    if average:  # local SGD's periodic averaging of ON_READ copies (a local assign each)
        for v in variables.values():
            v.assign(ctx.all_reduce("MEAN", v.read_value()), read_value=False)
    tracked = _tracked(ctx, metric, loss, n, new_epoch)
    return (float(to_host(loss)), n, _flat(variables, state), int(ctx.bytes_sent - sent_before),
            tracked)


def ps_step(variable: Any, spec, model, x, y, bounds: list[int], lr: float,
            skew: float) -> tuple[int, float, int, np.ndarray]:
    """One parameter-server worker's update on its own shard of a global batch: pull the
    parameter vector, compute, push. Returns (worker index, loss, shard size, the vector it
    read)."""
    ctx = get_replica_context()
    w = ctx.worker_index
    lo, hi = bounds[w], bounds[w + 1]
    x, y = x[lo:hi], y[lo:hi]
    if skew and len(x):
        x = x + w * skew
    flat = np.asarray(to_host(variable.read_value()), np.float64)
    loss, grads = model.loss_and_grads(np, spec.unflatten(flat), x, y)
    variable.assign_sub(lr * spec.flatten(grads), read_value=False)
    return w, float(to_host(loss)), len(x), flat


def assign_copies(first, variables: dict[str, Any], values: dict[str, Any]) -> None:
    """`extended.update` target: write this replica's own value into each variable's copy."""
    from labdist.replica.replica_context import current

    xp = current().xp  # this replica's array module: values go onto its device
    for k, v in variables.items():
        v.assign(xp.asarray(values[k], dtype=v.dtype), read_value=False)


def communicating_step(variables: dict[str, Any], state: dict[str, Any], metric, outer, model,
                       x, y, lr: float, skew: float, delay: float, mean: bool, new_epoch: bool
                       ) -> tuple[float, int, np.ndarray, dict, tuple[float, float]]:
    """A mirrored step under the strategy's communication modes (its compressor and local
    SGD / DiLoCo, read from the replica context): with local SGD on, this replica steps alone
    and every `local_steps` steps the round closes (pseudo-gradients all-reduced, outer step);
    else the gradients go through the compressed all-reduce. Returns mirrored_step's summary
    and what the communication did (bytes sent this step, residual norm, round progress,
    pseudo-gradient and outer-step norms when a round closed)."""
    from labdist.training.trainer import diloco

    ctx = get_replica_context()
    if delay > 0:
        time.sleep(float(delay))
    xp, n = ctx.xp, ctx.num_replicas_in_sync
    comm = ctx.communication
    sent_before = ctx.bytes_sent
    ws = list(variables.values())
    params = [ctx.local_copy(w).reshape(-1) for w in ws]
    rounds = diloco.RoundState(ctx, outer, [w.shape for w in ws])
    x = xp.asarray(x)
    if skew and len(x):
        x = x + ctx.replica_id_in_sync_group * skew
    loss, grads = _loss_and_grads(ctx, model, {k: v.read_value() for k, v in variables.items()},
                                  state, x, xp.asarray(y))
    grads = [xp.asarray(grads[k], dtype=w.dtype).reshape(-1) for k, w in variables.items()]
    info: dict[str, Any] = {"pseudo_norm": None, "outer_norm": None}
    if ctx.local_sgd is not None:
        before: list[np.ndarray] = []

        def update() -> None:
            for p, g in zip(params, grads, strict=True):
                p -= lr * g  # this replica's own step (mirrored MEAN's share, times n)

        def measure() -> None:  # the round about to close: from its anchors to here
            before.extend(np.array(to_host(a), np.float64) for a in rounds.anchors)
            info["pseudo_norm"] = float(np.linalg.norm(np.concatenate(
                [b - np.asarray(to_host(p), np.float64)
                 for b, p in zip(before, params, strict=True)])))

        if diloco.inner_step(ctx, rounds, params, update, apart=False, before_close=measure):
            after = np.concatenate([np.asarray(to_host(a), np.float64) for a in rounds.anchors])
            info["outer_norm"] = float(np.linalg.norm(after - np.concatenate(before)))
    else:
        if rounds.pending():  # local SGD was turned off: close the round in progress first
            diloco.leave_local(ctx, params, [{} for _ in params], rounds)
        # in their shapes (PowerSGD approximates the matrices), as error feedback keys them
        grads = [g.reshape(w.shape) for g, w in zip(grads, ws, strict=True)]
        _sgd_all_reduce(ctx, grads, params, lr / n if mean else lr)
        comm.synced_steps += 1
    rounds.save()
    info.update(bytes=int(ctx.bytes_sent - sent_before),
                residual_norm=float(comm.stats()["residual_norm"]),
                since=rounds.since, rounds=rounds.rounds)
    tracked = _tracked(ctx, metric, loss, len(x), new_epoch)
    return float(to_host(loss)), len(x), _flat(variables, state), info, tracked


def _sgd_all_reduce(ctx, grads: list, params: list, scale: float) -> None:
    """SGD on the all-reduced `grads` (through the strategy's compressor, with error
    feedback), each reduced segment applied to `params` as it arrives: `params -= scale * sum`;
    then the updated weights gathered where the reduce-scatter left each replica a part."""

    def update(j, lo, hi, summed):
        params[j][lo:hi] -= scale * summed

    if ctx.reduce_apply(GRADIENTS, grads, params, update, gradients=len(grads)):
        ctx.gather_segments("the lab's updated weights", params)


def closing_step(variables: dict[str, Any], state: dict[str, Any], outer, lr: float,
                 mean: bool) -> np.ndarray:
    """(a step of its own, at a switch that moves the copies elsewhere, once the modes are
    off) Settle what the communication modes left open on `variables`, so the switch moves
    the copies with every update in it exactly once: a DiLoCo round in progress is closed with
    its outer step (and the replicas' inner states made one), and error-feedback residuals
    still owed are sent in full and applied. Returns this replica's copy, flat (its state,
    which nothing here touches, after the parameters)."""
    from labdist.training.trainer import diloco

    ctx = get_replica_context()
    ws = list(variables.values())
    params = [ctx.local_copy(w).reshape(-1) for w in ws]
    if outer is not None:
        rounds = diloco.RoundState(ctx, outer, [w.shape for w in ws])
        if rounds.pending():
            diloco.leave_local(ctx, params, [{} for _ in params], rounds)
            rounds.save()
    if ctx.communication.owes(GRADIENTS):  # the same on every replica: they summed alike
        zeros = [ctx.xp.zeros(w.shape, p.dtype) for w, p in zip(ws, params, strict=True)]
        _sgd_all_reduce(ctx, zeros, params, lr / ctx.num_replicas_in_sync if mean else lr)
    return _flat(variables, state)


def reset_round(outer) -> None:
    """(a step of its own) Forget a round in progress: the lab wrote new copies (a switch)."""
    ctx = get_replica_context()
    for v in (outer.since, outer.split):
        ctx.local_copy(v)[...] = 0


def fresh_communication(outers: list) -> None:
    """(a step of its own, at the lab's start and reset) Start the lab's communication state
    afresh, as the values do: no error-feedback residual owed and no PowerSGD warm-start
    factor for its gradients or DiLoCo's pseudo-gradients, and every round state of `outers`
    (`OuterVariables`) back to none: no round open, no rounds counted, no outer velocity."""
    from labdist.training.trainer import diloco

    ctx = get_replica_context()
    ctx.communication.clear((GRADIENTS, diloco.WHAT))
    for outer in outers:
        for v in outer.variables().values():
            ctx.local_copy(v)[...] = 0
