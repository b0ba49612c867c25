"""How step functions travel from the driver to the replicas, and merge functions come back.

A merge function runs on the driver (TF's merge_call contract). The replica only holds a copy,
so each function pickled by value is tagged with a token, and the driver swaps the copy that
comes back for its own object: closures then mutate the driver's state, not a copy's.
"""

from __future__ import annotations

import io
import pickle
import types
import weakref
from typing import Any

import cloudpickle
from distributed.protocol import to_serialize

_TOKEN = "_labdist_driver_fn"
_driver_functions: weakref.WeakValueDictionary[int, types.FunctionType] = (
    weakref.WeakValueDictionary())


class _DriverPickler(cloudpickle.Pickler):
    def reducer_override(self, obj):
        if isinstance(obj, types.FunctionType) and _TOKEN not in obj.__dict__:
            token = id(obj)
            _driver_functions[token] = obj
            obj.__dict__[_TOKEN] = token
        return super().reducer_override(obj)


def dumps(fn) -> bytes:
    """Pickle `fn` for the workers (TypeError naming it if it cannot travel)."""
    buffer = io.BytesIO()
    try:
        _DriverPickler(buffer, protocol=5).dump(fn)
    except Exception as e:
        raise TypeError(f"fn={fn!r} cannot be sent to the workers (cloudpickle: {e})") from None
    return buffer.getvalue()


def driver_object(fn):
    """The driver's own function for a copy that came back from a replica (else the copy)."""
    token = getattr(fn, "__dict__", {}).get(_TOKEN)
    original = _driver_functions.get(token) if token is not None else None
    return original if original is not None else fn


def picklable_error(error: BaseException) -> BaseException:
    """`error` if it pickles (and unpickles: an exception class whose __init__ wants other
    arguments does not), else a RuntimeError with its text: what a worker can send back."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


def check_call(fn: Any, args: Any, kwargs: Any) -> None:
    """The (fn, args, kwargs) of strategy.run / coordinator.schedule, checked at the boundary."""
    if not callable(fn):
        raise TypeError(f"fn={fn!r} is not callable")
    if not isinstance(args, tuple | list):
        raise TypeError(f"args={args!r} must be a tuple of positional arguments")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"kwargs={kwargs!r} must be a dict or None")


_PLAIN = (int, float, str, bytes, bool, type(None))


def wire(value: Any) -> Any:
    """An actor call's argument as Dask sends it: msgpack carries plain values as they are;
    anything else goes as a pickled frame."""
    if type(value) in _PLAIN or (type(value) in (tuple, dict) and not value):
        return value
    return to_serialize(value)
