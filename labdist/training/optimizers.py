"""Optimizers with Keras' update rules, applied in place to one parameter at a time.

`slots(param)` makes the optimizer's state for a parameter (host arrays, stored by the model);
`apply(xp, param, grad, slots, step)` updates `param` and `slots` in place (weight decay
first, then the optimizer's own `update`); `step` counts updates from 1. `squared`, where
given, is what the rules that square the gradient take instead of grad * grad: an embedding
table's sum of squared per-lookup slices, as Keras 3 squares TensorFlow's IndexedSlices slice
by slice (layers/base.py `sliced`). In a custom loop,
`build(variables)` and `apply_gradients(grads_and_vars)` are TensorFlow's calls
(custom_loop.py).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

import numpy as np

from labdist import checks, shipping
from labdist.training import custom_loop

_positive = checks.positive  # finite and > 0: an infinite rate only ever gives nan weights
_fraction = checks.fraction


class Optimizer(ABC):
    """What every optimizer shares: TensorFlow's custom-loop calls and Keras' `weight_decay`.
    `slot_variables` and `iterations` are the state `build` (or `fit`) makes."""

    learning_rate: float

    def __init__(self, weight_decay: float | None = None, use_locking: Any = None):
        if use_locking is not None:  # TF1's optimizer flag (the seeds' SyncReplicasOptimizer)
            raise TypeError(
                f"{type(self).__name__}(use_locking={use_locking!r}): optimizers take no "
                "use_locking (nor do Keras 3's); locking is where the updates land, on the "
                "parameter servers: ld.ParameterServerStrategy(..., use_locking=True)")
        self.weight_decay = (None if weight_decay is None
                             else checks.number("weight_decay", weight_decay, 0.0))
        self.slot_variables: dict[int, dict[str, Any]] = {}  # variable id -> {slot: Variable}
        self.iterations: Any = None  # an ld.Variable counting apply_gradients calls, once built
        self.outer: Any = None  # local SGD / DiLoCo's state (trainer/diloco.py), once built
        shipping.remember(self)  # a replica's lazy build (apply_gradients) builds this one
        self._deferred: tuple[dict, str] | None = None  # a restore waiting for the build

    def hyperparameters(self) -> dict[str, Any]:
        """The numbers that decide an update (learning rate, momentum, ...), without the state
        `build` made: what tells one configuration of an optimizer from another."""
        return {k: v for k, v in vars(self).items()
                if k not in ("slot_variables", "iterations", "outer", "_deferred",
                             shipping.TOKEN)}

    @abstractmethod
    def slots(self, param: np.ndarray) -> dict[str, np.ndarray]:
        """The optimizer's state for one parameter (host arrays)."""

    @abstractmethod
    def update(self, xp, param, grad, slots, step: int, squared: Any = None) -> None:
        """This optimizer's own rule, in place on `param` and `slots`; a rule that squares
        the gradient takes `squared` instead where it is given (`square`)."""

    def apply(self, xp, param, grad, slots, step: int, squared: Any = None) -> None:
        """One step on one parameter: Keras' weight decay (w -= w * weight_decay * lr, on
        the summed step, once, before the update), then `update`."""
        if self.weight_decay:
            param -= param * (self.weight_decay * self.learning_rate)
        self.update(xp, param, grad, slots, step, squared)

    def build(self, variables: Iterable[Any]) -> None:
        """Under `strategy.scope()`: make the state (slot variables, step count) that
        `apply_gradients` keeps for `variables`; needed by every optimizer but plain SGD."""
        custom_loop.build(self, variables)

    @property
    def variables(self) -> list:
        """Keras 3's `optimizer.variables`: the step count, then each slot variable, in the
        order they were made (empty before the optimizer is built)."""
        head = [] if self.iterations is None else [self.iterations]
        return head + [v for slots in self.slot_variables.values() for v in slots.values()]

    checkpoint_needs_build = False  # saved before it made any state: nothing to store

    def checkpoint_variables(self) -> dict:
        """What a checkpoint stores of this optimizer: "iterations", and each slot as
        "slot/<name of the variable it belongs to>/<slot name>" (how a restore finds it)."""
        found = {f"slot/{v.name}": v for slots in self.slot_variables.values()
                 for v in slots.values()}
        if self.iterations is not None:
            found["iterations"] = self.iterations
        return found

    def defer_restore(self, values: dict, where: str) -> None:
        """A checkpoint's values for state not made yet (TF's deferred restoration): assigned
        by the build that makes it, keyed as `checkpoint_variables`; empty: nothing pending."""
        self._deferred = (dict(values), where) if values else None

    def restore_deferred(self, wait: bool = True) -> dict | None:
        """After a build: the values a restore left for it, if any, checked and assigned
        (returned; None where none were). A custom loop's build may make the slots of some
        variables only: with `wait`, values for slots not made yet keep waiting."""
        if self._deferred is None:
            return None
        from labdist.training import object_checkpoint

        values, where = self._deferred
        found = self.checkpoint_variables()
        if wait and not set(values) <= set(found):
            return None
        object_checkpoint.assign_deferred(values, found, where)  # refused: still pending
        self._deferred = None
        return values

    def apply_gradients(self, grads_and_vars: Iterable[tuple[Any, Any]]) -> None:
        """Inside `strategy.run`: sum each gradient over the replicas (one all-reduce, as
        TensorFlow) and apply this optimizer's step to every replica's copy."""
        custom_loop.apply_gradients(self, grads_and_vars)


def square(grad, squared):
    """The gradient's square as a second moment takes it: `squared` where the gradient came
    as slices (their squares summed, not the sum squared), else grad * grad."""
    return grad * grad if squared is None else squared


