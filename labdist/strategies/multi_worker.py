"""MultiWorkerMirroredStrategy: the mirrored strategy over every worker of an existing cluster,
possibly on many hosts (tf.distribute's name for it)."""

from __future__ import annotations

from typing import Any

from labdist.strategies.mirrored import MirroredStrategy

COMMUNICATIONS = ("auto", "ring", "nccl")


class MultiWorkerMirroredStrategy(MirroredStrategy):
    """One replica per worker of `cluster` (a scheduler address, a Client or a cluster object).

    communication: "auto" (shared memory among replicas on one host, else Dask comms),
    "ring" (Dask comms only: reduce-scatter + all-gather between workers), or "nccl" (every
    replica on a GPU: all-reduce through NCCL; "auto" also picks NCCL when every replica can).
    """

    def __init__(self, cluster: Any = None, communication: str = "auto", *,
                 num_replicas: int | None = None, device: str = "auto",
                 collective_timeout: float = 30.0, connect_timeout: float = 10.0,
                 security: Any = None):
        if communication not in COMMUNICATIONS:
            raise ValueError(f"communication={communication!r} is not supported; allowed: "
                             f"{', '.join(COMMUNICATIONS)}")
        super().__init__(num_replicas=num_replicas, cluster=cluster, device=device,
                         collective_timeout=collective_timeout,
                         connect_timeout=connect_timeout, security=security,
                         transport="tcp" if communication == "ring" else "auto",
                         _device_collectives={"ring": "host"}.get(communication, communication))
        self._fixed_replicas = num_replicas

    def refresh(self) -> bool:
        """Re-form on the cluster's workers if they changed since the last call (a worker
        joined or left); variables keep their values. `fit` calls this before training."""
        self._check_open()
        group = self._group
        present = group.present_workers()
        if self._fixed_replicas is None:
            changed = present != sorted(group.workers)
        else:  # a fixed replica count: only a lost worker of ours matters
            changed = not set(group.workers) <= set(present)
        if not changed and not group.lost_replicas():
            return False
        self._reform(self._fixed_replicas)
        return True
