"""MultiWorkerMirroredStrategy: the mirrored strategy over every worker of an existing cluster,
possibly on many hosts (tf.distribute's name for it)."""

from __future__ import annotations

from typing import Any

from labdist.collectives import registry
from labdist.strategies.mirrored import MirroredStrategy

# TF's older knob: communication= value -> the transport= value it means
COMMUNICATIONS = {"auto": "auto", "ring": "tcp", "nccl": "nccl"}


class MultiWorkerMirroredStrategy(MirroredStrategy):
    """One replica per worker of `cluster` (a scheduler address, a Client or a cluster object).

    transport: as for MirroredStrategy ("auto", "shm", "tcp", "nccl"; default "auto").
    communication: TF's older spelling of it, accepted instead: "auto", "ring" (= "tcp":
    Dask comms only, reduce-scatter + all-gather between workers), or "nccl".
    compression, local_steps, outer_optimizer: less communication, as for MirroredStrategy.
    """

    _pipeline_per_replica = True  # one input pipeline per worker, and each replica has one

    def __init__(self, cluster: Any = None, communication: str | None = None, *,
                 transport: str | None = None, num_replicas: int | None = None,
                 device: str = "auto", collective_timeout: float = 30.0,
                 connect_timeout: float = 10.0, security: Any = None, compression: Any = None,
                 local_steps: int | None = None, outer_optimizer: Any = None,
                 fault_tolerance: str = "none", min_replicas: int = 1):
        if communication is not None and transport is not None:
            raise ValueError(
                f"communication={communication!r} and transport={transport!r} were both "
                "passed; pass only transport= (communication= is its older spelling)")
        if communication is not None:
            knob = ("communication", communication)
            transport = registry.parse(communication, "communication", COMMUNICATIONS)
        else:
            transport = "auto" if transport is None else transport
            knob = ("transport", transport)
        super().__init__(num_replicas=num_replicas, cluster=cluster, device=device,
                         collective_timeout=collective_timeout,
                         connect_timeout=connect_timeout, security=security,
                         transport=transport, compression=compression,
                         local_steps=local_steps, outer_optimizer=outer_optimizer,
                         fault_tolerance=fault_tolerance, min_replicas=min_replicas, _knob=knob)
        self._fixed_replicas = num_replicas

    def refresh(self) -> bool:
        """Re-form on the cluster's workers if they changed since the last call (a worker
        joined or left); variables keep their values. `fit` calls this before training."""
        self._check_open()
        with self._lock:  # no run of another thread may use the group being replaced
            group = self.group
            present = group.present_workers()
            if self._fixed_replicas is None:
                changed = present != sorted(group.workers)
            else:  # a fixed replica count: only a lost worker of ours matters
                changed = not set(group.workers) <= set(present)
            if not changed and not group.lost_replicas():
                return False
            self._reform(self._fixed_replicas)
            return True
