"""TensorFlow's `Checkpoint(model=..., optimizer=..., step=...)`: any set of labdist objects.

Each keyword names an object; its variables are stored under that name in one `.npz` (no
pickle): a model's weights (`model/<weight name>`), an optimizer's step count and slots
(`optimizer/iterations`, `optimizer/<slot name>`), a bare variable (`step`). A variable is
stored as its cross-replica value, so it restores under any replica count: an `ON_READ`/`SUM`
variable's copies summed to 28 and restored on 3 replicas hold 9.33 each and read 28 (TF's
rule). An object with nothing made yet (a model not built, an optimizer not built) takes its
values when it makes its variables, as TensorFlow's deferred restoration does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from labdist import context
from labdist.enums import VariableSynchronization as Sync
from labdist.training.checkpoint_files import CheckpointError, read_arrays, read_headers
from labdist.training.restore import CASTING, assign_all, check_arrays, check_meta
from labdist.variables import Variable

FORMAT = 1
META = ("meta/format", "meta/save_counter")


@runtime_checkable
class Checkpointable(Protocol):
    """What a checkpoint needs of an object with variables (`ld.Sequential`, the optimizers):
    its variables by name (empty before it made any), and where to leave values for them."""

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
            raise TypeError(f"Checkpoint({name}={obj!r}): a checkpoint holds labdist models "
                            "(ld.Sequential), optimizers (ld.optimizers.*) and ld.Variables")


def variables(objects: dict[str, Any], deferred: set[str] | None = None) -> dict[str, Variable]:
    """Every variable the objects hold now, by its key in the file. An object with nothing
    made yet is listed in `deferred` where given (restore), else refused (save)."""
    out: dict[str, Variable] = {}
    for name, obj in objects.items():
        if isinstance(obj, Variable):
            found = {name: obj}
        else:
            found = {f"{name}/{key}": v for key, v in obj.checkpoint_variables().items()}
        if not found:
            if deferred is None:
                raise RuntimeError(f"Checkpoint: {name}={obj!r} has made no variables yet, so "
                                   "there is nothing to save (build the model, or run a step)")
            deferred.add(name)
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


def arrays(objects: dict[str, Any], save_counter: int) -> dict[str, np.ndarray]:
    out = {key: value_of(v) for key, v in variables(objects).items()}
    out["meta/format"] = np.asarray(FORMAT, np.int64)
    out["meta/save_counter"] = np.asarray(save_counter, np.int64)
    return out


def restore(objects: dict[str, Any], path: Path) -> int:
    """Check the whole file against the objects, then assign all or nothing; objects with no
    variables yet keep their part for when they make them. Returns the save counter."""
    headers = read_headers(path)
    check_meta(path, headers, META)
    deferred: set[str] = set()
    present = variables(objects, deferred)
    later = {k for k in headers if k.split("/", 1)[0] in deferred}
    check_arrays(path, headers, present, ignore=META + tuple(later))
    stored = read_arrays(path, sorted(headers))
    if int(stored["meta/format"]) != FORMAT:
        raise CheckpointError(f"checkpoint {str(path)!r} has format "
                              f"{int(stored['meta/format'])}; this labdist reads {FORMAT}")
    by_strategy: dict[str, dict[str, Variable]] = {}
    for key, v in present.items():
        by_strategy.setdefault(v.strategy_id, {})[key] = v
    for group in by_strategy.values():
        strategy = context.lookup(next(iter(group.values())).strategy_id)
        assign_all(strategy, path, group, stored, {k: value_of(v) for k, v in group.items()})
    for name in deferred:
        prefix = f"{name}/"
        objects[name].defer_restore(
            {k[len(prefix):]: stored[k] for k in later if k.startswith(prefix)}, str(path))
    return int(stored["meta/save_counter"])


def assign_deferred(pending: dict[str, np.ndarray], found: dict[str, Variable],
                    where: str) -> None:
    """At an object's build: its stored values into the variables it just made (keys as
    stored under the object's name), each checked first; all or nothing."""
    missing = sorted(set(pending) - set(found))
    if missing:
        raise CheckpointError(f"restoring {where}: the checkpoint holds {missing}, which "
                              "this object did not make")
    for key, value in pending.items():
        v = found[key]
        if tuple(value.shape) != tuple(v.shape) or not np.can_cast(value.dtype, v.dtype,
                                                                   CASTING):
            raise CheckpointError(f"restoring {where}: {key} is {value.dtype} of shape "
                                  f"{value.shape}; the variable made is {v.dtype} of shape "
                                  f"{v.shape}")
    strategy = context.lookup(next(iter(found.values())).strategy_id)
    assign_all(strategy, Path(where), {k: found[k] for k in pending}, pending,
               {k: value_of(found[k]) for k in pending})
