"""The strict double as a `Backend` (device="strict"): cupy's interface on the CPU. Its
modules load on first use, as cupy's do."""

from __future__ import annotations

import os
import sys
from functools import cached_property
from typing import Any

from labdist.devices.backend import Backend

ARRAY_MODULE = "labdist.devices.strict.array"


class StrictBackend(Backend):
    name = "strict"
    is_device = True
    real_gpus = False  # pretend GPUs: only labdist's own pinning knows them
    nccl_spans_hosts = False  # the NCCL double's sockets reach one host only
    device_kind = "strict double GPU"

    @cached_property
    def xp(self) -> Any:
        from labdist.devices.strict.array import StrictNumpy

        return StrictNumpy()

    @property
    def cuda(self) -> Any:
        from labdist.devices.strict import cuda

        return cuda

    @property
    def nccl(self) -> Any:
        from labdist.devices.strict import nccl

        return nccl

    def is_array(self, x: Any) -> bool:
        array = sys.modules.get(ARRAY_MODULE)  # not loaded yet: no array of it can exist
        return array is not None and isinstance(x, array.StrictDeviceArray)

    def to_host(self, x: Any) -> Any:
        if not self.is_array(x):
            return x
        from labdist.devices.strict.array import to_host

        return to_host(x)

    def visible_gpus(self) -> list[str]:
        """The double's pretend GPUs, when LABDIST_STRICT_GPUS asks for some (none otherwise:
        strict replicas are then unpinned, sharing the one pretend GPU each process sees)."""
        from labdist.devices.strict import cuda

        return cuda.visible() if os.environ.get(cuda.ENV_GPUS) else []


STRICT = StrictBackend()
