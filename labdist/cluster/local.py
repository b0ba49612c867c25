"""Where the replicas' Dask cluster comes from: an embedded LocalCluster the strategy owns, or
a connection to one the user runs (address, Client or cluster object)."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import dask
from distributed import Client, Security

from labdist.backend import gpu_count
from labdist.errors import ClusterConnectionError


def start_local_cluster(n_workers: int):
    """An embedded cluster: one single-threaded worker process per replica (one GPU each with
    dask-cuda when GPUs are present)."""
    # Dask's nanny sets MALLOC_TRIM_THRESHOLD_, which makes numpy temporaries ~2x slower.
    with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}):
        if gpu_count() > 0:
            with contextlib.suppress(ImportError):
                from dask_cuda import LocalCUDACluster

                return LocalCUDACluster(n_workers=n_workers, threads_per_worker=1,
                                        silence_logs=logging.ERROR)
        from distributed import LocalCluster

        return LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                            dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR)


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
        try:
            client = Client(cluster, timeout=timeout, security=security,
                            direct_to_workers=True, set_as_default=False)
        except (OSError, TimeoutError, ValueError) as e:
            raise ClusterConnectionError(
                f"could not reach the Dask scheduler at {where!r} within {timeout:g} s ({e}). "
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
