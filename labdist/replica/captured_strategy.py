"""What a mirrored strategy captured by a step function becomes on the replica: a stand-in
that answers what a replica may ask (`num_replicas_in_sync`) and refuses the cross-replica
calls, and any `scope()`, with TF's errors instead of the strategy failing to pickle."""

from __future__ import annotations

import contextlib
from typing import Any

_HINTS = {
    "gather": "inside a step use ld.get_replica_context().all_gather(value, axis)",
    "reduce": "inside a step use ld.get_replica_context().all_reduce(op, value)",
    "run": "strategy.run cannot be called inside a step function",
    "extended.reduce_to": "inside a step use ld.get_replica_context().all_reduce(op, value)",
    "extended.batch_reduce_to": "inside a step use ld.get_replica_context().all_reduce(op, "
                                "value)",
    "extended.update": "call it in a merge_call function",
}
CROSS_REPLICA = ("gather", "reduce", "run", "experimental_local_results",
                 "experimental_distribute_dataset", "distribute_datasets_from_function",
                 "experimental_distribute_values_from_function")
EXTENDED_CROSS_REPLICA = ("reduce_to", "batch_reduce_to", "update")


def cross_replica_error(method: str) -> RuntimeError:
    """TF's words for a cross-replica call made on a replica, naming the call."""
    hint = _HINTS.get(method, "call it on the driver, or in a merge_call function")
    return RuntimeError(f"strategy.{method} requires being in cross-replica context (the "
                        f"driver, or a merge_call function), not inside strategy.run; {hint}")


def scope_in_a_step_error() -> RuntimeError:
    """TF's words for the running strategy's `scope()` inside `strategy.run`."""
    return RuntimeError("strategy.scope() inside strategy.run: Method requires being in "
                        "cross-replica context, use get_replica_context().merge_call() (a step "
                        "cannot enter any strategy's scope: make variables and models before "
                        "strategy.run)")


def mixing_error(entered: Any, running: Any) -> RuntimeError:
    """TF's words for entering another strategy's scope where `running`'s is current (its
    step, its update function, or its scope on the driver)."""
    return RuntimeError(
        f"Mixing different tf.distribute.Strategy objects: {entered!r} is not {running!r}; "
        "one strategy at a time (leave the other strategy's scope first; a step or update "
        "function cannot enter another strategy's scope)")


class CapturedStrategy:
    """A mirrored strategy as a step (or `extended.update`) function sees it on a replica.

    `runs_in`: where this strategy's own function runs here: "replica" (its step:
    `ld.get_strategy()` there is this one), "update" (its `extended.update` function), or
    None (another strategy's function captured it). The driver says which when it pickles
    the strategy. Its `scope()` is refused in its step, as TF refuses it in replica context,
    and allowed in its update function, which TF runs in cross-replica context; another
    strategy's scope is "Mixing different tf.distribute.Strategy objects" everywhere."""

    def __init__(self, name: str, num_replicas_in_sync: int, runs_in: str | None = "replica"):
        if runs_in not in ("replica", "update", None):
            raise ValueError(f"runs_in={runs_in!r} is not allowed; use 'replica', 'update' "
                             "or None")
        self._name = name
        self.num_replicas_in_sync = num_replicas_in_sync
        self._runs_in = runs_in
        self.extended = CapturedExtended(name)

    def scope(self) -> contextlib.AbstractContextManager[CapturedStrategy]:
        if self._runs_in is None:
            raise mixing_error(self, "the strategy running this function")
        if self._runs_in == "update":
            return contextlib.nullcontext(self)
        raise scope_in_a_step_error()

    def __getattr__(self, name: str) -> Any:
        if name in CROSS_REPLICA:
            def refuse(*args, **kwargs):
                raise cross_replica_error(name)
            return refuse
        raise AttributeError(f"{self._name} has no attribute {name!r} inside a step function")

    def __repr__(self) -> str:
        return f"<{self._name} (inside a step, num_replicas_in_sync={self.num_replicas_in_sync})>"


class CapturedExtended:
    """`strategy.extended` inside a step: its calls need cross-replica context (TF's
    RuntimeError), which a replica never is."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, name: str) -> Any:
        if name in EXTENDED_CROSS_REPLICA:
            def refuse(*args, **kwargs):
                raise cross_replica_error(f"extended.{name}")
            return refuse
        raise AttributeError(f"{self._name}.extended has no attribute {name!r} inside a step "
                             "function")
