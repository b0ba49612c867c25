"""`Sequential`: a Keras-shaped model whose weights are distributed variables of the strategy in
scope when it was made. `fit` sends each replica its shard of `steps_per_execution` global
batches per call; replicas run forward/backward, sum the gradients (scaled so the sum is the
gradient of the global batch's mean loss) and apply the optimizer. Large models update
partitioned: each replica steps the segment of the weights it reduced, then all gather it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from labdist import context
from labdist.input import Batches, split_sizes
from labdist.training import layers as layers_mod
from labdist.training import losses, optimizers
from labdist.training.progress import ProgressBar, check_verbose
from labdist.values import PerReplica
from labdist.variables import Variable


class History:
    """What `fit` returns: `history.history["loss"]`, `["accuracy"]`, `["val_loss"]`, ..."""

    def __init__(self):
        self.history: dict[str, list[float]] = {}
        self.epoch: list[int] = []

    def _record(self, epoch: int, logs: dict[str, float]) -> None:
        self.epoch.append(epoch)
        for key, value in logs.items():
            self.history.setdefault(key, []).append(value)


class Sequential:
    """A stack of layers (`ld.layers.Dense`, `ld.layers.Dropout`)."""

    def __init__(self, layers: Sequence[Any] = (), name: str = "sequential", seed: int = 0):
        for layer in layers:
            if not isinstance(layer, layers_mod.Dense | layers_mod.Dropout):
                raise TypeError(f"layers: {layer!r} is not a labdist layer "
                                "(ld.layers.Dense or ld.layers.Dropout)")
        self.layers = list(layers)
        self.name = name
        self.seed = seed
        self._strategy = context.get_strategy()  # as Keras: the strategy in scope now
        self._weights: list[dict[str, Variable]] = []
        self._slots: list[dict[str, dict[str, Variable]]] = []
        self._compiled = False
        self._iterations = 0
        first = self.layers[0] if self.layers else None
        if getattr(first, "input_shape", None):
            self.build(first.input_shape[0])

    @property
    def built(self) -> bool:
        return bool(self._weights)

    def build(self, input_dim: int) -> None:
        """Create the weights (one set of copies per replica) for inputs of `input_dim`."""
        rng = np.random.default_rng(self.seed)
        with self._strategy.scope():
            width = input_dim
            for i, layer in enumerate(self.layers):
                params = layer.build(width, rng)
                self._weights.append({
                    k: Variable(v, name=f"{type(layer).__name__.lower()}_{i}/{k}",
                                aggregation="MEAN") for k, v in params.items()})
                width = getattr(layer, "units", width)

    def compile(self, loss: Any = "mse", optimizer: Any = "sgd", metrics: Sequence[str] = (),
                steps_per_execution: int = 1) -> None:
        self._loss = losses.get(loss)
        self._optimizer = optimizers.get(optimizer)
        unknown = [m for m in metrics if m not in ("accuracy", "acc")]
        if unknown:
            raise ValueError(f"metrics={list(metrics)!r}: {unknown} not supported; allowed: "
                             "'accuracy'")
        self._metrics = ["accuracy"] if metrics else []
        if isinstance(steps_per_execution, bool) or not isinstance(steps_per_execution, int) \
                or steps_per_execution < 1:
            raise ValueError(f"steps_per_execution={steps_per_execution!r} must be an integer "
                             ">= 1")
        self._steps_per_execution = steps_per_execution
        self._compiled = True
        self._slots = []

    def _ensure_ready(self, x: np.ndarray) -> None:
        if not self._compiled:
            raise RuntimeError("call model.compile(loss=..., optimizer=...) before fit/evaluate")
        if not self.built:
            self.build(x.shape[1])
        self._ensure_slots()

    def _ensure_slots(self) -> None:
        if not self._slots:
            with self._strategy.scope():  # optimizer state: each replica keeps its own
                self._slots = [{k: {s: Variable(a, synchronization="NONE", trainable=False,
                                                name=f"{v.name}/{s}")
                                    for s, a in self._optimizer.slots(v.numpy()).items()}
                                for k, v in w.items()} for w in self._weights]

    # -- training -----------------------------------------------------------------------------
    def fit(self, x, y, batch_size: int = 32, epochs: int = 1, verbose: Any = "auto",
            callbacks: Sequence[Any] = (), validation_data: tuple | None = None,
            shuffle: bool = True, initial_epoch: int = 0) -> History:
        x, y = _arrays(x, y)
        _positive_int("epochs", epochs)
        verbose = check_verbose(verbose)
        batches = Batches((x, y), _positive_int("batch_size", batch_size), shuffle=shuffle,
                          seed=self.seed)
        history = History()
        refresh = getattr(self._strategy, "refresh", None)
        if refresh is not None:  # multi-worker: train on the workers present now
            refresh()
        for cb in callbacks:
            _call(cb, "set_model", self)
            _call(cb, "on_train_begin")
        self._ensure_ready(x)
        for epoch in range(max(initial_epoch, getattr(self, "_resume_epoch", 0)), epochs):
            loss_sum = correct = seen = 0.0
            groups = _chunks(list(batches), self._steps_per_execution)
            bar = ProgressBar(f"Epoch {epoch + 1}/{epochs}", len(batches), verbose)
            done = 0
            delegate = getattr(self._strategy, "_train_model_steps", None)  # parameter servers
            outputs = delegate(self, groups) if delegate else map(self._train_steps, groups)
            for group, group_outputs in zip(groups, outputs, strict=True):
                for out_loss, out_correct, n in group_outputs:
                    loss_sum, correct, seen = loss_sum + out_loss, correct + out_correct, seen + n
                done += len(group)
                bar.update(done, self._running_logs(loss_sum, correct, seen))
            logs = {"loss": loss_sum / seen}
            if self._metrics:
                logs["accuracy"] = correct / seen
            if validation_data is not None:
                val = self.evaluate(*validation_data, batch_size=batch_size, verbose=0,
                                    return_dict=True)
                logs.update({f"val_{k}": v for k, v in val.items()})
            history._record(epoch, logs)
            bar.finish(logs)
            for cb in callbacks:
                _call(cb, "on_epoch_end", epoch, logs)
        for cb in callbacks:
            _call(cb, "on_train_end")
        return history

    def _running_logs(self, loss_sum: float, correct: float, seen: float) -> dict[str, float]:
        logs = {"loss": loss_sum / seen}
        if self._metrics:
            logs["accuracy"] = correct / seen
        return logs

    def _train_steps(self, group: list[tuple[np.ndarray, np.ndarray]]):
        """One strategy.run for a group of global batches; returns (loss sum, correct, n)."""
        n = self._strategy.num_replicas_in_sync
        shards, totals = [[] for _ in range(n)], []
        for bx, by in group:
            bounds = np.cumsum([0, *split_sizes(len(bx), n)])
            for r in range(n):
                shards[r].append((bx[bounds[r]:bounds[r + 1]], by[bounds[r]:bounds[r + 1]]))
            totals.append(len(bx))
        step0 = self._iterations
        self._iterations += len(group)
        out = self._strategy.run(_train_loop, args=(
            self.layers, self._weights, self._slots, self._loss, self._optimizer,
            _per_replica(shards), totals, step0, self.seed, bool(self._metrics)))
        return self._strategy.experimental_local_results(out)[0]

    # -- inference ----------------------------------------------------------------------------
    def evaluate(self, x, y, batch_size: int = 32, verbose: Any = "auto",
                 return_dict: bool = False):
        x, y = _arrays(x, y)
        verbose = check_verbose(verbose)
        self._ensure_ready(x)
        loss_sum = correct = seen = 0.0
        batches = Batches((x, y), _positive_int("batch_size", batch_size))
        bar = ProgressBar("Evaluate", len(batches), verbose)
        for done, (bx, by) in enumerate(batches, start=1):
            for r_loss, r_correct in self._run_forward(bx, by):
                loss_sum, correct = loss_sum + r_loss, correct + r_correct
            seen += len(bx)
            bar.update(done, self._running_logs(float(loss_sum), float(correct), seen))
        logs = self._running_logs(float(loss_sum), float(correct), len(x))
        bar.finish(logs)
        if return_dict:
            return logs
        return list(logs.values()) if len(logs) > 1 else logs["loss"]

    def predict(self, x, batch_size: int = 32, verbose: Any = "auto") -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        verbose = check_verbose(verbose)
        if not self.built:
            self.build(x.shape[1])
        batches = Batches(x, _positive_int("batch_size", batch_size))
        bar = ProgressBar("Predict", len(batches), verbose)
        outs = []
        for done, bx in enumerate(batches, start=1):
            outs.append(np.concatenate(self._run_forward(bx, None)))
            bar.update(done, {})
        bar.finish({})
        return np.concatenate(outs)

    def _run_forward(self, bx, by) -> list:
        n = self._strategy.num_replicas_in_sync
        bounds = np.cumsum([0, *split_sizes(len(bx), n)])
        xs = [bx[bounds[r]:bounds[r + 1]] for r in range(n)]
        ys = None if by is None else [by[bounds[r]:bounds[r + 1]] for r in range(n)]
        out = self._strategy.run(_forward_step, args=(
            self.layers, self._weights, _per_replica(xs),
            None if ys is None else _per_replica(ys), getattr(self, "_loss", None)))
        return list(self._strategy.experimental_local_results(out))

    # -- weights ------------------------------------------------------------------------------
    @property
    def weights(self) -> list[Variable]:
        """The model's distributed variables (Keras' `model.weights`): pass one to
        `strategy.experimental_local_results` to see every replica's copy."""
        return [v for w in self._weights for v in w.values()]

    def get_weights(self) -> list[np.ndarray]:
        return [v.numpy() for w in self._weights for v in w.values()]

    def set_weights(self, weights: Sequence[np.ndarray]) -> None:
        variables = [v for w in self._weights for v in w.values()]
        if len(weights) != len(variables):
            raise ValueError(f"set_weights: got {len(weights)} arrays, the model has "
                             f"{len(variables)} weights")
        for v, w in zip(variables, weights, strict=True):
            v._check_spec("set_weights", w, np.asarray(w).dtype, np.shape(w))
        with self._strategy.scope():
            for v, w in zip(variables, weights, strict=True):
                v.assign(np.asarray(w))

    def summary(self) -> None:
        lines = [f'Model: "{self.name}"', f"{'Layer':<36}{'Units':<8}{'Params':>10}"]
        total = 0
        for layer, w in zip(self.layers, self._weights or [{}] * len(self.layers),
                            strict=True):
            count = sum(int(np.prod(v.shape)) for v in w.values())
            total += count
            lines.append(f"{layer!r:<24}{getattr(layer, 'units', '-')!s:<14}{count:>10}")
        lines.append(f"Total params: {total}")
        print("\n".join(lines))


