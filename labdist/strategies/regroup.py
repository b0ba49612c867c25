"""Per-replica values in and out of `strategy.run`: each replica's part of the arguments
(`select`), and one value per replica back as one structure with a PerReplica at each leaf
(`regroup`: TF's regroup, with its rules for None, variables and constants)."""

from __future__ import annotations

from typing import Any

import numpy as np

from labdist import nest
from labdist.values import PerReplica
from labdist.variables import Variable

PY_SCALARS = (bool, int, float, complex)


def select(tree: Any, rank: int, what: str, num_replicas: int, strategy_id: str, *,
           arrays: bool = True) -> Any:
    """Replica `rank`'s view of `tree`: each PerReplica leaf its component; a variable of
    another strategy refused. `arrays`: a Python number component as a 0-d array, for a
    step's arguments (a per-replica number is distributed, not the same constant on every
    replica, when a variable write reduces it); False keeps it a Python object, as TF's
    `experimental_local_results` does."""

    def pick(x):
        if isinstance(x, PerReplica):
            if len(x) != num_replicas:
                raise ValueError(
                    f"{what}: a PerReplica value has {len(x)} components but this strategy "
                    f"has {num_replicas} replicas (was it made by another strategy?)"
                )
            x = x.values[rank]
            if arrays and isinstance(x, PY_SCALARS):
                x = np.asarray(x)
        elif isinstance(x, Variable) and x.strategy_id != strategy_id:
            raise ValueError(
                f"{what}: Variable {x.name!r} belongs to another strategy; create it "
                "under this strategy's scope()")
        return x

    return nest.map_structure(pick, tree)


def select_all(tree: Any, what: str, num_replicas: int, strategy_id: str) -> list[Any]:
    """`select` for every rank, flattening `tree` once: where no leaf is a PerReplica, every
    rank of a group of several (whose arguments are pickled, one copy each) gets `tree`
    itself (checked once), not a rebuilt structure per replica."""
    leaves, _ = nest.flatten(tree)
    if num_replicas > 1 and not any(isinstance(x, PerReplica) for x in leaves):
        select(leaves, 0, what, num_replicas, strategy_id)  # variables of another strategy
        return [tree] * num_replicas
    return [select(tree, r, what, num_replicas, strategy_id) for r in range(num_replicas)]


def regroup(per_rank: list[Any], what: str, constants: bool = False,
            results: bool = False) -> Any:
    """One value per replica as one structure with a PerReplica at each leaf; one replica's
    value as it is (TF 2.21's run and all_gather give the plain value with one replica, under
    MirroredStrategy too). `results`: `run`'s results, where a leaf that is None everywhere
    stays None. `constants`: the same Python number on every replica stays a number
    (merge_call's arguments)."""
    if len(per_rank) == 1:
        return per_rank[0]
    return regroup_leaves(per_rank, what, constants, results)


def regroup_leaves(per_rank: list[Any], what: str, constants: bool = False,
                   results: bool = False) -> Any:
    """`regroup` without its one-replica shortcut: a PerReplica at each leaf, even of one."""
    flat = [nest.flatten(v) for v in per_rank]
    treedef = flat[0][1]
    if any(t != treedef for _, t in flat):
        raise ValueError(
            f"{what} have different structures on different replicas: "
            + "; ".join(f"replica {r}: {nest.describe(t)}" for r, (_, t) in enumerate(flat))
        )
    leaves = []
    for i in range(len(flat[0][0])):
        parts = [f[0][i] for f in flat]
        if results and all(p is None for p in parts):
            leaves.append(None)
        elif isinstance(parts[0], Variable) and all(
                isinstance(p, Variable) and p.id == parts[0].id for p in parts):
            leaves.append(parts[0])
        elif constants and isinstance(parts[0], PY_SCALARS) and all(
                type(p) is type(parts[0]) and p == parts[0] for p in parts):
            leaves.append(parts[0])  # the same constant everywhere: non-distributed
        else:
            leaves.append(PerReplica(parts))
    return nest.unflatten(treedef, leaves)
