"""TensorFlow's `Checkpoint(model=..., optimizer=..., step=...)`: any set of labdist objects.

Each keyword names an object; its variables are stored under that name in one `.npz` (no
pickle): a model's weights (`model/weight/<weight name>`), an optimizer's step count and slots
(`optimizer/iterations`, `optimizer/slot/<variable name>/<slot name>`: matched by the name of
the variable they belong to), a bare variable (`step`). A variable is stored as its
cross-replica value, so it restores under any replica count: an `ON_READ`/`SUM` variable's
copies summed to 28 and restored on 3 replicas hold 9.33 each and read 28 (TF's rule; an
integer one truncates each share, as TF does). An object with nothing made yet (a model or an
optimizer not built) takes its values when it makes its variables, as TensorFlow's deferred
restoration does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from labdist import context
from labdist.enums import VariableSynchronization as Sync
from labdist.training.checkpoint_files import CheckpointError, read_arrays, read_headers
from labdist.training.restore import (
    CASTING,
    assign_all,
    check_arrays,
    check_meta,
    roll_back,
)
from labdist.variables import Variable

FORMAT = 1
META = ("meta/format", "meta/save_counter")
MODEL_FORMAT_KEY = "meta/iterations"  # only a compiled model's own checkpoint has it
ALLOWED = ("labdist models (ld.Sequential), optimizers (ld.optimizers.*) and ld.Variables")


@runtime_checkable
class Checkpointable(Protocol):
    """What a checkpoint needs of an object with variables (`ld.Sequential`, the optimizers):
    its variables by key (empty before it made any), where to leave values for variables it
    has not made yet (empty values: nothing pending), and `checkpoint_needs_build`: whether
    saving it before it made any is an error (a model) or stores nothing (an optimizer)."""

    checkpoint_needs_build: bool

    def checkpoint_variables(self) -> dict[str, Variable]: ...

    def defer_restore(self, values: dict[str, np.ndarray], where: str) -> None: ...


def check_objects(objects: dict[str, Any]) -> None:
    """Every keyword names a model, an optimizer or a variable; else `TypeError` naming it."""
    if not objects:
        raise ValueError("Checkpoint() needs something to save: Checkpoint(model=model, "
                         "optimizer=optimizer, step=variable)")
    for name, obj in objects.items():
        if name == "meta":
            raise ValueError("Checkpoint(meta=...): 'meta' is the name of the file's own "
                             "entries; use another keyword")
        if not isinstance(obj, Checkpointable | Variable):
            raise TypeError(f"Checkpoint({name}={obj!r}): a {type(obj).__name__} cannot be "
                            f"checkpointed; allowed: {ALLOWED}")


def variables(objects: dict[str, Any], deferred: set[str] | None = None) -> dict[str, Variable]:
    """Every variable the objects hold now, by its key in the file. An object with nothing
    made yet is listed in `deferred` where given (restore); at save a model is refused then,
    an optimizer stores nothing."""
    out: dict[str, Variable] = {}
    for name, obj in objects.items():
        if isinstance(obj, Variable):
            found = {name: obj}
        else:
            found = {f"{name}/{key}": v for key, v in obj.checkpoint_variables().items()}
        if not found:
            if deferred is not None:
                deferred.add(name)
            elif obj.checkpoint_needs_build:
                raise RuntimeError(f"Checkpoint: {name}={obj!r} has made no variables yet, so "
                                   "there is nothing to save (build it first: give the first "
                                   "layer input_shape=, call model.build(input_shape), or "
                                   "call it on a batch)")
        for key, v in found.items():
            if key in out and out[key] is not v:
                raise ValueError(f"Checkpoint: two variables would be stored as {key!r}; give "
                                 "them different names")
            out[key] = v
    return out


def value_of(v: Variable) -> np.ndarray:
    """What a checkpoint stores: the cross-replica value; of per-replica state (optimizer
    slots, synchronization NONE), replica 0's copy (every replica applies the same step)."""
    if v.synchronization is Sync.NONE:
        strategy = context.lookup(v.strategy_id)
        return np.asarray(strategy.experimental_local_results(v)[0])
    return v.numpy()


def _values(found: dict[str, Variable]) -> dict[str, np.ndarray]:
    """`value_of` each variable; an error names the key it was for."""
    out = {}
    for key, v in found.items():
        try:
            out[key] = value_of(v)
        except ValueError as error:
            raise ValueError(f"Checkpoint: cannot read {key!r} ({error})") from None
    return out


