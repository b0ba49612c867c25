"""Collective algorithms over a Communicator.

All-reduce is *direct*: every replica sends its (host) arrays to every peer and reduces all of
them in rank order. Every replica therefore computes bit-identical results, which is what keeps
mirrored copies exactly equal. Signatures travel with the data, so replicas that disagree on
what they are doing (kind, structure, shape, dtype) all raise the same error, never hang.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from labdist.errors import CollectiveMismatchError

OPS = ("sum", "mean", "first")


def signature(kind: str, arrays: list[Any]) -> tuple:
    return (kind, tuple((tuple(a.shape), np.dtype(a.dtype).str) for a in arrays))


def check_signatures(sigs: list[tuple], what: str) -> None:
    """Raise on every replica alike if the replicas' collective calls do not match."""
    kinds = [s[0] for s in sigs]
    if len(set(kinds)) > 1:
        listed = "; ".join(f"replica {r}: {k}" for r, k in enumerate(kinds))
        raise CollectiveMismatchError(
            f"replicas took different paths at the same collective: {listed}. "
            "Every replica must make the same collective calls in the same order."
        )
    specs = [s[1] for s in sigs]
    if specs[0] is None or all(s == specs[0] for s in specs):
        return
    if len({len(s) for s in specs}) > 1:
        counts = ", ".join(f"replica {r}: {len(s)}" for r, s in enumerate(specs))
        raise ValueError(f"{what}: replicas passed different numbers of values ({counts})")
    shapes = [[shape for shape, _ in s] for s in specs]
    if any(s != shapes[0] for s in shapes):
        listed = ", ".join(f"replica {r} has {_shapes(s)}" for r, s in enumerate(shapes))
        raise ValueError(f"{what}: shapes differ across replicas: {listed}; they must match")
    dtypes = [[np.dtype(d).name for _, d in s] for s in specs]
    listed = ", ".join(f"replica {r} has {d}" for r, d in enumerate(dtypes))
    raise TypeError(f"{what}: dtypes differ across replicas: {listed}; they must match")


def _shapes(shapes: list[tuple]) -> str:
    return str(shapes[0]) if len(shapes) == 1 else str(shapes)


def combine(op: str, parts: list[np.ndarray]) -> np.ndarray:
    """Reduce host arrays given in rank order; the same order on every replica."""
    if op == "first":
        return parts[0]
    if len(parts) == 1:
        acc = np.array(parts[0], copy=True)
    else:  # np.add of 0-d arrays gives a scalar: make it an array we can add into
        acc = np.asarray(np.add(parts[0], parts[1]))
    for p in parts[2:]:
        np.add(acc, p, out=acc)
    if op == "mean":
        acc = acc / len(parts)
    return acc


def all_reduce(comm, seq: int, kind: str, arrays: list[Any], op: str, backend) -> list[Any]:
    """Reduce each array across replicas with `op` in OPS; returns arrays of `backend`."""
    if op not in OPS:
        raise ValueError(f"op={op!r} is not an all-reduce op; allowed: {', '.join(OPS)}")
    host = [backend.to_host(a) for a in arrays]
    got = comm.exchange(seq, signature(kind, host), host, kind)
    check_signatures([sig for sig, _ in got], kind)
    out = []
    for i in range(len(host)):
        reduced = combine(op, [payload[i] for _, payload in got])
        out.append(backend.to_device(reduced))
    return out


def all_gather(comm, seq: int, kind: str, obj: Any) -> list[Any]:
    """Every replica's small host object, in rank order."""
    got = comm.exchange(seq, (kind, None), obj, kind)
    check_signatures([sig for sig, _ in got], kind)
    return [payload for _, payload in got]
