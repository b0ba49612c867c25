"""Metrics (`ld.metrics`), two ways, as in Keras.

**Metric objects** (`Mean`, `Sum`, `SparseCategoricalAccuracy`, `CategoricalAccuracy`,
`MeanSquaredError`, `AUC`) keep their state in `ON_READ` / `SUM` variables, where TensorFlow
keeps it: inside `strategy.run` each replica counts its own shard into its own copy, and
`result()` there is that replica's partial result; on the driver `result()` reads the sum of
the copies, so the whole batch's figure. `reset_state()` zeroes every copy.

**Compiled metrics** (`compile(metrics=["accuracy", ...])`, or the objects above that have a
per-sample formula) are `Formula`s: each gives the *sum* over a shard's samples of its
per-sample value, so shards and steps add up and `fit` divides by the samples seen. Only the
metrics the user compiled are computed. "accuracy" / "acc" resolve as Keras resolves them,
from the shapes: an output of width 1 is `binary_accuracy`; targets with fewer dimensions
than the output, or of width 1, are `sparse_categorical_accuracy`; otherwise
`categorical_accuracy`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, NamedTuple

import numpy as np

from labdist import checks
from labdist.replica import replica_context
from labdist.training.losses import like_output

NAMES = ("accuracy", "acc", "binary_accuracy", "categorical_accuracy",
         "sparse_categorical_accuracy", "mse", "mean_squared_error", "mae",
         "mean_absolute_error")
THRESHOLD = 0.5  # binary_accuracy's


class Formula(NamedTuple):
    """A compiled metric. `name`: the key in the logs (as the user wrote it); `kind`: the
    formula."""

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


def check(metrics) -> list:
    """What compile was given (None: none, as Keras), checked: metric names, and metric
    objects that have a per-sample formula."""
    if metrics is None:
        return []
    if isinstance(metrics, str | Metric):  # one metric, as TF Keras 2 takes it
        metrics = [metrics]
    if not isinstance(metrics, list | tuple):
        raise TypeError(f"metrics={metrics!r} is not allowed; use a list of metric names "
                        "(['accuracy']) or ld.metrics objects, or one of them")
    specs = list(metrics)
    unknown = [m for m in specs if not (isinstance(m, str) and m in NAMES)
               and not isinstance(m, Metric)]
    if unknown:
        raise ValueError(f"metrics={specs!r}: {unknown} not supported; allowed: "
                         f"{', '.join(NAMES)}, or an ld.metrics object")
    for m in specs:
        if isinstance(m, Metric) and m.formula is None:
            raise ValueError(f"metrics: {m!r} has no per-sample formula fit can add up (its "
                             "state is per-threshold counts); update it in a custom loop "
                             "(inside strategy.run), or compile a per-sample metric")
    names = [name_of(m) for m in specs]
    if len(set(names)) < len(names):
        raise ValueError(f"metrics={names!r}: two metrics share a name; give the objects "
                         "name=")
    return specs


def name_of(spec) -> str:
    """The key a compiled metric has in fit's logs."""
    return spec.name if isinstance(spec, Metric) else spec


def config_of(spec) -> str | dict:
    """A compiled metric as `model.save` writes it (JSON)."""
    if isinstance(spec, Metric):
        return {"class_name": type(spec).__name__, "name": spec.name}
    return spec


def from_config(config) -> str | Metric:
    """The compiled metric `config_of` wrote; a `ValueError` for anything else."""
    if isinstance(config, str):
        return config
    classes = {cls.__name__: cls for cls in OBJECTS}
    if (not isinstance(config, dict) or config.get("class_name") not in classes
            or not isinstance(config.get("name"), str)):
        raise ValueError(f"metric {config!r:.200} is not one labdist knows")
    return classes[config["class_name"]](name=config["name"])


def resolve(specs: list, y_shape: tuple, output_width: int) -> tuple[Formula, ...]:
    """The compiled metrics for targets of `y_shape` and an output of `output_width` values."""
    kinds = {"mean_squared_error": "mse", "mean_absolute_error": "mae"}
    out = []
    for spec in specs:
        if isinstance(spec, Metric):
            out.append(Formula(spec.name, spec.formula))
            continue
        name = spec
        kind = kinds.get(name, name)
        if name in ("accuracy", "acc"):
            if output_width == 1:
                kind = "binary_accuracy"
            elif len(y_shape) < 2 or y_shape[-1] == 1:
                kind = "sparse_categorical_accuracy"
            else:
                kind = "categorical_accuracy"
        out.append(Formula(name, kind))
    return tuple(out)


# -- metric objects -------------------------------------------------------------------------
def _xp():
    """The array module of the replica this runs on (numpy on the driver)."""
    ctx = replica_context.current()
    return np if ctx is None else ctx.xp


