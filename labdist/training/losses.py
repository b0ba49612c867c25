"""Losses, two ways: `loss.value_and_grad(xp, y_true, y_pred)` -> (mean loss over the batch,
d loss / d y_pred) is what training runs; `loss(y_true, y_pred, sample_weight=None)` is
Keras' call, for a custom loop, reduced as the loss's `reduction` says. The Keras classes
(`ld.losses.SparseCategoricalCrossentropy(from_logits=True)`, ...) make such losses, and
`compile` takes them or their names.

Keras' formulas, for any output width: each loss is a per-sample value (a mean over the last
axis for the element-wise losses, a sum over classes for cross-entropy) averaged over the
batch. Targets of one dimension fewer than the output (`y` of shape (n,) for an output of
(n, 1)) are reshaped to it, as Keras does. Probabilities are clipped to [EPSILON, 1 - EPSILON].
`sparse_categorical_crossentropy`'s gradient with respect to a softmax layer's *input* is the
famous `p - onehot`; a model that fuses softmax and this loss can use `fused_softmax_grad`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from labdist import checks
from labdist.autodiff import Recorded, node, unwrap

EPSILON = 1e-7  # Keras' clip for probabilities

NAMES = {  # what compile accepts -> the loss's name
    "mse": "mse", "mean_squared_error": "mse",
    "mae": "mae", "mean_absolute_error": "mae",
    "binary_crossentropy": "binary_crossentropy",
    "categorical_crossentropy": "categorical_crossentropy",
    "sparse_categorical_crossentropy": "sparse_categorical_crossentropy",
}


REDUCTIONS = ("sum_over_batch_size", "sum", "none")


class Loss(NamedTuple):
    name: str
    from_logits: bool = False
    reduction: str = "sum_over_batch_size"  # Keras' call only: training takes the mean

    def __call__(self, y_true, y_pred, sample_weight=None):
        """Keras' call: the per-sample losses (weighted by `sample_weight`), reduced by
        `reduction` ("sum_over_batch_size": their sum over the number of samples; "sum";
        "none": one per sample). On a replica, of this replica's arrays."""
        from labdist.replica.replica_context import current

        ctx = current()
        xp = np if ctx is None else ctx.xp
        recorded = y_pred if isinstance(y_pred, Recorded) else None
        y_pred = xp.asarray(unwrap(y_pred))
        y_true = xp.asarray(unwrap(y_true))
        per = self.per_sample(xp, y_true, y_pred)
        if recorded is not None:  # on a tape: the per-sample losses, recorded
            per = node(per, (recorded,), self._per_sample_backward(xp, y_true, y_pred))
        if sample_weight is not None:
            per = per * xp.asarray(unwrap(sample_weight), dtype=per.dtype).reshape(per.shape)
        if self.reduction == "none":
            return per
        total = per.sum()
        return total if self.reduction == "sum" else total * (1.0 / max(per.shape[0], 1))

    def _per_sample_backward(self, xp, y_true, y_pred):
        """d (per-sample losses) / d y_pred, weighted by the gradient coming back: each sample's
        loss depends on its own row only, so it is the batch mean's gradient times n."""
        def backward(g):
            _, grad_of_mean = self.value_and_grad(xp, y_true, y_pred)
            n = y_pred.shape[0]
            return (grad_of_mean * (g * n).reshape(n, *([1] * (y_pred.ndim - 1))),)
        return backward

    def per_sample(self, xp, y_true, y_pred):
        """One loss per sample (Keras' formulas, before any reduction)."""
        n = y_pred.shape[0]
        if self.name == "sparse_categorical_crossentropy":
            labels = y_true.reshape(-1).astype("int64")
            rows = xp.arange(n)
            if self.from_logits:
                shifted = y_pred - y_pred.max(axis=-1, keepdims=True)
                log_z = xp.log(xp.exp(shifted).sum(axis=-1))
                return log_z - shifted[rows, labels]
            return -xp.log(xp.clip(y_pred, EPSILON, 1 - EPSILON)[rows, labels])
        y_true = like_output(y_true, y_pred).astype(y_pred.dtype)
        if self.name in ("mse", "mae"):
            diff = y_pred - y_true
            each = diff * diff if self.name == "mse" else xp.abs(diff)
            return each.reshape(n, -1).mean(axis=1)
        if self.name == "binary_crossentropy":
            if self.from_logits:
                z = y_pred
                each = xp.maximum(z, 0) - z * y_true + xp.log1p(xp.exp(-xp.abs(z)))
            else:
                p = xp.clip(y_pred, EPSILON, 1 - EPSILON)
                each = -(y_true * xp.log(p) + (1 - y_true) * xp.log(1 - p))
            return each.reshape(n, -1).mean(axis=1)
        if self.from_logits:
            shifted = y_pred - y_pred.max(axis=-1, keepdims=True)
            log_p = shifted - xp.log(xp.exp(shifted).sum(axis=-1, keepdims=True))
            return -(y_true * log_p).sum(axis=-1)
        q = y_pred / y_pred.sum(axis=-1, keepdims=True)
        return -(y_true * xp.log(xp.clip(q, EPSILON, 1 - EPSILON))).sum(axis=-1)

    def value_and_grad(self, xp, y_true, y_pred):
        """(the batch's mean loss, its gradient with respect to y_pred): what training runs."""
        if self.name == "sparse_categorical_crossentropy":
            return _sparse_cce(xp, y_true, y_pred, self.from_logits)
        y_true = like_output(y_true, y_pred).astype(y_pred.dtype)
        if self.name == "mse":
            return _mse(xp, y_true, y_pred)
        if self.name == "mae":
            return _mae(xp, y_true, y_pred)
        if self.name == "binary_crossentropy":
            return _bce(xp, y_true, y_pred, self.from_logits)
        return _cce(xp, y_true, y_pred, self.from_logits)


