"""Single-replica strategies that run in the driver process: OneDeviceStrategy, and the default
strategy that variables use when no strategy is in scope."""

from __future__ import annotations

import weakref
from typing import Any

from labdist import context
from labdist.collectives import Communicator
from labdist.devices import get_backend
from labdist.replica.actor import ReplicaCore
from labdist.replica.replica_context import ReplicaContext
from labdist.strategies.base import Strategy


class LocalReplicaGroup:
    """One in-process replica: a `ReplicaGroup` (strategies/replica_group.py)."""

    num_replicas = 1
    runs_steps = True
    remote_input = False  # the replica is this process: input stays where it is

    def __init__(self, device: str):
        backend = get_backend(device)
        self.core = ReplicaCore(0, 1, backend, Communicator.local(), copy_results=True)

    def where(self, rank: int) -> str:
        return f"replica {rank} (in-process, {self.core.backend.name})"

    def create(self, var_id, host):
        self.core.create(var_id, host)

    def read(self, var_id, ranks):
        return [self.core.read(var_id) for _ in ranks]

    def write(self, var_id, mode, host, want):
        new = self.core.write(var_id, mode, host, bool(want))
        return [new for _ in want]

    def start_step(self, run_id, fn, args_r, kwargs_r, steps=1, forget=()):
        for key in forget:
            self.core.feeds.pop(key, None)
        return [self.core.start_step(run_id, fn, args_r[0], kwargs_r[0], steps).result()]

    def resume(self, run_id, values, errors, ranks=None):
        error = errors[0] if errors else None
        return [self.core.resume(values[0], error).result()]

    def lost_replicas(self) -> list[int]:
        return []  # in this process: it cannot be lost while we run

    def present_workers(self) -> list[str]:
        return []  # no cluster

    def reform(self, num_replicas: int | None = None) -> LocalReplicaGroup:
        raise RuntimeError("an in-process replica is never lost: there is nothing to re-form")

    def scatter(self, arrays: list[Any]) -> None:
        return None  # the replica reads the driver's arrays as they are

    def update(self, fn, args_r, kwargs_r) -> list[Any]:
        return [self.core.update(fn, args_r[0], kwargs_r[0])]

    def close(self) -> None:
        self.core.stop()


class OneDeviceStrategy(Strategy):
    """One replica in this process, on `device` ("auto": the GPU if there is one, else numpy)."""

    def __init__(self, device: str = "auto"):
        super().__init__(LocalReplicaGroup(device))
        # its steps run in this process: `ld.get_strategy()` there is this strategy, as in TF
        # (weakly held: the replica must not keep its strategy from being collected)
        self.group.core.owner = weakref.ref(self)

    def default_replica_context(self) -> ReplicaContext:
        """The replica context code sees with no strategy in scope (TF's default replica
        context): its one replica, here, with merge_call running in place."""
        return ReplicaContext(self.group.core, run_id=0,
                              merge_handler=lambda fn, args, kwargs: fn(self, *args, **kwargs),
                              strategy=self)


class DefaultStrategy(OneDeviceStrategy):
    """What variables and contexts use with no strategy in scope (host numpy, one replica)."""

    def __init__(self):
        super().__init__(device="cpu")

    def close(self) -> None:  # the default strategy lives as long as the process
        pass


context.set_default_strategy(DefaultStrategy)
