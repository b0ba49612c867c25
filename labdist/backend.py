"""Which array module (`xp`) a replica computes with, and the only sanctioned host<->device moves.

`numpy`: host replicas. `cupy`: device replicas on the worker's pinned GPU. `strict`: a numpy
double that fails like cupy on implicit host conversion (see strict_device.py), so tests on a
machine without a GPU still catch device mix-ups.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

DEVICES = ("auto", "cpu", "gpu", "strict")


@dataclass(frozen=True)
class Backend:
    """An array module and how to move arrays between it and the host."""

    name: str
    xp: Any
    is_device: bool

    def to_device(self, host: Any, dtype: Any = None) -> Any:
        """Host value -> array of this backend (a copy for device backends)."""
        if self.name == "numpy":
            return np.asarray(host, dtype=dtype)
        return self.xp.asarray(host, dtype=dtype)

    def to_host(self, x: Any) -> Any:
        """Array of this backend -> numpy array; other values are returned unchanged."""
        return to_host(x)

    def is_array(self, x: Any) -> bool:
        return isinstance(x, self.xp.ndarray)


NUMPY = Backend("numpy", np, is_device=False)


@cache
def strict_backend() -> Backend:
    from labdist.strict_device import StrictNumpy

    return Backend("strict", StrictNumpy(), is_device=True)


@cache
def cupy_backend() -> Backend:
    import cupy

    return Backend("cupy", cupy, is_device=True)


def gpu_count() -> int:
    """GPUs visible to this process (0 without cupy or CUDA)."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


def visible_gpus(device: str = "auto") -> list[str]:
    """The GPUs an embedded cluster pins its workers to, as CUDA_VISIBLE_DEVICES entries, for
    replicas computing on `device`: CUDA's (those CUDA_VISIBLE_DEVICES lists, if set), none for
    "cpu", and for "strict" the double's pretend GPUs when LABDIST_STRICT_GPUS asks for some."""
    if device == "cpu":
        return []
    if device == "strict":
        from labdist import strict_cuda

        return strict_cuda.visible() if os.environ.get(strict_cuda.ENV_GPUS) else []
    count = gpu_count()
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [d.strip() for d in listed.split(",") if d.strip()] if listed else []
    return (ids or [str(i) for i in range(count)])[:count]


def device_of(backend: str) -> str:
    """The device a process computing with `backend` (a Backend name) uses, in words."""
    if backend == "numpy":
        return "cpu"
    if backend == "strict":
        from labdist import strict_cuda as cuda

        kind = "strict double GPU"
    else:
        from cupy import cuda

        kind = "GPU"
    device = cuda.Device()
    pinned = os.environ.get("CUDA_VISIBLE_DEVICES")
    return (f"{kind} {device.id} (PCI {device.pci_bus_id}"
            + (f", CUDA_VISIBLE_DEVICES={pinned})" if pinned is not None else ")"))


def get_backend(device: str = "auto") -> Backend:
    """The backend for `device` in DEVICES; "auto" means a GPU when one is visible, else numpy.

    The LABDIST_DEVICE environment variable overrides "auto" (used to run the suite on `strict`).
    """
    if device not in DEVICES:
        raise ValueError(f"device={device!r} is not supported; allowed: {', '.join(DEVICES)}")
    if device == "auto":
        device = os.environ.get("LABDIST_DEVICE", "auto")
        if device == "auto":
            device = "gpu" if gpu_count() > 0 else "cpu"
    if device == "cpu":
        return NUMPY
    if device == "strict":
        return strict_backend()
    if gpu_count() == 0:
        raise ValueError("device='gpu' was requested but no GPU is visible (cupy + CUDA needed)")
    return cupy_backend()


def to_host(x: Any) -> Any:
    """Any array (numpy, cupy, strict double) -> numpy; other values unchanged."""
    if isinstance(x, np.ndarray):
        return x
    cls = type(x).__name__
    if cls == "StrictDeviceArray":
        from labdist.strict_device import to_host as strict_to_host

        return strict_to_host(x)
    if cls == "ndarray" and type(x).__module__.startswith("cupy"):
        return x.get()
    return x
