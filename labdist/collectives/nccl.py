"""NCCL all-reduce between GPU replicas, through `cupy.cuda.nccl`.

Bootstrapped as raft-dask does: rank 0 makes the unique id, the driver hands it to every rank at
once, and each replica's communicator keeps its `NcclChannel`. NCCL itself cannot tell that two
replicas disagree about a collective (it would reduce garbage or hang), so the host communicator
first exchanges the call's signature; only data moves through NCCL.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from labdist.aggregation import Aggregation

# numpy dtype -> the name of NCCL's data type constant in cupy.cuda.nccl
DTYPES = {
    "int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32",
    "uint32": "NCCL_UINT32", "int64": "NCCL_INT64", "uint64": "NCCL_UINT64",
    "float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64",
}


def nccl_module():
    """cupy's NCCL binding, or None where cupy or NCCL is missing."""
    try:
        from cupy.cuda import nccl
    except ImportError:
        return None
    return nccl if getattr(nccl, "available", True) else None


def unique_id() -> tuple | None:
    """A fresh NCCL unique id (made on rank 0), or None without NCCL."""
    nccl = nccl_module()
    return None if nccl is None else nccl.get_unique_id()


def supports(arrays: list[Any], agg: Aggregation) -> bool:
    """Whether NCCL can do this all-reduce as labdist defines it (the host path's result
    dtypes: integer MEANs, float64 there, stay on the host; so do dtypes NCCL lacks)."""
    if not arrays:
        return False
    return all(np.dtype(a.dtype).name in DTYPES and agg.nccl_can(a.dtype) for a in arrays)


class NcclChannel:
    """One rank's NCCL communicator; `all_reduce` runs on the replica's step thread."""

    def __init__(self, world: int, uid: tuple, rank: int):
        self._nccl = nccl_module()
        if self._nccl is None:
            raise RuntimeError("NCCL is not available in this worker (cupy.cuda.nccl)")
        self.world, self.rank = world, rank
        self.comm = self._nccl.NcclCommunicator(world, uid, rank)  # blocks until all join

    def all_reduce(self, xp, arrays: list[Any], agg: Aggregation) -> list[Any]:
        """Reduce `arrays` (cupy, the same specs on every rank) with one NCCL call per dtype."""
        out: list[Any] = [None] * len(arrays)
        by_dtype: dict[str, list[int]] = {}
        for i, a in enumerate(arrays):
            by_dtype.setdefault(np.dtype(a.dtype).name, []).append(i)
        stream = xp.cuda.get_current_stream()
        for name, idx in by_dtype.items():
            flat = xp.concatenate([xp.ravel(arrays[i]) for i in idx])  # a fresh buffer
            dtype = getattr(self._nccl, DTYPES[name])
            if agg.first_only:
                self.comm.bcast(flat.data.ptr, flat.size, dtype, 0, stream.ptr)
            else:
                self.comm.allReduce(flat.data.ptr, flat.data.ptr, flat.size, dtype,
                                    getattr(self._nccl, agg.nccl_op), stream.ptr)
            stream.synchronize()
            if agg.divides:
                flat /= self.world
            start = 0
            for i in idx:
                size = arrays[i].size
                out[i] = flat[start:start + size].reshape(arrays[i].shape)
                start += size
        return out

    def close(self) -> None:
        self.comm.destroy()
