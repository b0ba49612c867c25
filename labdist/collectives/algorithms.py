"""Collective algorithms over a Communicator: its `exchange` (the host transport) for
messages, and its device transport (`device_for`) for device arrays it can reduce.

Small all-reduces are *direct*: every replica sends its (host) arrays to every peer and reduces
all of them in rank order. Large ones reduce-scatter then all-gather: each rank reduces one
segment, in rank order, and hands it to all. Either way every replica ends with bit-identical
results, which is what keeps mirrored copies exactly equal. Signatures travel with the data, so
replicas that disagree on what they are doing (kind, structure, shape, dtype) all raise the
same error, never hang.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from labdist import aggregation
from labdist.aggregation import Aggregation
from labdist.collectives import shared
from labdist.enums import ReduceOp, VariableAggregation
from labdist.errors import CollectiveMismatchError

Op = ReduceOp | VariableAggregation


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


# Below this many bytes one round (everyone sends everything) beats two rounds of halves.
DIRECT_MAX_BYTES = 1 << 20


def all_reduce(comm, seq: int, kind: str, arrays: list[Any], op: Op, backend) -> list[Any]:
    """Reduce each array across replicas as `op` (a mode that combines values) says; returns
    arrays of `backend`."""
    agg = aggregation.of(op)
    if not agg.reduces:
        allowed = ", ".join(name for name, row in aggregation.TABLE.items() if row.reduces)
        raise ValueError(f"op={op!r} is not an all-reduce op; allowed: {allowed}")
    if comm.world == 1 and backend.is_device:  # nothing to combine: stay on the device
        return [backend.xp.asarray(a, dtype=agg.result_dtype(a.dtype)).copy() for a in arrays]
    device = comm.device_for(backend, arrays, agg)
    if device is not None:  # agree first (signatures, and whether every rank's device
        # transport still works: `broken`), then send
        got = comm.exchange(seq, signature(kind, arrays), device.broken, kind)
        check_signatures([s for s, _ in got], kind)
        # a ring all-reduce sends 2 (N-1)/N of the data from each rank
        comm.sent_bytes += 2 * (comm.world - 1) * sum(a.nbytes for a in arrays) // comm.world
        return device.all_reduce(backend.xp, arrays, agg, seq=seq, what=kind,
                                 states=[state for _, state in got])
    host = [backend.to_host(a) for a in arrays]
    sig = signature(kind, host)
    if (comm.world > 1 and not agg.first_only
            and sum(a.nbytes for a in host) >= shared.segment_min_bytes(comm, DIRECT_MAX_BYTES)):
        reduced = _reduce_scatter_all_gather(comm, seq, kind, sig, host, agg)
    else:
        got = comm.exchange(seq, sig, host, kind)
        check_signatures([s for s, _ in got], kind)
        reduced = [agg.combine([payload[i] for _, payload in got]) for i in range(len(host))]
    return [backend.to_device(r) for r in reduced]


def _reduce_scatter_all_gather(comm, seq, kind, sig, host, agg: Aggregation
                               ) -> list[np.ndarray]:
    """Large payloads: rank d reduces segment d of every array (reduce-scatter), then every
    rank gathers all reduced segments. Each rank moves 2 (N-1)/N of the data instead of N-1
    times it, and reduces 1/N of it; every element is still reduced once, in rank order."""
    flats = [np.ascontiguousarray(a).reshape(-1) for a in host]
    results = [np.empty(f.size, dtype=agg.result_dtype(f.dtype)) for f in flats]

    def reduce_into(i, lo, hi, parts):
        agg.combine(parts, out=results[i][lo:hi])  # straight into our segment
    _segmented(comm, seq, kind, sig, flats, results, reduce_into)
    return [r.reshape(a.shape) for r, a in zip(results, host, strict=True)]


def reduce_scatter_apply(comm, seq: int, kind: str, arrays: list[Any], targets: list[Any],
                         apply, backend) -> bool:
    """Sum `arrays` across replicas; `apply(i, lo, hi, summed)` writes the flat segment
    [lo, hi) of `targets[i]` from the summed segment (an optimizer step on those weights).
    `summed` is valid only during that call (it may be a buffer the next call reuses).

    With large host payloads each rank applies only the segment it owns, then gathers the
    others' updated segments of `targets`: every element is reduced and updated once in the
    group, not once per replica (ZeRO-1's partitioned update), and the replicas end
    bit-identical. Returns True in that case (state that `apply` touched outside `targets`,
    like optimizer slots, is then current only in each rank's own segment; see
    `gather_segments`); otherwise everyone all-reduces and applies everything (False).
    """
    flats = [a.reshape(-1) for a in arrays]
    nbytes = sum(a.nbytes for a in arrays)
    if (comm.world == 1 or backend.is_device
            or nbytes < shared.segment_min_bytes(comm, DIRECT_MAX_BYTES)):
        for i, summed in enumerate(all_reduce(comm, seq, kind, flats, ReduceOp.SUM, backend)):
            apply(i, 0, summed.size, summed)
        return False
    outs = [t.reshape(-1) for t in targets]
    add = aggregation.of(ReduceOp.SUM)

    def reduce_into(i, lo, hi, parts):  # summed into a buffer reused by every step
        out = comm.scratch(add.result_dtype(parts[0].dtype), hi - lo)
        apply(i, lo, hi, add.combine(parts, out=out))
    _segmented(comm, seq, kind, signature(kind, arrays), flats, outs, reduce_into)
    return True


def gather_segments(comm, seq: int, kind: str, arrays: list[np.ndarray]) -> None:
    """Copy every other rank's segment of each (flat, host) array into ours, in place: the
    all-gather half of a reduce-scatter, for state each rank updated only in its segment."""
    _gather(comm, seq, kind, [a.reshape(-1) for a in arrays], phase=0)


@functools.lru_cache(maxsize=256)  # a training loop asks for the same few every step
def _bounds(size: int, world: int, owners: int | None = None) -> tuple[int, ...]:
    """Where each rank's segment of `size` elements starts (and the end): integer arithmetic,
    the same on every rank. Ranks from `owners` on (shared.owners) own empty segments."""
    if owners is None or owners >= world:
        return tuple(size * d // world for d in range(world + 1))
    return tuple(size * min(d, owners) // owners for d in range(world + 1))


def _segmented(comm, seq, kind, sig, flats, outs, reduce_into) -> None:
    """Reduce-scatter `flats` (reduce_into fills this rank's segment of each of `outs`), then
    all-gather the segments of `outs`. Where peers read each other's messages in place
    (shared.py), every rank publishes its whole arrays once, the owners read their segment of
    each and publish the sums, and everyone copies those out."""
    me = comm.rank
    if shared.shared_reads(comm, sum(f.nbytes for f in flats)):
        _segmented_shared(comm, seq, kind, sig, flats, outs, reduce_into)
        return
    bounds = [_bounds(f.size, comm.world, shared.owners(comm)) for f in flats]
    outgoing = [[f[b[d]:b[d + 1]] for f, b in zip(flats, bounds, strict=True)]
                for d in range(comm.world)]
    got = comm.exchange(seq, sig, outgoing, kind, phase=0, per_peer=True)
    check_signatures([s for s, _ in got], kind)
    for i, b in enumerate(bounds):
        reduce_into(i, b[me], b[me + 1], [payload[i] for _, payload in got])
    _gather(comm, seq, kind, outs, phase=1)


def _segmented_shared(comm, seq, kind, sig, flats, outs, reduce_into) -> None:
    """Shared memory: all ranks -> owners (whole arrays), owners -> all ranks (their summed
    segments). Owners check the signatures; a mismatch travels to the others in the second
    message (its signature: MISMATCH and every rank's), so every rank raises the same error."""
    me, world = comm.rank, comm.world
    owners = range(shared.owners(comm))
    bounds = [_bounds(f.size, world, len(owners)) for f in flats]
    got = comm.exchange(seq, sig, flats, kind, phase=0, readers=owners)
    if me in owners:
        sigs = [s for s, _ in got]
        try:
            check_signatures(sigs, kind)
        except (CollectiveMismatchError, ValueError, TypeError):
            comm.exchange(seq, (MISMATCH, sigs), [], kind, phase=1, senders=owners)
            raise
        for i, b in enumerate(bounds):
            reduce_into(i, b[me], b[me + 1], [payload[i][b[me]:b[me + 1]]
                                              for _, payload in got])
        mine = [o[b[me]:b[me + 1]] for o, b in zip(outs, bounds, strict=True)]
    else:
        mine = []
    gathered = comm.exchange(seq, None, mine, kind, phase=1, senders=owners)
    for r in owners:
        if gathered[r][0] is not None:  # an owner found the signatures did not match
            check_signatures(gathered[r][0][1], kind)
    for i, (out, b) in enumerate(zip(outs, bounds, strict=True)):
        for r in owners:
            if r != me:
                out[b[r]:b[r + 1]] = gathered[r][1][i]


# The signature of an owner's second message when the first's signatures did not match.
MISMATCH = "signatures differ"


def _gather(comm, seq, kind, outs, phase) -> None:
    me = comm.rank
    owners = shared.owners(comm)
    bounds = [_bounds(o.size, comm.world, owners) for o in outs]
    mine = [o[b[me]:b[me + 1]] for o, b in zip(outs, bounds, strict=True)]
    gathered = comm.exchange(seq, None, mine, kind, phase=phase)
    for i, (out, b) in enumerate(zip(outs, bounds, strict=True)):
        for r in range(min(owners, comm.world)):
            if r != me:
                out[b[r]:b[r + 1]] = gathered[r][1][i]


def all_gather(comm, seq: int, kind: str, obj: Any) -> list[Any]:
    """Every replica's small host object, in rank order."""
    got = comm.exchange(seq, (kind, None), obj, kind)
    check_signatures([sig for sig, _ in got], kind)
    return [payload for _, payload in got]
