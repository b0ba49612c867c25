"""From the `device=` knob to a backend, and `to_host` for an array of any backend."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from labdist.devices.backend import Backend
from labdist.devices.cupy_gpu import CUPY, gpu_count
from labdist.devices.numpy_host import NUMPY
from labdist.devices.strict.backend import STRICT

DEVICES = ("auto", "cpu", "gpu", "strict")
DEVICE_BACKENDS = (STRICT, CUPY)  # the backends whose arrays live off the host


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
        return STRICT
    if gpu_count() == 0:
        raise ValueError("device='gpu' was requested but no GPU is visible (cupy + CUDA needed)")
    return CUPY


def pinning_backend(device: str = "auto") -> Backend:
    """The backend whose GPUs an embedded cluster pins its workers to, for replicas that
    compute on `device`: none for "cpu", the double's pretend ones for "strict", CUDA's
    otherwise ("auto" too: a machine without a GPU lists none). Decided on the driver, which
    may lack what the workers compute with, so it never raises for a missing GPU."""
    return {"cpu": NUMPY, "strict": STRICT}.get(device, CUPY)


def to_host(x: Any) -> Any:
    """Any array (numpy, cupy, the strict double) -> numpy; other values unchanged."""
    if isinstance(x, np.ndarray):
        return x
    for backend in DEVICE_BACKENDS:
        if backend.is_array(x):
            return backend.to_host(x)
    return x
