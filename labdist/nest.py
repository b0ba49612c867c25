"""Nested structures (tuples, lists, dicts) of leaves: flatten, rebuild, map.

Collectives and `strategy.run` work leaf by leaf on whatever structure a step function uses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _is_namedtuple(x: Any) -> bool:
    # a namedtuple, as collections defines one (its public marker is this attribute)
    return isinstance(x, tuple) and hasattr(x, "_fields")


def flatten(x: Any) -> tuple[list[Any], Any]:
    """Return (leaves, treedef); `unflatten(treedef, leaves)` rebuilds `x`."""
    leaves: list[Any] = []
    return leaves, _flatten(x, leaves)


def _flatten(x: Any, leaves: list[Any]) -> Any:
    if _is_namedtuple(x):
        return (type(x), tuple(_flatten(v, leaves) for v in x))
    if isinstance(x, tuple | list):
        return (type(x), tuple(_flatten(v, leaves) for v in x))
    if isinstance(x, dict):
        return (dict, tuple((k, _flatten(v, leaves)) for k, v in x.items()))
    leaves.append(x)
    return None


def unflatten(treedef: Any, leaves: list[Any]) -> Any:
    it = iter(leaves)
    return _unflatten(treedef, it)


def _unflatten(treedef: Any, it) -> Any:
    if treedef is None:
        return next(it)
    kind, children = treedef
    if kind is dict:
        return {k: _unflatten(c, it) for k, c in children}
    values = [_unflatten(c, it) for c in children]
    if kind is tuple or kind is list:
        return kind(values)
    return kind(*values)  # namedtuple


def map_structure(fn: Callable[[Any], Any], x: Any) -> Any:
    leaves, treedef = flatten(x)
    return unflatten(treedef, [fn(v) for v in leaves])


def describe(treedef: Any) -> str:
    """A short text of a structure for error messages."""
    if treedef is None:
        return "leaf"
    kind, children = treedef
    if kind is dict:
        return "{" + ", ".join(f"{k!r}: {describe(c)}" for k, c in children) + "}"
    return f"{kind.__name__}(" + ", ".join(describe(c) for c in children) + ")"
