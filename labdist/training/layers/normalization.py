"""`BatchNormalization`, with TensorFlow's distributed behaviour: the place where TensorFlow
itself uses aggregation NONE.

Its moving mean and variance are ON_WRITE / NONE state: while training, each replica updates
its own copy from its own slice of the batch, so the copies drift apart (a cross-replica read
and `get_weights` give replica 0's copy; `predict` and `evaluate` normalise each replica's
slice with that replica's copy). With `synchronized=True` the batch statistics are summed
across the replicas every step (one small all-reduce in the forward pass, one in the
backward), so every replica normalises with the global batch's statistics and the copies
stay equal.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from labdist import checks
from labdist.enums import ReduceOp
from labdist.training.layers.base import Layer, Shape, check_input_shape


def _context():
    """The replica this runs on (None outside `strategy.run`: one process, nothing to sum)."""
    from labdist.replica.replica_context import current

    ctx = current()
    return ctx if ctx is not None and ctx.num_replicas_in_sync > 1 else None


class BatchNormalization(Layer):
    """y = gamma * (x - mean) / sqrt(var + epsilon) + beta over the last axis (features or
    channels), with the batch's statistics while training and the moving ones otherwise;
    moving = moving * momentum + batch * (1 - momentum). Keras' defaults."""

    def __init__(self, momentum: float = 0.99, epsilon: float = 1e-3, center: bool = True,
                 scale: bool = True, synchronized: bool = False,
                 input_shape: tuple[int, ...] | None = None):
        self.momentum = checks.fraction("momentum", momentum)
        self.epsilon = checks.positive("epsilon", epsilon)
        self.center = checks.boolean("center", center)
        self.scale = checks.boolean("scale", scale)
        self.synchronized = checks.boolean("synchronized", synchronized)
        self.input_shape = check_input_shape(input_shape)

    def output_shape(self, input_shape: Shape) -> Shape:
        return input_shape

    def param_shapes(self, input_shape: Shape) -> dict[str, Shape]:
        features = (input_shape[-1],)
        return {**({"gamma": features} if self.scale else {}),
                **({"beta": features} if self.center else {})}

    def build(self, input_shape: Shape, rng: np.random.Generator) -> dict[str, np.ndarray]:
        features = input_shape[-1]
        return {**({"gamma": np.ones(features, np.float32)} if self.scale else {}),
                **({"beta": np.zeros(features, np.float32)} if self.center else {})}

    def state_shapes(self, input_shape: Shape) -> dict[str, Shape]:
        return {"moving_mean": (input_shape[-1],), "moving_variance": (input_shape[-1],)}

    def build_state(self, input_shape: Shape) -> dict[str, np.ndarray]:
        return {"moving_mean": np.zeros(input_shape[-1], np.float32),
                "moving_variance": np.ones(input_shape[-1], np.float32)}

    def _statistics(self, xp, x, axes):
        """(mean, variance, samples per feature) of this replica's slice, or of the global
        batch when synchronized (sums and counts all-reduced)."""
        count = math.prod(x.shape[a] for a in axes)
        ctx = _context() if self.synchronized else None
        if ctx is None:
            mean = x.mean(axis=axes)
            return mean, ((x - mean) ** 2).mean(axis=axes), count
        sums = xp.stack([x.sum(axis=axes), (x * x).sum(axis=axes),
                         xp.full(x.shape[-1], float(count), dtype=x.dtype)])
        total = ctx.reduce_arrays(f"{self!r}'s batch statistics", [sums], ReduceOp.SUM)[0]
        n = total[2]
        mean = total[0] / n
        return mean, total[1] / n - mean * mean, n

    def _update_moving(self, state: dict, mean, var) -> None:
        for name, batch in (("moving_mean", mean), ("moving_variance", var)):
            moving = state[name]
            moving[...] = moving * self.momentum + batch * (1 - self.momentum)

    def forward(self, xp, params, x, training: bool = False, rng: Any = None,
                state: dict | None = None):
        axes = tuple(range(x.ndim - 1))
        if training:
            mean, var, count = self._statistics(xp, x, axes)
            if state is not None:  # this replica's own copies (ON_WRITE / NONE)
                self._update_moving(state, mean, var)
        else:
            mean, var, count = state["moving_mean"], state["moving_variance"], None
        inv = 1 / xp.sqrt(var + self.epsilon)
        xhat = (x - mean) * inv
        y = xhat * params["gamma"] if self.scale else xhat
        if self.center:
            y = y + params["beta"]
        return y, (xhat, inv, count, axes)

    def backward(self, xp, params, cache, dy, input_grad: bool = True, out: dict | None = None):
        """Through the batch's statistics (training): dx = inv / n * (n * g - sum(g) -
        xhat * sum(g * xhat)), g = dy * gamma, the sums over the batch (the global batch's
        when synchronized: summed across the replicas, as TensorFlow differentiates its
        all-reduce)."""
        xhat, inv, count, axes = cache
        grads = out if out is not None else {}
        if self.scale:
            gamma_grad = (dy * xhat).sum(axis=axes)
            if out is None:
                grads["gamma"] = gamma_grad
            else:
                out["gamma"][...] = gamma_grad
        if self.center:
            beta_grad = dy.sum(axis=axes)
            if out is None:
                grads["beta"] = beta_grad
            else:
                out["beta"][...] = beta_grad
        if not input_grad:
            return None, grads
        g = dy * params["gamma"] if self.scale else dy
        sums = xp.stack([g.sum(axis=axes), (g * xhat).sum(axis=axes)])
        ctx = _context() if self.synchronized else None
        if ctx is not None:
            sums = ctx.reduce_arrays(f"{self!r}'s batch gradient", [sums], ReduceOp.SUM)[0]
        return inv / count * (count * g - sums[0] - xhat * sums[1]), grads

    @property
    def makes_collectives(self) -> bool:
        return self.synchronized

    def join_without_data(self, xp, input_shape: Shape, backward: bool,
                          state: dict | None = None) -> None:
        ctx = _context() if self.synchronized else None
        if ctx is None:
            return
        if backward:
            ctx.reduce_arrays(f"{self!r}'s batch gradient",
                              [xp.zeros((2, input_shape[-1]), dtype=xp.float32)], ReduceOp.SUM)
            return
        total = ctx.reduce_arrays(f"{self!r}'s batch statistics",
                                  [xp.zeros((3, input_shape[-1]), dtype=xp.float32)],
                                  ReduceOp.SUM)[0]
        if state is not None:  # the global batch's statistics reach every copy alike
            mean = total[0] / total[2]
            self._update_moving(state, mean, total[1] / total[2] - mean * mean)

    def get_config(self) -> dict[str, Any]:
        return {"momentum": self.momentum, "epsilon": self.epsilon, "center": self.center,
                "scale": self.scale, "synchronized": self.synchronized,
                "input_shape": list(self.input_shape) if self.input_shape else None}

    def __repr__(self) -> str:
        return (f"BatchNormalization(momentum={self.momentum}, epsilon={self.epsilon}"
                + (", synchronized=True)" if self.synchronized else ")"))
