"""Where the replicas' Dask cluster comes from: an embedded LocalCluster the strategy owns (one
worker per replica, one GPU each where replicas compute on GPUs), or a connection to one the
user runs (address, Client or cluster object)."""

from __future__ import annotations

import contextlib
import copy
import logging
from typing import Any

from distributed import Client, LocalCluster, Security

from labdist import interrupts
from labdist.cluster import capacity, main_module, reaper, threads
from labdist.cluster.probe import probe_scheduler
from labdist.devices import pinning_backend
from labdist.errors import ClusterConnectionError
from labdist.shm import doorbell

DASHBOARD = "127.0.0.1:0"  # the embedded cluster's dashboard: this machine only, any port


def start_local_cluster(n_workers: int, device: str = "cpu", gpus: list[str] | None = None):
    """An embedded cluster: one single-threaded worker process per replica. Replicas that
    compute on GPUs (`device` "gpu", "auto" where a GPU is seen, "strict" with pretend GPUs)
    get one each: worker i is started with CUDA_VISIBLE_DEVICES naming `gpus[i]` (default:
    the GPUs visible here, `pinning_backend(device).visible_gpus()`), through dask-cuda where
    it is installed and the GPUs are CUDA's."""
    capacity.check_local_workers(n_workers, f"n_workers={n_workers}")
    main_module.check()  # a script whose top level the workers would run again: say so now
    reaper.collect()  # strategies nobody holds (a set-up cell run again) go first
    pinning = pinning_backend(device)
    gpus = pinning.visible_gpus() if gpus is None else list(gpus)
    if device == "gpu" and not gpus:
        raise ValueError("device='gpu' was requested but no GPU is visible (cupy + CUDA "
                         "needed); use device='auto' or 'cpu'")
    if gpus and n_workers > len(gpus):
        raise ValueError(
            f"num_replicas={n_workers} but {len(gpus)} GPU(s) are visible "
            f"(CUDA_VISIBLE_DEVICES entries {', '.join(gpus)}): each replica needs a GPU of "
            f"its own. Ask for at most {len(gpus)} replicas, or pass device='cpu'")
    doorbell.spin_seconds()  # a bad LABDIST_SPIN_US fails here, before any worker starts
    threads.export(n_workers)  # BLAS threads: the cores split among the replicas
    # glibc's memory thresholds (Dask's nanny makes a step's temporaries page-fault in again
    # every step) are set by each replica itself when it starts (replica/memory.py), not
    # through the nanny's pre-spawn environment: the nanny writes that into this process's
    # own os.environ, where every LocalCluster the user starts later would inherit it.
    # the kernel's interrupt (■) goes to its whole process group: never to the workers
    with interrupts.deaf_children():
        options = dict(threads_per_worker=1, dashboard_address=DASHBOARD,
                       silence_logs=logging.ERROR)
        if gpus and pinning.real_gpus:
            with contextlib.suppress(ImportError):
                from dask_cuda import LocalCUDACluster

                return LocalCUDACluster(n_workers=n_workers,
                                        CUDA_VISIBLE_DEVICES=gpus[:n_workers], **options)
        if gpus:
            cluster = PinnedLocalCluster(gpus[:n_workers], processes=True, **options)
            cluster.scale(n_workers)
            return cluster
        return LocalCluster(n_workers=n_workers, processes=True, **options)


class PinnedLocalCluster(LocalCluster):
    """A LocalCluster whose worker i sees only GPU `gpus[i]` (CUDA_VISIBLE_DEVICES, set in the
    worker process before anything can initialise CUDA)."""

    def __init__(self, gpus: list[str], **options: Any):
        self.gpus = list(gpus)
        super().__init__(n_workers=0, **options)

    def new_worker_spec(self) -> dict:
        spec = super().new_worker_spec()
        for name, worker in spec.items():
            if not isinstance(name, int) or name >= len(self.gpus):
                raise ValueError(f"PinnedLocalCluster: no GPU left for worker {name!r} (it has "
                                 f"{len(self.gpus)}: {', '.join(self.gpus)})")
            worker = spec[name] = copy.deepcopy(worker)
            options = worker.setdefault("options", {})
            options["env"] = {**options.get("env", {}), "CUDA_VISIBLE_DEVICES": self.gpus[name]}
        return spec


def connect(cluster: Any, timeout: float, security: Any = None) -> tuple[Client, bool]:
    """A Client for `cluster` (address, Client or cluster object) and whether we own it."""
    if isinstance(cluster, Client):
        if cluster.status not in ("newly-created", "connecting", "running"):
            raise ClusterConnectionError(
                f"cluster={cluster!r} is a distributed.Client that is {cluster.status}; pass "
                "an open Client, a scheduler address, a cluster object, or None"
            )
        return cluster, False
    if isinstance(cluster, str) or hasattr(cluster, "scheduler_address"):
        where = cluster if isinstance(cluster, str) else cluster.scheduler_address
        _check_tls(where, security)
        if isinstance(cluster, str):
            with contextlib.suppress(ValueError):  # no HOST:PORT: Dask's error below names it
                probe_scheduler(cluster, timeout)  # anything else there: one clear error
        try:
            client = Client(cluster, timeout=timeout, security=security,
                            direct_to_workers=True, set_as_default=False)
        except (OSError, TimeoutError, ValueError) as e:
            raise ClusterConnectionError(
                f"could not reach the Dask scheduler at {where!r} within {timeout:g} s "
                f"({e or type(e).__name__}). "
                "Check the address (tcp://host:8786), that `dask scheduler` is running there, "
                "or leave cluster=None to start an embedded local cluster."
            ) from None
        return client, True
    raise TypeError(
        f"cluster={cluster!r} is not supported; allowed: None (embedded LocalCluster), a "
        "scheduler address like 'tcp://127.0.0.1:8786', a distributed.Client, or a Dask "
        "cluster object"
    )


def _check_tls(address: Any, security: Any) -> None:
    """A tls:// address needs TLS credentials; without them distributed raises a bare TypeError
    (and leaves a Client that times out in its finalizer)."""
    if not (isinstance(address, str) and address.startswith("tls://")):
        return
    if security is None:
        security = Security()  # what Dask's config (distributed.comm.tls.*) gives
    if not isinstance(security, Security):
        return  # e.g. security=True: Dask makes temporary credentials
    if security.get_connection_args("client").get("ssl_context") is None:
        raise ClusterConnectionError(
            f"cluster={address!r} is a TLS address, but no TLS credentials were given: pass "
            "security=distributed.Security(tls_ca_file=..., tls_client_cert=..., "
            "tls_client_key=..., require_encryption=True), the one the scheduler was started "
            "with (or set distributed.comm.tls.* in Dask's config)")