def arrays(objects: dict[str, Any], save_counter: int) -> dict[str, np.ndarray]:
    """The `.npz` arrays of a save: every object's variables, the format and save count."""
    out = _values(variables(objects))
    out["meta/format"] = np.asarray(FORMAT, np.int64)
    out["meta/save_counter"] = np.asarray(save_counter, np.int64)
    return out


def restore(objects: dict[str, Any], path: Path) -> int:
    """Check the whole file against the objects, then assign all or nothing; objects with no
    variables yet keep their part for when they make them. Returns the save counter."""
    headers = read_headers(path)
    if MODEL_FORMAT_KEY in headers and "meta/save_counter" not in headers:
        raise CheckpointError(
            f"checkpoint {str(path)!r} is a compiled model's own checkpoint (written by "
            "Checkpoint(model=model) of a compiled model: weight/, slot/, meta/iterations); "
            "restore it with Checkpoint(model=m) of a compiled model m")
    check_meta(path, headers, META)
    deferred: set[str] = set()
    present = variables(objects, deferred)
    later = {k for k in headers if k.split("/", 1)[0] in deferred}
    check_arrays(path, headers, present, ignore=META + tuple(later), holder="the variable")
    stored = read_arrays(path, sorted(headers))
    if int(stored["meta/format"]) != FORMAT:
        raise CheckpointError(f"checkpoint {str(path)!r} has format "
                              f"{int(stored['meta/format'])}; this labdist reads {FORMAT}")
    if int(stored["meta/save_counter"]) < 0:
        raise CheckpointError(f"checkpoint {str(path)!r}: meta/save_counter is "
                              f"{int(stored['meta/save_counter'])}; it must be >= 0")
    _assign_by_strategy(path, present, stored)
    for name, obj in objects.items():  # what is pending replaces what was (nothing, if built)
        if not isinstance(obj, Variable):
            prefix = f"{name}/"
            obj.defer_restore({k[len(prefix):]: stored[k] for k in later
                               if k.startswith(prefix)}, str(path))
    return int(stored["meta/save_counter"])


def _assign_by_strategy(path: Path, present: dict[str, Variable], stored: dict) -> None:
    """Assign each strategy's variables under its scope; if a later group fails, the groups
    already assigned are put back too, so the restore is still all or nothing."""
    groups: dict[str, dict[str, Variable]] = {}
    for key, v in present.items():
        groups.setdefault(v.strategy_id, {})[key] = v
    done: list[tuple[dict[str, Variable], dict[str, np.ndarray]]] = []
    for strategy_id, group in groups.items():
        before = _values(group)
        try:
            assign_all(context.lookup(strategy_id), path, group, stored, before)
        except BaseException as error:
            failed = [k for earlier, values in done
                      for k in roll_back(earlier, values, list(earlier))]
            if failed:
                raise CheckpointError(
                    f"restoring {str(path)!r} failed ({error}), and rolling back failed for "
                    f"{failed}: those variables may hold the checkpoint's values; call "
                    "strategy.recover() and restore again") from error
            raise
        done.append((group, before))


def assign_deferred(pending: dict[str, np.ndarray], found: dict[str, Variable],
                    where: str) -> None:
    """At an object's build: its stored values into the variables it just made (keys as
    stored under the object's name). The file and the object must hold the same keys, with
    matching shapes and dtypes, all checked before any is assigned; then all or nothing."""
    missing, unexpected = sorted(set(found) - set(pending)), sorted(set(pending) - set(found))
    if missing or unexpected:
        raise CheckpointError(f"restoring {where}: the variables made do not match the "
                              f"checkpoint: the checkpoint lacks {missing}, and holds "
                              f"{unexpected}, which were not made")
    for key, value in pending.items():
        v = found[key]
        if tuple(value.shape) != tuple(v.shape) or not np.can_cast(value.dtype, v.dtype,
                                                                   CASTING):
            raise CheckpointError(f"restoring {where}: {key} is {value.dtype} of shape "
                                  f"{value.shape} in the checkpoint; the variable made is "
                                  f"{v.dtype} of shape {v.shape}")
    if pending:
        _assign_by_strategy(Path(where), found, pending)
