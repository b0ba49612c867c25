"""What a training step computes, as the strategies run it.

`TrainStep` is the model's half of the strategy <-> training seam: the model builds one and
hands it to `strategy.train_model_steps`; the strategy decides where it runs (every mirrored
replica at once, or parameter-server workers one function at a time) and only calls the
public methods below, so the strategies never import the training layer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from labdist.enums import ReduceOp
from labdist.timing import phases
from labdist.training import losses
from labdist.training.layers import Dense
from labdist.training.trainer import diloco, overlap
from labdist.training.trainer.epoch_plan import EpochPlan
from labdist.training.trainer.loop_board import ReplicaBoard


class DeviceRNG:
    """Dropout masks drawn on the host from a per-(seed, replica, step) stream, so every run
    and every replica count draws the same masks."""

    def __init__(self, backend, key: tuple):
        self._backend = backend
        self._key = key
        self._rng = None  # made on first use: seeding costs tens of us, and most steps draw none

    def random(self, shape):
        if self._rng is None:
            self._rng = np.random.default_rng(self._key)
        return self._backend.to_device(self._rng.random(shape, dtype=np.float32))


class TrainStep:
    """A model's training step: its layers, weight and optimizer-slot variables, loss and
    optimizer. Picklable (variables travel as handles), so strategies ship it to workers.

    Calling it runs the mirrored loop on one replica; `gradients` is what a parameter-server
    worker computes between its pull and its push.
    """

    def __init__(self, layers: list, weights: list[dict], slots: list[dict], loss, optimizer,
                 seed: int, metrics: tuple = (), outer: diloco.OuterVariables | None = None,
                 states: list[dict] | None = None, targets: tuple | None = None):
        self.layers = layers
        self.weights = weights  # per layer: {name: Variable}
        # per layer: {name: Variable}, non-trainable and ON_WRITE / NONE (batch norm's moving
        # statistics): each replica updates its own copy in the forward pass
        self.states = states if states is not None else [{} for _ in layers]
        self.slots = slots  # per layer: {name: {slot: Variable}} (each replica keeps its own)
        self.loss = loss
        self.optimizer = optimizer
        self.seed = seed
        self.metrics = tuple(metrics)  # training.metrics.Formula: only the compiled ones
        self.outer = outer  # local SGD / DiLoCo's variables, if the model has made them
        # (sample shape, dtype) of the targets where each target row carries its sample's
        # weight as a last column (fit's sample_weight / class_weight), else None
        self.targets = targets

    def variables(self) -> list:
        """The weight variables, in layer order."""
        return [v for w in self.weights for v in w.values()]

    def state_variables(self) -> list:
        """The layers' non-trainable state variables (batch norm's moving statistics)."""
        return [v for s in self.states for v in s.values()]

    @property
    def makes_collectives(self) -> bool:
        """Whether a layer's forward or backward pass talks to the other replicas."""
        return any(layer.makes_collectives for layer in self.layers)

    def slot_variables(self) -> list[dict]:
        """Per weight (same order as `variables()`): {slot name: Variable}."""
        return [d for layer in self.slots for d in layer.values()]

    def gradients(self, xp, backend, params: list[dict], x, y, rank: int, iteration: int,
                  total: int, out: list[dict] | None = None, ready=None,
                  states: list[dict] | None = None,
                  squares: list[dict] | None = None) -> tuple[list[dict], Any]:
        """Gradients of (sum of this shard's losses) / `total` at `params` (per layer: {name:
        array}; written into `out` where given), and [loss sum, each metric's sum];
        `iteration` counts from 1 and seeds dropout; `ready(i)` after layer i's backward
        (and `ready.abandon()`, where it has one, if the backward pass raises); `states`:
        this replica's copies of the layers' state, updated in place; `squares` (per layer:
        {name: array} of its `sliced` parameters): filled with their squared slices."""
        rng = DeviceRNG(backend, (self.seed, rank, iteration))
        y, weight = split_weights(y, self.targets)
        return gradients(xp, self.layers, params, self.loss, x, y, rng, len(x), total,
                         self.metrics, out, ready, states, weight, squares)

    def round_state(self, ctx, names: list, local: bool) -> diloco.RoundState | None:
        """This replica's local-SGD round, where local SGD is on or a round is still open."""
        if self.outer is None:
            if local:
                raise RuntimeError("local SGD is on but the model has no outer state: fit "
                                   "makes it when the strategy has local_steps set")
            return None
        state = diloco.RoundState(ctx, self.outer, [tuple(self.weights[i][k].shape)
                                                    for i, k in names])
        return state if local or state.pending() else None

    def __call__(self, shards: list[tuple] | EpochPlan, totals: list[int] | None = None,
                 first_iteration: int = 0) -> Any:
        """On one mirrored replica: train on this replica's shard of each global batch
        (sizes `totals`), numbering steps from `first_iteration` + 1; returns (loss sum,
        metric sums (an array, one per compiled metric), n) per step, identical on every
        replica. The per-step figures stay on the device until the group ends: one host
        transfer per `steps_per_execution` steps.

        Given an `EpochPlan` instead (`shards` alone), the replica runs the plan's groups on
        its own, slicing its shards from the placed data (`run_plan`)."""
        if isinstance(shards, EpochPlan):
            return self.run_plan(shards)
        loop = _Loop(self, stop_column=False)
        host = loop.group(iter(shards), totals, first_iteration)
        loop.finish()
        return [(float(row[0]), np.asarray(row[1:], np.float64), total)
                for row, total in zip(host.tolist(), totals, strict=True)]

    def run_plan(self, plan: EpochPlan) -> tuple[np.ndarray, np.ndarray]:
        """On one mirrored replica: the plan's groups one after the other, with no driver in
        between. After each group every replica holds the group's figures (they ride the
        gradients' all-reduce) and replica 0 writes them to the plan's board; a stop request
        read there (once a group, at its last step) rides the same all-reduce as a flag, so
        every replica ends after the same group. Returns (rows: per step loss sum and metric
        sums, samples per step) for the steps taken, identical on every replica."""
        from labdist.replica.replica_context import current

        ctx = current()
        rank, n = ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync
        board = ReplicaBoard(plan.board, 1 + len(self.metrics), writer=rank == 0)
        loop = _Loop(self, stop_column=True)
        rows, totals = [], []
        to_device = ctx.backend.to_device
        try:
            iteration = plan.first_iteration
            for g, group in enumerate(plan.groups()):
                sizes = [plan.total(b) for b in group]
                shards = ((to_device(x), to_device(y))
                          for x, y in (plan.shard(b, rank, n) for b in group))
                host = loop.group(shards, sizes, iteration, stop=board.stop_requested)
                iteration += len(group)
                rows.append(host[:, :-1])
                totals.extend(sizes)
                board.record(g, float(host[:, 0].sum()), host[:, 1:-1].sum(axis=0),
                             float(sum(sizes)), len(group))
                if host[-1, -1] > 0:  # a stop request, seen by some replica: all end here
                    break
            loop.finish()
            board.end()
        finally:
            board.close()
        width = 1 + len(self.metrics)
        out = np.concatenate(rows) if rows else np.zeros((0, width))
        return out, np.asarray(totals, np.float64)


