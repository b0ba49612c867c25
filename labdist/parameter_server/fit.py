"""`model.fit` under ParameterServerStrategy: `train_model_steps` for parameter servers.

Async: every group of `steps_per_execution` global batches is one scheduled function; the
worker that takes it pulls the weights, computes the gradient of each batch's mean loss and
pushes it (the update rule runs on the parameter servers), step after step. Groups are
scheduled ahead, so all workers train at once, each on its own batches, and the first free
worker takes the next group (TF's rule): a straggler does its speed's share, and `fit` takes
results as they come, so the batch logs of async `fit` follow the order groups finished in.
Sync: each global batch is split over `total_num_replicas` functions (like MirroredStrategy
splits it over replicas); each pulls at its step (the barrier), pushes the gradient of its
shard's mean loss with the shard's size, and the PSs average `replicas_to_aggregate` of them
weighted by those sizes into one update: with every worker aggregated, the gradient of the
global batch's mean loss, as MirroredStrategy computes it, however unevenly the batch split.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections import deque
from collections.abc import Iterable, Iterator

import numpy as np

from labdist.data.distributed import shard_group
from labdist.devices import NUMPY
from labdist.parameter_server.coordinator import ClusterCoordinator
from labdist.parameter_server.push import Push
from labdist.replica.replica_context import current
from labdist.timing import phases

# fit ended early: how long it waits for the functions already running (■ answers in 1 s)
GRACE_S = 0.8


def train_model_steps(strategy, step, groups: Iterable[list], first_iteration: int
                      ) -> Iterator[list[tuple]]:
    """See `ParameterServerStrategy.train_model_steps`."""
    if step.state_variables():
        names = ", ".join(v.name for v in step.state_variables())
        raise NotImplementedError(
            f"model.fit on parameter servers: the model has layer state ({names}: batch "
            "norm's moving statistics, which each replica keeps in TensorFlow) that the "
            "parameter-server workers do not keep yet; train it under MirroredStrategy")
    strategy.bind_optimizer(step.optimizer, step.variables(), step.slot_variables())
    if strategy.mode == "async":
        return _async(strategy, step, groups, first_iteration)
    return _sync(strategy, step, groups, first_iteration)


def _window(strategy) -> int:
    return max(2, 2 * strategy.num_workers)


def _async(strategy, step, groups, iteration) -> Iterator[list[tuple]]:
    coordinator = ClusterCoordinator(strategy)
    pending: deque = deque()
    # pipelined: every worker that keeps pace holds its next group, so it never waits for the
    # driver; a window one group a worker deeper, so there is a next group to hold
    window = _window(strategy) + strategy.num_workers
    with coordinator.pipelined(), _ending_early(coordinator, pending):
        for group in groups:
            pending.append(coordinator.schedule(_async_steps,
                                                args=(step, list(group), iteration)))
            iteration += len(group)
            if len(pending) >= window:
                yield _any(pending)
        while pending:
            yield _any(pending)


def _sync(strategy, step, groups, iteration) -> Iterator[list[tuple]]:
    coordinator = ClusterCoordinator(strategy)
    total, needed = strategy.total_num_replicas, strategy.replicas_to_aggregate
    global_step = strategy.global_step()
    pending: deque = deque()
    window = _window(strategy)
    with _ending_early(coordinator, pending):
        for group in groups:
            steps = list(range(global_step, global_step + len(group)))
            global_step += len(group)
            iterations = list(range(iteration, iteration + len(group)))
            iteration += len(group)
            shards = shard_group(group, total)
            pending.append([coordinator.schedule(_sync_steps, args=(
                step, shards[i], steps, iterations, i)) for i in range(total)])
            if len(pending) >= window:
                yield _first(pending, lambda values: _settle(values, needed))
        while pending:
            yield _first(pending, lambda values: _settle(values, needed))
    coordinator.join()  # late backups' dropped gradients, so stats are final when fit returns


def _any(pending: deque) -> list[tuple]:
    """Async: the result of whichever group finished first (a straggler's group never holds
    the others back: the window counts groups in flight, not the oldest one's age). It
    leaves `pending` only once it has one."""
    done: set = set()
    while not done:  # short waits: ■ is answered within one
        done, _ = concurrent.futures.wait([v.future for v in pending], timeout=0.25,
                                          return_when=concurrent.futures.FIRST_COMPLETED)
    value = next(v for v in pending if v.future in done)
    out = value.fetch()  # raises the function's error
    pending.remove(value)
    return out


def _first(pending: deque, result):
    """The oldest group's result; it leaves `pending` only once it has one (an interrupted
    wait leaves it there, for `_ending_early`)."""
    out = result(pending[0])
    pending.popleft()
    return out


@contextlib.contextmanager
def _ending_early(coordinator: ClusterCoordinator, pending: deque) -> Iterator[None]:
    """`fit` ended before its last group (■, an error, a callback's stop_training): the
    functions no worker took yet are dropped, and those running are let finish (up to
    GRACE_S), so the weights stop changing when `fit` returns."""
    try:
        yield
    except BaseException:
        _drop(coordinator, pending)
        raise


def _drop(coordinator: ClusterCoordinator, pending: deque) -> None:
    values = [v for item in pending for v in (item if isinstance(item, list) else [item])]
    pending.clear()
    if values:
        coordinator.drop(values, GRACE_S)


def _settle(values: list, needed: int) -> list[tuple]:
    """A group's per-step (loss sum, metric sums, n) over the shards whose gradients were used,
    as soon as `needed` functions came back with every gradient accepted (or all did)."""
    futures = {v.future: v for v in values}
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
        out.append((float(sum(u[1] for u in used)), sum(u[2] for u in used),
                    float(sum(u[3] for u in used))))
    return out


# -- what runs on the workers ----------------------------------------------------------------
def _step(ctx, step, x, y, rank, iteration, global_step=None, key=None):
    """Pull, compute the gradient of this batch's mean loss, push; (status, loss sum,
    metric sums, n)."""
    names = [(i, k, v) for i, w in enumerate(step.weights) for k, v in w.items()]
    values = ctx.pull([v.id for _, _, v in names], step=global_step)
    params = [{k: values[v.id] for k, v in w.items()} for w in step.weights]
    local = len(x)
    grads, stats = step.gradients(np, NUMPY, params, x, y, rank, iteration + 1, max(local, 1))
    items = [Push(v.id, "gradient", grads[i][k], v.aggregation) for i, k, v in names]
    statuses, _ = ctx.push(items, step=global_step, key=key, barrier=global_step is None,
                           examples=local)
    status = "dropped" if "dropped" in statuses else sorted(statuses)[0]
    return status, float(stats[0]), np.asarray(stats[1:], np.float64), local


def _async_steps(step, batches, first_iteration):
    phases.RECORDER.trained(len(batches))  # labdist_steps_total counts optimizer steps
    ctx = current()
    out = []
    for j, (x, y) in enumerate(batches):
        _, loss_sum, correct, n = _step(ctx, step, x, y, 0, first_iteration + j)
        out.append((loss_sum, correct, n))
    return out


def _sync_steps(step, shards, global_steps, iterations, shard):
    phases.RECORDER.trained(len(shards))
    ctx = current()
    return [_step(ctx, step, x, y, shard, it, global_step=s, key=("fit", shard))
            for (x, y), s, it in zip(shards, global_steps, iterations, strict=True)]
