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


def _summary(ctx, model, variables, x, y, lr, rank, skew) -> tuple[float, int, dict]:
    """Read, compute this shard's loss and gradients, update through the variables."""
    xp = ctx.xp
    x = xp.asarray(x)
    if skew and len(x):
        x = x + rank * skew  # this replica's data comes from shifted inputs
    params = {k: v.read_value() for k, v in variables.items()}
    loss, grads = model.loss_and_grads(xp, params, x, xp.asarray(y))
    for k, v in variables.items():
        v.assign_sub(xp.asarray(lr * grads[k], dtype=v.dtype), read_value=False)
    return float(to_host(loss)), len(x), params


def mirrored_step(variables: dict[str, Any], model, x, y, lr: float, skew: float,
                  delay: float, average: bool) -> tuple[float, int, np.ndarray]:
    """One replica's step: (loss on its shard, shard size, its copy after the step, flat)."""
    ctx = get_replica_context()
    if delay > 0:  # a straggler: the others wait for it in the next collective
        time.sleep(float(delay))
    loss, n, _ = _summary(ctx, model, variables, x, y, lr, ctx.replica_id_in_sync_group, skew)
    if average:  # local SGD's periodic averaging of ON_READ copies (a local assign each)
        for v in variables.values():
            v.assign(ctx.all_reduce("MEAN", v.read_value()), read_value=False)
    flat = np.concatenate([np.asarray(to_host(v.read_value()), np.float64).reshape(-1)
                           for v in variables.values()])
    return loss, n, flat


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
    from labdist.worker.context import current

    xp = current().xp  # this replica's array module: values go onto its device
    for k, v in variables.items():
        v.assign(xp.asarray(values[k], dtype=v.dtype), read_value=False)
