"""A replica's collectives endpoint: the one primitive algorithms need (exchange a message with
every peer for collective number `seq`, get all of theirs back in rank order) over its host
transport, plus a device transport for device arrays where the group has one.

Transports are swapped in (`use`) once the replica group has agreed on them; until then a
group member talks over Dask comms, which work between any workers.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from labdist import network
from labdist.aggregation import Aggregation
from labdist.collectives.compressed import CompressionState
from labdist.collectives.transports.protocol import (
    HOST,
    DeviceTransport,
    Endpoint,
    HostTransport,
)
from labdist.timing import phases

PERSISTENT_KEYS = 8  # persistent buffers a replica keeps (a model's gradients: one)


class Communicator:
    """What the algorithms and the Replica actor use; transports stay behind it."""

    def __init__(self, endpoint: Endpoint, host: HostTransport):
        self.endpoint = endpoint
        self.host = host
        self.device: DeviceTransport | None = None
        self.mailbox = endpoint.mailbox  # the Replica actor clears it and posts peer news
        self._scratch: dict[np.dtype, np.ndarray] = {}
        self._persistent: dict[Any, Any] = {}  # key -> array (`persistent`), oldest first
        self._background: ThreadPoolExecutor | None = None
        self.compression = CompressionState()  # the gradient all-reduce's compressor, residuals
        self.sent_bytes = 0  # array bytes this replica sent to peers, every collective

    @classmethod
    def local(cls) -> Communicator:
        """A single replica's (OneDeviceStrategy, parameter-server workers): no peers."""
        return cls(Endpoint("", 0, [""], timeout=30.0), SoloTransport())

    @property
    def rank(self) -> int:
        return self.endpoint.rank

    @property
    def world(self) -> int:
        return self.endpoint.world

    def start_run(self, run: int) -> None:
        """Begin run `run`: later messages are keyed by it."""
        self.host.start_run(run)
        if self.device is not None:
            self.device.start_run(run)

    def exchange(self, seq: int, sig: Any, payload: Any, what: str, phase: int = 0,
                 per_peer: bool = False, senders: range | None = None,
                 readers: range | None = None) -> list[tuple[Any, Any]]:
        """Send (sig, payload) to every peer; return every rank's (sig, payload), own included.

        With `per_peer`, `payload` is a list indexed by rank: peer d gets `payload[d]`, and
        what comes back from each peer is what it addressed to this rank. `senders` /
        `readers` narrow it (the shm transport only: shared.py decides when): see
        `ShmTransport.exchange`.
        """
        narrowed = senders is not None or readers is not None
        if senders is not None and self.rank not in senders:
            sent = 0
        else:
            sent = payload_bytes(payload, self.rank, self.world, per_peer)
            if readers is not None:  # only they read it
                sent = sent // max(self.world - 1, 1) * (len(readers) - (self.rank in readers))
        self.sent_bytes += sent
        start = phases.now()
        if narrowed:
            got = self.host.exchange(seq, phase, sig, payload, what, per_peer, senders, readers)
        else:
            got = self.host.exchange(seq, phase, sig, payload, what, per_peer)
        arrived = self.host.last_arrival
        if network.CURRENT is not None:  # a modelled link: the data moves no faster than it
            network.delay(sent, phases.now() - max(arrived or start, start))
        phases.RECORDER.collective(start, arrived, phases.now(),
                                   {"kind": what, "seq": seq, "bytes": sent,
                                    "peers": self.world - 1})
        return got

    def scratch(self, dtype: Any, n: int) -> np.ndarray:
        """A host array of `n` elements of `dtype` that the next call may hand out again: the
        algorithms' intermediate results, allocated (and page-faulted) once, not every step.
        Grows to the largest request; one per dtype."""
        dtype = np.dtype(dtype)
        buf = self._scratch.get(dtype)
        if buf is None or buf.size < n:
            buf = self._scratch[dtype] = np.empty(max(n, 2 * buf.size if buf is not None
                                                      else n), dtype)
        return buf[:n]

    def persistent(self, key: Any, n: int, dtype: Any, xp: Any = np) -> Any:
        """The flat `xp` array of `n` `dtype` elements kept under `key` (made on first use; the
        last PERSISTENT_KEYS keys are kept): a step's buffers, allocated once, not every step."""
        dtype = np.dtype(dtype)
        buf = self._persistent.get(key)
        if buf is None or buf.size != n or buf.dtype != dtype:
            if len(self._persistent) >= PERSISTENT_KEYS:
                self._persistent.pop(next(iter(self._persistent)))
            buf = self._persistent[key] = xp.empty(n, dtype)
        return buf

    def background(self) -> ThreadPoolExecutor:
        """This replica's one helper thread for collectives that overlap its step (made on
        first use, ended by `close`)."""
        if self._background is None:
            self._background = ThreadPoolExecutor(
                1, thread_name_prefix=f"labdist-collectives-{self.rank}")
        return self._background

    def device_for(self, backend, arrays: list[Any], agg: Aggregation) -> DeviceTransport | None:
        """The device transport, if it can take this all-reduce (else the data goes through
        the host transport)."""
        device = self.device
        return device if device is not None and device.supports(backend, arrays, agg) else None

    def use(self, transport: HostTransport | DeviceTransport) -> None:
        """Carry this layer's traffic over `transport` from now on."""
        if transport.layer == HOST:
            previous, self.host = self.host, transport
        else:
            previous, self.device = self.device, transport
        if previous is not None and previous is not transport:
            previous.close()

    def close(self) -> None:
        if self._background is not None:
            self._background.shutdown(wait=False)
            self._background = None
        for transport in (self.host, self.device):
            if transport is not None:
                transport.close()
        self.device = None


def payload_bytes(payload: Any, rank: int, world: int, per_peer: bool) -> int:
    """The array bytes a message puts on the wire to peers (objects other than arrays, and
    framing, not counted)."""
    if world == 1:
        return 0
    if per_peer:
        return sum(_array_bytes(p) for d, p in enumerate(payload) if d != rank)
    return _array_bytes(payload) * (world - 1)


def _array_bytes(x: Any) -> int:
    if isinstance(x, np.ndarray | np.generic):  # a 0-d sum (gradient + residual) is a scalar
        return x.nbytes
    if isinstance(x, list | tuple):
        return sum(_array_bytes(v) for v in x)
    return 0


class SoloTransport:
    """The one-replica group: nothing to send, so every exchange returns our own message."""

    name, layer, requirement, alone, bootstraps = "solo", HOST, "one replica", True, False
    last_arrival = None  # no peers: nothing arrives
    reads_in_place, cores = False, 1

    def probe(self) -> int:
        return 0

    def connect(self, probes: list[Any]) -> bool:
        return True

    def start_run(self, run: int) -> None:
        pass

    def exchange(self, seq, phase, sig, payload, what, per_peer) -> list[tuple[Any, Any]]:
        return [(sig, payload[0] if per_peer else payload)]

    def close(self) -> None:
        pass