def _weighted(xp, values, sample_weight):
    """(sum of values x weights, sum of weights) over the samples, as float64 0-d arrays."""
    values = values.astype(xp.float64)
    if sample_weight is None:
        return values.sum(), xp.asarray(float(values.size), dtype=xp.float64)
    weight = xp.asarray(sample_weight, dtype=xp.float64)
    if values.ndim == 0:  # one value (a batch's mean loss) weighted by, say, its batch size
        if weight.size != 1:
            raise ValueError(f"sample_weight has shape {weight.shape} for a single value; "
                             "give one weight")
        return values * weight.reshape(()), weight.reshape(())
    weight = xp.broadcast_to(weight.reshape((-1,) + (1,) * (values.ndim - 1)), values.shape)
    return (values * weight).sum(), weight.sum()


class Metric(ABC):
    """Keras' metric object: `update_state` adds a batch, `result()` reads, `reset_state()`
    starts again. Its state variables are made in the strategy in scope when it is made,
    `ON_READ` / `SUM`, not trainable, so each replica keeps its own partial counts.

    `formula`: the per-sample `Formula` kind that gives the same figure inside `fit` when the
    object is compiled (`compile(metrics=[ld.metrics.SparseCategoricalAccuracy()])`); None
    for a metric `fit` cannot add up per sample (AUC).
    """

    formula: str | None = None

    def __init__(self, name: str, dtype: str = "float32"):
        self.name = checks.string("name", name)
        self.dtype = np.dtype(dtype)
        self._state: dict[str, Any] = {}

    def add_variable(self, shape: tuple[int, ...], name: str):
        """A zeroed `ON_READ` / `SUM` state variable (Keras' `add_variable`)."""
        from labdist.variables import Variable

        v = Variable(np.zeros(shape, self.dtype), name=f"{self.name}/{name}", trainable=False,
                     synchronization="ON_READ", aggregation="SUM")
        self._state[name] = v
        return v

    @property
    def variables(self) -> list:
        return list(self._state.values())

    def _add(self, name: str, delta) -> None:
        """Inside `strategy.run`: this replica's copy += delta. On the driver, Keras' rule:
        the sum of the copies plus delta, spread over the copies (each holds (sum + x) / N),
        since an `ON_READ` / `SUM` variable takes no cross-replica `assign_add`."""
        v = self._state[name]
        if replica_context.current() is not None:
            v.assign_add(delta)
        else:
            v.assign((v.numpy() + np.asarray(delta)).astype(self.dtype))

    def _read(self, name: str):
        """This replica's copy inside `strategy.run`; the sum of the copies on the driver."""
        v = self._state[name]
        return v.read_value() if replica_context.current() is not None else v.numpy()

    @abstractmethod
    def update_state(self, *args, sample_weight=None) -> None:
        """Add a batch (or, inside `strategy.run`, this replica's shard of it)."""

    @abstractmethod
    def result(self):
        """The metric's value: a float32 scalar on the driver, a 0-d array on a replica."""

    def reset_state(self) -> None:
        for v in self._state.values():
            v.assign(np.zeros(v.shape, self.dtype))

    def set_totals(self, total: float, count: float) -> None:
        """What `fit` / `evaluate` leave in a compiled metric after an epoch: its sum over the
        samples seen, and their count (Keras' compiled metric holds the epoch's figure)."""
        raise TypeError(f"{self!r} cannot take fit's per-sample totals")

    def __call__(self, *args, sample_weight=None):
        """Keras' shorthand: update with this batch, then the result."""
        self.update_state(*args, sample_weight=sample_weight)
        return self.result()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class Mean(Metric):
    """The (weighted) mean of every value given: `total` / `count`, 0 before any."""

    default_name = "mean"

    def __init__(self, name: str | None = None, dtype: str = "float32"):
        super().__init__(self.default_name if name is None else name, dtype)
        self.add_variable((), "total")
        self.add_variable((), "count")

    def _values(self, xp, *args):
        (values,) = args
        return xp.asarray(values)

    def update_state(self, *args, sample_weight=None) -> None:
        xp = _xp()
        total, count = _weighted(xp, self._values(xp, *args), sample_weight)
        self._add("total", total)
        self._add("count", count)

    def result(self):
        xp = _xp()
        total, count = self._read("total"), self._read("count")
        safe = xp.where(count == 0, 1, count)
        return xp.where(count == 0, 0, total / safe).astype(self.dtype)[()]

    def set_totals(self, total: float, count: float) -> None:
        self._state["total"].assign(np.asarray(total, self.dtype))
        self._state["count"].assign(np.asarray(count, self.dtype))


