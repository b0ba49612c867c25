"""Checkpoints: a model's weights, optimizer state and step count in one `.npz` (no pickle),
written atomically (temp file + rename), restorable under any replica count. `restore` checks
the whole file against the model before it changes anything, then assigns all or nothing."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from labdist.training.checkpoint_files import (
    INDEX,
    CheckpointError,
    atomic_write,
    atomic_write_all,
    read_arrays,
    read_headers,
    read_index,
    writing,
)
from labdist.training.restore import CASTING, assign_all, check_arrays, check_meta
from labdist.training.trainer import replica_slots

__all__ = ["CASTING", "FORMAT", "INDEX", "Checkpoint", "CheckpointError", "atomic_write"]

FORMAT = 1
META = ("meta/format", "meta/iterations")  # required, integer scalars


class Checkpoint:
    """`Checkpoint(model=model).save(directory)` / `.restore(directory)`."""

    def __init__(self, model, optimizer=None):
        from labdist.training.model import Sequential

        if not isinstance(model, Sequential):
            raise TypeError(f"model={model!r} is not a labdist model (ld.models.Sequential)")
        if optimizer is not None and optimizer is not model._optimizer:
            raise ValueError("optimizer= must be the optimizer the model was compiled with")
        self.model = model

    def _variables(self) -> dict[str, object]:
        """Every variable a checkpoint holds, by its key in the `.npz`."""
        m = self.model
        if not m.built or not m._compiled:
            raise RuntimeError("checkpoints need a built, compiled model (give the first layer "
                               "input_shape=, and call compile)")
        m._ensure_slots()
        out = {f"weight/{v.name}": v for v in m.weights}
        for layer_slots in m._slots:
            for slots in layer_slots.values():
                out.update({f"slot/{v.name}": v for v in slots.values()})
        m._ensure_outer()
        if m._outer is not None:  # local SGD / DiLoCo: anchors, outer slots, round counter
            out.update(m._outer.variables())
        return out

    def _read(self, variables: dict[str, object]) -> dict[str, np.ndarray]:
        m = self.model
        # every replica holds the same optimizer state: any copy of a slot is the slot
        return {k: (v.numpy() if k.startswith("weight/")
                    else m._strategy.experimental_local_results(v)[0])
                for k, v in variables.items()}

    def _arrays(self) -> dict[str, np.ndarray]:
        variables = self._variables()
        arrays = self._read(variables)
        arrays.update(replica_slots.read(self.model, variables))
        arrays["meta/iterations"] = np.asarray(self.model._iterations, dtype=np.int64)
        arrays["meta/format"] = np.asarray(FORMAT, dtype=np.int64)
        return arrays

    def save(self, directory: str | os.PathLike) -> str:
        """Write `ckpt-<step>.npz` in `directory` and point the index (`checkpoint`) at it;
        returns its path. Touches no other file of the directory."""
        directory = Path(directory)
        name = f"ckpt-{self.model._iterations}.npz"
        arrays = self._arrays()
        with writing(f"Checkpoint.save({str(directory)!r})", directory):
            directory.mkdir(parents=True, exist_ok=True)
            atomic_write_all([(directory / name, lambda f: np.savez(f, **arrays)),
                              (directory / INDEX, lambda f: f.write(name.encode()))])
        return str(directory / name)

    def restore(self, path: str | os.PathLike) -> None:
        """Load a checkpoint file, or the one a directory's index names, into the model.

        Everything is checked before any variable changes: the index names a file inside the
        directory; every array's npy header (read without its data) matches a variable's
        name and shape, with a dtype that casts to the variable's under numpy's "safe" rule;
        no array is missing or extra; `meta/format` is this version and `meta/iterations` a
        count. Any failure raises `CheckpointError` naming the file, and the model is as it
        was. If an assignment still fails (a worker lost mid-restore), the variables already
        assigned are put back to the values read before (see `restore.assign_all` for when
        that cannot reach a replica)."""
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"no checkpoint at {str(path)!r}")
        if path.is_dir():
            path = read_index(path)
        elif not path.is_file():
            raise CheckpointError(f"checkpoint {str(path)!r} is not a regular file")
        variables = self._variables()
        headers = read_headers(path)
        check_meta(path, headers, META)
        extra = replica_slots.check(path, headers, variables)
        check_arrays(path, headers, variables, ignore=META + extra)
        stored = read_arrays(path, sorted(headers))
        iterations = self._check_meta_values(path, stored)
        before = self._read(variables)
        assign_all(self.model._strategy, path, variables, stored, before)
        replica_slots.assign(self.model, variables, stored)
        self.model._iterations = iterations

    def _check_meta_values(self, path: Path, stored: dict) -> int:
        fmt, iterations = int(stored["meta/format"]), int(stored["meta/iterations"])
        if fmt != FORMAT:
            raise CheckpointError(f"checkpoint {str(path)!r} has format {fmt}; this labdist "
                                  f"reads format {FORMAT}")
        if iterations < 0:
            raise CheckpointError(f"checkpoint {str(path)!r}: meta/iterations is {iterations}; "
                                  "it must be >= 0")
        return iterations
