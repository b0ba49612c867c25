"""labdist.devices: every backend answers the same questions (so callers never ask which one
they hold), the knob picks them, and `to_host` recognises each one's arrays. Real cupy and
NCCL are tests/devices/test_gpu.py's (GPU machines only)."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import numpy as np
import pytest

import labdist as ld
from labdist.devices import NUMPY, Backend, get_backend, gpu_count, pinning_backend, to_host
from labdist.devices.cupy_gpu import CupyBackend
from labdist.devices.strict import cuda as strict_cuda

STRICT = get_backend("strict")


def test_the_host_backend_has_no_device_no_cuda_and_no_nccl():
    assert NUMPY is get_backend("cpu") and isinstance(NUMPY, Backend)
    assert NUMPY.xp is np and not NUMPY.is_device
    assert NUMPY.cuda is None and NUMPY.nccl is None and NUMPY.visible_gpus() == []
    a = NUMPY.to_device([1, 2], dtype=np.float32)
    assert a.dtype == np.float32 and NUMPY.is_array(a) and NUMPY.to_host(a) is a
    assert NUMPY.describe_device() == "cpu"


def test_the_strict_double_answers_as_a_gpu_backend_would():
    assert STRICT.is_device and not STRICT.real_gpus and not STRICT.nccl_spans_hosts
    d = STRICT.to_device(np.arange(3.0))
    assert STRICT.is_array(d) and not NUMPY.is_array(d) and not STRICT.is_array(np.ones(2))
    host = STRICT.to_host(d)
    assert isinstance(host, np.ndarray) and host.tolist() == [0.0, 1.0, 2.0]
    assert STRICT.to_host(5.0) == 5.0  # not its array: unchanged
    assert STRICT.cuda.Device().pci_bus_id == STRICT.xp.cuda.Device().pci_bus_id
    assert STRICT.nccl.NcclCommunicator is STRICT.xp.cuda.nccl.NcclCommunicator
    assert STRICT.describe_device().startswith("strict double GPU 0 (PCI 0000:")


def test_to_host_takes_any_backends_arrays_and_leaves_other_values():
    d = STRICT.xp.asarray([1.0, 2.0])
    assert to_host(d).tolist() == [1.0, 2.0] and ld.to_host is to_host
    a = np.ones(2)
    assert to_host(a) is a
    assert to_host([1, 2]) == [1, 2] and to_host(None) is None and to_host(3) == 3


def test_the_knob_picks_the_backend_and_names_what_is_allowed(monkeypatch):
    monkeypatch.delenv("LABDIST_DEVICE", raising=False)
    assert get_backend("strict") is STRICT
    monkeypatch.setenv("LABDIST_DEVICE", "strict")
    assert get_backend("auto") is STRICT  # the suite's switch
    with pytest.raises(ValueError, match=r"device='tpu' is not supported; allowed: auto, cpu, "
                                         r"gpu, strict"):
        get_backend("tpu")
    if gpu_count() == 0:
        with pytest.raises(ValueError, match="device='gpu' was requested but no GPU"):
            get_backend("gpu")


def test_pinning_asks_the_backend_the_knob_names_without_needing_its_gpu(monkeypatch):
    assert pinning_backend("cpu") is NUMPY and pinning_backend("strict") is STRICT
    assert pinning_backend("gpu").real_gpus and pinning_backend("auto").real_gpus
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv(strict_cuda.ENV_GPUS, raising=False)
    assert STRICT.visible_gpus() == []  # unpinned unless pretend GPUs are asked for
    monkeypatch.setenv(strict_cuda.ENV_GPUS, "3")
    assert STRICT.visible_gpus() == ["0", "1", "2"]
    if gpu_count() == 0:
        assert pinning_backend("gpu").visible_gpus() == []  # no GPU: none, and no error


def test_importing_labdist_loads_neither_cupy_nor_the_double():
    """The backends load their modules on first use, so `import labdist` stays light."""
    probe = ("import sys, labdist; print(sorted(m for m in ('cupy', "
             "'labdist.devices.strict.array', 'labdist.devices.strict.nccl') if m in sys.modules))")
    root = os.path.dirname(os.path.dirname(ld.__file__))  # where this labdist is imported from
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": root}, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


# -- the cupy backend, over a fake cupy (this machine may have no GPU: the one mock allowed) ----
def fake_cupy(monkeypatch, gpus: int, nccl_available: bool | None) -> types.ModuleType:
    """A `cupy` with `gpus` devices; `cupy.cuda.nccl` importable unless nccl_available is None."""
    cupy = types.ModuleType("cupy")
    cuda = types.ModuleType("cupy.cuda")

    class ndarray:  # cupy's name
        def __init__(self, host):
            self.host = np.asarray(host)

        def get(self):
            return self.host.copy()

    class Device:
        def __init__(self, device=None):
            self.id, self.pci_bus_id = 0, "0000:41:00.0"

    cupy.ndarray, cupy.asarray, cupy.cuda = ndarray, lambda x, dtype=None: ndarray(x), cuda
    cuda.Device = Device
    cuda.runtime = types.SimpleNamespace(getDeviceCount=lambda: gpus)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    if nccl_available is not None:
        cuda.nccl = types.SimpleNamespace(available=nccl_available)
    return cupy


def test_the_cupy_backend_answers_from_cupy(monkeypatch):
    cupy = fake_cupy(monkeypatch, gpus=2, nccl_available=True)
    gpu = CupyBackend()
    assert gpu.is_device and gpu.real_gpus and gpu.nccl_spans_hosts
    assert gpu.xp is cupy and gpu.cuda is cupy.cuda and gpu.nccl is cupy.cuda.nccl
    d = gpu.to_device([1.0, 2.0])
    assert gpu.is_array(d) and not STRICT.is_array(d) and not gpu.is_array(np.ones(2))
    assert gpu.to_host(d).tolist() == [1.0, 2.0] and to_host(d).tolist() == [1.0, 2.0]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7,9")
    assert gpu.describe_device() == "GPU 0 (PCI 0000:41:00.0, CUDA_VISIBLE_DEVICES=5,7,9)"
    assert gpu.visible_gpus() == ["5", "7"]  # CUDA's entries, as many as it counts
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert gpu.visible_gpus() == ["0", "1"] and gpu_count() == 2


@pytest.mark.parametrize("nccl_available", [False, None])
def test_the_cupy_backend_without_nccl_offers_none(monkeypatch, nccl_available):
    fake_cupy(monkeypatch, gpus=1, nccl_available=nccl_available)
    assert CupyBackend().nccl is None  # the NCCL transport's probe then says "cannot run here"


def test_no_cupy_means_no_cupy_arrays_and_no_import(monkeypatch):
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    assert not CupyBackend().is_array(np.ones(2)) and "cupy" not in sys.modules