class Sum(Metric):
    """The (weighted) sum of every value given."""

    def __init__(self, name: str = "sum", dtype: str = "float32"):
        super().__init__(name, dtype)
        self.add_variable((), "total")

    def update_state(self, values, sample_weight=None) -> None:
        xp = _xp()
        total, _ = _weighted(xp, xp.asarray(values), sample_weight)
        self._add("total", total)

    def result(self):
        return self._read("total").astype(self.dtype)[()]


class SparseCategoricalAccuracy(Mean):
    """How often argmax(y_pred) is the class id in y_true."""

    formula = default_name = "sparse_categorical_accuracy"

    def _values(self, xp, y_true, y_pred):
        y_pred = xp.asarray(y_pred)
        y_true = xp.asarray(y_true).reshape(y_pred.shape[:-1])
        return y_pred.argmax(axis=-1) == y_true.astype(xp.int64)


class CategoricalAccuracy(Mean):
    """How often argmax(y_pred) is argmax(y_true) (one-hot targets)."""

    formula = default_name = "categorical_accuracy"

    def _values(self, xp, y_true, y_pred):
        return xp.asarray(y_pred).argmax(axis=-1) == xp.asarray(y_true).argmax(axis=-1)


class MeanSquaredError(Mean):
    """The mean over samples of each sample's mean squared error over its last axis."""

    formula = "mse"
    default_name = "mean_squared_error"

    def _values(self, xp, y_true, y_pred):
        y_pred = xp.asarray(y_pred)
        y_true = like_output(xp.asarray(y_true), y_pred)
        return ((y_pred.astype(xp.float64) - y_true) ** 2).mean(axis=-1)


class AUC(Metric):
    """Area under the ROC curve from counts at `num_thresholds` thresholds (Keras' defaults:
    200, evenly spaced in (0, 1) plus one below 0 and one above 1; the trapezoid rule).
    Labels count as positive when non-zero; every entry of y_pred is one prediction."""

    EPSILON = 1e-7

    def __init__(self, num_thresholds: int = 200, curve: str = "ROC", name: str = "auc",
                 dtype: str = "float32"):
        self.num_thresholds = checks.integer("num_thresholds", num_thresholds, 2)
        if curve != "ROC":
            checks.refuse("curve", curve, "'ROC' (the precision-recall curve is not built "
                          "yet)")
        self.curve = curve
        super().__init__(name, dtype)
        inner = [(i + 1) / (self.num_thresholds - 1) for i in range(self.num_thresholds - 2)]
        self.thresholds = np.array([-self.EPSILON, *inner, 1 + self.EPSILON], np.float32)
        for part in ("true_positives", "false_positives", "true_negatives", "false_negatives"):
            self.add_variable((self.num_thresholds,), part)

    def update_state(self, y_true, y_pred, sample_weight=None) -> None:
        xp = _xp()
        y_pred = xp.asarray(y_pred, dtype=xp.float32)
        positive = (xp.asarray(y_true).reshape(y_pred.shape) != 0).reshape(-1)
        if sample_weight is None:
            weight = xp.ones(y_pred.size, xp.float64)
        else:  # one weight per sample, for each of its predictions
            per_sample = xp.asarray(sample_weight, dtype=xp.float64).reshape(
                (-1,) + (1,) * (y_pred.ndim - 1))
            weight = xp.broadcast_to(per_sample, y_pred.shape).reshape(-1)
        y_pred = y_pred.reshape(-1)
        above = y_pred[None, :] > xp.asarray(self.thresholds)[:, None]  # (thresholds, n)
        pos_w = weight * positive
        neg_w = weight * ~positive
        self._add("true_positives", (above * pos_w).sum(axis=1))
        self._add("false_positives", (above * neg_w).sum(axis=1))
        self._add("false_negatives", (~above * pos_w).sum(axis=1))
        self._add("true_negatives", (~above * neg_w).sum(axis=1))

    def result(self):
        xp = _xp()
        tp, fp, tn, fn = (self._read(k) for k in ("true_positives", "false_positives",
                                                  "true_negatives", "false_negatives"))
        tpr = xp.where(tp + fn == 0, 0, tp / xp.where(tp + fn == 0, 1, tp + fn))
        fpr = xp.where(fp + tn == 0, 0, fp / xp.where(fp + tn == 0, 1, fp + tn))
        return ((fpr[:-1] - fpr[1:]) * (tpr[:-1] + tpr[1:]) / 2).sum().astype(self.dtype)[()]


OBJECTS = (Mean, Sum, SparseCategoricalAccuracy, CategoricalAccuracy, MeanSquaredError, AUC)
