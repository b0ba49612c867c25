"""`strategy.extended`: the lower-level cross-replica calls used inside merge_call."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from labdist import nest
from labdist.enums import ReduceOp
from labdist.replica import replica_context
from labdist.replica.captured_strategy import cross_replica_error
from labdist.values import Mirrored, PerReplica
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
        `fn` runs in cross-replica context, as TF's update context is
        (`ld.in_cross_replica_context()` is True, `ld.get_replica_context()` None), but on
        the replicas' workers: the strategy's cross-replica calls are refused there.
        """
        s = self._strategy
        s._check_open()
        if replica_context.current() is not None:
            raise cross_replica_error("extended.update")
        if not isinstance(var, Variable) or var.strategy_id != s.id:
            raise ValueError(f"var={var!r} is not a variable of {s!r}")
        n = s.num_replicas_in_sync
        with s._lock:
            updating, s._updating = s._updating, True  # `fn` may capture the strategy
            try:
                args_r = [s._select((var, *args), r, "args") for r in range(n)]
                kwargs_r = [s._select(kwargs or {}, r, "kwargs") for r in range(n)]
                results = s.group.update(fn, args_r, kwargs_r)
            finally:
                s._updating = updating
        if not group:
            return tuple(results)
        return s._regroup(results, "the update function's results")

    def reduce_to(self, reduce_op: ReduceOp | str, value: Any, destinations: Any,
                  options: None = None) -> Any:
        """TF's `extended.reduce_to`: `value` (a PerReplica, a variable, a structure of them,
        or a value that is the same everywhere) reduced across the replicas, for
        `destinations`: a variable of this strategy or a PerReplica (every replica: a
        `Mirrored` of the reduced value at each leaf, as TF gives it), or a device string
        like "/cpu:0" (the reduced host value itself). With one replica, the value itself
        either way (TF's one-device `Mirrored` is the plain tensor)."""
        op = self._check_reduce(reduce_op, options, "reduce_to")
        self._check_destinations(destinations, "destinations")
        return self._reduced(op, value, destinations)

    def batch_reduce_to(self, reduce_op: ReduceOp | str, value_destination_pairs: Any,
                        options: None = None) -> list[Any]:
        """`reduce_to` of each (value, destinations) pair, in order (TF's batched form); every
        pair is checked before any is reduced."""
        op = self._check_reduce(reduce_op, options, "batch_reduce_to")
        if isinstance(value_destination_pairs, str | bytes | dict) or not isinstance(
                value_destination_pairs, Iterable):
            raise TypeError(f"value_destination_pairs={value_destination_pairs!r} is not "
                            "allowed; use a list of (value, destinations) pairs")
        pairs = list(value_destination_pairs)
        for i, pair in enumerate(pairs):
            if not isinstance(pair, tuple | list) or len(pair) != 2:
                raise TypeError(f"value_destination_pairs[{i}]={pair!r} is not allowed; each "
                                "entry is a (value, destinations) pair")
            self._check_destinations(pair[1], f"value_destination_pairs[{i}][1]")
        return [self._reduced(op, value, destinations) for value, destinations in pairs]

    def _check_reduce(self, reduce_op: Any, options: Any, method: str) -> ReduceOp:
        """What reduce_to and batch_reduce_to check first: cross-replica context, the op
        (TF's ValueError "... is not a valid ReduceOp"), no CommunicationOptions."""
        self._strategy._check_open()
        if replica_context.current() is not None:
            raise cross_replica_error(f"extended.{method}")
        op = ReduceOp.parse(reduce_op, "reduce_op")
        if options is not None:
            raise ValueError(f"options={options!r} is not supported: labdist has no "
                             "CommunicationOptions (its collectives choose their own "
                             "transport); pass None")
        return op

    def _reduced(self, op: ReduceOp, value: Any, destinations: Any) -> Any:
        s = self._strategy
        reduced = s.reduce(op, value, axis=None)
        n = s.num_replicas_in_sync
        if isinstance(destinations, str) or n == 1:
            return reduced
        return nest.map_structure(lambda leaf: Mirrored([leaf] * n), reduced)

    def _check_destinations(self, destinations: Any, name: str) -> None:
        s = self._strategy
        n = s.num_replicas_in_sync
        if isinstance(destinations, Variable):
            if destinations.strategy_id != s.id:
                raise ValueError(f"{name}={destinations!r} is a variable of another strategy; "
                                 f"use one of {s!r}'s, a PerReplica value of it, or a device "
                                 "string")
        elif isinstance(destinations, PerReplica):
            if len(destinations) != n:
                raise ValueError(f"{name} is a PerReplica of {len(destinations)} components, "
                                 f"but {s!r} has {n} replicas")
        elif not isinstance(destinations, str) or not destinations.strip():
            raise ValueError(f"{name}={destinations!r} is not allowed; use a variable of this "
                             "strategy, a PerReplica value of it, or a device string like "
                             "'/cpu:0'")

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
