"""What a mirrored strategy captured by a step function becomes on the replica: a stand-in
that answers what a replica may ask (`num_replicas_in_sync`, `scope()`) and refuses the
cross-replica calls with TF's error instead of the strategy failing to pickle."""

from __future__ import annotations

from typing import Any

_HINTS = {
    "gather": "inside a step use ld.get_replica_context().all_gather(value, axis)",
    "reduce": "inside a step use ld.get_replica_context().all_reduce(op, value)",
    "run": "strategy.run cannot be called inside a step function",
}
CROSS_REPLICA = ("gather", "reduce", "run", "experimental_local_results",
                 "experimental_distribute_dataset", "distribute_datasets_from_function",
                 "experimental_distribute_values_from_function")


def cross_replica_error(method: str) -> RuntimeError:
    """TF's words for a cross-replica call made on a replica, naming the call."""
    hint = _HINTS.get(method, "call it on the driver, or in a merge_call function")
    return RuntimeError(f"strategy.{method} requires being in cross-replica context (the "
                        f"driver, or a merge_call function), not inside strategy.run; {hint}")


def scope_in_a_step_error() -> RuntimeError:
    """TF's words for `strategy.scope()` inside `strategy.run`."""
    return RuntimeError("strategy.scope() inside strategy.run: Method requires being in "
                        "cross-replica context, use get_replica_context().merge_call() (a step "
                        "cannot enter any strategy's scope: make variables and models before "
                        "strategy.run)")


class CapturedStrategy:
    """A mirrored strategy as a step function sees it on a replica."""

    def __init__(self, name: str, num_replicas_in_sync: int):
        self._name = name
        self.num_replicas_in_sync = num_replicas_in_sync

    def scope(self):
        """TF 2.21 refuses any strategy's scope inside a step (`RuntimeError`: the running
        strategy's needs cross-replica context; another's is "Mixing different
        tf.distribute.Strategy objects")."""
        raise scope_in_a_step_error()

    def __getattr__(self, name: str) -> Any:
        if name in CROSS_REPLICA:
            def refuse(*args, **kwargs):
                raise cross_replica_error(name)
            return refuse
        raise AttributeError(f"{self._name} has no attribute {name!r} inside a step function")

    def __repr__(self) -> str:
        return f"<{self._name} (inside a step, num_replicas_in_sync={self.num_replicas_in_sync})>"
