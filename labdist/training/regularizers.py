"""Keras' weight penalties (`ld.regularizers.L2(1e-5)`, `L1`, `L1L2`): a layer given one adds
`penalty(weight)` to the loss. `fit` adds it and its gradient inside the step; a custom loop
reads the penalties from `model.losses` (recorded on an open `GradientTape`) and adds them, as
TensorFlow's custom-training tutorial does with `scale_regularization_loss`."""

from __future__ import annotations

from typing import Any

from labdist import checks


class Regularizer:
    """penalty(w) = l1 * sum(|w|) + l2 * sum(w²)."""

    def __init__(self, l1: float = 0.0, l2: float = 0.0):
        self.l1 = checks.number("l1", l1, 0.0)
        self.l2 = checks.number("l2", l2, 0.0)

    def __call__(self, weight: Any) -> Any:
        """The penalty of `weight` (an array, or a value a tape records)."""
        total = 0.0
        if self.l1:
            total = total + self.l1 * abs(weight).sum()
        if self.l2:
            total = total + self.l2 * (weight * weight).sum()
        return total

    def gradient(self, xp, weight) -> Any:
        """d penalty / d weight, in the weight's array module."""
        grad = 2 * self.l2 * weight
        if self.l1:
            grad = grad + self.l1 * xp.sign(weight)
        return grad

    def get_config(self) -> dict[str, float]:
        return {"l1": self.l1, "l2": self.l2}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(l1={self.l1:g}, l2={self.l2:g})"


def L1(l1: float = 0.01) -> Regularizer:
    return Regularizer(l1=l1)


def L2(l2: float = 0.01) -> Regularizer:
    return Regularizer(l2=l2)


def L1L2(l1: float = 0.0, l2: float = 0.0) -> Regularizer:
    return Regularizer(l1=l1, l2=l2)


l1, l2, l1_l2 = L1, L2, L1L2  # Keras' lower-case aliases

NAMES = {"l1": L1, "l2": L2, "l1_l2": L1L2}


def get(value: Any, name: str) -> Regularizer | None:
    """A layer's `kernel_regularizer=` / `bias_regularizer=`: None, a regularizer, its name
    ("l2": Keras' default strength 0.01) or a saved config {"l1": .., "l2": ..}."""
    if value is None or isinstance(value, Regularizer):
        return value
    if isinstance(value, str) and value in NAMES:
        return NAMES[value]()
    if isinstance(value, dict) and set(value) <= {"l1", "l2"}:
        return Regularizer(**value)
    checks.refuse(name, value, "None, an ld.regularizers object (L1, L2, L1L2) or one of "
                  + ", ".join(map(repr, NAMES)))
    return None