# -- what runs on the replicas ---------------------------------------------------------------
def _train_loop(layers, weights, slots, loss, optimizer, shards, totals, step0, seed, metric):
    from labdist.worker.context import current

    ctx = current()
    replica, xp = ctx._replica, ctx.xp
    params = [{k: replica.copy_of(v._id, v.name) for k, v in w.items()} for w in weights]
    states = [{k: {s: replica.copy_of(v._id, v.name) for s, v in d.items()}
               for k, d in layer_slots.items()} for layer_slots in slots]
    names = [(i, k) for i, w in enumerate(params) for k in w]
    flat_params = [params[i][k].reshape(-1) for i, k in names]
    flat_slots = [{s: a.reshape(-1) for s, a in states[i][k].items()} for i, k in names]
    stats = xp.zeros(2, dtype=xp.float64)
    out, sharded = [], False
    for step, ((x, y), total) in enumerate(zip(shards, totals, strict=True), start=step0 + 1):
        rng = _DeviceRNG(replica.backend, (seed, replica.rank, step))
        grads, local_stats = _gradients(xp, layers, params, loss, x, y, rng, len(x), total)

        def update(j, lo, hi, summed, step=step):
            if j == len(names):  # the (loss sum, correct) pair rides along
                stats[lo:hi] = summed
                return
            optimizer.apply(xp, flat_params[j][lo:hi], summed,
                            {s: a[lo:hi] for s, a in flat_slots[j].items()}, step)
        sharded |= ctx._reduce_apply("the training step's gradients",
                                     [grads[i][k] for i, k in names] + [local_stats],
                                     [*flat_params, stats], update)
        loss_sum, correct = (float(v) for v in stats[:2])
        out.append((loss_sum, correct if metric else 0.0, total))
    slots = [a for d in flat_slots for a in d.values()]
    if sharded and slots:  # each rank updated its own segment of the slots: make them whole
        ctx._gather_segments("the optimizer's slots", slots)
    return out


