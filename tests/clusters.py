"""Clusters for tests that place parameter servers and workers themselves, or kill them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from distributed import Client

from labdist.cluster import start_local_cluster


@contextlib.contextmanager
def local_client(n_workers: int) -> Iterator[Client]:
    """A Client on a LocalCluster of its own (`n_workers` worker processes), for tests that
    place parameter servers and workers themselves or kill them; both closed after."""
    cluster = start_local_cluster(n_workers)
    client = Client(cluster, direct_to_workers=True, set_as_default=False)
    try:
        yield client
    finally:
        client.close()
        cluster.close()
