"""NCCL all-reduce between GPU replicas, through `cupy.cuda.nccl`: the device transport.

Bootstrapped as raft-dask does: every rank's probe is a unique id, the driver hands rank 0's to
every rank at once, and each joins the NCCL communicator. NCCL itself cannot tell that two
replicas disagree about a collective (it would reduce garbage or hang), so the host transport
first exchanges the call's signature (collectives/algorithms.py); only data moves through NCCL.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from labdist.aggregation import Aggregation
from labdist.collectives.transports.base import DEVICE, Endpoint

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


def supports(arrays: list[Any], agg: Aggregation) -> bool:
    """Whether NCCL can do this all-reduce as labdist defines it (the host path's result
    dtypes: integer MEANs, float64 there, stay on the host; so do dtypes NCCL lacks)."""
    if not arrays:
        return False
    return all(np.dtype(a.dtype).name in DTYPES and agg.nccl_can(a.dtype) for a in arrays)


class NcclTransport:
    """One rank's NCCL communicator; `all_reduce` runs on the replica's step thread."""

    name: ClassVar[str] = "nccl"
    layer: ClassVar[str] = DEVICE
    requirement: ClassVar[str] = "every replica on a GPU with NCCL (cupy.cuda.nccl)"
    alone: ClassVar[bool] = False

    def __init__(self, endpoint: Endpoint):
        self.endpoint = endpoint
        self._nccl = nccl_module()
        self.comm = None

    def probe(self) -> tuple | None:
        """A fresh NCCL unique id (rank 0's is used) where this replica computes on a GPU."""
        if self.endpoint.device != "cupy" or self._nccl is None:
            return None
        return self._nccl.get_unique_id()

    def connect(self, probes: list[Any]) -> bool:
        """Join rank 0's communicator: blocks until every rank does (called on all at once)."""
        ep = self.endpoint
        self.comm = self._nccl.NcclCommunicator(ep.world, probes[0], ep.rank)
        return True

    def supports(self, backend, arrays: list[Any], agg: Aggregation) -> bool:
        return backend.name == "cupy" and supports(arrays, agg)

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
                flat /= self.endpoint.world
            start = 0
            for i in idx:
                size = arrays[i].size
                out[i] = flat[start:start + size].reshape(arrays[i].shape)
                start += size
        return out

    def close(self) -> None:
        if self.comm is not None:
            self.comm.destroy()
            self.comm = None
