"""Small models the lab trains: named parameters, and the loss with its gradient on one batch,
written once against an array module `xp` (numpy or cupy) so the same code runs on any replica.
They are built from the training blocks (`labdist.training`'s Dense layer and losses), under
the lab's own parameter names, which the charts and `track` use.

A lab model is anything with `init_params()`, `loss_and_grads(xp, params, x, y)` and
`loss(xp, params, x, y)`; gradients are of the batch's *mean* loss, so with aggregation SUM the
replicas' gradients add up (a bigger step) and with MEAN they average, as in tf.distribute.
A model with *state* besides its parameters (batch norm's moving statistics) also says
`init_state()` and takes `state=`, this replica's copies, which training updates in place.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from labdist import checks
from labdist.training import losses
from labdist.training.layers import BatchNormalization, Conv2D, Dense, Flatten, MaxPooling2D


class LabModel:
    """The base of the lab's models; subclasses say what their parameters and loss are."""

    #: the two scalar parameters drawn in the parameter plane (None: no plane view)
    plane: tuple[str, str] | None = None

    def init_params(self) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def init_state(self) -> dict[str, np.ndarray]:
        """The model's non-trainable state ({} for most): batch norm's moving statistics,
        which the lab keeps per replica (ON_WRITE / NONE, as TensorFlow does)."""
        return {}

    def loss_and_grads(self, xp, params: dict[str, Any], x, y) -> tuple[Any, dict[str, Any]]:
        """(mean loss over the batch, {name: d mean loss / d param}); an empty batch gives
        (0, zeros). A model with state takes `state=` too ({name: this replica's copy}) and
        updates it in place."""
        raise NotImplementedError

    def configured(self, synchronized_bn: bool) -> LabModel:
        """The model as a run's settings ask for it: with batch norm, its statistics summed
        across the replicas (`synchronized_bn`) or not; the same model where nothing
        applies."""
        return self

    def loss(self, xp, params: dict[str, Any], x, y) -> Any:
        return self.loss_and_grads(xp, params, x, y)[0]

    def check_data(self, x: np.ndarray, y: np.ndarray) -> None:
        """Raise ValueError naming what is wrong when (x, y) does not fit this model."""

    def default_data(self, seed: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The data the lab trains this model on when it is given none (None: it must be
        given)."""
        return None

    def default_track(self, spec: ParamSpec) -> list[str]:
        """The elements the lab charts when not told (`spec`: this model's)."""
        return spec.default_track()

    def solve(self, x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray] | None:
        """The parameters that minimise the loss on (x, y), where a model can say (the
        parameter plane marks each replica's optimum); None where it cannot."""
        return None

    def loss_grid(self, a: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray,
                  base: dict[str, np.ndarray]) -> np.ndarray:
        """The loss at every (a[i], b[i]) of the plane's two parameters (others from `base`);
        a generic loop, which models may vectorise."""
        out = np.empty(len(a))
        pa, pb = self.plane
        for i in range(len(a)):
            params = dict(base)
            params[pa], params[pb] = np.asarray(a[i]), np.asarray(b[i])
            out[i] = float(self.loss(np, params, x, y))
        return out


@lru_cache(maxsize=64)
def dense(n_features: int, units: int) -> Dense:
    """A linear `Dense` layer, made once per shape and process: a lab model keeps only its
    sizes, so it pickles plainly (a layer holds its activation's lambda) for every step it
    travels with."""
    return Dense(units, input_shape=(n_features,))


def empty_batch(xp, params: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """An empty shard (more replicas than samples): zero loss and zero gradients."""
    return xp.asarray(0.0), {k: xp.zeros_like(v) for k, v in params.items()}


class Linear(LabModel):
    """y ≈ x @ w + b with the mean squared error. With one feature, `w` and `b` are scalars and
    the lab draws each replica's path in the (w, b) plane over the loss contours.

    A `Dense(1)` layer with the "mse" loss: `w` is its kernel and `b` its bias, reshaped.
    `loss_grid` and `solve` stay written out: they evaluate many (w, b) at once or solve
    for the optimum, which a layer holding one set of parameters does not do.
    """

    def __init__(self, n_features: int = 1, init: tuple[float, float] = (0.0, 0.0)):
        checks.integer("n_features", n_features, 1)
        if (not isinstance(init, tuple | list) or len(init) != 2
                or not all(isinstance(v, int | float) and not isinstance(v, bool)
                           for v in init)):
            raise ValueError(f"init={init!r} must be (w0, b0), two numbers")
        self.n_features = n_features
        self.init = (float(init[0]), float(init[1]))
        self.plane = ("w", "b") if n_features == 1 else None
        self.loss_fn = losses.get("mse")

    def __repr__(self) -> str:
        return f"Linear(n_features={self.n_features})"

    def init_params(self) -> dict[str, np.ndarray]:
        shape = () if self.n_features == 1 else (self.n_features,)
        return {"w": np.full(shape, self.init[0]), "b": np.asarray(self.init[1])}

    def loss_and_grads(self, xp, params, x, y):
        if len(x) == 0:
            return empty_batch(xp, params)
        kernel_bias = {"kernel": params["w"].reshape(self.n_features, 1),
                       "bias": params["b"].reshape(1)}
        x2 = x.reshape(len(x), self.n_features)
        layer = dense(self.n_features, 1)
        out, cache = layer.forward(xp, kernel_bias, x2)
        loss, d_out = self.loss_fn.value_and_grad(xp, y, out)
        _, grads = layer.backward(xp, kernel_bias, cache, d_out, input_grad=False)
        return loss, {"w": grads["kernel"].reshape(params["w"].shape),
                      "b": grads["bias"].reshape(params["b"].shape)}

    def default_data(self, seed: int) -> tuple[np.ndarray, np.ndarray] | None:
        """One feature: a noisy line (512 samples), whose (w, b) plane the lab draws."""
        if self.n_features != 1:
            return None
        from labdist.data.datasets import synthetic

        x, y = synthetic.regression(n_samples=512, n_features=1, noise=0.3, seed=seed)
        return x.astype(np.float64), y.astype(np.float64)

    def check_data(self, x, y):
        if x.ndim not in (1, 2) or (x.ndim == 2 and x.shape[1] != self.n_features) or \
                (x.ndim == 1 and self.n_features != 1):
            raise ValueError(f"data: x has shape {x.shape} but {self!r} takes "
                             f"(n, {self.n_features}) inputs")
        if y.shape not in ((len(x),), (len(x), 1)):
            raise ValueError(f"data: y has shape {y.shape}; {self!r} takes one target per "
                             f"sample: ({len(x)},)")

    def loss_grid(self, a, b, x, y, base):
        x1 = x.reshape(-1)
        err = a[:, None] * x1[None, :] + b[:, None] - y.reshape(-1)[None, :]
        return (err * err).mean(axis=1)

    def solve(self, x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
        """The least-squares optimum on (x, y): where the contours centre."""
        x2 = np.c_[x.reshape(len(x), self.n_features), np.ones(len(x))]
        coef = np.linalg.lstsq(x2, y.reshape(-1), rcond=None)[0]
        w = coef[:-1] if self.n_features > 1 else np.asarray(coef[0])
        return {"w": w, "b": np.asarray(coef[-1])}


class SoftmaxRegression(LabModel):
    """Multinomial logistic regression (softmax of x @ W + b) with cross-entropy loss.

    A `Dense(n_classes)` layer (`W` its kernel, `b` its bias) and sparse categorical
    cross-entropy from logits, whose gradient is the fused softmax one, (p - onehot) / n.
    """

    def __init__(self, n_features: int, n_classes: int, seed: int = 0):
        for name, v in (("n_features", n_features), ("n_classes", n_classes)):
            checks.integer(name, v, 1)
        if n_classes < 2:
            raise ValueError(f"n_classes={n_classes!r} must be at least 2")
        self.n_features, self.n_classes, self.seed = n_features, n_classes, seed
        self.loss_fn = losses.get("sparse_categorical_crossentropy", from_logits=True)

    def __repr__(self) -> str:
        return f"SoftmaxRegression(n_features={self.n_features}, n_classes={self.n_classes})"

    def init_params(self):
        rng = np.random.default_rng(self.seed)
        return {"W": rng.normal(0, 0.1, (self.n_features, self.n_classes)),
                "b": np.zeros(self.n_classes)}

    def loss_and_grads(self, xp, params, x, y):
        if len(x) == 0:
            return empty_batch(xp, params)
        layer = dense(self.n_features, self.n_classes)
        kernel_bias = {"kernel": params["W"], "bias": params["b"]}
        logits, cache = layer.forward(xp, kernel_bias, x)
        loss, d_logits = self.loss_fn.value_and_grad(xp, y, logits)
        _, grads = layer.backward(xp, kernel_bias, cache, d_logits, input_grad=False)
        return loss, {"W": grads["kernel"], "b": grads["bias"]}

    def check_data(self, x, y):
        if x.ndim != 2 or x.shape[1] != self.n_features:
            raise ValueError(f"data: x has shape {x.shape} but {self!r} takes "
                             f"(n, {self.n_features}) inputs")
        if y.shape != (len(x),) or y.dtype.kind not in "iu" or (
                len(y) and (y.min() < 0 or y.max() >= self.n_classes)):
            raise ValueError(f"data: y must be {len(x)} integer labels in 0..{self.n_classes - 1}")


@lru_cache(maxsize=8)
def cnn_layers(filters: int) -> tuple[Conv2D, MaxPooling2D, Flatten, Dense]:
    """The CNN's layers, made once per size and process (as `dense`)."""
    return (Conv2D(filters, 3, activation="relu", input_shape=(8, 8, 1)), MaxPooling2D(2),
            Flatten(), Dense(10, input_shape=(9 * filters,)))


class DigitsCNN(LabModel):
    """The tutorials' small CNN, sized for the 8x8 digits: Conv2D(filters, 3, relu) ->
    MaxPooling2D(2) -> Flatten -> Dense(10) logits, with sparse categorical cross-entropy.
    A real model in the lab: hundreds of parameters (the charts follow a few), each mode's
    all-reduce or push carrying all of them. Trains on the digits when given no data.

    Its parameters are the layers' own, named `conv_kernel`, `conv_bias`, `dense_kernel`,
    `dense_bias`; their initial values are Keras' (Glorot uniform kernels, zero biases)."""

    def __init__(self, filters: int = 8, seed: int = 0):
        self.filters = checks.integer("filters", filters, 1)
        self.seed = checks.integer("seed", seed, 0)
        self.loss_fn = losses.get("sparse_categorical_crossentropy", from_logits=True)

    def __repr__(self) -> str:
        return f"DigitsCNN(filters={self.filters})"

    def init_params(self) -> dict[str, np.ndarray]:
        conv, _, _, dense_layer = cnn_layers(self.filters)
        rng = np.random.default_rng(self.seed)
        c = conv.build((8, 8, 1), rng)
        d = dense_layer.build((9 * self.filters,), rng)
        return {"conv_kernel": c["kernel"].astype(np.float64),
                "conv_bias": c["bias"].astype(np.float64),
                "dense_kernel": d["kernel"].astype(np.float64),
                "dense_bias": d["bias"].astype(np.float64)}

    def loss_and_grads(self, xp, params, x, y):
        if len(x) == 0:
            return empty_batch(xp, params)
        conv, pool, flatten, dense_layer = cnn_layers(self.filters)
        cp = {"kernel": params["conv_kernel"], "bias": params["conv_bias"]}
        dp = {"kernel": params["dense_kernel"], "bias": params["dense_bias"]}
        h, conv_cache = conv.forward(xp, cp, x.reshape(len(x), 8, 8, 1))
        h, pool_cache = pool.forward(xp, {}, h)
        h, flat_cache = flatten.forward(xp, {}, h)
        logits, dense_cache = dense_layer.forward(xp, dp, h)
        loss, d = self.loss_fn.value_and_grad(xp, y, logits)
        d, dense_grads = dense_layer.backward(xp, dp, dense_cache, d)
        d, _ = flatten.backward(xp, {}, flat_cache, d)
        d, _ = pool.backward(xp, {}, pool_cache, d)
        _, conv_grads = conv.backward(xp, cp, conv_cache, d, input_grad=False)
        return loss, {"conv_kernel": conv_grads["kernel"], "conv_bias": conv_grads["bias"],
                      "dense_kernel": dense_grads["kernel"], "dense_bias": dense_grads["bias"]}

    def check_data(self, x, y):
        check_digits(self, x, y)

    def default_data(self, seed: int) -> tuple[np.ndarray, np.ndarray]:
        return digits_data(seed)


@lru_cache(maxsize=8)
def bn_layers(hidden: int, synchronized: bool) -> tuple[Dense, BatchNormalization, Dense]:
    """The batch-norm MLP's layers, made once per size and process (as `dense`)."""
    return (Dense(hidden, input_shape=(64,)),
            BatchNormalization(momentum=BatchNormMLP.momentum, synchronized=synchronized,
                               input_shape=(hidden,)),
            Dense(10, input_shape=(hidden,)))


class BatchNormMLP(LabModel):
    """Dense(hidden) -> BatchNormalization -> relu -> Dense(10) logits on the digits, with
    sparse categorical cross-entropy: where TensorFlow itself uses aggregation NONE.

    Batch norm's moving mean and variance are state, not parameters: each replica updates
    its own copy from its own slice of the batch (ON_WRITE / NONE), so the copies drift
    apart while the parameters stay one value. With `synchronized_bn` on (the lab's setting,
    Keras' `BatchNormalization(synchronized=True)`) the batch statistics are summed across
    the replicas every step, so every copy takes the same update and the gap closes by the
    momentum's factor a step. The momentum is 0.9 (Keras: 0.99) so that both show within
    tens of steps. The lab tracks `moving_mean[0]` and `moving_mean[1]` by default."""

    momentum = 0.9

    def __init__(self, hidden: int = 8, seed: int = 0, synchronized: bool = False):
        self.hidden = checks.integer("hidden", hidden, 1)
        self.seed = checks.integer("seed", seed, 0)
        self.synchronized = checks.boolean("synchronized", synchronized)
        self.loss_fn = losses.get("sparse_categorical_crossentropy", from_logits=True)

    def __repr__(self) -> str:
        sync = ", synchronized=True" if self.synchronized else ""
        return f"BatchNormMLP(hidden={self.hidden}{sync})"

    def configured(self, synchronized_bn: bool) -> BatchNormMLP:
        if synchronized_bn == self.synchronized:
            return self
        return BatchNormMLP(self.hidden, self.seed, synchronized_bn)

    def init_params(self) -> dict[str, np.ndarray]:
        first, norm, last = bn_layers(self.hidden, False)
        rng = np.random.default_rng(self.seed)
        d1, bn, d2 = (first.build((64,), rng), norm.build((self.hidden,), rng),
                      last.build((self.hidden,), rng))
        return {name: value.astype(np.float64) for name, value in (
            ("dense_kernel", d1["kernel"]), ("dense_bias", d1["bias"]),
            ("gamma", bn["gamma"]), ("beta", bn["beta"]),
            ("out_kernel", d2["kernel"]), ("out_bias", d2["bias"]))}

    def init_state(self) -> dict[str, np.ndarray]:
        _, norm, _ = bn_layers(self.hidden, False)
        return {k: v.astype(np.float64) for k, v in norm.build_state((self.hidden,)).items()}

    def loss_and_grads(self, xp, params, x, y, state: dict[str, Any] | None = None):
        """Training mode: batch norm normalises with this slice's statistics (the global
        batch's when synchronized) and, given `state`, moves this replica's copies."""
        if len(x) == 0:
            return empty_batch(xp, params)
        first, norm, last = bn_layers(self.hidden, self.synchronized)
        p1 = {"kernel": params["dense_kernel"], "bias": params["dense_bias"]}
        pn = {"gamma": params["gamma"], "beta": params["beta"]}
        p2 = {"kernel": params["out_kernel"], "bias": params["out_bias"]}
        h, c1 = first.forward(xp, p1, x.reshape(len(x), 64))
        hn, cn = norm.forward(xp, pn, h, training=True, state=state)
        a = xp.maximum(hn, 0)
        logits, c2 = last.forward(xp, p2, a)
        loss, d = self.loss_fn.value_and_grad(xp, y, logits)
        d, g2 = last.backward(xp, p2, c2, d)
        d, gn = norm.backward(xp, pn, cn, d * (hn > 0))
        _, g1 = first.backward(xp, p1, c1, d, input_grad=False)
        return loss, {"dense_kernel": g1["kernel"], "dense_bias": g1["bias"],
                      "gamma": gn["gamma"], "beta": gn["beta"],
                      "out_kernel": g2["kernel"], "out_bias": g2["bias"]}

    def check_data(self, x, y):
        check_digits(self, x, y)

    def default_data(self, seed: int) -> tuple[np.ndarray, np.ndarray]:
        return digits_data(seed)

    def default_track(self, spec: ParamSpec) -> list[str]:
        return ["moving_mean[0]", "moving_mean[1]", "dense_kernel[0]"]


def check_digits(model: LabModel, x: np.ndarray, y: np.ndarray) -> None:
    """The digits models' data check: 8x8 images and labels 0..9."""
    if x.shape[1:] not in ((64,), (8, 8), (8, 8, 1)):
        raise ValueError(f"data: x has shape {x.shape} but {model!r} takes 8x8 images: "
                         "(n, 64), (n, 8, 8) or (n, 8, 8, 1)")
    if y.shape != (len(x),) or y.dtype.kind not in "iu" or (
            len(y) and (y.min() < 0 or y.max() > 9)):
        raise ValueError(f"data: y must be {len(x)} integer labels in 0..9")


def digits_data(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The digits' training part (1,437 images; needs scikit-learn, as the digits do)."""
    from labdist.data.datasets import digits

    (x, y), _ = digits.load_data(seed=seed)
    return x.astype(np.float64), y


class ParamSpec:
    """Packs a model's named parameters, then its state, into one flat vector and back (what
    crosses to the driver each step), and names each element ("w", "W[2]",
    "moving_mean[0]"). `trainable` elements come first: the parameters, which switches unify
    and the spread measures; the state after them stays each replica's own."""

    def __init__(self, params: dict[str, np.ndarray], state: dict[str, np.ndarray] | None = None):
        state = state or {}
        self.names = [*params, *state]
        self.state_names = list(state)
        values = {**params, **state}
        self.shapes = [np.shape(values[k]) for k in self.names]
        self.sizes = [int(np.prod(s)) for s in self.shapes]
        self.offsets = np.cumsum([0, *self.sizes]).tolist()
        self.size = self.offsets[-1]
        self.trainable = self.offsets[len(params)]  # elements that are parameters

    @classmethod
    def of(cls, model: LabModel) -> ParamSpec:
        return cls(model.init_params(), model.init_state())

    def initial(self, model: LabModel) -> np.ndarray:
        """The model's starting vector: its initial parameters, then its initial state."""
        return self.flatten({**model.init_params(), **model.init_state()})

    def flatten(self, params: dict[str, Any]) -> np.ndarray:
        return np.concatenate([np.asarray(params[k], dtype=np.float64).reshape(-1)
                               for k in self.names])

    def unflatten(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        return {k: np.array(flat[self.offsets[i]:self.offsets[i + 1]]).reshape(self.shapes[i])
                for i, k in enumerate(self.names)}

    def index(self, element: str) -> int:
        """Position of "name" (a scalar parameter) or "name[i]" (element i, flattened)."""
        name, _, rest = element.partition("[")
        if name not in self.names:
            raise ValueError(f"track: {element!r} is not a parameter; the model has "
                             f"{', '.join(self.names)}")
        i = self.names.index(name)
        if not rest:
            if self.sizes[i] != 1:
                raise ValueError(f"track: parameter {name!r} has {self.sizes[i]} elements; "
                                 f"name one, e.g. '{name}[0]'")
            return self.offsets[i]
        try:
            k = int(rest.rstrip("]"))
        except ValueError:
            raise ValueError(f"track: {element!r} must look like '{name}[0]'") from None
        if not rest.endswith("]") or not 0 <= k < self.sizes[i]:
            raise ValueError(f"track: {element!r}: {name!r} has elements 0..{self.sizes[i] - 1}")
        return self.offsets[i] + k

    def default_track(self) -> list[str]:
        out = []
        for name, size in zip(self.names, self.sizes, strict=True):
            out += [name] if size == 1 else [f"{name}[{k}]" for k in range(min(size, 2))]
        return out[:4]