def _gradients(xp, layers, params, loss, x, y, rng, local, total):
    """Gradients of (sum of this shard's losses) / global batch size, and (loss sum, correct)."""
    if local == 0:  # an empty shard still joins the all-reduce, with zeros
        grads = [{k: xp.zeros_like(v) for k, v in p.items()} for p in params]
        return grads, xp.zeros(2, dtype=xp.float64)
    caches, h = [], x
    for layer, p in zip(layers, params, strict=True):
        h, cache = layer.forward(xp, p, h, training=True, rng=rng)
        caches.append(cache)
    value, dh = loss(xp, y, h)
    last = layers[-1]
    fused = (loss.name == "sparse_categorical_crossentropy" and not loss.from_logits
             and getattr(last, "activation", None) is not None
             and last.activation.name == "softmax")
    grads: list[dict] = [None] * len(layers)
    start = len(layers) - 1
    scale = local / total
    if fused:  # softmax + cross-entropy: d loss / d logits = p - onehot, stable and cheap
        dz = losses.fused_softmax_grad(xp, y, h) * scale
        dh, grads[-1] = last.backward_linear(xp, params[-1], caches[-1][0], dz, start > 0)
        start -= 1
    else:
        dh = dh * scale
    for i in range(start, -1, -1):
        dh, grads[i] = layers[i].backward(xp, params[i], caches[i], dh, input_grad=i > 0)
    correct = (h.argmax(axis=1) == y.reshape(-1)).sum() if h.ndim == 2 and h.shape[1] > 1 else 0
    stats = xp.zeros(2, dtype=xp.float64)
    stats[0] = float(value) * local
    stats[1] = float(correct)
    return grads, stats


