"""Host replicas: numpy arrays, nothing to move, no CUDA and no NCCL."""

from __future__ import annotations

from typing import Any

import numpy as np

from labdist.devices.backend import Backend


class NumpyBackend(Backend):
    name = "numpy"
    is_device = False

    @property
    def xp(self) -> Any:
        return np

    def is_array(self, x: Any) -> bool:
        return isinstance(x, np.ndarray)

    def to_device(self, host: Any, dtype: Any = None) -> np.ndarray:
        return np.asarray(host, dtype=dtype)

    def to_host(self, x: Any) -> Any:
        return x  # its arrays are host arrays already


NUMPY = NumpyBackend()
