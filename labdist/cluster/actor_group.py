"""What a group of Dask actors owns and how it lets go: the base of the mirrored replica group
(dask_group.py) and the parameter-server group (parameter_server/actors.py)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from distributed import Client, Future

from labdist.cluster.local import connect, start_local_cluster
from labdist.errors import ClusterConnectionError
from labdist.timing.dashboard import proxied_link, show_replica_steps


class ActorGroup:
    """The embedded cluster it started (if any), the client it made (if any), and the futures
    of the actors it placed. `close` asks the actors to let go (`_close_actors`), cancels their
    futures, then closes what the group owns, never a client or cluster it was given."""

    def __init__(self) -> None:
        self.client: Client | None = None
        self._owned_cluster: Any = None
        self._owns_client = False
        self._futures: list[Future] = []
        self._closed = False

    def _connect(self, cluster: Any, local_workers: int, timeout: float,
                 security: Any = None, device: str = "cpu") -> None:
        """Use `cluster`, or start (and own) an embedded one of `local_workers` workers (one
        GPU each where replicas compute on `device` GPUs)."""
        if cluster is None:
            self._owned_cluster = cluster = start_local_cluster(local_workers, device)
        self.client, self._owns_client = connect(cluster, timeout, security)
        show_replica_steps(self.client)

    def take_over(self, old: ActorGroup) -> None:
        """Own what `old` owned (its embedded cluster, its client): `old` is being replaced."""
        self._owned_cluster, old._owned_cluster = old._owned_cluster, None
        self._owns_client, old._owns_client = old._owns_client, False

    def _start_actor(self, cls: type, address: str, key: str, *args: Any) -> Future:
        """Start the actor `cls(*args)` on the worker at `address`, and only there."""
        future = self.client.submit(cls, *args, actor=True, workers=[address],
                                    allow_other_workers=False, pure=False, key=key)
        self._futures.append(future)
        return future

    @staticmethod
    def gone(future: Future) -> bool:
        """The scheduler told the client this actor's worker (and so the actor) is gone."""
        return future.status not in ("finished", "pending")

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The client's event loop, where calls to the actors run."""
        return self.client.loop.asyncio_loop

    def add_local_worker(self) -> None:
        """Start one more worker on the embedded cluster this group owns (a worker that
        joins: quorum training takes it in)."""
        if self._owned_cluster is None:
            raise RuntimeError("this strategy runs on a cluster it did not start: add a worker "
                               "to that cluster (dask worker ...) and it joins at the next step")
        self._owned_cluster.scale(len(self._owned_cluster.worker_spec) + 1)

    @property
    def dashboard_link(self) -> str | None:
        if self._owned_cluster is None:
            return None
        return proxied_link(self.client.dashboard_link)

    def scheduler_lost(self) -> bool:
        """The client lost its scheduler (killed, or unreachable): it is reconnecting, or gave
        up and closed. Its workers close without it, and their actors with them."""
        return self.client is not None and self.client.status not in ("running",
                                                                      "newly-created")

    def scheduler_error(self) -> ClusterConnectionError:
        client = self.client
        address = getattr(getattr(client, "scheduler", None), "address", None)
        return ClusterConnectionError(
            f"lost the Dask scheduler at {address!r} (the client is {client.status}): "
            "without it the workers close, and the replicas' variable copies with them. Close "
            "this strategy and start a new one once the scheduler is back (restore from a "
            "checkpoint)")

    def present_workers(self) -> list[str]:
        return sorted(self.client.scheduler_info(n_workers=-1)["workers"])

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self.client is not None and self._futures:
                self._close_actors()
        finally:
            self._release()

    def _close_actors(self) -> None:
        """Ask the actors to release what they hold; must not raise (best effort)."""

    def _release(self) -> None:
        if self.client is not None and self._futures:
            with contextlib.suppress(Exception):
                self.client.cancel(self._futures)
        self._futures = []
        if self.client is not None and self._owns_client:
            with contextlib.suppress(Exception):
                self.client.close()
        if self._owned_cluster is not None:
            with contextlib.suppress(Exception):
                self._owned_cluster.close()
            self._owned_cluster = None
