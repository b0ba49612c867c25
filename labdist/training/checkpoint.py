"""Checkpoints: a model's weights, optimizer state and step count in one `.npz` (no pickle),
written atomically (temp file + rename), restorable under any replica count. `restore` checks
the whole file against the model before it changes anything, then assigns all or nothing."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from labdist.training import object_checkpoint
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
from labdist.variables import Variable

__all__ = ["CASTING", "FORMAT", "INDEX", "Checkpoint", "CheckpointError", "atomic_write",
           "latest_checkpoint"]

FORMAT = 1
META = ("meta/format", "meta/iterations")  # required, integer scalars


class Checkpoint:
    """`ld.train.Checkpoint(model=model, optimizer=optimizer, step=variable)`: TensorFlow's
    checkpoint of any labdist models, optimizers and variables (object_checkpoint.py).
    `save(prefix)` writes `prefix-1.npz`, `prefix-2.npz`, ... and points the folder's index
    at the newest (`ld.train.latest_checkpoint(folder)`); `write(path)` writes exactly
    `path`; `restore(path)` reads any of them (also named as TF names them, `prefix-1`), or a
    folder's newest. A compiled model alone (with its own optimizer) keeps the model's format
    and folder: `save(folder)` writes its weights, `fit`'s optimizer state and step count as
    `folder/ckpt-<step>.npz`."""

    def __init__(self, root: Any = None, **objects: Any) -> None:
        if root is not None:  # Checkpoint(model): the model's own checkpoint, as before
            objects = {"model" if "model" not in objects else "root": root, **objects}
        object_checkpoint.check_objects(objects)
        self._objects = objects
        self.model = objects.get("model")
        self.save_counter = 0  # saves by this checkpoint (TF's save_counter), restored too

    def _of_a_model(self) -> bool:
        """Whether this is a compiled model's own checkpoint (the model's format)."""
        from labdist.training.model import Sequential

        model, optimizer = self._objects.get("model"), self._objects.get("optimizer")
        return (set(self._objects) <= {"model", "optimizer"} and isinstance(model, Sequential)
                and model._compiled and (optimizer is None or optimizer is model._optimizer))

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
        if not self._of_a_model():
            return object_checkpoint.arrays(self._objects, self.save_counter)
        variables = self._variables()
        arrays = self._read(variables)
        arrays.update(replica_slots.read(self.model, variables))
        arrays["meta/iterations"] = np.asarray(self.model._iterations, dtype=np.int64)
        arrays["meta/format"] = np.asarray(FORMAT, dtype=np.int64)
        return arrays

    def save(self, file_prefix: str | os.PathLike) -> str:
        """A compiled model's own checkpoint: `file_prefix` is a folder (made if missing);
        write `ckpt-<the model's step count>.npz` in it and point its index (`checkpoint`) at
        it. Other checkpoints: an existing folder gets `ckpt-<save count>.npz`; anything else
        is a prefix, as TensorFlow's: write `<prefix>-<save count>.npz` and point the index of
        its folder at it. Returns the path written; touches no other file."""
        path = Path(file_prefix)
        self.save_counter += 1
        if self._of_a_model():  # the model's own: always a folder (made if need be)
            directory, name = path, f"ckpt-{self.model._iterations}.npz"
        elif path.is_dir():
            directory, name = path, f"ckpt-{self.save_counter}.npz"
        else:
            directory, name = path.parent, f"{path.name}-{self.save_counter}.npz"
        try:
            arrays = self._arrays()
            with writing(f"Checkpoint.save({str(path)!r})", directory):
                directory.mkdir(parents=True, exist_ok=True)
                atomic_write_all([(directory / name, lambda f: np.savez(f, **arrays)),
                                  (directory / INDEX, lambda f: f.write(name.encode()))])
        except BaseException:
            self.save_counter -= 1
            raise
        return str(directory / name)

    def write(self, file_path: str | os.PathLike) -> str:
        """Write exactly `file_path` (no index, no numbering), as TensorFlow's `write`."""
        path = Path(file_path)
        arrays = self._arrays()
        with writing(f"Checkpoint.write({str(path)!r})", path.parent):
            atomic_write(path, lambda f: np.savez(f, **arrays))
        return str(path)

    def restore(self, path: str | os.PathLike) -> None:
        """Load a checkpoint file (`path`, or `path.npz` as TF's programs name it), or the one
        a directory's index names, into the objects.

        Everything is checked before any variable changes: the index names a file inside the
        directory; every array's npy header (read without its data) matches a variable's
        name and shape, with a dtype that casts to the variable's under numpy's "safe" rule;
        no array is missing or extra; `meta/format` is this version and `meta/iterations` a
        count. Any failure raises `CheckpointError` naming the file, and the model is as it
        was. If an assignment still fails (a worker lost mid-restore), the variables already
        assigned are put back to the values read before (see `restore.assign_all` for when
        that cannot reach a replica)."""
        path = _existing(Path(path))
        if path.is_dir():
            path = read_index(path)
        elif not path.is_file():
            raise CheckpointError(f"checkpoint {str(path)!r} is not a regular file")
        if not self._of_a_model():
            self.save_counter = object_checkpoint.restore(self._objects, path)
            self._count_from_optimizers()
            return
        variables = self._variables()
        headers = read_headers(path)
        if "meta/save_counter" in headers and "meta/iterations" not in headers:
            raise CheckpointError(
                f"checkpoint {str(path)!r} is an object checkpoint (keys named by keyword: "
                f"{_keywords(headers)}); restore it with a Checkpoint of the same keywords, "
                "e.g. Checkpoint(model=model, optimizer=optimizer)")
        check_meta(path, headers, META)
        extra = replica_slots.check(path, headers, variables)
        check_arrays(path, headers, variables, ignore=META + extra)
        stored = read_arrays(path, sorted(headers))
        iterations = self._check_meta_values(path, stored)
        before = self._read(variables)
        assign_all(self.model._strategy, path, variables, stored, before)
        replica_slots.assign(self.model, variables, stored)
        self.model._iterations = iterations
        counter = self.model._optimizer.iterations  # Keras' optimizer.iterations: the same
        if counter is not None and counter.strategy_id == self.model._strategy.id:
            counter.assign(np.asarray(iterations, np.int64))

    def _count_from_optimizers(self) -> None:
        """After an object restore: a compiled model whose optimizer was restored counts its
        steps from the optimizer's restored `iterations` (fit's step count, as in Keras)."""
        from labdist.training.model import Sequential

        restored = [obj for obj in self._objects.values() if not isinstance(obj, Variable)]
        for model in restored:
            if not (isinstance(model, Sequential) and model._compiled):
                continue
            counter = model._optimizer.iterations
            if counter is not None and any(o is model._optimizer for o in restored):
                model._iterations = int(counter.numpy())

    def _check_meta_values(self, path: Path, stored: dict) -> int:
        fmt, iterations = int(stored["meta/format"]), int(stored["meta/iterations"])
        if fmt != FORMAT:
            raise CheckpointError(f"checkpoint {str(path)!r} has format {fmt}; this labdist "
                                  f"reads format {FORMAT}")
        if iterations < 0:
            raise CheckpointError(f"checkpoint {str(path)!r}: meta/iterations is {iterations}; "
                                  "it must be >= 0")
        return iterations


def _existing(path: Path) -> Path:
    """`path`, or `path.npz` where only that exists: TensorFlow's programs name a checkpoint
    by its prefix (`ckpt-1`), labdist's files end in `.npz`."""
    if not path.exists():
        with_suffix = path.with_name(path.name + ".npz")
        if path.suffix != ".npz" and with_suffix.is_file():
            return with_suffix
        raise FileNotFoundError(f"no checkpoint at {str(path)!r}")
    return path


def _keywords(headers: dict) -> list[str]:
    return sorted({k.split("/", 1)[0] for k in headers if not k.startswith("meta/")})


def latest_checkpoint(checkpoint_dir: str | os.PathLike) -> str | None:
    """The checkpoint the folder's index names (the newest `save` wrote there), or None where
    there is none, as TensorFlow's `tf.train.latest_checkpoint`."""
    directory = Path(checkpoint_dir)
    if not (directory / INDEX).exists():
        return None
    return str(read_index(directory))
