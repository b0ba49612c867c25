"""MirroredStrategy: synchronous replicas on Dask workers, kept in step by peer all-reduce."""

from __future__ import annotations

from typing import Any

from labdist import checks
from labdist.cluster import capacity
from labdist.collectives import registry
from labdist.devices import DEVICES
from labdist.quorum import training as quorum
from labdist.strategies.base import Strategy
from labdist.strategies.communication_modes import CommunicationModes, parse_modes


class MirroredStrategy(Strategy):
    """One replica per Dask worker; variables mirrored on every replica.

    num_replicas: replicas (None: one per GPU if there are GPUs, else 2 for an embedded
        cluster, or every worker of `cluster`).
    cluster: None (start and own an embedded LocalCluster), a scheduler address, a
        `distributed.Client`, or a Dask cluster object (used, never closed).
    devices: TensorFlow's way to say both (also as the first argument): a list of device
        names, one replica each, `["/gpu:0", "/gpu:1"]` or `["cpu:0", "cpu:1"]`.
    device: "auto" (GPU if the worker has one), "cpu", "gpu", or "strict" (a cupy-like test
        double that refuses implicit host conversion).
    collective_timeout: seconds a replica waits for its peers in one collective; also, plus
        5 s, how long the driver waits for a replica once a peer has reported (then
        `ReplicaUnresponsiveError` names it: a frozen worker).
    connect_timeout: seconds to reach the scheduler and to wait for enough workers.
    transport: "auto" (collectives through shared memory when all replicas share a host,
        else Dask comms, and GPU replicas' data through NCCL when every replica can; steps
        sent over a direct socket lane unless Dask uses TLS), "shm" (require shared memory),
        "tcp" (Dask comms only, for collectives and steps), or "nccl" (require NCCL between
        GPU replicas). The values come from collectives/registry.py.
    compression: how gradients travel in the all-reduce of `fit` and
        `optimizer.apply_gradients`: "none", "fp16", "bf16", `ld.compression.TopK(ratio)` or
        `ld.compression.PowerSGD(rank)`, with error feedback (docs/less_communication.md).
    local_steps: None (synchronise every step), or H: local SGD / DiLoCo, each replica takes
        H optimizer steps on its own, then the replicas average their weight change.
    outer_optimizer: with local_steps, what applies that averaged change (DiLoCo:
        `ld.optimizers.SGD(0.7, momentum=0.9, nesterov=True)`; None: plain averaging).
    fault_tolerance: "none" (a lost worker stops the step with ReplicaLostError) or "quorum":
        `model.fit` goes on with the replicas alive at each step, undoing and re-running an
        unfinished step among the survivors, and takes in workers that join at the next step
        boundary (docs/design.md, "Quorum training").
    min_replicas: in quorum mode, the fewest replicas training goes on with; below it
        `QuorumLostError` names the lost workers.
    """

    # TF 2.21: experimental_distribute_values_from_function wraps even one replica's value
    # (run and all_gather give it plain)
    _values_per_replica_with_one = True

    def __init__(self, num_replicas: int | None = None, cluster: Any = None, *,
                 devices: Any = None, device: str = "auto", collective_timeout: float = 30.0,
                 connect_timeout: float = 10.0, security: Any = None,
                 transport: str = "auto", compression: Any = None, local_steps: int | None = None,
                 outer_optimizer: Any = None, fault_tolerance: str = "none",
                 min_replicas: int = 1, _knob: tuple[str, str] | None = None):
        if isinstance(num_replicas, list | tuple) and devices is None:
            devices, num_replicas = num_replicas, None  # TF's first argument: the devices
        if devices is not None:
            if num_replicas is not None:
                raise ValueError(f"num_replicas={num_replicas!r} and devices={devices!r}: give "
                                 "one of them (a replica per device)")
            num_replicas, device = device_list(devices, device)
        num_replicas = checks.integer("num_replicas", num_replicas, 1, optional=True)
        modes = parse_modes(compression, local_steps, outer_optimizer)
        if fault_tolerance not in quorum.FAULT_TOLERANCE:
            checks.refuse("fault_tolerance", fault_tolerance,
                          " or ".join(repr(f) for f in quorum.FAULT_TOLERANCE))
        min_replicas = checks.integer("min_replicas", min_replicas, 1, num_replicas)
        if fault_tolerance != "quorum" and min_replicas != 1:
            checks.refuse("min_replicas", min_replicas,
                          "1 unless fault_tolerance='quorum' (only quorum training goes on "
                          "with fewer replicas)")
        if device not in DEVICES:
            raise ValueError(f"device={device!r} is not supported; allowed: {', '.join(DEVICES)}")
        transport = registry.parse(transport, "transport")
        for name, value in (("collective_timeout", collective_timeout),
                            ("connect_timeout", connect_timeout)):
            checks.positive(name, value, unit="seconds")
        if cluster is None and num_replicas is not None:
            capacity.check_local_workers(num_replicas, f"num_replicas={num_replicas}")
        from labdist.cluster.dask_group import DaskReplicaGroup

        super().__init__(DaskReplicaGroup(num_replicas, cluster, device, float(collective_timeout),
                                          float(connect_timeout), security, transport,
                                          _knob))
        self._modes = CommunicationModes(self.run, self.experimental_local_results, modes)
        try:
            self._modes.send()
        except BaseException:  # no strategy to hand back: release what it started
            self.close()
            raise
        if fault_tolerance == "quorum":
            if self.num_replicas_in_sync < min_replicas:
                have = self.num_replicas_in_sync
                self.close()
                checks.refuse("min_replicas", min_replicas,
                              f"at most the {have} replica(s) this cluster has")
            self.use_quorum(quorum.Quorum(self, self._lock, self._run_ids, min_replicas,
                                          num_replicas))

    def _on_new_group(self) -> None:
        self._modes.send()  # new replicas start without the modes

    # -- less communication (strategies/communication_modes.py) ---------------------------
    @property
    def compression(self) -> Any:
        """The gradient all-reduce's compressor (None: plain). Settable between steps:
        'none', 'fp16', 'bf16', or `ld.compression.TopK(ratio)` / `PowerSGD(rank)` / ...;
        error-feedback residuals carry over a change, so no gradient is lost."""
        return self._modes.compressor

    @compression.setter
    def compression(self, value: Any) -> None:
        self._modes.set_compression(value)

    @property
    def local_steps(self) -> int | None:
        """Steps each replica takes on its own between synchronisations (None: every step)."""
        return None if self._modes.local_sgd is None else self._modes.local_sgd.local_steps

    @property
    def outer_optimizer(self) -> Any:
        """The optimizer applying the averaged pseudo-gradient (None: plain averaging)."""
        local_sgd = self._modes.local_sgd
        return None if local_sgd is None else local_sgd.outer_optimizer

    def set_local_sgd(self, local_steps: int | None, outer_optimizer: Any = None) -> None:
        """Switch local SGD / DiLoCo on (`local_steps=H`), change it, or off (None), at the
        next step boundary. Turning it off closes a round in progress with its outer step
        first; a new H applies to the round in progress (it closes once H steps are done)."""
        self._modes.set_local_sgd(local_steps, outer_optimizer)

    def communication_stats(self) -> list[dict[str, Any]]:
        """Per replica: `bytes_sent` (array bytes sent to peers by every collective so far),
        `compressed_reductions`, `residual_norm` (error feedback's), `inner_steps`,
        `outer_steps` and `synced_steps` (updates applied locally, rounds closed, steps
        all-reduced)."""
        return self._modes.stats()

    @property
    def workers(self) -> list[str]:
        """The worker address of each replica, in replica order."""
        return list(self.group.workers)

    @property
    def replicas(self) -> list[dict]:
        """Each replica, in replica order: rank, worker address, pid, backend, and the device
        it computes on ("cpu", or which GPU: its PCI bus id and CUDA_VISIBLE_DEVICES)."""
        return [dict(info) for info in self.group.infos]

    @property
    def transport(self) -> str:
        """"shm" or "tcp": how this strategy's collectives move host data."""
        return self.group.transport

    @property
    def uses_nccl(self) -> bool:
        """Whether all-reduces of GPU replicas go through NCCL (else through the host)."""
        return self.group.device_transport == "nccl"

    @property
    def client(self):
        """The distributed.Client this strategy uses."""
        return self.group.client

    @property
    def dashboard_link(self) -> str | None:
        """The Dask dashboard of the embedded cluster (None for external clusters)."""
        return self.group.dashboard_link


def device_list(devices: Any, device: str) -> tuple[int, str]:
    """TensorFlow's `devices=["/gpu:0", "/gpu:1"]` as labdist says it: one replica per entry
    (each on a Dask worker of its own), on GPUs or on host arrays as the names say."""
    names = list(devices) if isinstance(devices, list | tuple) else None
    kinds = set()
    for name in names or [None]:
        kind = (name.lower().rsplit("/", 1)[-1].rsplit("device:", 1)[-1].split(":")[0]
                if isinstance(name, str) else None)
        if kind not in ("cpu", "gpu"):
            checks.refuse("devices", devices, "a non-empty list of device names like "
                          "['/gpu:0', '/gpu:1'] or ['cpu:0', 'cpu:1'] (one replica each)")
        kinds.add(kind)
    if len(kinds) > 1:
        checks.refuse("devices", devices, "devices of one kind: all CPUs or all GPUs")
    kind = kinds.pop()
    if device not in ("auto", kind):
        raise ValueError(f"devices={devices!r} and device={device!r} disagree; give one")
    return len(names), kind

