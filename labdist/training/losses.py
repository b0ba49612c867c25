"""Losses: loss(xp, y_true, y_pred) -> (mean loss over the batch, d loss / d y_pred).

`sparse_categorical_crossentropy` takes integer labels and probabilities (or logits with
`from_logits=True`). Its gradient with respect to a softmax layer's *input* is the famous
`p - onehot`; a model that fuses softmax and this loss can use `fused_softmax_grad`.
"""

from __future__ import annotations

from typing import NamedTuple

EPSILON = 1e-7  # Keras' clip for probabilities


class Loss(NamedTuple):
    name: str
    from_logits: bool = False

    def __call__(self, xp, y_true, y_pred):
        if self.name == "mse":
            return _mse(xp, y_true, y_pred)
        return _sparse_cce(xp, y_true, y_pred, self.from_logits)


def _mse(xp, y_true, y_pred):
    diff = y_pred - y_true.reshape(y_pred.shape).astype(y_pred.dtype)
    n = diff.shape[0] if diff.ndim else 1
    per_sample = (diff * diff).reshape(n, -1).mean(axis=1)
    width = diff.size // max(n, 1)
    return per_sample.mean(), 2 * diff / (max(n, 1) * max(width, 1))


def _sparse_cce(xp, y_true, y_pred, from_logits):
    labels = y_true.reshape(-1).astype("int64")
    n = y_pred.shape[0]
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
    if loss in ("mse", "mean_squared_error"):
        return Loss("mse")
    if loss == "sparse_categorical_crossentropy":
        return Loss("sparse_categorical_crossentropy", from_logits)
    raise ValueError(
        f"loss={loss!r} is not supported; allowed: 'mse', 'sparse_categorical_crossentropy'")
