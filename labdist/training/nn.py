"""`ld.nn`: TensorFlow's loss scaling for custom loops, and activations a tape records.

`compute_average_loss` is what makes summed gradients right: each replica divides its
per-example losses by the *global* batch size, so `apply_gradients`, which sums the
replicas' gradients, applies the gradient of the global batch's mean loss.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from labdist import context
from labdist.autodiff import unwrap


def _replicas(what: str) -> int:
    """The replicas a loss is shared by: the step's, or 1 with no strategy (TF's rules)."""
    if context.in_cross_replica_context():
        raise RuntimeError(
            f"You are calling `{what}` in cross replica context, while it was expected to be "
            "called in replica context: call it inside the function strategy.run runs")
    ctx = context.get_replica_context()
    return 1 if ctx is None else ctx.num_replicas_in_sync


def compute_average_loss(per_example_loss: Any, sample_weight: Any = None,
                         global_batch_size: int | None = None) -> Any:
    """sum(per_example_loss * sample_weight) / global batch size (by default this replica's
    batch times the replicas in sync)."""
    n = _replicas("compute_average_loss")
    shape = np.shape(unwrap(per_example_loss))
    if len(shape) == 0:
        raise ValueError("compute_average_loss takes one loss per example (a vector); got a "
                         "scalar: build the loss with reduction=None ('none')")
    if sample_weight is not None:
        per_example_loss = per_example_loss * sample_weight
    if global_batch_size is None:
        global_batch_size = shape[0] * n
    elif (isinstance(global_batch_size, bool)
          or not isinstance(global_batch_size, int | np.integer) or global_batch_size < 1):
        raise ValueError(f"global_batch_size={global_batch_size!r} must be a positive "
                         "integer (the batch summed over every replica)")
    return per_example_loss.sum() * (1.0 / max(int(global_batch_size), 1))


def scale_regularization_loss(regularization_loss: Any) -> Any:
    """The penalty divided by the replicas in sync: summed over them, it counts once."""
    return regularization_loss * (1.0 / _replicas("scale_regularization_loss"))


def relu(x: Any) -> Any:
    return np.maximum(x, 0)


def sigmoid(x: Any) -> Any:
    return 1 / (1 + np.exp(-x))


def softmax(x: Any, axis: int = -1) -> Any:
    """Shifted by the (unrecorded) maximum: the gradient does not depend on the shift."""
    e = np.exp(x - unwrap(x).max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def l2_loss(t: Any) -> Any:
    """sum(t²) / 2, as TensorFlow's."""
    return (t * t).sum() * 0.5
