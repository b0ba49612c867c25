"""`strategy.extended`: the lower-level cross-replica calls used inside merge_call."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from labdist.replica import replica_context
from labdist.variables import Variable

if TYPE_CHECKING:
    from labdist.strategies.base import Strategy

class StrategyExtended:
    """`strategy.extended`: the lower-level calls used inside merge_call."""

    def __init__(self, strategy: Strategy):
        self._strategy = strategy

    def update(self, var: Variable, fn: Callable, args: tuple = (), kwargs: dict | None = None,
               group: bool = True) -> Any:
        """Run `fn(var, *args)` on every replica with writes going to that replica's copy only.

        Per-replica args give each replica its component (as merge_call's reduced values do).
        """
        s = self._strategy
        s._check_open()
        if replica_context.current() is not None:
            raise RuntimeError("extended.update is a cross-replica call: use it in merge_call")
        if not isinstance(var, Variable) or var.strategy_id != s.id:
            raise ValueError(f"var={var!r} is not a variable of {s!r}")
        n = s.num_replicas_in_sync
        args_r = [s._select((var, *args), r, "args") for r in range(n)]
        kwargs_r = [s._select(kwargs or {}, r, "kwargs") for r in range(n)]
        with s._lock:
            results = s.group.update(fn, args_r, kwargs_r)
        if not group:
            return tuple(results)
        return s._regroup(results, "the update function's results")

    # -- variable copies (what `Variable` reads and writes through) ------------------------------
    def create_copies(self, var_id: int, host: np.ndarray) -> None:
        """Give variable `var_id` a copy of `host` on every replica."""
        s = self._strategy
        s._check_open()
        with s._replicas_lock():
            s.group.create(var_id, host)
            s._variable_ids.append(var_id)

    def read_copies(self, var_id: int, ranks: Iterable[int]) -> list[np.ndarray]:
        """The copies of variable `var_id` held by `ranks`, as host arrays."""
        s = self._strategy
        s._check_open()
        with s._replicas_lock():
            return s.group.read(var_id, list(ranks))

    def write_copies(self, var_id: int, mode: str, host: np.ndarray,
                     want: Iterable[int]) -> list[np.ndarray]:
        """Apply `mode` ("assign", "assign_add", "assign_sub") of `host` to every replica's
        copy of `var_id`; returns the new copies of the ranks in `want`."""
        s = self._strategy
        s._check_open()
        with s._replicas_lock():
            return s.group.write(var_id, mode, host, list(want))
