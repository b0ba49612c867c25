"""`optimizer.apply_gradients` inside `strategy.run`: TensorFlow's custom-loop update, done
the way `fit` does it.

A step that all-reduces its gradients and then calls `v.assign_sub` on MEAN variables
exchanges twice: each assign's own aggregation reduces the (already identical) deltas again.
`apply_gradients` does what TensorFlow's optimizer does in a replica context: one all-reduce
that **sums** every gradient over the replicas (so scale each replica's loss by the global
batch size, as `tf.nn.compute_average_loss` does), then the same optimizer step on every
replica's copy, in place. The copies stay identical without another exchange. Optimizer state
(momentum, Adam's moments) lives in slot variables, and the step count in `iterations`, that
`optimizer.build(variables)` makes under the strategy's scope, as in Keras.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from labdist import autodiff, context, shipping
from labdist.enums import ReduceOp
from labdist.enums import VariableSynchronization as Sync
from labdist.replica.replica_context import current
from labdist.training.trainer import diloco
from labdist.training.trainer.steps import apply_summed

WHAT = "optimizer.apply_gradients"


def needs_slots(optimizer) -> bool:
    """Whether `optimizer` keeps state per parameter (anything but plain SGD)."""
    return bool(optimizer.slots(np.zeros(1, np.float32)))


def build(optimizer, variables) -> None:
    """On the driver, under the variables' strategy's scope: make the slot variables of each
    variable not built yet, and the step count. Each replica keeps its own copy of them
    (synchronization NONE): every replica applies the same summed gradients, so they agree."""
    from labdist.variables import Variable

    if current() is not None:
        raise RuntimeError(f"{type(optimizer).__name__}.build(variables) makes variables: "
                           "call it under strategy.scope() on the driver, before strategy.run")
    variables = list(variables)
    for v in variables:
        if not isinstance(v, Variable):
            raise TypeError(f"build(variables): {v!r} is not an ld.Variable")
    if optimizer.iterations is None:
        # as TF's: mirrored, ONLY_FIRST_REPLICA; every replica counts alike, so the driver
        # reads it as any other variable
        optimizer.iterations = Variable(np.zeros((), np.int64), trainable=False,
                                        aggregation="ONLY_FIRST_REPLICA", name="iterations")
    strategy = context.get_strategy()
    if strategy.local_steps is not None:  # local SGD / DiLoCo's state
        if optimizer.outer is None or optimizer.outer.ids != [v.id for v in variables]:
            optimizer.outer = diloco.OuterVariables(variables, strategy.outer_optimizer)
        else:
            optimizer.outer.ensure_slots(strategy.outer_optimizer)
    for v in variables:
        if v.id not in optimizer.slot_variables:
            optimizer.slot_variables[v.id] = {
                s: Variable(a, synchronization="NONE", trainable=False, name=f"{v.name}/{s}")
                for s, a in optimizer.slots(np.zeros(v.shape, v.dtype)).items()}
    optimizer.restore_deferred()  # a checkpoint restored before the optimizer was built


def build_from_replica(ctx, optimizer, variables: list) -> None:
    """Keras 3's lazy build, from inside `strategy.run`: the replicas pause in one
    `merge_call`, the driver builds the user's optimizer (its slot variables and step count,
    under the scope), and each replica's copy takes the handles it made."""
    token = optimizer.__dict__.get(shipping.TOKEN)
    made = ctx.merge_call(_build_on_driver, args=(token, variables))
    optimizer.iterations, slots = made
    optimizer.slot_variables.update(slots)


def _build_on_driver(strategy, token, variables) -> tuple:
    """merge_call's function: build the driver's optimizer for `variables`."""
    optimizer = shipping.driver_object_by_token(token)
    if optimizer is None:
        raise RuntimeError(
            "apply_gradients could not build the optimizer from inside strategy.run (it was "
            "not made in this driver process): call optimizer.build(variables) under "
            "strategy.scope() before strategy.run")
    with strategy.scope():
        build(optimizer, variables)
    return optimizer.iterations, {v.id: optimizer.slot_variables[v.id] for v in variables}


def _checked(optimizer, grads_and_vars) -> list[tuple[Any, Any]]:
    """The (gradient, variable) pairs to apply: None gradients skipped, as TensorFlow does;
    anything else wrong is an error naming the variable, before anything changes."""
    from labdist.variables import Variable

    pairs = []
    for i, pair in enumerate(grads_and_vars):
        try:
            g, v = pair
        except (TypeError, ValueError):
            raise TypeError(f"grads_and_vars[{i}] must be a (gradient, variable) pair, got "
                            f"{pair!r}") from None
        if not isinstance(v, Variable):
            raise TypeError(f"grads_and_vars[{i}]: {v!r} is not an ld.Variable")
        if v.synchronization is Sync.NONE:
            raise ValueError(f"apply_gradients updates mirrored (AUTO, ON_WRITE) or ON_READ "
                             f"variables; {v.name!r} is synchronization NONE: each replica "
                             "owns it, update it with v.assign_sub")
        if g is None:
            continue
        if tuple(np.shape(g)) != v.shape:
            raise ValueError(f"the gradient of {v.name!r} has shape {tuple(np.shape(g))}; the "
                             f"variable's shape is {v.shape}")
        pairs.append((g, v))
    if not pairs:
        raise ValueError("apply_gradients: no gradients provided for any variable")
    if len({v.id for _, v in pairs}) != len(pairs):
        raise ValueError("apply_gradients: a variable appears twice in grads_and_vars")
    return pairs


