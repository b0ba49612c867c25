"""Device replicas on a real GPU: cupy arrays on the worker's pinned GPU, `cupy.cuda`, and
cupy's NCCL binding. cupy is imported only when this backend is used, so the package loads
on machines without it."""

from __future__ import annotations

import os
import sys
from functools import cached_property
from typing import Any

from labdist.devices.backend import Backend


def gpu_count() -> int:
    """GPUs visible to this process (0 without cupy or CUDA)."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


def cuda_gpus() -> list[str]:
    """CUDA's GPUs, as CUDA_VISIBLE_DEVICES entries (those it lists, if it is set)."""
    count = gpu_count()
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [d.strip() for d in listed.split(",") if d.strip()] if listed else []
    return (ids or [str(i) for i in range(count)])[:count]


class CupyBackend(Backend):
    name = "cupy"
    is_device = True
    real_gpus = True
    nccl_spans_hosts = True

    @cached_property
    def xp(self) -> Any:
        import cupy

        return cupy

    @property
    def cuda(self) -> Any:
        return self.xp.cuda

    @cached_property
    def nccl(self) -> Any:
        try:
            from cupy.cuda import nccl
        except ImportError:
            return None
        return nccl if getattr(nccl, "available", True) else None

    def is_array(self, x: Any) -> bool:
        cupy = sys.modules.get("cupy")  # no cupy loaded: no cupy array can exist
        return cupy is not None and isinstance(x, cupy.ndarray)

    def to_host(self, x: Any) -> Any:
        return x.get() if self.is_array(x) else x

    def visible_gpus(self) -> list[str]:
        return cuda_gpus()


CUPY = CupyBackend()