def _forward_step(layers, weights, x, y, loss):
    from labdist.worker.context import current

    replica = current()._replica
    xp = replica.backend.xp
    h = x
    for layer, w in zip(layers, weights, strict=True):
        h, _ = layer.forward(xp, {k: replica.copy_of(v._id, v.name) for k, v in w.items()}, h)
    if y is None:
        return h
    if len(x) == 0:
        return 0.0, 0.0
    value, _ = loss(xp, y, h)
    correct = float((h.argmax(axis=1) == y.reshape(-1)).sum()) if h.shape[1] > 1 else 0.0
    return float(value) * len(x), correct


class _DeviceRNG:
    """Dropout masks drawn on the host from a per-(seed, replica, step) stream."""

    def __init__(self, backend, key):
        self._backend = backend
        self._rng = np.random.default_rng(key)

    def random(self, shape):
        return self._backend.to_device(self._rng.random(shape, dtype=np.float32))


# -- helpers ----------------------------------------------------------------------------------
def _arrays(x, y) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(x, dtype=np.float32), np.asarray(y)
    if x.ndim != 2 or len(x) != len(y):
        raise ValueError(f"x must be (samples, features) and y (samples, ...) of the same "
                         f"length; got x {x.shape} and y {y.shape}")
    return x, y


def _per_replica(values: list) -> Any:
    return values[0] if len(values) == 1 else PerReplica(values)


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer")
    return int(value)


def _chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _call(callback, hook: str, *args) -> None:
    method = getattr(callback, hook, None)
    if method is not None:
        method(*args)