def _round_state(ctx, optimizer, pairs) -> diloco.RoundState:
    outer = optimizer.outer
    if outer is None or outer.ids != [v.id for _, v in pairs]:
        raise RuntimeError(
            "local SGD is on: call optimizer.build(variables) under strategy.scope() after "
            "setting local_steps, with the variables apply_gradients updates, in that order")
    return diloco.RoundState(ctx, outer, [v.shape for _, v in pairs])


def _apply_to_each_copy(ctx, optimizer, grads, params, slots, step, pairs) -> None:
    """TensorFlow's step on ON_READ variables: the summed gradient applied to each replica's
    own copy, which may differ from the others' (measured in TF 2.21: copies 1 and 2, gradients
    10 and 20, SGD(1.0) -> -29 and -28). Never partitioned: a segment updated on one replica
    and gathered would overwrite the other copies."""
    if ctx.local_sgd is not None:
        names = [v.name for _, v in pairs if v.synchronization is Sync.ON_READ]
        raise ValueError(f"local SGD averages mirrored weights; ON_READ variables {names} "
                         "cannot take part: apply their gradients outside the local rounds")
    summed = ctx.reduce_arrays(WHAT, grads, ReduceOp.SUM)
    for param, grad, slot in zip(params, summed, slots, strict=True):
        optimizer.apply(ctx.xp, param, grad, slot, step)
    ctx.communication.synced_steps += 1


def apply_gradients(optimizer, grads_and_vars) -> None:
    """On a replica, inside `strategy.run`: sum the gradients over the replicas in one
    all-reduce and apply `optimizer`'s step to this replica's copies (module doc)."""
    ctx = current()
    if ctx is None or ctx.mode != "replica":
        raise RuntimeError(
            "optimizer.apply_gradients runs inside strategy.run, on each replica (it sums the "
            "replicas' gradients); outside a step use model.fit, or v.assign_sub")
    from labdist.parameter_server.worker_context import WorkerContext

    if isinstance(ctx, WorkerContext):
        raise RuntimeError(
            "optimizer.apply_gradients is for mirrored strategies; under "
            "ParameterServerStrategy push updates with v.assign_sub (applied on the parameter "
            "server), or train with model.fit")
    pairs = _checked(optimizer, grads_and_vars)
    if ctx.compression is not None:  # before anything changes (the step count included)
        for _, v in pairs:
            ctx.compression.check_dtype(v.dtype, f"the gradient of {v.name!r}")
    stateful = needs_slots(optimizer)
    if optimizer.iterations is None or (stateful and any(
            v.id not in optimizer.slot_variables for _, v in pairs)):
        build_from_replica(ctx, optimizer, [v for _, v in pairs])
    xp = ctx.xp
    step = 1
    if optimizer.iterations is not None:
        count = ctx.local_copy(optimizer.iterations)
        count += 1
        step = int(count)
    params = [ctx.local_copy(v).reshape(-1) for _, v in pairs]
    # an Embedding table's gradient from the tape carries its lookups' squared slices
    # (autodiff/sliced.py): the second moments take their sum over the replicas, as fit's
    squares = [autodiff.squares_of(g) for g, _ in pairs]
    squares = ([None if s is None else xp.asarray(s, dtype=p.dtype).reshape(-1)
                for s, p in zip(squares, params, strict=True)]
               if any(s is not None for s in squares) else None)
    grads = [xp.asarray(g, dtype=p.dtype) for (g, _), p in zip(pairs, params, strict=True)]
    slots = [{s: ctx.local_copy(sv).reshape(-1)
              for s, sv in optimizer.slot_variables.get(v.id, {}).items()} for _, v in pairs]
    if any(v.synchronization is Sync.ON_READ for _, v in pairs):
        _apply_to_each_copy(ctx, optimizer, grads, params, slots, step, pairs)
        return
    if ctx.local_sgd is not None:
        state = _round_state(ctx, optimizer, pairs)
        diloco.local_step(ctx, optimizer, grads, params, slots, step, state)
        state.save()
        return
    if optimizer.outer is not None and optimizer.outer.ids == [v.id for _, v in pairs]:
        state = _round_state(ctx, optimizer, pairs)
        if state.pending():  # local SGD was just turned off: close its round first
            diloco.leave_local(ctx, params, slots, state)
            state.save()
    sharded = apply_summed(ctx, WHAT, optimizer, grads, params, slots, step, squares=squares)
    ctx.communication.synced_steps += 1
    state = [a for d in slots for a in d.values()]
    if sharded and state:  # each rank updated its own segment of the slots: make them whole
        ctx.gather_segments(f"{WHAT}'s slots", state)
