"""Same-host transport: each replica publishes its collective messages in files under /dev/shm
that its peers map and read in place, and signals with a stamp in a small control file
(shm_area.py). No socket copies and no event-loop round trips; the Dask mailbox is still
consulted while waiting, so a peer that took another path, failed, or never comes is reported
as on Dask comms.

Message k goes to slot k % 2. Rank r writes a slot again only with message k + 2, after it
read every peer's message k + 1, which a peer publishes only after it finished with r's
message k: two slots are enough. Stamps (run << 24 | k) rely on aligned 8-byte stores being
seen in program order (x86-64's memory model).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import secrets
import time
from typing import Any, ClassVar

import numpy as np

from labdist.collectives.transports import shm_area as area
from labdist.collectives.transports.base import HOST, Endpoint
from labdist.errors import CollectiveMismatchError, CollectiveTimeoutError

# A waiting replica yields (sleep(0)) this long before it backs off to short sleeps: peers in
# step are usually microseconds apart, and a sleep of even 20 us costs more than it saves.
SPIN_SECONDS = 2e-3


class ShmTransport:
    """One replica's side of the shared-memory transport (`exchange` runs on its step thread).
    Its probe is (control path, token): a peer that can read the token shares this /dev/shm."""

    name: ClassVar[str] = "shm"
    layer: ClassVar[str] = HOST
    requirement: ClassVar[str] = "every replica on one host with a shared /dev/shm"
    alone: ClassVar[bool] = False

    def __init__(self, endpoint: Endpoint):
        self.endpoint = endpoint
        self.run = 0
        self.messages = 0  # this run's messages so far; reset when a run starts
        self._prefix = os.path.join(
            area.SHM_DIR, f"labdist-{endpoint.group[:16]}-{endpoint.rank}-{os.getpid()}")
        self.token = secrets.token_hex(8)
        self._control: area.Mapping | None = None
        self._words: list[np.ndarray] = []
        self._data: area.Mapping | None = None
        self._generation = 0
        self._peer_prefix: dict[int, str] = {}
        self._peer_words: dict[int, list[np.ndarray]] = {}
        self._peer_controls: list[area.Mapping] = []
        self._peer_data: dict[int, area.Mapping] = {}

    def probe(self) -> tuple[str, str] | None:
        if not area.available():
            return None
        area.remove_orphans()
        path = f"{self._prefix}-control"
        self._control = area.Mapping(path, area.CONTROL_BYTES, create=True)
        self._control.bytes[:16] = np.frombuffer(self.token.encode(), np.uint8)
        self._words = area.slot_words(self._control)
        return path, self.token

    def connect(self, probes: list[Any]) -> bool:
        """Map the peers' control files, if every one is readable here."""
        peers = {r: p for r, p in enumerate(probes) if r != self.endpoint.rank}
        if not area.can_reach(list(peers.values())):
            return False
        for rank, (path, _) in peers.items():
            control = area.Mapping(path, area.CONTROL_BYTES, create=False)
            self._peer_controls.append(control)
            self._peer_words[rank] = area.slot_words(control)
            self._peer_prefix[rank] = path.removesuffix("-control")
        return True

    def start_run(self, run: int) -> None:
        self.run, self.messages = run, 0

    # -- one exchange -------------------------------------------------------------------------
    def exchange(self, seq: int, phase: int, sig: Any, payload: Any, what: str,
                 per_peer: bool) -> list[tuple[Any, Any]]:
        """Arrays that come back are read-only views of the peers' areas: valid until this
        replica's next collective."""
        run, rank, world = self.run, self.endpoint.rank, self.endpoint.world
        k, self.messages = self.messages, self.messages + 1  # the same count on every replica
        stamp = (run << 24) | k
        message = payload
        if per_peer:  # peers read only their part; don't publish our own
            message = [None if r == rank else p for r, p in enumerate(payload)]
        self._publish(k % 2, stamp, (sig, message))
        got: list[tuple[Any, Any]] = []
        for r in range(world):
            if r == rank:
                got.append((sig, payload[rank] if per_peer else payload))
                continue
            peer_sig, peer_payload = self._receive(r, k % 2, stamp, seq, phase, what)
            got.append((peer_sig, peer_payload[rank] if per_peer else peer_payload))
        return got

    def _publish(self, slot: int, stamp: int, message: Any) -> None:
        buffers: list[pickle.PickleBuffer] = []
        inner = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
        raws = [b.raw() for b in buffers]
        meta = pickle.dumps((inner, [r.nbytes for r in raws]), protocol=5)
        offsets, end = area.layout([r.nbytes for r in raws] + [len(meta)])
        self._ensure(2 * end)
        base = slot * (self._data.size // 2)
        data = self._data.bytes
        for raw, off in zip(raws, offsets, strict=False):
            data[base + off:base + off + raw.nbytes] = np.frombuffer(raw, np.uint8)
        meta_off = base + offsets[-1]
        data[meta_off:meta_off + len(meta)] = np.frombuffer(meta, np.uint8)
        words = self._words[slot]
        words[1:] = (self._generation, self._data.size, meta_off, len(meta))
        words[0] = stamp  # last: peers may read everything above once they see it

    def _receive(self, r: int, slot: int, stamp: int, seq: int, phase: int, what: str):
        words = self._peer_words[r][slot]
        self._wait(r, words, stamp, seq, phase, what)
        generation, size, meta_off, meta_len = (int(w) for w in words[1:])
        path = f"{self._peer_prefix[r]}-data{generation}"
        data = self._peer_data.get(r)
        if data is None or data.path != path:
            if data is not None:
                data.close()
            data = self._peer_data[r] = area.Mapping(path, size, create=False)
        inner, sizes = pickle.loads(bytes(data.bytes[meta_off:meta_off + meta_len]))
        base = slot * (size // 2)
        offsets, _ = area.layout(sizes)
        views = []
        for n, off in zip(sizes, offsets, strict=True):
            view = data.bytes[base + off:base + off + n].view()
            view.flags.writeable = False
            views.append(memoryview(view))
        return pickle.loads(inner, buffers=views)

    def _wait(self, r, words, stamp, seq, phase, what) -> None:
        """Poll the peer's stamp; meanwhile watch the mailbox for news of that peer."""
        if words[0] >= stamp:
            return
        now = time.monotonic()
        timeout, mailbox = self.endpoint.timeout, self.endpoint.mailbox
        deadline, spin_until = now + timeout, now + SPIN_SECONDS
        pause, polls = 0.0, 0
        while words[0] < stamp:
            polls += 1
            if polls % 16 == 0:
                if (self.run, seq, phase, r) in mailbox._messages:
                    raise CollectiveMismatchError(
                        f"replicas took different paths at collective #{seq}: this replica is "
                        f"in {what}, but replica {r} made another kind of collective. Every "
                        "replica must make the same collective calls in the same order.")
                mailbox._raise_if_gone(self.run, seq, r, what)
                if time.monotonic() > deadline:
                    raise CollectiveTimeoutError(
                        f"collective #{seq} ({what}) waited {timeout:g} s for replica(s) "
                        f"[{r}]; it never reached it. Raise collective_timeout= on the strategy "
                        "if a step is legitimately this slow.")
            time.sleep(pause)
            if pause or time.monotonic() > spin_until:  # then back off, up to 0.25 ms
                pause = min(2.5e-4, pause * 2 if pause else 2e-5)

    # -- files --------------------------------------------------------------------------------
    def _ensure(self, nbytes: int) -> None:
        if self._data is None or self._data.size < nbytes:
            size = max(-(-nbytes // (2 * area.ALIGN)) * 2 * area.ALIGN,
                       2 * self._data.size if self._data else 0, 1 << 20)
            self._generation += 1
            new = area.Mapping(f"{self._prefix}-data{self._generation}", size, create=True)
            if self._data is not None:
                os.unlink(self._data.path)  # peers that mapped it keep their mapping
                self._data.close()
            self._data = new

    def close(self) -> None:
        """Unmap the peers' files; remove ours (peers that mapped them keep their mappings)."""
        for m in [*self._peer_data.values(), *self._peer_controls]:
            m.close()
        self._peer_data.clear()
        self._peer_controls.clear()
        self._peer_words.clear()
        for m in (self._control, self._data):
            if m is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(m.path)
                m.close()
        self._control = self._data = None