class _Loop:
    """One replica's training loop over groups of batches in one step function: the local
    copies, flat views and the figures' buffers made once; `finish` once after the last
    group. `stop_column`: each step's figures carry one more column, where the last step of
    a group sums the replicas' stop requests (the driver's, read on each replica)."""

    def __init__(self, step: TrainStep, stop_column: bool):
        from labdist.replica.replica_context import current

        self.step = step
        self.ctx = ctx = current()
        xp = ctx.xp
        self.names = names = [(i, k) for i, w in enumerate(step.weights) for k in w]
        self.params = params = [{k: ctx.local_copy(v) for k, v in w.items()}
                                for w in step.weights]
        self.states = [{k: ctx.local_copy(v) for k, v in s.items()} for s in step.states]
        self.flat_params = [params[i][k].reshape(-1) for i, k in names]
        self.flat_slots = [{s: ctx.local_copy(v).reshape(-1)
                            for s, v in step.slots[i][k].items()} for i, k in names]
        self.out = gradient_buffer(ctx, params)  # the gradients' persistent buffer
        # an embedding's squared lookup slices, for the second moments (None: no layer has
        # sliced gradients, the step does nothing more)
        self.squares = squares_buffer(ctx, step.layers, params)
        self.flat_squares = None if self.squares is None else [
            self.squares[i][k].reshape(-1) if k in self.squares[i] else None
            for i, k in names]
        self.width = 1 + len(step.metrics)
        self.extra = int(stop_column)
        self.stats = xp.zeros(self.width + self.extra, dtype=xp.float64)
        # with a stop column, the figures ride the all-reduce from a buffer of that width
        self.rider = xp.zeros(self.width + 1, dtype=xp.float64) if stop_column else None
        self.sharded = False
        self.local = ctx.local_sgd is not None

    def group(self, shards, totals: list[int], first_iteration: int, stop=None):
        """Train on `shards` (this replica's (x, y) of each global batch, sizes `totals`),
        steps numbered from `first_iteration` + 1; the group's per-step figures on the host
        (one row a step; with a stop column, its last row's says whether to stop)."""
        ctx, step_obj = self.ctx, self.step
        xp, width, names = ctx.xp, self.width, self.names
        flat_params, flat_slots = self.flat_params, self.flat_slots
        history = xp.zeros((len(totals), width + self.extra), dtype=xp.float64)  # on the device
        local = self.local
        state = step_obj.round_state(ctx, names, local)
        last = first_iteration + len(totals)
        # a layer that talks to the other replicas mid-step (synchronized batch norm) keeps
        # the step's collectives on this thread, in one order on every replica
        squares = self.flat_squares
        buckets = None if (local or state is not None or step_obj.makes_collectives
                           or squares is not None) \
            else overlap.Buckets.make(
            ctx, "the training step's gradients", step_obj.optimizer, names, self.out,
            flat_params, flat_slots, first_iteration + 1, apply_summed)
        for step, ((x, y), total) in enumerate(zip(shards, totals, strict=True),
                                               start=first_iteration + 1):
            grads, local_stats = step_obj.gradients(xp, ctx.backend, self.params, x, y,
                                                    ctx.replica_id_in_sync_group, step, total,
                                                    self.out, buckets, self.states,
                                                    self.squares)
            grads = [grads[i][k] for i, k in names]
            row = step - first_iteration - 1
            if local:  # this replica's own step; the figures are summed once, below
                diloco.local_step(ctx, step_obj.optimizer, grads, flat_params, flat_slots,
                                  step, state, owned=True, squares=squares)
                history[row, :width] = local_stats
                continue
            if state is not None:  # local SGD was just turned off: close its round first
                diloco.leave_local(ctx, flat_params, flat_slots, state)
            rider = local_stats
            if self.rider is not None:
                rider = self.rider
                rider[:width] = local_stats
                rider[width] = float(step == last and stop())
            if buckets is not None:  # the later layers' sum is under way already
                self.sharded |= buckets.finish((rider, self.stats))
            else:
                self.sharded |= apply_summed(ctx, "the training step's gradients",
                                             step_obj.optimizer, grads, flat_params,
                                             flat_slots, step, rider=(rider, self.stats),
                                             squares=squares)
            ctx.communication.synced_steps += 1
            history[row] = self.stats
        if state is not None:
            state.save()
        phases.RECORDER.trained(len(totals))  # labdist_steps_total counts optimizer steps
        if local:
            if self.extra:
                history[-1, width] = float(stop())
            history = ctx.reduce_arrays("fit's loss and accuracy", [history], ReduceOp.SUM)[0]
        return ctx.backend.to_host(history)  # the one device -> host move of the group

    def finish(self) -> None:
        """After the last group: slots that each rank updated only in its own segment (a
        partitioned update) are made whole, once (every step of a run partitions alike)."""
        slots = [a for d in self.flat_slots for a in d.values()]
        if self.sharded and slots:
            self.ctx.gather_segments("the optimizer's slots", slots)


