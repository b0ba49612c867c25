"""Checkpoints: a model's weights, optimizer state and step count in one `.npz` (no pickle),
written atomically (temp file + rename), restorable under any replica count."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

FORMAT = 1
INDEX = "checkpoint"


class Checkpoint:
    """`Checkpoint(model=model).save(directory)` / `.restore(directory)`."""

    def __init__(self, model, optimizer=None):
        from labdist.training.model import Sequential

        if not isinstance(model, Sequential):
            raise TypeError(f"model={model!r} is not a labdist model (ld.models.Sequential)")
        if optimizer is not None and optimizer is not model._optimizer:
            raise ValueError("optimizer= must be the optimizer the model was compiled with")
        self.model = model

    def _arrays(self) -> dict[str, np.ndarray]:
        m = self.model
        if not m.built or not m._compiled:
            raise RuntimeError("checkpoints need a built, compiled model (give the first layer "
                               "input_shape=, and call compile)")
        m._ensure_slots()
        arrays = {f"weight/{v.name}": v.numpy() for w in m._weights for v in w.values()}
        for layer_slots in m._slots:  # every replica holds the same optimizer state
            for slots in layer_slots.values():
                for v in slots.values():
                    arrays[f"slot/{v.name}"] = m._strategy.experimental_local_results(v)[0]
        arrays["meta/iterations"] = np.asarray(m._iterations)
        arrays["meta/format"] = np.asarray(FORMAT)
        return arrays

    def save(self, directory: str | os.PathLike) -> str:
        """Write `ckpt-<step>.npz` in `directory` and point the index at it; returns its path."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        name = f"ckpt-{self.model._iterations}.npz"
        atomic_write(directory / name, lambda f: np.savez(f, **self._arrays()))
        atomic_write(directory / INDEX, lambda f: f.write(name.encode()))
        return str(directory / name)

    def restore(self, path: str | os.PathLike) -> None:
        """Load a checkpoint file, or the latest one of a directory, into the model."""
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"no checkpoint at {str(path)!r}")
        if path.is_dir():
            index = path / INDEX
            if not index.exists():
                raise FileNotFoundError(f"no checkpoint in {str(path)!r} (no {INDEX!r} index)")
            path = path / index.read_text().strip()
        with np.load(path, allow_pickle=False) as data:
            stored = {k: data[k] for k in data.files}
        expected = {k: v for k, v in self._arrays().items() if not k.startswith("meta/")}
        found = {k for k in stored if not k.startswith("meta/")}
        if found != set(expected):
            missing, extra = sorted(set(expected) - found), sorted(found - set(expected))
            raise ValueError(f"checkpoint {str(path)!r} does not match this model: missing "
                             f"{missing}, unexpected {extra}")
        for key, want in expected.items():
            if stored[key].shape != want.shape:
                raise ValueError(f"checkpoint {str(path)!r}: {key} has shape "
                                 f"{stored[key].shape}, the model has {want.shape}")
        m = self.model
        with m._strategy.scope():  # checked everything first: nothing half-restored
            for w in m._weights:
                for v in w.values():
                    v.assign(stored[f"weight/{v.name}"])
            for layer_slots in m._slots:
                for slots in layer_slots.values():
                    for v in slots.values():
                        v.assign(stored[f"slot/{v.name}"])
        m._iterations = int(stored["meta/iterations"])


def atomic_write(target: Path, write) -> None:
    """Write `target` through a temp file and a rename: a crash leaves the old file or the
    new one, never half of one."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
