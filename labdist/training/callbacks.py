"""`fit` callbacks. BackupAndRestore: an interrupted `fit` (a lost worker, a crash) resumes from
the last finished epoch when called again, on the workers present then."""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

from labdist.training.checkpoint import Checkpoint
from labdist.training.checkpoint_files import (
    INDEX,
    CheckpointError,
    atomic_write,
    inside,
    temp_pattern,
)


class Callback:
    """Base class: override any of the hooks; `self.model` is set by `fit`."""

    model = None

    def set_model(self, model) -> None:
        self.model = model

    def on_train_begin(self, logs=None) -> None:
        pass

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        pass

    def on_train_end(self, logs=None) -> None:
        pass

    def resume_epoch(self) -> int | None:
        """The epoch `fit` should start at (after `on_train_begin`), or None for no say."""
        return None


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
        if isinstance(max_to_keep, bool) or not isinstance(max_to_keep, int) or max_to_keep < 1:
            raise ValueError(f"max_to_keep={max_to_keep!r} must be an integer >= 1 (how many "
                             "of the last checkpoints stay in backup_dir)")
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