def like_output(y_true, y_pred):
    """`y_true` in the output's shape: (n,) targets for an (n, 1) output become (n, 1)."""
    if y_true.shape == y_pred.shape:
        return y_true
    if y_true.size != y_pred.size:
        raise ValueError(f"targets of shape {y_true.shape} do not match the model's output "
                         f"of shape {y_pred.shape}")
    return y_true.reshape(y_pred.shape)


def _count(y_pred) -> tuple[int, int]:
    """(samples, values per sample) of an output."""
    n = y_pred.shape[0] if y_pred.ndim else 1
    return max(n, 1), max(y_pred.size // max(n, 1), 1)


def _mse(xp, y_true, y_pred):
    diff = y_pred - y_true
    n, width = _count(y_pred)
    return (diff * diff).mean(), 2 * diff / (n * width)


def _mae(xp, y_true, y_pred):
    diff = y_pred - y_true
    n, width = _count(y_pred)
    return xp.abs(diff).mean(), xp.sign(diff) / (n * width)


def _bce(xp, y_true, y_pred, from_logits):
    n, width = _count(y_pred)
    if from_logits:  # Keras' stable form: max(z, 0) - z y + log(1 + exp(-|z|))
        z = y_pred
        loss = xp.maximum(z, 0) - z * y_true + xp.log1p(xp.exp(-xp.abs(z)))
        return loss.mean(), (1 / (1 + xp.exp(-z)) - y_true) / (n * width)
    p = xp.clip(y_pred, EPSILON, 1 - EPSILON)
    loss = -(y_true * xp.log(p) + (1 - y_true) * xp.log(1 - p))
    inside = (y_pred > EPSILON) & (y_pred < 1 - EPSILON)  # the clip passes no gradient
    grad = (-(y_true / p) + (1 - y_true) / (1 - p)) * inside
    return loss.mean(), grad / (n * width)


def _cce(xp, y_true, y_pred, from_logits):
    n, _ = _count(y_pred)
    if from_logits:
        shifted = y_pred - y_pred.max(axis=-1, keepdims=True)
        log_p = shifted - xp.log(xp.exp(shifted).sum(axis=-1, keepdims=True))
        loss = -(y_true * log_p).sum(axis=-1)
        grad = xp.exp(log_p) * y_true.sum(axis=-1, keepdims=True) - y_true
        return loss.mean(), grad / n
    # Keras: scale the output to sum to 1 along the last axis, clip, -sum(t log q)
    s = y_pred.sum(axis=-1, keepdims=True)
    q = y_pred / s
    clipped = xp.clip(q, EPSILON, 1 - EPSILON)
    loss = -(y_true * xp.log(clipped)).sum(axis=-1)
    t = y_true * ((q > EPSILON) & (q < 1 - EPSILON))  # the clip passes no gradient
    grad = (-t / clipped + t.sum(axis=-1, keepdims=True)) / s
    return loss.mean(), grad / n


def _sparse_cce(xp, y_true, y_pred, from_logits):
    labels = y_true.reshape(-1).astype("int64")
    n = y_pred.shape[0]
    if labels.shape[0] != n:
        raise ValueError(f"sparse_categorical_crossentropy takes one integer label per sample: "
                         f"targets of shape {y_true.shape} for an output of {y_pred.shape}")
    rows = xp.arange(n)
    if from_logits:
        shifted = y_pred - y_pred.max(axis=-1, keepdims=True)
        log_z = xp.log(xp.exp(shifted).sum(axis=-1, keepdims=True))
        log_p = shifted - log_z
        loss = -log_p[rows, labels].mean()
        grad = xp.exp(log_p)
        grad[rows, labels] -= 1
        return loss, grad / n
    p = xp.clip(y_pred, EPSILON, 1 - EPSILON)
    loss = -xp.log(p[rows, labels]).mean()
    grad = xp.zeros_like(y_pred)
    grad[rows, labels] = -1 / (p[rows, labels] * n)
    return loss, grad


def fused_softmax_grad(xp, y_true, probs):
    """d loss / d logits for softmax followed by sparse categorical cross-entropy."""
    n = probs.shape[0]
    grad = probs.copy()
    grad[xp.arange(n), y_true.reshape(-1).astype("int64")] -= 1
    return grad / n


def get(loss, from_logits: bool = False) -> Loss:
    if isinstance(loss, Loss):
        return loss
    if isinstance(loss, str) and loss in NAMES:
        return Loss(NAMES[loss], from_logits)
    raise ValueError(f"loss={loss!r} is not supported; allowed: {', '.join(NAMES)}, or an "
                     "ld.losses object (SparseCategoricalCrossentropy(from_logits=True), ...)")


def _made(name: str, from_logits: bool, reduction: str) -> Loss:
    from_logits = checks.boolean("from_logits", from_logits)
    if reduction is None:
        reduction = "none"
    if reduction not in REDUCTIONS:
        checks.refuse("reduction", reduction, ", ".join(map(repr, REDUCTIONS)) + " or None")
    return Loss(name, from_logits, reduction)


# Keras' loss classes, as constructors of `Loss` (compile takes them; calling one gives the
# reduced loss, as Keras' objects do)
def SparseCategoricalCrossentropy(from_logits: bool = False,
                                  reduction: str | None = "sum_over_batch_size") -> Loss:
    return _made("sparse_categorical_crossentropy", from_logits, reduction)


def CategoricalCrossentropy(from_logits: bool = False,
                            reduction: str | None = "sum_over_batch_size") -> Loss:
    return _made("categorical_crossentropy", from_logits, reduction)


def BinaryCrossentropy(from_logits: bool = False,
                       reduction: str | None = "sum_over_batch_size") -> Loss:
    return _made("binary_crossentropy", from_logits, reduction)


def MeanSquaredError(reduction: str | None = "sum_over_batch_size") -> Loss:
    return _made("mse", False, reduction)


def MeanAbsoluteError(reduction: str | None = "sum_over_batch_size") -> Loss:
    return _made("mae", False, reduction)