def apply_summed(ctx, what: str, optimizer, grads: list, params: list, slots: list[dict],
                 step: int, rider: tuple | None = None, squares: list | None = None) -> bool:
    """Sum `grads` over the replicas and apply `optimizer`'s step to `params` (flat, this
    replica's copies) and their `slots`, segment by segment as the reduce-scatter hands them
    out; `rider`: (array, target) summed along and stored (fit's loss and accuracy);
    `squares` (flat, per gradient, None where it has none): sliced gradients' squared slices,
    summed over the replicas first (TensorFlow gathers every replica's slices) and given to
    the optimizer's second moments. Returns whether the step was partitioned: the slots then
    need `ctx.gather_segments`, once the caller's steps are done (each rank updated only its
    own segment of them)."""
    xp, n = ctx.xp, len(params)
    squared = None if squares is None else summed_squares(ctx, what, squares)

    def update(j, lo, hi, summed):
        if j == n:
            rider[1][lo:hi] = summed
            return
        sq = None if squared is None else squared[j]
        optimizer.apply(xp, params[j][lo:hi], summed,
                        {s: a[lo:hi] for s, a in slots[j].items()}, step,
                        None if sq is None else sq[lo:hi])

    if rider is None:
        return ctx.reduce_apply(what, grads, params, update, gradients=n)
    return ctx.reduce_apply(what, [*grads, rider[0]], [*params, rider[1]], update, gradients=n)


