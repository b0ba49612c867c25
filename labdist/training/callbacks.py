"""`fit` callbacks. BackupAndRestore: an interrupted `fit` (a lost worker, a crash) resumes from
the last finished epoch when called again, on the workers present then."""

from __future__ import annotations

import shutil
from pathlib import Path

from labdist.training.checkpoint import Checkpoint, atomic_write


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
    """Saves a checkpoint after every epoch in `backup_dir`; at the start of `fit`, if a
    backup is there, re-forms the strategy around lost workers and resumes after the epoch it
    recorded. A `fit` that completes removes the backup (as Keras does)."""

    def __init__(self, backup_dir: str):
        self.backup_dir = Path(backup_dir)
        self._resume: int | None = None

    def on_train_begin(self, logs=None) -> None:
        model = self.model
        model._strategy.recover()  # a no-op unless a replica was lost
        if (self.backup_dir / "checkpoint").exists():
            Checkpoint(model=model).restore(self.backup_dir)
            self._resume = int((self.backup_dir / "epoch").read_text()) + 1

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        Checkpoint(model=self.model).save(self.backup_dir)
        atomic_write(self.backup_dir / "epoch", lambda f: f.write(str(epoch).encode()))

    def on_train_end(self, logs=None) -> None:
        shutil.rmtree(self.backup_dir, ignore_errors=True)
        self._resume = None

    def resume_epoch(self) -> int | None:
        return self._resume
