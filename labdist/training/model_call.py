"""`model(x, training=...)`: Keras' eager call, inside a step or on the driver.

Inside `strategy.run` the layers run on this replica's copies of the weights (a training call
updates the replica's own batch-norm statistics, as TensorFlow's does). Under an open
`ld.GradientTape` the output is recorded: `tape.gradient` runs the layers' backward pass,
the same one `fit` runs, into the model's weights. A model not built yet is built at its
first call; from inside a step, through one `merge_call` (the driver makes the variables).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from labdist import autodiff, context, shipping
from labdist.replica import replica_context

_calls = itertools.count(1)  # this process's calls: each training call draws its own masks


def call(model, x: Any, training: bool = False) -> Any:
    """The model's output on the batch `x` (see the module doc)."""
    if not isinstance(training, bool | np.bool_):
        raise TypeError(f"training={training!r} must be True or False")
    ctx = replica_context.current()
    if ctx is None and context.is_default(model.strategy) and context.scoped_strategy() is None:
        ctx = model.strategy.default_replica_context()  # no strategy: the one local replica
    recorded_x = x if isinstance(x, autodiff.Recorded) else None
    data = autodiff.unwrap(x)
    data = np.asarray(data) if ctx is None else ctx.xp.asarray(data)
    if data.ndim < 2:
        raise ValueError(f"model({type(x).__name__} of shape {tuple(data.shape)}): a model "
                         "takes a batch, the samples along the first axis")
    if not model.built:
        _build(model, ctx, tuple(int(n) for n in data.shape[1:]))
    elif tuple(data.shape[1:]) != tuple(model.input_shape[1:]):
        raise ValueError(f"model({tuple(data.shape)}): the model takes samples of shape "
                         f"{tuple(model.input_shape[1:])} (built for input_shape="
                         f"{model.input_shape})")
    layers, weights, states = model.layers, model.weight_dicts(), model.state_dicts()
    if ctx is None:  # on the driver, under a strategy: the replicas' weights, read here
        if training and any(states):
            raise ValueError(
                "model(x, training=True) on the driver would update batch normalization's "
                "moving statistics on no replica: call it inside strategy.run (each replica "
                "updates its own), or use training=False")
        xp = np
        params = [{k: v.numpy() for k, v in w.items()} for w in weights]
        local_states = [{k: v.numpy() for k, v in s.items()} for s in states]
        rank = 0
    else:
        xp = ctx.xp
        params = [{k: ctx.local_copy(v) for k, v in w.items()} for w in weights]
        local_states = [{k: ctx.local_copy(v) for k, v in s.items()} for s in states]
        rank = ctx.replica_id_in_sync_group
    leaves = [{k: autodiff.read(v, params[i][k]) for k, v in w.items()}
              for i, w in enumerate(weights)]
    rng = _Masks(ctx, (model.seed, rank, next(_calls))) if training else None
    caches, h = [], data
    for layer, p, st in zip(layers, params, local_states, strict=True):
        if st:
            h, cache = layer.forward(xp, p, h, training=training, rng=rng, state=st)
        else:
            h, cache = layer.forward(xp, p, h, training=training, rng=rng)
        caches.append(cache)
    watched = [(i, k, leaf) for i, w in enumerate(leaves) for k, leaf in w.items()
               if isinstance(leaf, autodiff.Recorded)]
    if not watched and recorded_x is None:
        return h

    wanted = {(i, k) for i, k, _ in watched}

    def backward(g):
        grads: dict[tuple, Any] = {}
        for i in range(len(layers) - 1, -1, -1):
            want_input = i > 0 or recorded_x is not None
            # an Embedding table: its lookups' squared slices (sliced.py), which only a
            # numpy gradient carries
            sliced = [k for k in sorted(layers[i].sliced) if (i, k) in wanted] \
                if xp is np else []
            squares = {k: xp.zeros_like(params[i][k]) for k in sliced}
            if squares:
                layers[i].squared_slices(xp, caches[i], g, squares)
            g, layer_grads = layers[i].backward(xp, params[i], caches[i], g,
                                                input_grad=want_input)
            for k, grad in layer_grads.items():
                grads[(i, k)] = (autodiff.SlicedGradient(grad, squares[k]) if k in squares
                                 else grad)
        return (g if recorded_x is not None else None,
                *(grads.get((i, k)) for i, k, _ in watched))

    parents = (recorded_x, *(leaf for _, _, leaf in watched))
    return autodiff.node(h, parents, backward)


class _Masks:
    """Dropout's draws for one training call, from a (seed, replica, call) stream, on the
    replica's device."""

    def __init__(self, ctx, key: tuple):
        self._ctx = ctx
        self._rng = np.random.default_rng(key)

    def random(self, shape):
        draw = self._rng.random(shape, dtype=np.float32)
        return draw if self._ctx is None else self._ctx.backend.to_device(draw)


def _build(model, ctx, sample_shape: tuple) -> None:
    """Build at the first call: here on the driver, or through the driver from a step."""
    if ctx is None or ctx is not replica_context.current():  # the driver's own thread
        model.build(sample_shape)
        return
    token = model.__dict__.get(shipping.TOKEN)
    built = ctx.merge_call(_build_on_driver, args=(token, sample_shape))
    model.adopt_build(*built)


def _build_on_driver(strategy, token, sample_shape) -> tuple:
    """merge_call's function: build the user's model (the driver's object) and hand each
    replica the variables it made."""
    model = shipping.driver_object_by_token(token)
    if model is None:
        raise RuntimeError("a model first called inside strategy.run must be made in this "
                           "driver process; build it first: model.build(input_shape)")
    if not model.built:
        model.build(sample_shape)
    return model.build_record()
