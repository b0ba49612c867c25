"""Checkpoints of local SGD / DiLoCo: each replica's inner optimizer state is its own, so a
checkpoint keeps every replica's copy of the slots (`replica<r>/slot/...` besides replica 0's
`slot/...`) and a restore on the same replica count gives each replica its own again; on
another count, replicas without a stored copy take replica 0's."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from labdist.training.checkpoint_files import CheckpointError
from labdist.training.restore import CASTING
from labdist.values import PerReplica

PATTERN = re.compile(r"replica([1-9][0-9]*)/(slot/.*)")


def read(model, variables: dict) -> dict[str, np.ndarray]:
    """The slots of replicas 1.. (local SGD only: under synchronous training they agree)."""
    if model._outer is None:
        return {}
    out = {}
    for key, v in variables.items():
        if key.startswith("slot/"):
            copies = model._strategy.experimental_local_results(v)
            out.update({f"replica{r}/{key}": c for r, c in enumerate(copies) if r})
    return out


def check(path: Path, headers: dict, variables: dict) -> tuple[str, ...]:
    """The per-replica keys of the file, each checked against its slot variable."""
    keys = []
    for key, (shape, dtype) in headers.items():
        match = PATTERN.fullmatch(key)
        if match is None:
            continue
        v = variables.get(match.group(2))
        if v is None or shape != tuple(v.shape) or not np.can_cast(dtype, v.dtype, CASTING):
            raise CheckpointError(f"checkpoint {str(path)!r}: {key} ({dtype}, {shape}) matches "
                                  "no slot of this model")
        keys.append(key)
    return tuple(keys)


def assign(model, variables: dict, stored: dict) -> None:
    """Give each replica its own stored slots (after every variable took replica 0's)."""
    strategy = model._strategy
    n = strategy.num_replicas_in_sync
    if n == 1 or not any(PATTERN.fullmatch(k) for k in stored):
        return
    for key, v in variables.items():
        if not key.startswith("slot/"):
            continue
        values = [stored.get(f"replica{r}/{key}", stored[key]).astype(v.dtype) if r
                  else stored[key].astype(v.dtype) for r in range(n)]
        strategy.extended.update(v, _assign, args=(PerReplica(values),))


def _assign(variable, value) -> None:
    variable.assign(value)
