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

    def reduce_to(self, reduce_op: Any, value: Any, destinations: Any, options: Any = None
                  ) -> Any:
        """TF's `extended.reduce_to`: `value` (per-replica, or one value) reduced across the
        replicas, for `destinations` (a variable of this strategy or a device string). labdist
        returns the reduced host value itself: where TF gives a mirrored value (a variable as
        destination) its components are all that one value."""
        self._check_destinations(destinations)
        return self._strategy.reduce(reduce_op, value, axis=None)

    def batch_reduce_to(self, reduce_op: Any, value_destination_pairs: Any,
                        options: Any = None) -> list:
        """`reduce_to` of each (value, destinations) pair, in order (TF's batched form)."""
        pairs = list(value_destination_pairs)
        for i, pair in enumerate(pairs):
            if not isinstance(pair, tuple | list) or len(pair) != 2:
                raise ValueError(f"value_destination_pairs[{i}]={pair!r}: each entry is a "
                                 "(value, destinations) pair")
            self._check_destinations(pair[1])
        return [self._strategy.reduce(reduce_op, v, axis=None) for v, _ in pairs]

    def _check_destinations(self, destinations: Any) -> None:
        s = self._strategy
        if isinstance(destinations, Variable):
            if destinations.strategy_id != s.id:
                raise ValueError(f"destinations={destinations!r} is a variable of another "
                                 f"strategy; use one of {s!r}'s, or a device string")
        elif not isinstance(destinations, str):
            raise ValueError(f"destinations={destinations!r} is not allowed; use a variable "
                             "of this strategy or a device string like '/cpu:0'")

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
