"""Dask comms: direct worker-to-worker messages (`worker.rpc`, TCP or UCX as Dask is
configured) into each peer's mailbox, never through the driver or the scheduler. Works
between any workers of a cluster, so it is every group's fallback."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from distributed.protocol import to_serialize

from labdist.collectives.plugin import HANDLER
from labdist.collectives.transports.protocol import HOST, Endpoint


class DaskTransport:
    """Messages over Dask comms; `exchange` is called from the replica's step thread."""

    name: ClassVar[str] = "tcp"
    layer: ClassVar[str] = HOST
    requirement: ClassVar[str] = "Dask comms between the replicas' workers"
    alone: ClassVar[bool] = True
    bootstraps: ClassVar[bool] = False
    last_arrival: float | None = None
    reads_in_place: ClassVar[bool] = False
    cores: int = 1

    def __init__(self, endpoint: Endpoint):
        self.endpoint = endpoint
        self.run = 0

    def probe(self) -> str:
        return self.endpoint.peers[self.endpoint.rank]

    def connect(self, probes: list[Any]) -> bool:
        return True  # the workers are in one cluster

    def start_run(self, run: int) -> None:
        self.run = run  # the Replica actor already cleared the mailbox, on the event loop

    def exchange(self, seq, phase, sig, payload, what, per_peer) -> list[tuple[Any, Any]]:
        loop = self.endpoint.worker.loop.asyncio_loop
        future = asyncio.run_coroutine_threadsafe(
            self._exchange(self.run, seq, phase, sig, payload, what, per_peer), loop)
        return future.result()

    def send(self, run: int, seq: int, phase: int, sig: Any, payload: Any,
             per_peer: bool) -> None:
        """Only send this rank's message of one exchange (from a thread other than the event
        loop's): another transport's path for a message it cannot carry."""
        ep = self.endpoint
        others = [r for r in range(ep.world) if r != ep.rank]

        async def send_all():
            shared = None if per_peer else to_serialize(payload)
            await asyncio.gather(*(
                self._send(r, run, seq, phase, sig,
                           to_serialize(payload[r]) if per_peer else shared)
                for r in others))
        asyncio.run_coroutine_threadsafe(send_all(), ep.worker.loop.asyncio_loop).result()

    def receive(self, run: int, seq: int, phase: int, src: int, what: str) -> tuple[Any, Any]:
        """Wait for `src`'s message of one exchange (sent by `send` or an exchange)."""
        ep = self.endpoint
        future = asyncio.run_coroutine_threadsafe(
            ep.mailbox.collect(run, seq, phase, [src], ep.timeout, what),
            ep.worker.loop.asyncio_loop)
        return future.result()[src]

    async def _exchange(self, run, seq, phase, sig, payload, what, per_peer):
        ep = self.endpoint
        others = [r for r in range(ep.world) if r != ep.rank]
        shared = None if per_peer else to_serialize(payload)
        sends = [
            asyncio.ensure_future(self._send(
                r, run, seq, phase, sig, to_serialize(payload[r]) if per_peer else shared))
            for r in others
        ]
        try:
            got = await ep.mailbox.collect(run, seq, phase, others, ep.timeout, what)
            self.last_arrival = ep.mailbox.last_arrival  # for the recorded `wait` (phases.py)
            await asyncio.gather(*sends)
        finally:
            for s in sends:
                if not s.done():
                    s.cancel()
        got[ep.rank] = (sig, payload[ep.rank] if per_peer else payload)
        return [got[r] for r in range(ep.world)]

    async def _send(self, dst, run, seq, phase, sig, payload):
        ep = self.endpoint
        rpc = ep.worker.rpc(ep.peers[dst])
        await getattr(rpc, HANDLER)(
            group=ep.group, run=run, seq=seq, phase=phase, src=ep.rank, sig=sig,
            payload=payload,
        )

    def close(self) -> None:
        pass  # nothing of its own: the mailbox belongs to the collectives plugin
