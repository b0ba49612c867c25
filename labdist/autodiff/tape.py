"""`ld.GradientTape`: TensorFlow's tape, eager and per thread.

While a tape is open, reading a trainable variable (`v.read_value()`, `x @ v`, a model's
call) gives a `Recorded` leaf, and arithmetic on recorded values records too.
`tape.gradient(loss, variables)` walks the record backwards once. Inside `strategy.run` each
replica's step has its own tape (a thread of its worker), so the gradients are this
replica's; `optimizer.apply_gradients` sums them over the replicas, as TensorFlow's does.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from labdist.autodiff import sliced
from labdist.autodiff.recorded import Recorded, Watchable

_local = threading.local()


def _open() -> list[GradientTape]:
    tapes = getattr(_local, "tapes", None)
    if tapes is None:
        tapes = _local.tapes = []
    return tapes


def recording() -> bool:
    """Whether a tape records on this thread now."""
    return any(t._recording for t in _open())


def read(variable: Watchable, value: Any) -> Any:
    """What reading `variable` (whose value is `value`) gives: a leaf when a recording tape
    watches it (trainable variables are watched unless the tape says otherwise)."""
    tapes = _open()
    if not tapes or not any(t._watches(variable) for t in tapes):
        return value
    return Recorded(value, source=variable)


def key(variable: Watchable) -> tuple:
    """How gradients are collected per variable (a variable's `==` compares values)."""
    return (variable.strategy_id, variable.id)


class GradientTape:
    """`with ld.GradientTape() as tape: loss = ...` then `tape.gradient(loss, variables)`.

    `persistent=True` allows several `gradient` calls; `watch_accessed_variables=False`
    records only the variables given to `watch`. Higher-order gradients (a tape around
    another tape's `gradient`) are not recorded.
    """

    def __init__(self, persistent: bool = False, watch_accessed_variables: bool = True):
        if not isinstance(persistent, bool):
            raise TypeError(f"persistent={persistent!r} must be True or False")
        if not isinstance(watch_accessed_variables, bool):
            raise TypeError(f"watch_accessed_variables={watch_accessed_variables!r} must be "
                            "True or False")
        self.persistent = persistent
        self._watch_all = watch_accessed_variables
        self._watched: dict[tuple, Any] = {}
        self._recording = False
        self._used = False

    def __enter__(self) -> GradientTape:
        _open().append(self)
        self._recording = True
        return self

    def __exit__(self, *exc) -> None:
        self._recording = False
        tapes = _open()
        if self in tapes:
            tapes.remove(self)

    def _watches(self, variable: Watchable) -> bool:
        if not self._recording:
            return False
        return (self._watch_all and variable.trainable) or key(variable) in self._watched

    def watch(self, tensor: Any) -> None:
        """Watch a variable (or each of a list of them), trainable or not. Plain arrays cannot
        be watched: numpy arrays carry no record; make the value an `ld.Variable`."""
        items = tensor if isinstance(tensor, list | tuple) else [tensor]
        for item in items:
            if isinstance(item, Recorded):
                continue  # already on the tape
            if not isinstance(item, Watchable):
                raise TypeError(
                    f"tape.watch({item!r}): labdist's tape watches ld.Variables (and values "
                    "already recorded); a plain array has no record to follow. Make it an "
                    "ld.Variable(..., trainable=False) and read it inside the tape")
            self._watched[key(item)] = item

    def watched_variables(self) -> list:
        return list(self._watched.values())

    @contextlib.contextmanager
    def stop_recording(self) -> Iterator[None]:
        """Nothing computed in this block is recorded (TF's `tape.stop_recording()`)."""
        was, self._recording = self._recording, False
        try:
            yield
        finally:
            self._recording = was

    def reset(self) -> None:
        """Forget the watched variables (what was recorded stays with the values made)."""
        self._watched.clear()

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: str = "none") -> Any:
        """d target / d each source, in the sources' structure (a list, tuple, dict or one
        variable); a source the target does not depend on gets None (or zeros with
        `unconnected_gradients="zero"`). A target that is not a scalar is summed first, as
        TensorFlow does (or weighted by `output_gradients`)."""
        if unconnected_gradients not in ("none", "zero"):
            raise ValueError(f"unconnected_gradients={unconnected_gradients!r}; allowed: "
                             "'none', 'zero'")
        if self._used and not self.persistent:
            raise RuntimeError("A non-persistent GradientTape can only be used to compute one "
                               "set of gradients (or jacobians); use persistent=True")
        flat, rebuild = _flatten(sources)
        keys = [_source_key(s) for s in flat]
        self._used = True
        found = backpropagate(target, output_gradients) if isinstance(target, Recorded) else {}
        out = []
        for source, k in zip(flat, keys, strict=True):
            g = found.get(k)
            if g is None and unconnected_gradients == "zero":
                g = np.zeros(source.shape, source.dtype)
            elif g is not None:
                g = g.astype(source.dtype, copy=True) if hasattr(g, "astype") else g
            out.append(g)
        return rebuild(out)


def _source_key(source: Any) -> Any:
    if isinstance(source, Watchable):
        return key(source)
    if isinstance(source, Recorded):
        return id(source)
    raise TypeError(f"tape.gradient: the sources must be ld.Variables (or recorded values); "
                    f"got {source!r}")


def _flatten(sources: Any):
    """(list of sources, a function giving the gradients back in the sources' structure)."""
    if isinstance(sources, dict):
        names = list(sources)
        return [sources[k] for k in names], lambda g: dict(zip(names, g, strict=True))
    if isinstance(sources, list | tuple):
        kind = type(sources)
        return list(sources), lambda g: kind(g) if kind in (list, tuple) else list(g)
    return [sources], lambda g: g[0]


def backpropagate(target: Recorded, output_gradients: Any = None) -> dict:
    """The gradient of `target` (summed, or weighted by `output_gradients`) with respect to
    every leaf under it: {variable key or id(recorded): gradient}."""
    order, seen = [], set()
    stack = [(target, False)]
    while stack:  # depth first, each value after everything it depends on
        value, expanded = stack.pop()
        if expanded:
            order.append(value)
            continue
        if id(value) in seen:
            continue
        seen.add(id(value))
        stack.append((value, True))
        stack.extend((p, False) for p in value.parents if isinstance(p, Recorded))
    seed = output_gradients
    if seed is None:
        seed = np.ones_like(target.data)
    grads: dict[int, Any] = {id(target): seed}
    found: dict[Any, Any] = {}
    for value in reversed(order):
        g = grads.pop(id(value), None)
        if g is None:
            continue
        if value.source is not None:
            k = key(value.source)
            found[k] = g if k not in found else sliced.add(found[k], g)
        found[id(value)] = g
        if value.backward is None:
            continue
        for parent, pg in zip(value.parents, value.backward(g), strict=True):
            if pg is None or not isinstance(parent, Recorded):
                continue
            grads[id(parent)] = pg if id(parent) not in grads else \
                sliced.add(grads[id(parent)], pg)
    return found
