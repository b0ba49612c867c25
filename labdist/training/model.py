"""`Sequential`: a Keras-shaped model whose weights are distributed variables of the strategy in
scope when it was made. `fit` sends each replica its shard of `steps_per_execution` global
batches per call; replicas run forward/backward, sum the gradients (scaled so the sum is the
gradient of the global batch's mean loss) and apply the optimizer. Large models update
partitioned: each replica steps the segment of the weights it reduced, then all gather it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from labdist import checks, context, shipping
from labdist.data.dataset import Dataset
from labdist.data.distributed import Batches, shard
from labdist.data.placed_input import placed_arrays
from labdist.timing import phases
from labdist.training import (
    fit_checks,
    losses,
    model_call,
    object_checkpoint,
    optimizers,
    saving,
)
from labdist.training import layers as layers_mod
from labdist.training import metrics as metric_lib
from labdist.training.progress import ProgressBar, check_verbose
from labdist.training.trainer import diloco
from labdist.training.trainer.fit_loop import FitLoop
from labdist.training.trainer.steps import TrainStep, forward_step
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
    """A stack of layers (`ld.layers.Dense`, `ld.layers.Conv2D`, ...: any `ld.layers.Layer`)."""

    def __init__(self, layers: Sequence[Any] = (), name: str = "sequential", seed: int = 0):
        layers = list(layers)
        given_shape = None
        if layers and isinstance(layers[0], layers_mod.Input):  # Keras 3: Input((784,)) first
            given_shape = layers.pop(0).shape
        for layer in layers:
            if not isinstance(layer, layers_mod.Layer):
                raise TypeError(f"layers: {layer!r} is not a labdist layer; allowed: "
                                f"ld.layers.{', ld.layers.'.join(layers_mod.__all__)}"
                                " (ld.Input(shape) first)")
        self.layers = list(layers)
        self.name = name
        self.seed = seed
        self._strategy = context.get_strategy()  # as Keras: the strategy in scope now
        self._weights: list[dict[str, Variable]] = []  # per layer, trainable
        self._states: list[dict[str, Variable]] = []  # per layer, non-trainable (ON_WRITE/NONE)
        self._input_shape: tuple[int, ...] | None = None  # one sample's, once built
        self._output_shape: tuple[int, ...] | None = None
        self._slots: list[dict[str, dict[str, Variable]]] = []
        self._outer: diloco.OuterVariables | None = None  # local SGD / DiLoCo's state, once on
        self._compiled = False
        self._loss = None
        self._optimizer = None
        self._metrics: list = []  # names and ld.metrics objects, as compiled
        self._steps_per_execution = 1
        self._iterations = 0
        self.stop_training = False  # a callback sets it to end `fit` after this epoch (Keras)
        shipping.remember(self)  # a first call inside strategy.run builds this one
        self._deferred: tuple[dict, str] | None = None  # a restore waiting for the build
        if given_shape is None and self.layers:
            given_shape = self.layers[0].input_shape
        if given_shape is not None:
            self.build(given_shape)

    @property
    def built(self) -> bool:
        return self._input_shape is not None

    @property
    def input_shape(self) -> tuple | None:
        """Keras' `(None, ...)`: the batch axis first; None before the model is built."""
        return None if self._input_shape is None else (None, *self._input_shape)

    @property
    def output_shape(self) -> tuple | None:
        return None if self._output_shape is None else (None, *self._output_shape)

    def shapes(self, input_shape: tuple[int, ...]) -> list[tuple[int, ...]]:
        """One sample's shape after each layer, for inputs of `input_shape`; a `ValueError`
        naming the first layer that cannot take what reaches it."""
        out, shape = [], tuple(input_shape)
        for layer in self.layers:
            shape = tuple(layer.output_shape(shape))
            out.append(shape)
        return out

    def build(self, input_shape: int | Sequence[int | None]) -> None:
        """Create the weights (one set of copies per replica) for samples of `input_shape`
        (Keras' `(None, 784)` or `(784,)`; an int means `(n,)`)."""
        shape = fit_checks.sample_shape(input_shape)
        outputs = self.shapes(shape)  # every layer takes what reaches it: checked first
        rng = np.random.default_rng(self.seed)
        weights, states = [], []
        with self._strategy.scope():
            for i, (layer, into) in enumerate(zip(self.layers, [shape, *outputs[:-1]],
                                                  strict=True)):
                prefix = f"{type(layer).__name__.lower()}_{i}"
                weights.append({k: Variable(v, name=f"{prefix}/{k}", aggregation="MEAN")
                                for k, v in layer.build(into, rng).items()})
                # TensorFlow's modes for a layer's own state: each replica updates its copy
                states.append({k: Variable(v, name=f"{prefix}/{k}", trainable=False,
                                           synchronization="ON_WRITE", aggregation="NONE")
                               for k, v in layer.build_state(into).items()})
        self._weights, self._states = weights, states
        self._input_shape, self._output_shape = shape, outputs[-1] if outputs else shape
        if self._deferred is not None:  # a checkpoint restored before the model was built
            values, where = self._deferred
            self._deferred = None
            object_checkpoint.assign_deferred(values, self.checkpoint_variables(), where)

    checkpoint_needs_build = True  # saving a model not built yet is an error

    def checkpoint_variables(self) -> dict[str, Variable]:
        """What a checkpoint stores of this model: its weights (and layer state) as
        "weight/<name>"; none before build."""
        return {f"weight/{v.name}": v for v in self.weights}

    def defer_restore(self, values: dict, where: str) -> None:
        """A checkpoint's weights for a model not built yet (TF's deferred restoration):
        assigned when `build` makes the weights, keyed as `checkpoint_variables`; empty:
        nothing pending."""
        self._deferred = (dict(values), where) if values else None

    def build_record(self) -> tuple:
        """What a replica's copy needs to take over this model's build (`adopt_build`)."""
        return self._weights, self._states, self._input_shape, self._output_shape

    def adopt_build(self, weights, states, input_shape, output_shape) -> None:
        """On a replica's copy: the variables the driver made when a step's first call built
        the model (model_call.py)."""
        self._weights, self._states = weights, states
        self._input_shape, self._output_shape = input_shape, output_shape

    @property
    def strategy(self):
        """The strategy in scope when the model was made: its weights' copies live there."""
        return self._strategy

    def weight_dicts(self) -> list[dict[str, Variable]]:
        """Per layer, {parameter name: its trainable variable}."""
        return self._weights

    def state_dicts(self) -> list[dict[str, Variable]]:
        """Per layer, {name: its non-trainable state variable} (batch norm's statistics)."""
        return self._states or [{} for _ in self._weights]

    def __call__(self, x: Any, training: bool = False) -> Any:
        """Keras' call: the model's output on the batch `x`; inside `strategy.run`, on this
        replica's copies; recorded on an open `ld.GradientTape` (model_call.py)."""
        return model_call.call(self, x, training)

    @property
    def losses(self) -> list:
        """Keras' `model.losses`: each weight penalty (`kernel_regularizer=` ...) at the
        weights' current values, recorded on an open tape; empty without regularizers."""
        out = []
        for layer, w in zip(self.layers, self._weights, strict=False):
            for k, penalty in layer.regularizers().items():
                out.append(penalty(w[k].read_value()))
        return out

    def compile(self, loss: Any = "mse", optimizer: Any = "sgd", metrics: Sequence[str] = (),
                steps_per_execution: int = 1) -> None:
        loss = losses.get(loss)
        optimizer = optimizers.get(optimizer)
        names = metric_lib.check(metrics)  # resolved against y in fit
        checks.integer("steps_per_execution", steps_per_execution, 1)
        self._loss, self._optimizer = loss, optimizer  # all checked: now change the model
        self._metrics = names
        self._steps_per_execution = int(steps_per_execution)
        self._compiled = True
        self._slots = []

    def _check_compiled(self) -> None:
        if not self._compiled:
            raise RuntimeError("call model.compile(loss=..., optimizer=...) before fit/evaluate")

    def _ensure_ready(self, x: np.ndarray) -> None:
        self._check_compiled()
        if not self.built:
            self.build(x.shape[1:])
        self._ensure_slots()
        self._ensure_outer()

    def _ensure_outer(self) -> None:
        """Local SGD / DiLoCo's anchors and outer-optimizer slots, once the strategy has
        local_steps set (kept after it is turned off: checkpoints and a round still open)."""
        if self._strategy.local_steps is None:
            return
        with self._strategy.scope():
            if self._outer is None:
                self._outer = diloco.OuterVariables(self.trainable_weights,
                                                    self._strategy.outer_optimizer)
            else:
                self._outer.ensure_slots(self._strategy.outer_optimizer)

    def _ensure_slots(self) -> None:
        """Make fit's optimizer state, which is the optimizer's (as in Keras: one state for
        `fit`, a custom loop's `apply_gradients`, `optimizer.variables` and checkpoints):
        registered by variable id as `optimizer.build` keys it, and taken from there where
        the optimizer already made it (a custom loop ran first)."""
        if self._slots:
            return
        with self._strategy.scope():  # optimizer state: each replica keeps its own
            self._slots = [{k: self._slots_of(v) for k, v in w.items()}
                           for w in self._weights]
        for w, slots in zip(self._weights, self._slots, strict=True):
            for k, v in w.items():
                self._optimizer.slot_variables[v.id] = slots[k]
        if self._optimizer._deferred is not None:  # an object checkpoint restored before
            self._count_in_optimizer()  # the step count it restores too
            restored = self._optimizer.restore_deferred(wait=False)
            if restored and "iterations" in restored:
                self._iterations = int(restored["iterations"])

    def _slots_of(self, v: Variable) -> dict[str, Variable]:
        """The optimizer's slots of weight `v`: those it has (same slots, shapes and
        strategy), else new ones."""
        wanted = self._optimizer.slots(np.zeros(v.shape, v.dtype))
        have = self._optimizer.slot_variables.get(v.id)
        if have is not None and set(have) == set(wanted) and all(
                s.shape == v.shape and s.strategy_id == self._strategy.id
                for s in have.values()):
            return have
        return {s: Variable(a, synchronization="NONE", trainable=False, name=f"{v.name}/{s}")
                for s, a in wanted.items()}

    # -- training -----------------------------------------------------------------------------
    def fit(self, x, y=None, batch_size: int = 32, epochs: int = 1, verbose: Any = "auto",
            callbacks: Sequence[Any] | None = (), validation_data: Any = None,
            shuffle: bool = True, initial_epoch: int = 0, sample_weight: Any = None,
            class_weight: dict | None = None, steps_per_epoch: int | None = None
            ) -> History:
        """Keras' fit, on arrays (x, y) or on an `ld.data.Dataset` of (x, y) batches: its
        batches are taken from one pass (their size is the global batch size), and a
        pipeline with a shuffle step is reshuffled every epoch (a full shuffle).
        `steps_per_epoch`: an epoch takes that many batches, carrying on through the pass
        where the last epoch stopped; an epoch that reaches the pass's end stops there (short),
        and the next starts a new pass, as Keras 3 does. A dataset that repeats forever needs
        it (its batches are then read in order, epoch after epoch).
        `sample_weight` / `class_weight` weigh each sample's loss as Keras 3 does (the sum of
        weighted losses over the batch size); compiled metrics stay unweighted, as Keras'
        `metrics=` are."""
        # everything checked before anything changes (fit_checks.py)
        self._check_compiled()
        steps_per_epoch = fit_checks.fit_arguments(self, epochs, shuffle, initial_epoch,
                                                   steps_per_epoch)
        if isinstance(x, Dataset):
            # a stream (repeated forever) comes in the order it was drawn: no pass to reshuffle
            shuffle = x.shuffled and x.finite
            x = fit_checks.stream(x, steps_per_epoch, epochs, initial_epoch)
            x, y, batch_size = fit_checks.from_dataset(x, y, "fit")
        if isinstance(validation_data, Dataset):
            validation_data = fit_checks.from_dataset(validation_data, None,
                                                      "validation_data")[:2]
        x, y = fit_checks.arrays(x, y)
        fit_checks.check_data(self, x, y)
        weights = fit_checks.sample_weights(y, sample_weight, class_weight)
        callbacks = fit_checks.callbacks(callbacks)
        validation_data = fit_checks.validation(self, validation_data)
        verbose = check_verbose(verbose)
        batch_size = _positive_int("batch_size", batch_size)
        history = History()
        self.stop_training = False
        self._strategy.refresh()  # multi-worker: train on the workers present now
        for cb in callbacks:
            _call(cb, "set_model", self)
            _call(cb, "on_train_begin")
        self._ensure_ready(x)
        resume = [_call(cb, "resume_epoch") for cb in callbacks]  # e.g. BackupAndRestore
        start = max([initial_epoch, *(e for e in resume if e is not None)])
        self._take_count_from_optimizer()
        steps_before = self._iterations
        stop_listening = self._strategy.add_membership_listener(  # quorum training's changes
            lambda change: [_call(cb, "on_membership_change", change) for cb in callbacks])
        try:
            # the driver's part of every step, fit's bookkeeping and callbacks included, is
            # recorded as `driver` spans between the requests it sends (labdist/timing/phases.py)
            # weights ride with the targets, one more column (fit_checks.with_weights)
            targets = None if weights is None else (y.shape[1:], y.dtype)
            carried = y if weights is None else fit_checks.with_weights(y, weights)
            with phases.driving(), placed_arrays(self._strategy, x, carried) as data:
                batches = Batches(data, batch_size, shuffle=shuffle, seed=self.seed)
                with FitLoop(self, self._strategy, callbacks, data, batches,
                             steps_per_epoch) as loop:
                    history = self._epochs(start, epochs, loop, y, batch_size, verbose,
                                           callbacks, validation_data, history, targets)
            if self._outer is not None:  # one model to evaluate, save and read: close a round
                slots = [d for layer in self._slots for d in layer.values()]
                self._strategy.run(diloco.finish_round,
                                   args=(self._outer, self.trainable_weights, slots))
            self._count_in_optimizer()
            return history
        except BaseException as error:  # say how far it got: which updates the weights hold
            error.add_note(f"model.fit: {self._iterations - steps_before} optimizer step(s) "
                           f"of this call (epochs {start}..{epochs - 1}) completed before "
                           "this error; the weights hold their updates")
            raise
        finally:
            stop_listening()

    def _take_count_from_optimizer(self) -> None:
        """Keras has one step counter, `optimizer.iterations`: steps a custom loop's
        `apply_gradients` took count for `fit` too (Adam's bias correction reads it)."""
        counter = self._optimizer.iterations
        if counter is None or counter.strategy_id != self._strategy.id:
            return
        if self._strategy.fault_tolerance == "quorum":
            # a replica lost since the last call is found by the first step's transaction;
            # a read now would ask the lost worker. fit's own count goes on (it wrote the
            # counter last, unless a custom loop stepped since: then those steps are missed)
            return
        self._iterations = int(counter.numpy())

    def _count_in_optimizer(self) -> None:
        """Keras' `model.optimizer.iterations` after `fit`: the optimizer steps the model has
        taken, as an `ONLY_FIRST_REPLICA` int64 variable (the one a custom loop's
        `optimizer.build` makes, where it made one)."""
        counter = self._optimizer.iterations
        with self._strategy.scope():
            if counter is None:
                self._optimizer.iterations = Variable(
                    np.asarray(self._iterations, np.int64), trainable=False,
                    aggregation="ONLY_FIRST_REPLICA", name="iterations")
            elif counter.strategy_id == self._strategy.id:
                counter.assign(np.asarray(self._iterations, np.int64))

    def _epochs(self, start, epochs, loop, y, batch_size, verbose, callbacks,
                validation_data, history, targets=None) -> History:
        """Each epoch: its groups of steps (fit_loop.py decides who loops over them), then
        validation, the epoch's callbacks and History."""
        logs: dict[str, float] = {}
        for epoch in range(start, epochs):
            for cb in callbacks:
                _call(cb, "on_epoch_begin", epoch)
            bar = ProgressBar(f"Epoch {epoch + 1}/{epochs}", loop.next_epoch_steps(), verbose)
            totals = loop.epoch(self._train_step(y, targets), bar)
            loss_sum, sums, seen = totals.loss, totals.sums, totals.seen
            logs = self._running_logs(loss_sum, sums, seen)
            self._leave_in_metric_objects(sums, seen)
            if validation_data is not None:
                val = self.evaluate(*validation_data, batch_size=batch_size, verbose=0,
                                    return_dict=True)
                logs.update({f"val_{k}": v for k, v in val.items()})
            bar.finish(logs)
            for cb in callbacks:
                _call(cb, "on_epoch_end", epoch, logs)
            history._record(epoch, logs)  # last, as Keras' History: sees what callbacks logged
            if self.stop_training:  # e.g. EarlyStopping
                break
        for cb in callbacks:
            _call(cb, "on_train_end", logs)
        return history

    def _running_logs(self, loss_sum: float, sums: np.ndarray, seen: float) -> dict[str, float]:
        """Keras' logs: the mean loss, then each compiled metric's mean, by the name given."""
        logs = {"loss": float(loss_sum) / seen}
        for spec, total in zip(self._metrics, sums, strict=True):
            logs[metric_lib.name_of(spec)] = float(total) / seen
        return logs

    def _leave_in_metric_objects(self, sums: np.ndarray, seen: float) -> None:
        """A compiled metric object holds the figure of the epoch (or evaluation) just done,
        as in Keras: `metric.result()` after `fit` is the last epoch's logged value."""
        for spec, total in zip(self._metrics, sums, strict=True):
            if isinstance(spec, metric_lib.Metric):
                spec.set_totals(float(total), float(seen))

    def _resolved_metrics(self, y: np.ndarray) -> tuple:
        return metric_lib.resolve(self._metrics, y.shape, self._output_shape[-1])

    def _train_step(self, y: np.ndarray, targets: tuple | None = None) -> TrainStep:
        """What the strategy runs for each step of `fit` (the strategy <-> training seam);
        `targets`: the targets' sample shape and dtype where they carry sample weights."""
        self._ensure_outer()  # local SGD may have been turned on since fit began (a callback)
        return TrainStep(self.layers, self._weights, self._slots, self._loss, self._optimizer,
                         self.seed, self._resolved_metrics(y), self._outer, self._states,
                         targets)

    # -- inference ----------------------------------------------------------------------------
    def evaluate(self, x, y=None, batch_size: int = 32, verbose: Any = "auto",
                 return_dict: bool = False):
        self._check_compiled()
        if isinstance(x, Dataset):
            x, y, batch_size = fit_checks.from_dataset(x, y, "evaluate")
        x, y = fit_checks.arrays(x, y, "evaluate")
        fit_checks.check_data(self, x, y, "evaluate")
        verbose = check_verbose(verbose)
        self._ensure_ready(x)
        loss_sum, sums, seen = 0.0, np.zeros(len(self._metrics)), 0.0
        batches = Batches((x, y), _positive_int("batch_size", batch_size))
        bar = ProgressBar("Evaluate", len(batches), verbose)
        resolved = self._resolved_metrics(y)
        for done, (bx, by) in enumerate(batches, start=1):
            for r_loss, r_sums in self._run_forward(bx, by, resolved):
                loss_sum, sums = loss_sum + r_loss, sums + r_sums
            seen += len(bx)
            bar.update(done, self._running_logs(loss_sum, sums, seen))
        logs = self._running_logs(loss_sum, sums, len(x))
        self._leave_in_metric_objects(sums, len(x))
        bar.finish(logs)
        if return_dict:
            return logs
        return list(logs.values()) if len(logs) > 1 else logs["loss"]

    def predict(self, x, batch_size: int = 32, verbose: Any = "auto") -> np.ndarray:
        if isinstance(x, Dataset):
            x, _, batch_size = fit_checks.from_dataset(x, None, "predict", targets=False)
        x = fit_checks.inputs(self, x, "predict")
        verbose = check_verbose(verbose)
        if not self.built:
            self.build(x.shape[1:])
        batches = Batches(x, _positive_int("batch_size", batch_size))
        bar = ProgressBar("Predict", len(batches), verbose)
        outs = []
        for done, bx in enumerate(batches, start=1):
            outs.append(np.concatenate(self._run_forward(bx, None)))
            bar.update(done, {})
        bar.finish({})
        return np.concatenate(outs)

    def _run_forward(self, bx, by, metrics: tuple = ()) -> list:
        n = self._strategy.num_replicas_in_sync
        xs = shard(bx, n)
        ys = None if by is None else shard(by, n)
        out = self._strategy.run(forward_step, args=(
            self.layers, self._weights, _per_replica(xs),
            None if ys is None else _per_replica(ys), self._loss, metrics, self._states))
        return list(self._strategy.experimental_local_results(out))

    @property
    def optimizer(self):
        """The optimizer `compile` set (None before): callbacks change its `learning_rate`
        between epochs; each step ships it to the replicas, so the change reaches them."""
        return self._optimizer

    # -- weights ------------------------------------------------------------------------------
    @property
    def weights(self) -> list[Variable]:
        """The model's distributed variables (Keras' `model.weights`), layer by layer: the
        trainable ones, then the layer's state (batch norm's moving statistics). Pass one to
        `strategy.experimental_local_results` to see every replica's copy."""
        states = self._states or [{}] * len(self._weights)
        return [v for w, st in zip(self._weights, states, strict=True)
                for v in [*w.values(), *st.values()]]

    @property
    def trainable_weights(self) -> list[Variable]:
        return [v for w in self._weights for v in w.values()]

    trainable_variables = trainable_weights  # TensorFlow's names for the same lists
    variables = weights

    @property
    def non_trainable_weights(self) -> list[Variable]:
        return [v for st in self._states for v in st.values()]

    non_trainable_variables = non_trainable_weights

    def get_weights(self) -> list[np.ndarray]:
        """Every weight as a host array; of a state each replica keeps (ON_WRITE / NONE),
        replica 0's copy, as TensorFlow reads it."""
        return [v.numpy() for v in self.weights]

    def set_weights(self, weights: Sequence[np.ndarray]) -> None:
        variables = self.weights
        if len(weights) != len(variables):
            raise ValueError(f"set_weights: got {len(weights)} arrays, the model has "
                             f"{len(variables)} weights")
        for v, w in zip(variables, weights, strict=True):
            v.check_assignable(w, "set_weights")
        with self._strategy.scope():
            for v, w in zip(variables, weights, strict=True):
                v.assign(np.asarray(w))

    def save(self, path: str | os.PathLike) -> str:
        """Architecture (`config.json`) and weights (`weights.npz`) in the directory `path`,
        no pickle; `ld.models.load_model(path)` makes the model again."""
        return saving.save_model(self, path)

    def save_weights(self, path: str | os.PathLike) -> str:
        """The weights alone, as an `.npz` file (`load_weights` reads it back)."""
        return saving.save_weights(self, path)

    def load_weights(self, path: str | os.PathLike) -> None:
        """Assign the weights `save_weights` wrote, checked first: all or nothing."""
        saving.load_weights(self, path)

    def summary(self) -> None:
        lines = [f'Model: "{self.name}"', f"{'Layer':<56}{'Output Shape':<20}{'Params':>10}"]
        total = 0
        shapes = self.shapes(self._input_shape) if self.built else [None] * len(self.layers)
        for layer, w, shape in zip(self.layers, self._weights or [{}] * len(self.layers),
                                   shapes, strict=True):
            count = sum(int(np.prod(v.shape)) for v in w.values())
            total += count
            shown = "?" if shape is None else str((None, *shape))
            lines.append(f"{layer!r:<56}{shown:<20}{count:>10}")
        lines.append(f"Total params: {total}")
        print("\n".join(lines))


def load_model(path: str | os.PathLike, compile: bool = True) -> Sequential:
    """The model `model.save(path)` wrote, under the strategy in scope now (Keras' rule),
    compiled as it was unless `compile=False`. Layer types come from a fixed table: an
    unknown one is refused (`CheckpointError`), never imported."""
    saved = saving.read_saved(path)
    model = Sequential(saved["layers"], name=saved["name"], seed=saved["seed"])
    if saved["input_shape"] is not None and not model.built:
        model.build(saved["input_shape"])
    if model.built:
        model.load_weights(saved["weights"])
    if compile and saved["compile"] is not None:
        model.compile(**saved["compile"])
    return model


# -- helpers ----------------------------------------------------------------------------------
def _per_replica(values: list) -> Any:
    return values[0] if len(values) == 1 else PerReplica(values)


def _positive_int(name: str, value) -> int:
    return checks.integer(name, value, 1)


def _call(callback, hook: str, *args) -> Any:
    """Keras callbacks implement the hooks they need: a missing one is skipped."""
    method = getattr(callback, hook, None)
    return method(*args) if method is not None else None
