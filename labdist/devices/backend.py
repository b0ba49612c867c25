"""The interface every array backend answers, so no caller needs to know which one it holds.

A replica computes with one backend: numpy on the host (`numpy_host.py`), cupy on its pinned
GPU (`cupy_gpu.py`), or the strict double (`strict/`), numpy underneath but refusing implicit
host conversion as cupy does, with CPU doubles of `cupy.cuda` and NCCL. Whatever differs
between them (the array module, how arrays move, the CUDA and NCCL modules, which GPUs a
cluster pins its workers to) is a question put to the `Backend`, never a test of its name.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import Any, ClassVar


class Backend(ABC):
    """An array module and what callers may ask about it. One instance per kind and process."""

    name: ClassVar[str]  # "numpy", "cupy" or "strict": for messages and `strategy.replicas()`
    is_device: ClassVar[bool]  # arrays live off the host: moves are explicit
    # GPUs of CUDA (dask-cuda may start workers on them) rather than the double's pretend ones
    real_gpus: ClassVar[bool] = False
    # NCCL's communicators may join replicas on different hosts (the double's sockets cannot)
    nccl_spans_hosts: ClassVar[bool] = False
    device_kind: ClassVar[str] = "GPU"  # what its devices are called in `describe_device()`

    @property
    @abstractmethod
    def xp(self) -> Any:
        """The array module (numpy's interface): what step functions compute with."""

    @property
    def cuda(self) -> Any:
        """The `cupy.cuda`-like module (Device, Stream, Event, runtime), or None on the host."""
        return None

    @property
    def nccl(self) -> Any:
        """The `cupy.cuda.nccl`-like module, or None where there is none (host, no NCCL)."""
        return None

    @abstractmethod
    def is_array(self, x: Any) -> bool:
        """Whether `x` is an array of this backend."""

    def to_device(self, host: Any, dtype: Any = None) -> Any:
        """Host value -> array of this backend (a copy for device backends)."""
        return self.xp.asarray(host, dtype=dtype)

    @abstractmethod
    def to_host(self, x: Any) -> Any:
        """Array of this backend -> numpy array; any other value is returned unchanged."""

    def visible_gpus(self) -> list[str]:
        """The GPUs an embedded cluster pins one worker each to, as CUDA_VISIBLE_DEVICES
        entries, for replicas computing with this backend (none on the host)."""
        return []

    def describe_device(self) -> str:
        """The device this process computes on, in words ("cpu", or which GPU)."""
        if self.cuda is None:
            return "cpu"
        device = self.cuda.Device()
        pinned = os.environ.get("CUDA_VISIBLE_DEVICES")
        return (f"{self.device_kind} {device.id} (PCI {device.pci_bus_id}"
                + (f", CUDA_VISIBLE_DEVICES={pinned})" if pinned is not None else ")"))

    def __repr__(self) -> str:
        return f"<labdist backend {self.name}>"
