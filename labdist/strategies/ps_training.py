"""`model.fit` under ParameterServerStrategy: what the model's training hook does.

Async: every group of `steps_per_execution` global batches is one scheduled function; the
worker that takes it pulls the weights, computes the gradient of each batch's mean loss and
pushes it (the update rule runs on the parameter servers), step after step. Groups are
scheduled ahead, so all workers train at once, each on its own batches.
Sync: each global batch is split over `total_num_replicas` functions (like MirroredStrategy
splits it over replicas); each pulls at its step (the barrier), pushes the gradient of its
shard's mean loss, and the PSs average `replicas_to_aggregate` of them into one update.
"""

from __future__ import annotations

import concurrent.futures
from collections import deque
from collections.abc import Iterable, Iterator

import numpy as np

from labdist.backend import NUMPY
from labdist.input import split_sizes
from labdist.training.model import _DeviceRNG, _gradients


def train_model_steps(strategy, model, groups: Iterable[list]) -> Iterator[list[tuple]]:
    _bind(strategy, model)
    if strategy.mode == "async":
        return _async(strategy, model, groups)
    return _sync(strategy, model, groups)


def _bind(strategy, model) -> None:
    """Put each optimizer slot next to its weight and tell that PS which optimizer updates
    the weight with which slots (again whenever the model is recompiled)."""
    weights = [v for w in model._weights for v in w.values()]
    slots = [d for layer in model._slots for d in layer.values()]
    signature = (id(model._optimizer), tuple(v._id for v in weights),
                 tuple(s._id for d in slots for s in d.values()))
    if strategy._bound_models.get(id(model)) == signature:
        return
    group = strategy._ps_group
    for v, d in zip(weights, slots, strict=True):
        for s in d.values():
            strategy._colocate(s._id, v._id)
        group.store_call(group.placement[v._id], "bind", v._id, model._optimizer,
                         {name: s._id for name, s in d.items()})
    strategy._bound_models[id(model)] = signature


def _window(strategy) -> int:
    return max(2, 2 * strategy.num_workers)


def _async(strategy, model, groups) -> Iterator[list[tuple]]:
    coordinator = strategy._coordinator()
    pending: deque = deque()
    args = (model.layers, model._weights, model._loss, model.seed, bool(model._metrics))
    for group in groups:
        step0 = model._iterations
        model._iterations += len(group)
        pending.append(coordinator.schedule(_async_steps, args=(*args, list(group), step0)))
        if len(pending) >= _window(strategy):
            yield pending.popleft().fetch()
    while pending:
        yield pending.popleft().fetch()


def _sync(strategy, model, groups) -> Iterator[list[tuple]]:
    coordinator = strategy._coordinator()
    total, needed = strategy.total_num_replicas, strategy.replicas_to_aggregate
    step = strategy._global_step()
    pending: deque = deque()
    args = (model.layers, model._weights, model._loss, model.seed, bool(model._metrics))
    for group in groups:
        steps = list(range(step, step + len(group)))
        step += len(group)
        iterations = list(range(model._iterations, model._iterations + len(group)))
        model._iterations += len(group)
        shards: list[list] = [[] for _ in range(total)]
        for bx, by in group:
            bounds = np.cumsum([0, *split_sizes(len(bx), total)])
            for i in range(total):
                shards[i].append((bx[bounds[i]:bounds[i + 1]], by[bounds[i]:bounds[i + 1]]))
        pending.append([coordinator.schedule(_sync_steps, args=(
            *args, shards[i], steps, iterations, i)) for i in range(total)])
        if len(pending) >= _window(strategy):
            yield _settle(pending.popleft(), needed)
    while pending:
        yield _settle(pending.popleft(), needed)
    coordinator.join()  # late backups' dropped gradients, so stats are final when fit returns


def _settle(values: list, needed: int) -> list[tuple]:
    """A group's per-step (loss sum, correct, n) over the shards whose gradients were used,
    as soon as `needed` functions came back with every gradient accepted (or all did)."""
    futures = {v._future: v for v in values}
    accepted: list[list] = []
    pending = set(futures)
    while pending and len(accepted) < needed:
        done, pending = concurrent.futures.wait(
            pending, return_when=concurrent.futures.FIRST_COMPLETED)
        for f in done:
            result = f.result()  # raises the function's error
            if all(status != "dropped" for status, *_ in result):
                accepted.append(result)
    if len(accepted) < needed:  # some gradients were dropped: report what was used
        accepted = [f.result() for f in futures]
    steps = len(accepted[0])
    out = []
    for j in range(steps):
        used = [r[j] for r in accepted if r[j][0] != "dropped"] or [r[j] for r in accepted]
        out.append(tuple(float(sum(u[k] for u in used)) for k in (1, 2, 3)))
    return out


# -- what runs on the workers ----------------------------------------------------------------
def _names(weights):
    return [(i, k, v) for i, w in enumerate(weights) for k, v in w.items()]


def _step(ctx, layers, weights, loss, x, y, seed, rank, iteration, metric, step=None,
          key=None):
    """Pull, compute the gradient of this batch's mean loss, push; (status, loss sum,
    correct, n)."""
    names = _names(weights)
    values = ctx._pull([v._id for _, _, v in names], step=step)
    params = [{k: values[v._id] for k, v in w.items()} for w in weights]
    rng = _DeviceRNG(NUMPY, (seed, rank, iteration + 1))
    local = len(x)
    grads, stats = _gradients(np, layers, params, loss, x, y, rng, local, max(local, 1))
    items = [(v._id, "gradient", grads[i][k], v.aggregation.name) for i, k, v in names]
    statuses, _ = ctx._push(items, step=step, key=key, barrier=step is None)
    status = "dropped" if "dropped" in statuses else sorted(statuses)[0]
    return status, float(stats[0]), float(stats[1]) if metric else 0.0, local


def _async_steps(layers, weights, loss, seed, metric, batches, step0):
    from labdist.worker.context import current

    ctx = current()
    out = []
    for j, (x, y) in enumerate(batches):
        _, loss_sum, correct, n = _step(ctx, layers, weights, loss, x, y, seed, 0, step0 + j,
                                        metric)
        out.append((loss_sum, correct, n))
    return out


def _sync_steps(layers, weights, loss, seed, metric, shards, steps, iterations, shard):
    from labdist.worker.context import current

    ctx = current()
    return [_step(ctx, layers, weights, loss, x, y, seed, shard, it, metric, step=s,
                  key=("fit", shard))
            for (x, y), s, it in zip(shards, steps, iterations, strict=True)]