def summed_squares(ctx, what: str, squares: list) -> list:
    """`squares` (flat arrays or None) summed over the replicas in one all-reduce, in place
    of the arrays; the Nones stay."""
    present = [s for s in squares if s is not None]
    summed = iter(ctx.reduce_arrays(f"{what}' squared slices", present, ReduceOp.SUM))
    return [None if s is None else next(summed).reshape(-1) for s in squares]


def squares_buffer(ctx, layers: list, params: list[dict]) -> list[dict] | None:
    """Per layer, {name: array} for its `sliced` parameters' squared slices, views of one
    buffer this replica keeps across steps; None where no layer has a sliced parameter."""
    if not any(layer.sliced for layer in layers):
        return None
    wanted = [(i, k) for i, layer in enumerate(layers) for k in sorted(layer.sliced)]
    arrays = [params[i][k] for i, k in wanted]
    key = ("squared slices", tuple(tuple(a.shape) for a in arrays), str(arrays[0].dtype))
    flat = ctx.persistent_buffer(key, sum(a.size for a in arrays), arrays[0].dtype)
    views: list[dict] = [{} for _ in layers]
    at = 0
    for (i, k), a in zip(wanted, arrays, strict=True):
        views[i][k] = flat[at:at + a.size].reshape(a.shape)
        at += a.size
    return views


def gradient_buffer(ctx, params: list[dict]) -> list[dict] | None:
    """Views, shaped as `params` (per layer: {name: array}), of one flat buffer this replica
    keeps across steps for this layout: the backward pass writes each layer's gradients
    there, so a step allocates (and page-faults) no gradient arrays. None where the
    parameters do not share one dtype."""
    arrays = [a for p in params for a in p.values()]
    if not arrays or any(a.dtype != arrays[0].dtype for a in arrays):
        return None
    key = ("gradients", tuple(tuple(a.shape) for a in arrays), str(arrays[0].dtype))
    flat = ctx.persistent_buffer(key, sum(a.size for a in arrays), arrays[0].dtype)
    views, at = [], 0
    for p in params:
        views.append({})
        for k, a in p.items():
            views[-1][k] = flat[at:at + a.size].reshape(a.shape)
            at += a.size
    return views


def split_weights(y, targets: tuple | None):
    """(targets, per-sample weights or None) of a target array that may carry the weights
    as its last column (fit_checks.with_weights)."""
    if targets is None:
        return y, None
    shape, dtype = targets
    return y[:, :-1].reshape(len(y), *shape).astype(dtype), y[:, -1]


def gradients(xp, layers, params, loss, x, y, rng, local, total, metrics=(), out=None,
              ready=None, states=None, weight=None, squares=None):
    """Gradients of (sum of this shard's losses) / global batch size, and [loss sum, each
    metric's sum over the shard]; with `out` (per layer: {name: array}), written there;
    `states` (per layer: {name: array}): the layers' state, updated in place; `squares`
    (per layer: {name: array}): the sliced parameters' squared slices, written there."""
    if local == 0:  # an empty shard still joins the all-reduce, with zeros
        _join_without_data(xp, layers, x.shape[1:], states)
        for layer_squares in squares or ():
            for v in layer_squares.values():
                v[...] = 0
        if out is not None:
            for grads in out:
                for v in grads.values():
                    v[...] = 0
            return out, xp.zeros(1 + len(metrics), dtype=xp.float64)
        grads = [{k: xp.zeros_like(v) for k, v in p.items()} for p in params]
        return grads, xp.zeros(1 + len(metrics), dtype=xp.float64)
    try:
        return _backward(xp, layers, params, loss, x, y, rng, local, total, metrics, out, ready,
                         states, weight, squares)
    except BaseException:  # a bucket already handed to the helper thread: let it finish
        abandon = getattr(ready, "abandon", None)  # (its peers are in it), before we raise
        if abandon is not None:
            abandon()
        raise


def _join_without_data(xp, layers, sample_shape, states) -> None:
    """An empty shard's part in the collectives its layers make mid-step: the forward
    pass's in layer order, then the backward pass's in reverse, as the other replicas."""
    if not any(layer.makes_collectives for layer in layers):
        return
    shapes = [tuple(sample_shape)]
    for layer in layers[:-1]:
        shapes.append(tuple(layer.output_shape(shapes[-1])))
    states = states if states is not None else [None] * len(layers)
    for layer, shape, state in zip(layers, shapes, states, strict=True):
        layer.join_without_data(xp, shape, backward=False, state=state)
    for i in range(len(layers) - 1, 0, -1):  # the first layer computes no input gradient
        layers[i].join_without_data(xp, shapes[i], backward=True)


