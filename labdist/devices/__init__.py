"""Where a replica's arrays live, behind one interface: `Backend` (numpy on the host, cupy on a
GPU, or the strict double, a CPU stand-in for cupy with its own `cuda` and NCCL). Code outside
this package asks its backend, never which backend it has."""

from labdist.devices.backend import Backend
from labdist.devices.choice import DEVICES, get_backend, pinning_backend, to_host
from labdist.devices.cupy_gpu import gpu_count
from labdist.devices.numpy_host import NUMPY

__all__ = ["DEVICES", "NUMPY", "Backend", "get_backend", "gpu_count", "pinning_backend",
           "to_host"]
