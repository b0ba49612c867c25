"""How step functions travel from the driver to the replicas, and merge functions come back.

A merge function runs on the driver (TF's merge_call contract). The replica only holds a copy,
so each function pickled by value is tagged with a token, and the driver swaps the copy that
comes back for its own object: closures then mutate the driver's state, not a copy's.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import io
import itertools
import os
import pickle
import sys
import types
import weakref
from typing import Any

import cloudpickle
import numpy as np
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
    """The driver's own function (or object `remember` tagged) for a copy that came back
    from a replica (else the copy itself)."""
    token = getattr(fn, "__dict__", {}).get(_TOKEN)
    if isinstance(token, tuple):  # remembered: (the process that made it, its number)
        original = _driver_objects.get(token[1]) if token[0] == os.getpid() else None
    else:
        original = _driver_functions.get(token) if token is not None else None
    return original if original is not None else fn


_driver_objects: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_object_numbers = itertools.count(1)
TOKEN = _TOKEN  # the key `remember` adds to an object's __dict__ (left out of its config)


def driver_object_by_token(token: Any) -> Any:
    """The object `remember` tagged with `token` (a copy's `__dict__[TOKEN]`), if it was made
    in this process and still lives; else None."""
    if not isinstance(token, tuple) or token[0] != os.getpid():
        return None
    return _driver_objects.get(token[1])


def remember(obj: Any) -> None:
    """Tag `obj` (a model, an optimizer) so that a copy of it a replica sends back to the
    driver in a `merge_call` is swapped for `obj` itself (`driver_object`): building its
    variables there builds the user's object, not a copy."""
    number = next(_object_numbers)
    _driver_objects[number] = obj
    obj.__dict__[_TOKEN] = (os.getpid(), number)


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


# -- merge_call results: pickled by the driver, unpickled in the step that waits for them -------
class Packed:
    """A merge_call result the driver pickled itself (`pack`). The replica unpickles it in
    the step that waits for it (`unpack`), so a result its worker cannot rebuild fails that
    step, saying so, instead of the request that carries it (which would leave the step
    waiting in merge_call for an answer that never comes)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data


def _plain(value: Any) -> bool:
    """Whether `value` unpickles anywhere: numbers, strings, arrays, variable handles, and
    lists, tuples and dicts of them (a named tuple's class may not be importable there)."""
    kind = type(value)
    if kind in _PLAIN or kind is complex or kind in _frozen_types or isinstance(value,
                                                                                 np.generic):
        return True
    if kind is np.ndarray:
        return value.dtype != object
    if kind is tuple or kind is list:
        return all(_plain(x) for x in value)
    if kind is dict:
        return all(_plain(k) and _plain(v) for k, v in value.items())
    return False


def pack(value: Any, what: str) -> Any:
    """`value` for one replica: as it is when it unpickles anywhere, else `Packed` (pickled
    here: a value that cannot be pickled raises TypeError naming `what` before anything is
    sent to any replica)."""
    if _plain(value):
        return value
    try:  # cloudpickle: classes of __main__ (a notebook's) and lambdas travel by value
        data = cloudpickle.dumps(value, protocol=5)
    except Exception as e:
        raise TypeError(f"{what} cannot be sent to the replicas ({type(e).__name__}: {e}); "
                        "return arrays, numbers and picklable objects (or structures of "
                        "them)") from None
    return Packed(data)


def unpack(value: Any, what: str) -> Any:
    """The value `pack` made, on the replica (a TypeError naming `what` where it cannot be
    unpickled: a class only the driver has)."""
    if not isinstance(value, Packed):
        return value
    try:
        return pickle.loads(value.data)
    except Exception as e:
        raise TypeError(f"{what} cannot be unpickled on its worker ({type(e).__name__}: {e}); "
                        "return objects the workers can rebuild (arrays, numbers, or classes "
                        "from a module the workers have)") from None


def wire(value: Any) -> Any:
    """An actor call's argument as Dask sends it: msgpack carries plain values as they are;
    anything else goes as a pickled frame."""
    if type(value) in _PLAIN or (type(value) in (tuple, dict) and not value):
        return value
    return to_serialize(value)


# -- pickling a step function once: the driver's cache ----------------------------------------
# A step function sent again is pickled again only when something its pickle holds may have
# changed. cloudpickle pickles a function from `__main__` (or a closure) by value: its code, its
# defaults, its closure cells and the globals it names (their values). `_capture` lists every
# object whose identity decides those bytes; equal lists (element by element, `is`) mean equal
# bytes. Lists and dicts (up to MAX_ITEMS entries) are listed by their contents, so a change in
# place shows; instances of classes registered with `register_state` by their `__dict__`. Where
# the function holds anything else that can change in place (an array, an instance of the
# user's class), there is no cache: it is pickled on every call, as before.

_frozen_types: set[type] = set()
_state_types: set[type] = set()
MAX_ITEMS = 256  # a list or dict longer than this is not walked on every call: no cache
_END = object()  # closes a container's contents in a snapshot
_SCALARS = (int, float, complex, str, bytes, bool, type(None), type(Ellipsis), range)


def register_frozen(cls: type) -> None:
    """Instances of `cls` pickle to a handle that never changes (a Variable's id, name, dtype,
    shape, synchronization and aggregation): a step function may hold them and stay cached."""
    _frozen_types.add(cls)


def register_state(cls: type) -> None:
    """Instances of `cls` (an importable class with no custom pickling) pickle as their class
    and `__dict__`: a step function holding one (an optimizer) stays cached while that holds."""
    _state_types.add(cls)


try:  # cloudpickle's own rules for what it pickles by value; without them: no cache
    from cloudpickle.cloudpickle import _extract_code_globals, _should_pickle_by_reference
except ImportError:  # pragma: no cover - another cloudpickle
    _extract_code_globals = _should_pickle_by_reference = None


def _by_reference(obj: Any) -> bool:
    try:
        return bool(_should_pickle_by_reference(obj))
    except Exception:
        return False


def _capture(obj: Any, out: list, seen: set[int]) -> bool:
    """Append to `out` what decides `obj`'s pickle; False where it holds something mutable."""
    kind = type(obj)
    if kind in _SCALARS or isinstance(obj, np.generic | np.dtype) or kind in _frozen_types:
        out.append(obj)
        return True
    if kind is tuple or kind is frozenset or (isinstance(obj, tuple) and _by_reference(kind)):
        out.append(obj)  # a named tuple pickles as its class (by reference) and its items
        return all(_capture(x, out, seen) for x in obj)
    if isinstance(obj, types.ModuleType | type | types.BuiltinFunctionType | np.ufunc
                  | enum.Enum):
        out.append(obj)
        return _by_reference(obj if not isinstance(obj, enum.Enum) else kind)
    if kind is list or kind is dict or kind in _state_types:
        out.append(obj)
        if id(obj) in seen:
            return True  # listed earlier in this snapshot
        seen.add(id(obj))
        if kind in _state_types:
            ok = _by_reference(kind) and _capture_dict(obj.__dict__, out, seen)
        elif len(obj) > MAX_ITEMS:
            return False
        elif kind is list:
            ok = all(_capture(x, out, seen) for x in obj)
        else:
            ok = _capture_dict(obj, out, seen)
        out.append(_END)
        return ok
    if kind is functools.partial:
        out.append(obj)
        return (_capture(obj.func, out, seen) and _capture(obj.args, out, seen)
                and _capture_dict(obj.keywords, out, seen) and _capture_dict(obj.__dict__, out,
                                                                               seen))
    if kind is types.FunctionType:
        out.append(obj)
        if id(obj) in seen or _by_reference(obj):
            return True
        seen.add(id(obj))
        out.extend((obj.__code__, obj.__name__, obj.__qualname__, obj.__module__, obj.__doc__))
        if not (_capture(obj.__defaults__, out, seen)
                and _capture_dict(obj.__kwdefaults__, out, seen)
                and _capture_dict(obj.__dict__, out, seen)
                and _capture_dict(obj.__annotations__, out, seen)):
            return False
        for cell in obj.__closure__ or ():
            try:
                contents = cell.cell_contents
            except ValueError:  # an empty cell
                contents = _EMPTY
            if not _capture(contents, out, seen):
                return False
        names = obj.__globals__
        for name in _extract_code_globals(obj.__code__):
            if name in names:
                out.append(name)
                if not _capture(names[name], out, seen):
                    return False
            else:
                out.append(_EMPTY)
        return True
    return False


_EMPTY = object()


def _capture_dict(d: dict | None, out: list, seen: set[int]) -> bool:
    if not d:
        out.append(None)
        return True
    for key, value in d.items():
        out.append(key)
        if not _capture(value, out, seen):
            return False
    return True


def snapshot(fn: Any) -> list | None:
    """What decides `fn`'s pickle, to compare by identity; None where it cannot be cached."""
    if _extract_code_globals is None:
        return None
    out: list = [len(sys.modules)]  # a module imported since may change what travels
    try:
        return out if _capture(fn, out, set()) else None
    except Exception:  # anything unexpected: no cache
        return None


def same(a: list | None, b: list | None) -> bool:
    """The module count by value, everything else by identity."""
    return a is not None and b is not None and len(a) == len(b) and a[0] == b[0] and all(
        x is y for x, y in zip(a[1:], b[1:], strict=True))


class PickledFunctions:
    """The driver's pickles of the step functions it sent, by function object: `dumps_cached`
    pickles again only when the function's snapshot changed (module doc above). Each pickle is
    named by a digest of its bytes, which is what replicas cache it under."""

    def __init__(self):
        self._by_fn: dict[int, tuple[Any, list, bytes, str]] = {}  # id -> (fn, snap, data, key)

    def dumps_cached(self, fn: Any) -> tuple[str, bytes]:
        """(key, bytes) of `fn`: the bytes of the last call when nothing it holds changed."""
        snap = snapshot(fn)
        hit = self._by_fn.get(id(fn))
        if hit is not None and hit[0] is fn and same(hit[1], snap):
            return hit[3], hit[2]
        data = dumps(fn)
        key = hashlib.blake2b(data, digest_size=16).hexdigest()
        if snap is not None:
            if len(self._by_fn) >= 64:
                self._by_fn.clear()
            self._by_fn[id(fn)] = (fn, snap, data, key)  # holds fn: its id stays its own
        return key, data
