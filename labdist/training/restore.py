"""Assigning stored arrays to a model's variables, as checkpoints and saved weights do: the
file's npy headers are checked against every variable before any data is read, then all
variables are assigned or none (a failed assignment rolls back the ones done)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from labdist.training.checkpoint_files import CheckpointError

CASTING = "safe"  # a stored dtype restores into a variable only if no value can change


def roll_back(variables: dict, before: dict, keys: list[str]) -> list[str]:
    """Assign `before` back to `keys`, trying every one; returns those that failed."""
    failed = []
    for key in keys:
        try:
            variables[key].assign(before[key])
        except Exception:
            failed.append(key)
    return failed


def check_meta(path: Path, headers: dict, keys: tuple) -> None:
    """Each of `keys` is in the `.npz` (its `headers`) as an integer scalar."""
    for key in keys:
        if key not in headers:
            raise CheckpointError(f"checkpoint {str(path)!r} has no {key!r}: not a labdist "
                                  "checkpoint, or a damaged one")
        shape, dtype = headers[key]
        if shape != () or dtype.kind not in "iu":
            raise CheckpointError(f"checkpoint {str(path)!r}: {key!r} is {dtype} of shape "
                                  f"{shape}; it must be an integer scalar")


def check_arrays(path: Path, headers: dict, variables: dict, ignore: tuple = (),
                 holder: str = "the model") -> None:
    """The `.npz` at `path` (its `headers`, from `read_headers`) holds exactly `variables`' keys
    (besides `ignore`), each with the variable's shape and a dtype that casts to it safely;
    else `CheckpointError` naming the file and what differs (`holder`: what the variables
    are, for the message). Reads no data."""
    found = {k for k in headers if k not in ignore}
    if found != set(variables):
        missing, extra = sorted(set(variables) - found), sorted(found - set(variables))
        what = "this model" if holder == "the model" else "these objects"
        raise CheckpointError(f"checkpoint {str(path)!r} does not match {what}: "
                              f"missing {missing}, unexpected {extra}")
    for key, v in variables.items():
        shape, dtype = headers[key]
        if shape != tuple(v.shape):
            raise CheckpointError(f"checkpoint {str(path)!r}: {key} has shape {shape}, "
                                  f"{holder} has {tuple(v.shape)}")
        if not np.can_cast(dtype, v.dtype, casting=CASTING):
            raise CheckpointError(
                f"checkpoint {str(path)!r}: {key} is {dtype}, which does not restore into "
                f"{holder}'s {v.dtype} without changing values (allowed: {v.dtype} or a "
                f"dtype numpy casts to it under casting={CASTING!r})")


def assign_all(strategy, path: Path, variables: dict, stored: dict, before: dict) -> None:
    """Assign every variable; if one assignment fails, assign back `before` to those
    already written (and the one that failed) and re-raise.

    Why a rollback can fail: the strategy writes every replica's copy, and a replica
    whose worker is gone cannot be written, neither forward nor back. Then the error
    names the variables the rollback did not reach; `strategy.recover()` (BackupAndRestore
    calls it before restoring) re-forms on the workers present, and a second restore
    makes the model whole."""
    done: list[str] = []
    with strategy.scope():
        try:
            for key, v in variables.items():
                done.append(key)
                v.assign(stored[key].astype(v.dtype, copy=False))
        except BaseException as error:
            failed = roll_back(variables, before, done)
            if failed:
                raise CheckpointError(
                    f"restoring {str(path)!r} failed at {done[-1]} ({error}), and rolling "
                    f"back failed for {failed}: those variables may hold the checkpoint's "
                    "values on some replicas; call strategy.recover() and restore again"
                ) from error
            raise
