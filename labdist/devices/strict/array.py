"""A strict stand-in for cupy: numpy underneath, but device arrays refuse to become host arrays
implicitly, so host/device mix-ups fail on a laptop the way they fail on a GPU.

Like cupy: `np.asarray(device_array)` raises TypeError, mixing a device array with a numpy
array (or assigning one into a device array) raises TypeError, and only `to_host` (cupy's
`.get()`) or `float()`/`.item()` move data; `host_transfers()` counts those moves, so a test can
tell a step that syncs with the host every iteration. `xp.cuda` is cuda.py (streams, events,
devices, and its `nccl`: the NCCL double of nccl.py); `x.data.ptr` is a device pointer it
accepts.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from labdist.devices.strict import cuda as strict_cuda
from labdist.devices.strict import nccl as strict_nccl

_transfers = [0]  # device -> host moves in this process (float(), .item(), .get(), to_host)


def host_transfers() -> int:
    """How many times a device value was moved to the host in this process so far."""
    return _transfers[0]


class StrictDeviceArray(NDArrayOperatorsMixin):
    """An array on the pretend device."""

    __slots__ = ("_a",)
    __array_priority__ = 100

    def __init__(self, host: np.ndarray):
        self._a = host

    # -- the refusals that make this a strict double ------------------------------------------
    def __array__(self, dtype=None, copy=None):
        raise TypeError(
            "Implicit conversion of a device array to a host numpy array is not allowed; "
            "use labdist.to_host(x) (cupy: x.get())"
        )

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        args = [_unwrap(x, ufunc.__name__) for x in inputs]
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = tuple(_unwrap(x, ufunc.__name__) for x in out)
        result = getattr(ufunc, method)(*args, **kwargs)
        if out is not None:  # in place (x += y, out=...): the caller's arrays, as cupy does
            return out[0] if len(out) == 1 else tuple(out)
        return _wrap(result)

    def __array_function__(self, func, types, args, kwargs):
        name = getattr(func, "__name__", "function")
        return _wrap(func(*_unwrap_tree(args, name), **_unwrap_tree(kwargs, name)))

    # -- the ndarray surface step functions use -------------------------------------------------
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    T = property(lambda self: StrictDeviceArray(self._a.T))

    def __getitem__(self, index):  # indices may be tuples of device arrays, as in cupy
        return _wrap(self._a[_unwrap_tree(index, "__getitem__")])

    def __setitem__(self, index, value):
        self._a[_unwrap_tree(index, "__setitem__")] = _unwrap(value, "__setitem__")

    def __len__(self) -> int:
        return len(self._a)

    def __iter__(self):
        return (_wrap(x) for x in self._a)

    def __float__(self) -> float:
        _transfers[0] += 1
        return float(self._a)

    def __int__(self) -> int:
        _transfers[0] += 1
        return int(self._a)

    def __bool__(self) -> bool:
        _transfers[0] += 1
        return bool(self._a)

    def item(self):
        _transfers[0] += 1
        return self._a.item()

    def get(self) -> np.ndarray:
        """Copy to the host, as cupy's `ndarray.get()`."""
        return to_host(self)

    @property
    def data(self) -> strict_cuda.MemoryPointer:
        """The device pointer of the buffer (cupy's `x.data`; `.ptr` goes to NCCL calls)."""
        return strict_cuda.MemoryPointer(self._a)

    def __getattr__(self, name: str):
        # reshape, astype, sum, mean, copy, ravel, fill, ...: run on the data, keep it on device.
        if name.startswith("__") and name.endswith("__"):
            # never expose the host buffer's protocols (__array_interface__, __array_struct__,
            # __dlpack__): numpy would use them to convert without calling __array__
            raise AttributeError(name)
        attr = getattr(self._a, name)
        if not callable(attr):
            return _wrap(attr)
        return lambda *a, **k: _wrap(attr(*_unwrap_tree(a, name), **_unwrap_tree(k, name)))

    def __repr__(self) -> str:
        return f"StrictDeviceArray({self._a!r})"

    def __reduce__(self):
        raise TypeError(
            "A device array cannot be pickled; move it to the host first with to_host(x)"
        )


def _unwrap(x: Any, where: str) -> Any:
    if isinstance(x, StrictDeviceArray):
        return x._a
    if isinstance(x, np.ndarray):
        raise TypeError(
            f"{where}: a host numpy array was mixed with a device array; "
            "move it explicitly with xp.asarray(x) (cupy raises the same way)"
        )
    return x


def _unwrap_tree(x: Any, where: str) -> Any:
    if isinstance(x, tuple | list):
        return type(x)(_unwrap_tree(v, where) for v in x)
    if isinstance(x, dict):
        return {k: _unwrap_tree(v, where) for k, v in x.items()}
    return _unwrap(x, where)


def _wrap(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return StrictDeviceArray(x)
    if isinstance(x, np.generic):  # an element or a full reduction: a 0-d device array
        return StrictDeviceArray(np.asarray(x))
    if isinstance(x, tuple):
        return tuple(_wrap(v) for v in x)
    if isinstance(x, list):
        return [_wrap(v) for v in x]
    return x


def _device_leaves(x: Any) -> Any:
    """Nested lists/tuples may hold device arrays (as cupy.asarray allows): take their data."""
    if isinstance(x, StrictDeviceArray):
        return x._a
    if isinstance(x, tuple | list):
        return [_device_leaves(v) for v in x]
    return x


class _Cuda:
    """`xp.cuda`: cuda.py's names (Stream, Event, Device, runtime, ...) plus `nccl`."""

    nccl = strict_nccl

    def __getattr__(self, name: str) -> Any:
        return getattr(strict_cuda, name)


class StrictNumpy:
    """The `xp` module of the double: numpy's functions, taking and giving device arrays."""

    __name__ = "labdist.devices.strict.array"
    ndarray = StrictDeviceArray
    cuda = _Cuda()

    def asarray(self, x: Any, dtype=None) -> StrictDeviceArray:
        """Explicit host-to-device copy (allowed, as `cupy.asarray`)."""
        if isinstance(x, StrictDeviceArray):
            return x if dtype is None or x.dtype == dtype else StrictDeviceArray(x._a.astype(dtype))
        return StrictDeviceArray(np.array(_device_leaves(x), dtype=dtype))

    array = asarray

    def __getattr__(self, name: str):
        attr = getattr(np, name)
        if not callable(attr) or isinstance(attr, type):
            return attr  # dtypes, constants (float32, pi, newaxis)
        return lambda *a, **k: _wrap(attr(*_unwrap_tree(a, name), **_unwrap_tree(k, name)))


def to_host(x: StrictDeviceArray) -> np.ndarray:
    _transfers[0] += 1
    return x._a.copy()
