"""Transports. A Communicator gives a replica one primitive: exchange a message with every peer
for collective number `seq` and get all of theirs back, in rank order.

`LocalCommunicator` is the single-replica case. `PeerCommunicator` talks to the other workers
directly over Dask's comms (`worker.rpc`), never through the driver or the scheduler.
"""

from __future__ import annotations

import asyncio
from typing import Any

from distributed.protocol import to_serialize


class Communicator:
    """What algorithms need from a transport."""

    rank: int = 0
    world: int = 1
    timeout: float = 30.0

    def start_run(self, run: int) -> None:
        """Begin run `run`: later messages are keyed by it."""

    def exchange(self, seq: int, sig: Any, payload: Any, what: str, phase: int = 0,
                 per_peer: bool = False) -> list[tuple[Any, Any]]:
        """Send (sig, payload) to every peer; return every rank's (sig, payload), own included.

        With `per_peer`, `payload` is a list indexed by rank: peer d gets `payload[d]`, and
        what comes back from each peer is what it addressed to this rank.
        """
        raise NotImplementedError


class LocalCommunicator(Communicator):
    """One replica: nothing to exchange."""

    def exchange(self, seq, sig, payload, what, phase=0, per_peer=False):
        return [(sig, payload[0] if per_peer else payload)]


class PeerCommunicator(Communicator):
    """Direct worker-to-worker messages over Dask comms. Called from the replica's step thread."""

    def __init__(self, worker, group: str, rank: int, peers: list[str], timeout: float):
        from labdist.collectives.plugin import HANDLER, get_plugin

        self.worker = worker
        self.group = group
        self.rank = rank
        self.world = len(peers)
        self.peers = peers
        self.timeout = timeout
        self.mailbox = get_plugin(worker).mailbox(group)
        self._handler = HANDLER
        self._loop = worker.loop.asyncio_loop
        self.run = 0
        self.shm = None  # a ShmChannel once the replicas know they share this host
        self.nccl = None  # an NcclChannel when every replica computes on a GPU

    def start_run(self, run: int) -> None:
        self.run = run  # the Replica actor already cleared the mailbox, on the event loop
        if self.shm is not None:
            self.shm.messages = 0

    def exchange(self, seq, sig, payload, what, phase=0, per_peer=False):
        if self.shm is not None:  # same host: through shared memory, no event-loop hops
            return self.shm.exchange(self, seq, phase, sig, payload, what, per_peer)
        future = asyncio.run_coroutine_threadsafe(
            self._exchange(self.run, seq, phase, sig, payload, what, per_peer), self._loop
        )
        return future.result()

    async def _exchange(self, run, seq, phase, sig, payload, what, per_peer):
        others = [r for r in range(self.world) if r != self.rank]
        shared = None if per_peer else to_serialize(payload)
        sends = [
            asyncio.ensure_future(self._send(
                r, run, seq, phase, sig, to_serialize(payload[r]) if per_peer else shared))
            for r in others
        ]
        try:
            got = await self.mailbox.collect(run, seq, phase, others, self.timeout, what)
            await asyncio.gather(*sends)
        finally:
            for s in sends:
                if not s.done():
                    s.cancel()
        got[self.rank] = (sig, payload[self.rank] if per_peer else payload)
        return [got[r] for r in range(self.world)]

    async def _send(self, dst, run, seq, phase, sig, payload):
        rpc = self.worker.rpc(self.peers[dst])
        await getattr(rpc, self._handler)(
            group=self.group, run=run, seq=seq, phase=phase, src=self.rank, sig=sig,
            payload=payload,
        )
