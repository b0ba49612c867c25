"""`fit` callbacks, with Keras' names and rules. BackupAndRestore: an interrupted `fit` (a lost
worker, a crash) resumes from the last finished epoch when called again, on the workers present
then. ModelCheckpoint, EarlyStopping and LearningRateScheduler: as in Keras."""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import os
import re
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

from labdist import checks
from labdist.training.callback_base import Callback
from labdist.training.checkpoint import Checkpoint
from labdist.training.checkpoint_files import (
    INDEX,
    CheckpointError,
    atomic_write,
    inside,
    temp_pattern,
)


class BackupAndRestore(Callback):
    """Saves a checkpoint after every epoch in `backup_dir`, keeping the last `max_to_keep`;
    at the start of `fit`, if a backup is there, re-forms the strategy around lost workers and
    resumes after the epoch it recorded. A `fit` that completes removes the backup (as Keras
    does).

    It owns only what it wrote: its `ckpt-<step>.npz` files (listed in its state file before
    each is written), the `checkpoint` index and the `epoch` state file, and their temp files
    (`.<name>.<random>.tmp`, left by a crash; removed when `fit` starts). Other files in
    `backup_dir` are never read, overwritten or removed; the directory itself is removed at
    the end only if this callback made it and nothing else is left in it."""

    STATE = "epoch"
    _CKPT = re.compile(r"ckpt-\d+\.npz")
    _TEMP = temp_pattern("|".join([_CKPT.pattern, re.escape(INDEX), re.escape(STATE)]))

    def __init__(self, backup_dir: str | os.PathLike, max_to_keep: int = 2):
        if not isinstance(backup_dir, str | os.PathLike) or not str(backup_dir):
            raise TypeError(f"backup_dir={backup_dir!r} must be a non-empty path (str or "
                            "os.PathLike)")
        checks.integer("max_to_keep", max_to_keep, 1,
                       meaning="how many of the last checkpoints stay in backup_dir")
        self.backup_dir = Path(backup_dir)
        self.max_to_keep = max_to_keep
        self._state: dict | None = None
        self._resume: int | None = None

    # -- fit hooks --------------------------------------------------------------------------
    def on_train_begin(self, logs=None) -> None:
        model = self.model
        model._strategy.recover()  # a no-op unless a replica was lost
        self._resume = None
        self._state = self._load_state()
        self._remove_temp_files()
        if self._state is None:
            if (self.backup_dir / INDEX).exists():
                raise CheckpointError(
                    f"backup_dir={str(self.backup_dir)!r} holds a {INDEX!r} file that "
                    f"BackupAndRestore did not write (it has no {self.STATE!r} state); move "
                    "it, or choose another backup_dir")
        elif self._state["checkpoint"] is not None:
            path = inside(self.backup_dir, self._state["checkpoint"], self._where)
            Checkpoint(model=model).restore(path)
            self._resume = self._state["epoch"] + 1

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        directory = self.backup_dir
        state = self._state
        if state is None:
            made = not directory.exists()
            directory.mkdir(parents=True, exist_ok=True)
            state = {"epoch": -1, "checkpoint": None, "checkpoints": [], "made_dir": made}
        name = f"ckpt-{self.model._iterations}.npz"
        owned = [n for n in state["checkpoints"] if n != name]
        if name not in state["checkpoints"] and (directory / name).exists():
            raise CheckpointError(f"backup_dir={str(directory)!r} holds {name!r}, which "
                                  "BackupAndRestore did not write; it will not overwrite it")
        self._write_state(state | {"checkpoints": [*owned, name]})  # claimed before written
        Checkpoint(model=self.model).save(directory)
        owned.append(name)
        self._write_state(state | {"epoch": epoch, "checkpoint": name, "checkpoints": owned})
        if len(owned) > self.max_to_keep:  # the oldest go, after the state names the newest
            for old in owned[:-self.max_to_keep]:
                (directory / old).unlink(missing_ok=True)
            self._write_state(self._state | {"checkpoints": owned[-self.max_to_keep:]})

    def on_train_end(self, logs=None) -> None:
        """A completed fit: remove what this callback wrote, and nothing else."""
        state, self._state, self._resume = self._state, None, None
        if state is None:
            return
        for name in [*state["checkpoints"], INDEX]:
            (self.backup_dir / name).unlink(missing_ok=True)
        self._remove_temp_files()
        (self.backup_dir / self.STATE).unlink(missing_ok=True)  # last: it lists the others
        if state["made_dir"]:
            with contextlib.suppress(OSError):  # someone else's files are in it: it stays
                self.backup_dir.rmdir()

    def resume_epoch(self) -> int | None:
        return self._resume

    # -- its files --------------------------------------------------------------------------
    @property
    def _where(self) -> str:
        return f"BackupAndRestore state {str(self.backup_dir / self.STATE)!r}"

    def _write_state(self, state: dict) -> None:
        data = json.dumps(state, sort_keys=True).encode()
        atomic_write(self.backup_dir / self.STATE, lambda f: f.write(data))
        self._state = state

    def _load_state(self) -> dict | None:
        """The state file, checked: names it lists are checkpoint names of this callback's
        pattern (a damaged or hostile state file cannot make it delete other files)."""
        path = self.backup_dir / self.STATE
        if not path.is_file():
            return None
        try:
            raw = json.loads(path.read_bytes()[:1 << 20].decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise CheckpointError(f"{self._where} is not readable ({e})") from None
        if type(raw) is int:  # an older labdist: the epoch alone, the index names the file
            name = (self.backup_dir / INDEX).read_text().strip() if (
                self.backup_dir / INDEX).is_file() else None
            raw = {"epoch": raw, "checkpoint": name, "checkpoints": [name] if name else [],
                   "made_dir": False}
        ok = (isinstance(raw, dict) and type(raw.get("epoch")) is int and raw["epoch"] >= -1
              and isinstance(raw.get("checkpoints"), list)
              and all(isinstance(n, str) and self._CKPT.fullmatch(n)
                      for n in raw["checkpoints"])
              and (raw.get("checkpoint") is None or raw.get("checkpoint") in raw["checkpoints"])
              and type(raw.get("made_dir")) is bool)
        if not ok:
            raise CheckpointError(
                f"{self._where} is damaged, or not BackupAndRestore's (then choose another "
                "backup_dir): expected {epoch: int >= -1, checkpoint: one of checkpoints or "
                f"null, checkpoints: [ckpt-<step>.npz, ...], made_dir: bool}}, got {raw!r:.200}")
        return {k: raw[k] for k in ("epoch", "checkpoint", "checkpoints", "made_dir")}

    def _remove_temp_files(self) -> None:
        if self.backup_dir.is_dir():
            for p in self.backup_dir.iterdir():
                if self._TEMP.fullmatch(p.name) and p.is_file() and not p.is_symlink():
                    p.unlink(missing_ok=True)


# -- Keras' monitoring callbacks ------------------------------------------------------------------
def _monitor_op(monitor: str, mode: str) -> Callable[[float, float], bool]:
    """Keras' rule: "min" / "max", or "auto": max for accuracy-like names, else min."""
    if mode not in ("auto", "min", "max"):
        raise ValueError(f"mode={mode!r} is not allowed; allowed: 'auto', 'min', 'max'")
    if mode == "max" or (mode == "auto" and "acc" in monitor):
        return np.greater
    return np.less


def _check_monitor(monitor) -> str:
    if not isinstance(monitor, str) or not monitor:
        raise TypeError(f"monitor={monitor!r} must be the name of a logged metric, such as "
                        "'val_loss' or 'accuracy'")
    return monitor


class ModelCheckpoint(Callback):
    """Saves the model after each epoch (Keras' `ModelCheckpoint`, `save_freq="epoch"`).

    `filepath` may hold `{epoch}` (counted from 1) and any logged metric, formatted as in
    Keras: `"ckpt/weights-{epoch:02d}-{val_loss:.2f}.npz"`. With `save_weights_only`, writes
    `model.save_weights(path)` (an `.npz`); else `model.save(path)` (a directory). With
    `save_best_only`, saves only when `monitor` improved on the best so far (`mode`: "min",
    "max", or "auto": max for accuracy-like names); `initial_value_threshold` is the best to
    beat at first. `self.best` is the best value seen."""

    def __init__(self, filepath: str | os.PathLike, monitor: str = "val_loss", verbose: int = 0,
                 save_best_only: bool = False, save_weights_only: bool = False,
                 mode: str = "auto", save_freq: str = "epoch",
                 initial_value_threshold: float | None = None):
        if not isinstance(filepath, str | os.PathLike) or not str(filepath):
            raise TypeError(f"filepath={filepath!r} must be a non-empty path (str or "
                            "os.PathLike), optionally with {epoch} / {val_loss:.2f} fields")
        if save_freq != "epoch":
            raise ValueError(f"save_freq={save_freq!r} is not supported; allowed: 'epoch'")
        self.filepath = os.fspath(filepath)
        if save_weights_only and not self.filepath.endswith(".npz"):
            raise ValueError(f"filepath={self.filepath!r}: with save_weights_only=True the "
                             "weights are saved as .npz; give a path ending in .npz")
        self.monitor = _check_monitor(monitor)
        self.verbose = verbose
        self.save_best_only = bool(save_best_only)
        self.save_weights_only = bool(save_weights_only)
        self.save_freq = save_freq
        self.monitor_op = _monitor_op(monitor, mode)
        self.mode = mode
        worst = math.inf if self.monitor_op is np.less else -math.inf
        self.best = worst if initial_value_threshold is None else float(initial_value_threshold)

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        logs = logs or {}
        path = self._path(epoch, logs)
        if self.save_best_only:
            current = logs.get(self.monitor)
            if current is None:
                warnings.warn(f"ModelCheckpoint: can save best model only with "
                              f"{self.monitor!r} available (logged: {sorted(logs)}); "
                              "skipping", RuntimeWarning, stacklevel=2)
                return
            if not self.monitor_op(current, self.best):
                if self.verbose:
                    print(f"\nEpoch {epoch + 1}: {self.monitor} did not improve from "
                          f"{self.best:.5f}")
                return
            if self.verbose:
                print(f"\nEpoch {epoch + 1}: {self.monitor} improved from {self.best:.5f} to "
                      f"{current:.5f}, saving model to {path}")
            self.best = float(current)
        elif self.verbose:
            print(f"\nEpoch {epoch + 1}: saving model to {path}")
        if self.save_weights_only:
            self.model.save_weights(path)
        else:
            self.model.save(path)

    def _path(self, epoch: int, logs: dict) -> str:
        try:
            return self.filepath.format(epoch=epoch + 1, **logs)
        except (KeyError, IndexError, ValueError) as e:
            raise KeyError(f"ModelCheckpoint could not format filepath={self.filepath!r} with "
                           f"epoch and the logged {sorted(logs)}: {e!r}") from None


class EarlyStopping(Callback):
    """Stops `fit` when `monitor` has not improved by more than `min_delta` for `patience`
    epochs (Keras' `EarlyStopping`): sets `model.stop_training`, so `fit` ends after this
    epoch. With `restore_best_weights`, a stopped model gets the weights of its best epoch
    back; `baseline` is a value the monitor must beat; epochs before `start_from_epoch` are
    not watched. `stopped_epoch` (0: it did not stop) and `best_epoch` say what happened."""

    def __init__(self, monitor: str = "val_loss", min_delta: float = 0, patience: int = 0,
                 verbose: int = 0, mode: str = "auto", baseline: float | None = None,
                 restore_best_weights: bool = False, start_from_epoch: int = 0):
        checks.integer("patience", patience, 0,
                       meaning="epochs without improvement before stopping")
        checks.number("min_delta", min_delta)
        self.monitor = _check_monitor(monitor)
        self.monitor_op = _monitor_op(monitor, mode)
        self.mode = mode
        # as Keras: the delta counts toward "better" in the monitor's direction
        self.min_delta = abs(float(min_delta)) * (1 if self.monitor_op is np.greater else -1)
        self.patience = patience
        self.verbose = verbose
        self.baseline = baseline
        self.restore_best_weights = bool(restore_best_weights)
        self.start_from_epoch = start_from_epoch
        self.wait = 0
        self.stopped_epoch = 0
        self.best_epoch = 0
        self.best: float = math.inf if self.monitor_op is np.less else -math.inf
        self.best_weights: list | None = None

    def on_train_begin(self, logs=None) -> None:
        self.wait = 0
        self.stopped_epoch = 0
        self.best_epoch = 0
        self.best = math.inf if self.monitor_op is np.less else -math.inf
        self.best_weights = None

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        logs = logs or {}
        current = logs.get(self.monitor)
        if current is None:
            warnings.warn(f"EarlyStopping conditioned on {self.monitor!r}, which is not logged "
                          f"(logged: {sorted(logs)})", RuntimeWarning, stacklevel=2)
            return
        if epoch < self.start_from_epoch:
            return
        if self.restore_best_weights and self.best_weights is None:
            self.best_weights = self.model.get_weights()  # the first epoch is the best so far
            self.best_epoch = epoch
        self.wait += 1
        if self._is_improvement(current, self.best):
            self.best, self.best_epoch = float(current), epoch
            if self.restore_best_weights:
                self.best_weights = self.model.get_weights()
            if self.baseline is None or self._is_improvement(current, self.baseline):
                self.wait = 0
            return
        if self.wait >= self.patience and epoch > 0:
            self.stopped_epoch = epoch
            self.model.stop_training = True
            if self.restore_best_weights and self.best_weights is not None:
                if self.verbose:
                    print("Restoring model weights from the end of the best epoch: "
                          f"{self.best_epoch + 1}.")
                self.model.set_weights(self.best_weights)

    def on_train_end(self, logs=None) -> None:
        if self.stopped_epoch > 0 and self.verbose:
            print(f"Epoch {self.stopped_epoch + 1}: early stopping")

    def _is_improvement(self, value: float, reference: float) -> bool:
        return bool(self.monitor_op(value - self.min_delta, reference))


class LearningRateScheduler(Callback):
    """Sets the optimizer's learning rate at the start of each epoch to `schedule(epoch, lr)`
    (or `schedule(epoch)`), epochs counted from 0 (Keras' `LearningRateScheduler`). The
    optimizer travels to the replicas with every step, so the new rate is what they use.
    The rate of each epoch is logged as `learning_rate`."""

    def __init__(self, schedule: Callable[..., float], verbose: int = 0):
        if not callable(schedule):
            raise TypeError(f"schedule={schedule!r} must be a function of (epoch, lr) or "
                            "(epoch) returning the learning rate")
        self.schedule = schedule
        self.verbose = verbose
        try:  # Keras tries (epoch, lr), then (epoch): decided once, from the signature
            inspect.signature(schedule).bind(0, 0.1)
            self._takes_lr = True
        except TypeError:
            self._takes_lr = False
        except ValueError:  # no signature (a builtin): Keras' new API
            self._takes_lr = True

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        optimizer = getattr(self.model, "optimizer", None)
        if not hasattr(optimizer, "learning_rate"):
            raise ValueError("LearningRateScheduler: the model's optimizer has no "
                             "learning_rate (compile the model first)")
        lr = float(optimizer.learning_rate)
        new = self.schedule(epoch, lr) if self._takes_lr else self.schedule(epoch)
        if isinstance(new, bool) or not isinstance(new, int | float | np.floating | np.integer) \
                or not math.isfinite(new) or new <= 0:
            raise ValueError(f"LearningRateScheduler: schedule returned {new!r} for epoch "
                             f"{epoch}; it must return a positive finite number")
        optimizer.learning_rate = float(new)
        if self.verbose:
            print(f"\nEpoch {epoch + 1}: LearningRateScheduler setting learning rate to "
                  f"{float(new)}.")

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        if logs is not None:
            logs["learning_rate"] = float(self.model.optimizer.learning_rate)
