"""Which context code runs in: cross-replica (driver, inside `strategy.scope()`), replica (inside
`strategy.run`, on the replica's worker), or the default replica context (no strategy at all).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from labdist.replica import replica_context
from labdist.replica.captured_strategy import mixing_error, scope_in_a_step_error
from labdist.replica.replica_context import ReplicaContext

# A strategies.base.Strategy. Named, not imported: the strategies import this module, and
# this one only keeps them (a registry and a scope stack), never calls into their classes.
Strategy = Any

_scopes = threading.local()
_strategies: weakref.WeakValueDictionary[str, Strategy] = weakref.WeakValueDictionary()
_default: list[Strategy] = []
_default_factory: list[Callable[[], Strategy]] = []


def register(strategy: Strategy) -> None:
    _strategies[strategy.id] = strategy


def lookup(strategy_id: str) -> Strategy:
    try:
        return _strategies[strategy_id]
    except KeyError:
        raise ValueError(
            "this variable's strategy is closed (or lives in another process); "
            "its copies are gone"
        ) from None


def _stack() -> list:
    stack = getattr(_scopes, "stack", None)
    if stack is None:
        stack = _scopes.stack = []
    return stack


def enter_scope(strategy: Strategy) -> None:
    """TF's rules: one strategy at a time ("Mixing different tf.distribute.Strategy
    objects", on the driver and inside a step or update function), and not even the running
    strategy's scope inside its step (replica context); its update function may enter it,
    and so may the default strategy's steps (TF 2.21 lets them)."""
    ctx = replica_context.current()
    if ctx is not None:
        if strategy is not ctx.strategy:
            raise mixing_error(strategy, ctx.strategy)
        if ctx.mode == "replica" and not is_default(strategy):
            raise scope_in_a_step_error()
    stack = _stack()
    if stack and stack[-1] is not strategy:
        raise mixing_error(strategy, stack[-1])
    stack.append(strategy)


def exit_scope(strategy: Strategy) -> None:
    stack = _stack()
    if stack and stack[-1] is strategy:
        stack.pop()


def set_default_strategy(factory: Callable[[], Strategy]) -> None:
    """Name what makes the default strategy (strategies/one_device.py does, on import), so
    this module needs no import of the strategies that use it."""
    _default_factory[:] = [factory]


def default_strategy() -> Strategy:
    """The single-replica strategy variables use with no strategy in scope (made once)."""
    if not _default:
        if not _default_factory:
            raise RuntimeError("no default strategy is registered: import labdist first")
        _default.append(_default_factory[0]())
    return _default[0]


def is_default(strategy: Strategy) -> bool:
    """Whether `strategy` is the default strategy (made by `default_strategy()`)."""
    return bool(_default) and _default[0] is strategy


def scoped_strategy() -> Strategy | None:
    stack = _stack()
    return stack[-1] if stack else None


def get_strategy() -> Strategy:
    """The strategy in scope on the driver, else the default (single-replica) strategy;
    inside a step (or an `extended.update` function), the running strategy as a step sees it
    (`num_replicas_in_sync`; its cross-replica calls refused with TF's error)."""
    ctx = replica_context.current()
    if ctx is not None:
        return ctx.strategy
    return scoped_strategy() or default_strategy()


def has_strategy() -> bool:
    """True inside a (non-default) strategy's scope, step or update function (TF: the
    default strategy's steps have none)."""
    ctx = replica_context.current()
    if ctx is not None:
        return not is_default(ctx.strategy)
    return scoped_strategy() is not None


def in_cross_replica_context() -> bool:
    """True on the driver inside a scope, and inside an `extended.update` function (TF's
    update context is a cross-replica one; not the default strategy's, as in TF)."""
    ctx = replica_context.current()
    if ctx is not None:
        return ctx.mode == "update" and not is_default(ctx.strategy)
    return scoped_strategy() is not None


def get_replica_context() -> ReplicaContext | None:
    """The replica context inside `strategy.run`; None in cross-replica context (inside
    `strategy.scope()` on the driver, or an `extended.update` function); the default
    replica context with no strategy (also in the default strategy's update function)."""
    ctx = replica_context.current()
    if ctx is not None:
        if ctx.mode == "replica":
            return ctx
        return default_strategy().default_replica_context() if is_default(ctx.strategy) \
            else None
    if scoped_strategy() is not None:
        return None
    return default_strategy().default_replica_context()