class SGD(Optimizer):
    """v = momentum * v - lr * g; w += v (Nesterov: w += momentum * v - lr * g)."""

    def __init__(self, learning_rate: float = 0.01, momentum: float = 0.0,
                 nesterov: bool = False, weight_decay: float | None = None,
                 use_locking: Any = None):
        super().__init__(weight_decay, use_locking)
        self.learning_rate = _positive("learning_rate", learning_rate)
        self.momentum = _fraction("momentum", momentum)
        self.nesterov = checks.boolean("nesterov", nesterov)

    def slots(self, param: np.ndarray) -> dict[str, np.ndarray]:
        return {"velocity": np.zeros_like(param)} if self.momentum else {}

    def update(self, xp, param, grad, slots, step: int, squared: Any = None) -> None:
        lr = self.learning_rate
        if not self.momentum:
            param -= lr * grad
            return
        v = slots["velocity"]
        v *= self.momentum
        v -= lr * grad
        param += (self.momentum * v - lr * grad) if self.nesterov else v


class Adagrad(Optimizer):
    """acc += g^2; w -= lr * g / (sqrt(acc) + epsilon)."""

    def __init__(self, learning_rate: float = 0.001, initial_accumulator_value: float = 0.1,
                 epsilon: float = 1e-7, weight_decay: float | None = None, use_locking: Any = None):
        super().__init__(weight_decay, use_locking)
        self.learning_rate = _positive("learning_rate", learning_rate)
        self.initial_accumulator_value = checks.number(
            "initial_accumulator_value", initial_accumulator_value, 0.0)
        self.epsilon = _positive("epsilon", epsilon)

    def slots(self, param: np.ndarray) -> dict[str, np.ndarray]:
        return {"accumulator": np.full_like(param, self.initial_accumulator_value)}

    def update(self, xp, param, grad, slots, step: int, squared: Any = None) -> None:
        acc = slots["accumulator"]
        acc += square(grad, squared)
        param -= self.learning_rate * grad / (xp.sqrt(acc) + self.epsilon)


class Adam(Optimizer):
    """Keras' Adam: m, v moving averages; bias correction folded into the step size."""

    def __init__(self, learning_rate: float = 0.001, beta_1: float = 0.9,
                 beta_2: float = 0.999, epsilon: float = 1e-7,
                 weight_decay: float | None = None, use_locking: Any = None):
        super().__init__(weight_decay, use_locking)
        self.learning_rate = _positive("learning_rate", learning_rate)
        self.beta_1 = _fraction("beta_1", beta_1)
        self.beta_2 = _fraction("beta_2", beta_2)
        self.epsilon = _positive("epsilon", epsilon)

    def slots(self, param: np.ndarray) -> dict[str, np.ndarray]:
        return {"m": np.zeros_like(param), "v": np.zeros_like(param)}

    def update(self, xp, param, grad, slots, step: int, squared: Any = None) -> None:
        b1, b2 = self.beta_1, self.beta_2
        alpha = self.learning_rate * math.sqrt(1 - b2 ** step) / (1 - b1 ** step)
        m, v = slots["m"], slots["v"]
        m += (grad - m) * (1 - b1)
        v += (square(grad, squared) - v) * (1 - b2)
        param -= alpha * m / (xp.sqrt(v) + self.epsilon)


class RMSprop(Optimizer):
    """Keras' RMSprop: v = rho * v + (1 - rho) * g^2; step = lr * g / sqrt(v + epsilon)
    (centered: v minus the squared moving mean of g); with momentum, the steps accumulate
    (m = momentum * m + step; w -= m), otherwise w -= step."""

    def __init__(self, learning_rate: float = 0.001, rho: float = 0.9, momentum: float = 0.0,
                 epsilon: float = 1e-7, centered: bool = False,
                 weight_decay: float | None = None, use_locking: Any = None):
        super().__init__(weight_decay, use_locking)
        self.learning_rate = _positive("learning_rate", learning_rate)
        self.rho = _fraction("rho", rho)
        self.momentum = _fraction("momentum", momentum)
        self.epsilon = _positive("epsilon", epsilon)
        self.centered = checks.boolean("centered", centered)

    def slots(self, param: np.ndarray) -> dict[str, np.ndarray]:
        out = {"velocity": np.zeros_like(param)}
        if self.momentum:
            out["momentum"] = np.zeros_like(param)
        if self.centered:
            out["average_gradient"] = np.zeros_like(param)
        return out

    def update(self, xp, param, grad, slots, step: int, squared: Any = None) -> None:
        rho = self.rho
        v = slots["velocity"]
        v *= rho
        v += (1 - rho) * square(grad, squared)
        if self.centered:
            avg = slots["average_gradient"]
            avg *= rho
            avg += (1 - rho) * grad
            denominator = v - avg * avg + self.epsilon
        else:
            denominator = v + self.epsilon
        increment = self.learning_rate * grad / xp.sqrt(denominator)
        if self.momentum:
            m = slots["momentum"]
            m *= self.momentum
            m += increment
            param -= m
        else:
            param -= increment


OPTIMIZERS = {"sgd": SGD, "adagrad": Adagrad, "adam": Adam, "rmsprop": RMSprop}
for _cls in OPTIMIZERS.values():  # a step holding an optimizer is pickled again only on change
    shipping.register_state(_cls)


def get(optimizer) -> Optimizer:
    if isinstance(optimizer, Optimizer):
        return optimizer
    if isinstance(optimizer, str) and optimizer.lower() in OPTIMIZERS:
        return OPTIMIZERS[optimizer.lower()]()
    raise ValueError(f"optimizer={optimizer!r} is not supported; allowed: an optimizer object "
                     f"or one of {', '.join(OPTIMIZERS)}")
