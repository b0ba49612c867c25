"""Saving a model without pickle: `model.save(dir)` writes its architecture as JSON
(`config.json`) and its weights as an `.npz` (`weights.npz`); `load_model(dir)` rebuilds it
from a fixed table of layer types (an unknown type is refused, never imported), so a saved
model can be read from anyone. Weights load all-or-nothing through the checkpoint checks."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from labdist import checks
from labdist.training import layers as layers_mod
from labdist.training import losses, metrics, optimizers
from labdist.training.checkpoint_files import (
    CheckpointError,
    atomic_write,
    atomic_write_all,
    read_arrays,
    read_headers,
    writing,
)
from labdist.training.restore import assign_all, check_arrays, check_meta

CONFIG = "config.json"
WEIGHTS = "weights.npz"
FORMAT = 1
_META = ("meta/format",)
_CONFIG_MAX_BYTES = 1 << 20
_OPTIMIZER_ARGS = {
    "SGD": ("learning_rate", "momentum", "nesterov", "weight_decay"),
    "Adagrad": ("learning_rate", "initial_accumulator_value", "epsilon", "weight_decay"),
    "Adam": ("learning_rate", "beta_1", "beta_2", "epsilon", "weight_decay"),
    "RMSprop": ("learning_rate", "rho", "momentum", "epsilon", "centered", "weight_decay")}


# -- weights ----------------------------------------------------------------------------------
def save_weights(model, path: str | os.PathLike) -> str:
    """Write the model's weights to the `.npz` file `path` (atomically); returns the path."""
    path = Path(path)
    if path.suffix != ".npz":
        raise ValueError(f"path={str(path)!r}: weights are saved as .npz; give a path ending "
                         "in .npz")
    arrays = _weight_arrays(model)
    with writing(f"save_weights({str(path)!r})", path):
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda f: np.savez(f, **arrays))
    return str(path)


def _weight_arrays(model) -> dict[str, np.ndarray]:
    arrays = {key: v.numpy() for key, v in _weight_variables(model).items()}
    arrays["meta/format"] = np.asarray(FORMAT, dtype=np.int64)
    return arrays


