"""Metrics `compile(metrics=[...])` accepts, with Keras' formulas. Each gives the *sum* over a
shard's samples of its per-sample value, so shards and steps add up and `fit` divides by the
samples seen. Only the metrics the user compiled are computed.

"accuracy" / "acc" resolve as Keras resolves them, from the shapes: an output of width 1 is
`binary_accuracy`; targets with fewer dimensions than the output, or of width 1, are
`sparse_categorical_accuracy`; otherwise `categorical_accuracy`.
"""

from __future__ import annotations

from typing import NamedTuple

from labdist.training.losses import like_output

NAMES = ("accuracy", "acc", "binary_accuracy", "categorical_accuracy",
         "sparse_categorical_accuracy", "mse", "mean_squared_error", "mae",
         "mean_absolute_error")
THRESHOLD = 0.5  # binary_accuracy's


class Metric(NamedTuple):
    """`name`: the key in the logs (as the user wrote it); `kind`: the formula."""

    name: str
    kind: str

    def __call__(self, xp, y_true, y_pred):
        """Sum over the samples of the per-sample value (a 0-d array on the device)."""
        if self.kind == "sparse_categorical_accuracy":
            return (y_pred.argmax(axis=-1) == y_true.reshape(-1)).sum()
        y_true = like_output(y_true, y_pred)
        if self.kind == "categorical_accuracy":
            return (y_pred.argmax(axis=-1) == y_true.argmax(axis=-1)).sum()
        if self.kind == "binary_accuracy":
            hit = y_true == (y_pred > THRESHOLD).astype(y_true.dtype)  # Keras' exact test
        elif self.kind == "mse":
            hit = (y_pred - y_true) ** 2
        else:  # mae
            hit = xp.abs(y_pred - y_true)
        n = y_pred.shape[0]
        return hit.reshape(n, -1).mean(axis=1, dtype=xp.float64).sum() if n else 0.0


def check(metrics) -> list[str]:
    """The names compile was given (None: none, as Keras), checked."""
    if metrics is None:
        return []
    if isinstance(metrics, str):  # one metric's name, as TF Keras 2 takes it
        metrics = [metrics]
    if not isinstance(metrics, list | tuple):
        raise TypeError(f"metrics={metrics!r} is not allowed; use a list of metric names "
                        "(['accuracy']) or one name")
    names = list(metrics)
    unknown = [m for m in names if not isinstance(m, str) or m not in NAMES]
    if unknown:
        raise ValueError(f"metrics={names!r}: {unknown} not supported; allowed: "
                         f"{', '.join(NAMES)}")
    return names


def resolve(names: list[str], y_shape: tuple, output_width: int) -> tuple[Metric, ...]:
    """The compiled metrics for targets of `y_shape` and an output of `output_width` values."""
    kinds = {"mean_squared_error": "mse", "mean_absolute_error": "mae"}
    out = []
    for name in names:
        kind = kinds.get(name, name)
        if name in ("accuracy", "acc"):
            if output_width == 1:
                kind = "binary_accuracy"
            elif len(y_shape) < 2 or y_shape[-1] == 1:
                kind = "sparse_categorical_accuracy"
            else:
                kind = "categorical_accuracy"
        out.append(Metric(name, kind))
    return tuple(out)