def _backward(xp, layers, params, loss, x, y, rng, local, total, metrics, out, ready, states,
              weight=None, squares=None):
    """`gradients` of a shard that is not empty."""
    caches, h = [], x
    states = states if states is not None else [None] * len(layers)
    for layer, p, st in zip(layers, params, states, strict=True):
        if st:  # only a layer with state takes it (a layer written before state need not)
            h, cache = layer.forward(xp, p, h, training=True, rng=rng, state=st)
        else:
            h, cache = layer.forward(xp, p, h, training=True, rng=rng)
        caches.append(cache)
    value, dh = loss.value_and_grad(xp, y, h)
    if weight is not None:  # Keras 3: sum(w * loss) / samples, each row's gradient times w
        weight = weight.astype(h.dtype, copy=False)
        value = (loss.per_sample(xp, y, h) * weight).sum() / len(h)
        dh = dh * weight.reshape(len(h), *([1] * (h.ndim - 1)))
    last = layers[-1]
    fused = (loss.name == "sparse_categorical_crossentropy" and not loss.from_logits
             and isinstance(last, Dense) and last.activation.name == "softmax")
    grads: list[dict] = [None] * len(layers)
    start = len(layers) - 1
    scale = local / total
    if fused:  # softmax + cross-entropy: d loss / d logits = p - onehot, stable and cheap
        dz = losses.fused_softmax_grad(xp, y, h) * scale
        if weight is not None:
            dz *= weight.reshape(-1, 1)
        dh, grads[-1] = last.backward_linear(xp, params[-1], caches[-1][0], dz, start > 0,
                                             None if out is None else out[-1])
        _penalize(xp, last, params[-1], grads[-1], scale)
        if ready is not None:
            ready(start)
        start -= 1
    else:
        dh = dh * scale
    for i in range(start, -1, -1):
        if squares is not None and squares[i]:  # before backward: dh is this layer's dy
            layers[i].squared_slices(xp, caches[i], dh, squares[i])
        if out is None:
            dh, grads[i] = layers[i].backward(xp, params[i], caches[i], dh, input_grad=i > 0)
        else:
            dh, grads[i] = layers[i].backward(xp, params[i], caches[i], dh, input_grad=i > 0,
                                              out=out[i])
        _penalize(xp, layers[i], params[i], grads[i], scale)
        if ready is not None:
            ready(i)
    stats = xp.zeros(1 + len(metrics), dtype=xp.float64)  # filled on the device: no host sync
    stats[0] = (value + penalty(layers, params)) * local
    for j, metric in enumerate(metrics, start=1):
        stats[j] = metric(xp, y, h)
    return grads, stats


def _penalize(xp, layer, params: dict, grads: dict, scale: float) -> None:
    """Add the layer's weight penalties' gradients (Keras' regularizers) to its gradients, in
    place, scaled as the data's: each replica's share of the batch, so summed over the
    replicas (or one parameter-server push) the penalty counts once."""
    for k, reg in layer.regularizers().items():
        grads[k] += scale * reg.gradient(xp, params[k])


def penalty(layers, params) -> float:
    """The model's weight penalties at `params` (0 without regularizers): Keras adds them to
    the logged loss."""
    total = 0.0
    for layer, p in zip(layers, params, strict=True):
        for k, reg in layer.regularizers().items():
            total = total + reg(p[k])
    return total


def forward_step(layers, weights, x, y, loss, metrics=(), states=None):
    """On a replica: the model's output on `x`, or with `y` its (loss sum, metric sums);
    each layer's state is this replica's own copy (batch norm normalises with it)."""
    from labdist.replica.replica_context import current

    ctx = current()
    xp = ctx.xp
    h = x
    states = states if states is not None else [{} for _ in layers]
    for layer, w, st in zip(layers, weights, states, strict=True):
        params = {k: ctx.local_copy(v) for k, v in w.items()}
        if st:
            h, _ = layer.forward(xp, params, h,
                                 state={k: ctx.local_copy(v) for k, v in st.items()})
        else:
            h, _ = layer.forward(xp, params, h)
    if y is None:
        return h
    if len(x) == 0:
        return 0.0, np.zeros(len(metrics))
    value, _ = loss.value_and_grad(xp, y, h)
    params = [{k: ctx.local_copy(v) for k, v in w.items()} for w in weights]
    value = value + penalty(layers, params)
    return float(value) * len(x), np.array([float(m(xp, y, h)) for m in metrics])