def load_weights(model, path: str | os.PathLike) -> None:
    """Load an `.npz` of `save_weights` into `model`: names, shapes and dtypes are checked
    against every weight before any changes (`CheckpointError` otherwise, nothing changed)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no weights file at {str(path)!r}")
    variables = _weight_variables(model)
    headers = read_headers(path)
    check_meta(path, headers, _META)
    check_arrays(path, headers, variables, ignore=_META)
    stored = read_arrays(path, sorted(headers))
    if int(stored["meta/format"]) != FORMAT:
        raise CheckpointError(f"weights file {str(path)!r} has format "
                              f"{int(stored['meta/format'])}; this labdist reads {FORMAT}")
    before = {k: v.numpy() for k, v in variables.items()}
    assign_all(model._strategy, path, variables, stored, before)


def _weight_variables(model) -> dict[str, Any]:
    if not model.built:
        raise RuntimeError("the model has no weights yet: give the first layer input_shape=, "
                           "or call model.build(input_shape)")
    return {f"weight/{v.name}": v for v in model.weights}


# -- whole models -----------------------------------------------------------------------------
def save_model(model, path: str | os.PathLike) -> str:
    """Write `config.json` (layers, name, seed, input size, compile settings) and `weights.npz`
    in the directory `path`; returns it. Optimizer state is not saved: resume training from
    `ld.train.Checkpoint` instead."""
    directory = Path(path)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"path={str(directory)!r} is a file; model.save writes a directory")
    config = model_config(model)
    arrays = _weight_arrays(model)
    data = json.dumps(config, indent=2, sort_keys=True).encode()
    with writing(f"model.save({str(directory)!r})", directory):
        directory.mkdir(parents=True, exist_ok=True)
        # both files written before either is renamed into place: all or nothing
        atomic_write_all([(directory / WEIGHTS, lambda f: np.savez(f, **arrays)),
                          (directory / CONFIG, lambda f: f.write(data))])
    return str(directory)


def read_saved(path: str | os.PathLike) -> dict:
    """What `model.save(path)` wrote, checked, with its layers made again: {"name", "seed",
    "input_shape", "layers", "compile": None or {loss, optimizer, metrics,
    steps_per_execution} as `compile` takes them, "weights": the weights file}.
    `ld.models.load_model` builds the model from it."""
    directory = Path(path)
    if not (directory / CONFIG).is_file():
        raise FileNotFoundError(f"no saved model at {str(directory)!r} (no {CONFIG!r}; "
                                "model.save(path) writes one)")
    config = _read_config(directory / CONFIG)
    compiled = None
    if config["compile"] is not None:
        c = config["compile"]
        try:
            loss = losses.get(c["loss"], bool(c["from_logits"]))
            compiled = {"loss": loss, "optimizer": _optimizer(directory, c["optimizer"]),
                        "metrics": [metrics.from_config(m) for m in c["metrics"]],
                        "steps_per_execution": c["steps_per_execution"]}
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, CheckpointError):
                raise
            raise CheckpointError(f"saved model {str(directory)!r}: bad compile settings "
                                  f"{c!r:.200} ({e})") from None
    layers = [_layer(directory, i, c) for i, c in enumerate(config["layers"])]
    shape = config["input_shape"]
    if shape is not None:
        shape = tuple(shape)
        _check_declared_shapes(directory, shape, layers)
    return {"name": config["name"], "seed": config["seed"], "input_shape": shape,
            "layers": layers, "compile": compiled, "weights": directory / WEIGHTS}


def _check_declared_shapes(directory: Path, input_shape: tuple[int, ...], layers: list) -> None:
    """The weights the config declares (layer settings x input shape) are the arrays the
    weights file's headers describe, each within the memory limit: checked before anything is
    built, so a config claiming Dense(units=10**9) allocates nothing."""
    if not (directory / WEIGHTS).is_file():
        raise FileNotFoundError(f"saved model {str(directory)!r} has no {WEIGHTS!r}")
    where = f"saved model {str(directory)!r}"
    if not input_shape or any(type(n) is not int or n < 1 for n in input_shape):
        raise CheckpointError(f"{where}: input_shape={list(input_shape)} is not allowed; use "
                              "positive integers")
    headers = read_headers(directory / WEIGHTS)
    shape = input_shape
    for i, layer in enumerate(layers):
        try:
            declared = {**layer.param_shapes(shape), **layer.state_shapes(shape)}
            shape = layer.output_shape(shape)
        except ValueError as e:
            raise CheckpointError(f"{where}: layer {i} ({layer!r}) cannot take the saved "
                                  f"input: {e}") from None
        for name, param_shape in declared.items():
            key = f"weight/{type(layer).__name__.lower()}_{i}/{name}"
            stored = headers.get(key, (None,))[0]
            if stored != param_shape:
                raise CheckpointError(
                    f"{where}: layer {i} ({layer!r}) declares {key} of shape {param_shape}, "
                    f"but {WEIGHTS} holds {stored if stored else 'no such array'}"
                    "; the config and the weights do not belong together")
            try:
                checks.array_bytes(f"{where}: {key}", param_shape, 4)
            except ValueError as e:
                raise CheckpointError(str(e)) from None


def model_config(model) -> dict:
    """The JSON-able description `load_model` rebuilds the model from."""
    out = []
    for layer in model.layers:
        name = type(layer).__name__
        if _LAYERS.get(name) is not type(layer):
            raise TypeError(f"cannot save layer {layer!r}: allowed {', '.join(_LAYERS)}")
        out.append({"class_name": name, "config": layer.get_config()})
    compiled = None
    if model._compiled:
        opt = model._optimizer
        compiled = {"loss": model._loss.name, "from_logits": bool(model._loss.from_logits),
                    "metrics": [metrics.config_of(m) for m in model._metrics],
                    "steps_per_execution": model._steps_per_execution,
                    "optimizer": {"class_name": type(opt).__name__, "config": {
                        k: getattr(opt, k) for k in _OPTIMIZER_ARGS[type(opt).__name__]}}}
    shape = model.input_shape
    return {"format": FORMAT, "class_name": "Sequential", "name": model.name,
            "seed": model.seed, "input_shape": None if shape is None else list(shape[1:]),
            "layers": out, "compile": compiled}


def _read_config(path: Path) -> dict:
    with open(path, "rb") as f:
        raw = f.read(_CONFIG_MAX_BYTES + 1)
    try:
        config = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"saved model config {str(path)!r} is not JSON ({e})") from None
    if isinstance(config, dict) and "input_dim" in config and "input_shape" not in config:
        dim = config.pop("input_dim")  # written before models took images: one int
        config["input_shape"] = [dim] if type(dim) is int else dim
    ok = (len(raw) <= _CONFIG_MAX_BYTES and isinstance(config, dict)
          and config.get("class_name") == "Sequential" and isinstance(config.get("name"), str)
          and type(config.get("seed")) is int and isinstance(config.get("layers"), list)
          and (config.get("input_shape") is None or isinstance(config.get("input_shape"), list))
          and (config.get("compile") is None or isinstance(config.get("compile"), dict)))
    if not ok:
        raise CheckpointError(f"saved model config {str(path)!r} is not a labdist Sequential "
                              "config (class_name 'Sequential', name, seed, input_shape, "
                              "layers, compile)")
    if config.get("format") != FORMAT:
        raise CheckpointError(f"saved model config {str(path)!r} has format "
                              f"{config.get('format')!r}; this labdist reads {FORMAT}")
    return config


_LAYERS = {cls.__name__: cls for cls in (
    layers_mod.Dense, layers_mod.Dropout, layers_mod.Flatten, layers_mod.Conv2D,
    layers_mod.MaxPooling2D, layers_mod.AveragePooling2D, layers_mod.GlobalAveragePooling1D,
    layers_mod.Embedding, layers_mod.BatchNormalization, layers_mod.Reshape)}


def _layer(directory: Path, index: int, spec: Any):
    where = f"saved model {str(directory)!r}: layer {index}"
    if not isinstance(spec, dict) or not isinstance(spec.get("config"), dict):
        raise CheckpointError(f"{where} is {spec!r:.200}; expected {{class_name, config}}")
    name = spec.get("class_name")
    if name not in _LAYERS:
        raise CheckpointError(f"{where} has class_name={name!r}, which labdist does not know; "
                              f"allowed: {', '.join(_LAYERS)}")
    config = dict(spec["config"])
    for key in ("input_shape", "kernel_size", "strides", "pool_size", "target_shape"):
        if isinstance(config.get(key), list):
            config[key] = tuple(config[key])
    try:
        return _LAYERS[name](**config)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{where} ({name}) has a bad config {spec['config']!r}: {e}"
                              ) from None


def _optimizer(directory: Path, spec: Any):
    name = spec.get("class_name") if isinstance(spec, dict) else None
    if name not in _OPTIMIZER_ARGS or not isinstance(spec.get("config"), dict):
        raise CheckpointError(f"saved model {str(directory)!r}: optimizer {spec!r:.200} is not "
                              f"one labdist knows; allowed: {', '.join(_OPTIMIZER_ARGS)}")
    try:
        return getattr(optimizers, name)(**spec["config"])
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"saved model {str(directory)!r}: optimizer {name} has a bad "
                              f"config {spec['config']!r}: {e}") from None
