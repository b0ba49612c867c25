"""Same-host transport: each replica publishes its collective messages in files under /dev/shm
that its peers map and read in place, and signals with a stamp in a small control file
(shm/area.py) and a byte on each peer's FIFO (shm/doorbell.py), which wakes a waiting peer in
microseconds. No socket copies and no event-loop round trips; the Dask mailbox is still
consulted while waiting, so a peer that took another path, failed, or never comes is reported
as on Dask comms.

A message that /dev/shm has no room for (its areas reserve their memory: shm/area.py) goes
over Dask comms instead: its stamp says so (generation FALLBACK), and the peers take it from
their mailbox. Each rank decides this for its own messages only, so no rank has to agree with
another, and the next message that fits takes shared memory again. The step gets a warning
naming /dev/shm and its size.

A data area never shrinks within a step; one much larger than recent runs needed is dropped
when a run starts (shm_review.py), and the next message makes one of the size it needs.
Peers that mapped the dropped area let go of it when they read this replica's next message
(it names the new area); the check is arithmetic, no system call.

Message k goes to slot k % 2. Rank r writes a slot again only with message k + 2, after it
read every peer's message k + 1, which a peer publishes only after it finished with r's
message k: two slots are enough. Stamps (run << 24 | k) rely on aligned 8-byte stores being
seen in program order (x86-64's memory model).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import pickle
import secrets
import threading
import time
from typing import Any, ClassVar

import numpy as np

from labdist.collectives.transports.dask import DaskTransport
from labdist.collectives.transports.protocol import HOST, Endpoint
from labdist.collectives.transports.shm_layout import Layouts
from labdist.collectives.transports.shm_review import (  # noqa: F401 (tests read them here)
    HIGH_WATER_BYTES,
    KEEP_BYTES,
    REVIEW_RUNS,
    SHRINK_FACTOR,
    AreaReview,
)
from labdist.errors import CollectiveMismatchError, CollectiveTimeoutError
from labdist.shm import area
from labdist.shm import doorbell as shm_wake
from labdist.shm.doorbell import Doorbell

log = logging.getLogger(__name__)


class ShmTransport:
    """One replica's side of the shared-memory transport (`exchange` runs on its step thread).
    Its probe is (control path, token, cores): a peer that can read the token shares this
    /dev/shm; `cores`, the fewest any rank may run on, is how many ranks reduce segments."""

    name: ClassVar[str] = "shm"
    layer: ClassVar[str] = HOST
    requirement: ClassVar[str] = "every replica on one host with a shared /dev/shm"
    alone: ClassVar[bool] = False
    bootstraps: ClassVar[bool] = False
    last_arrival: float | None = None
    reads_in_place: ClassVar[bool] = True  # peers map this rank's data area

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
        self._retired: area.Mapping | None = None  # replaced, but a peer may still open it
        self._generation = 0
        self._peer_prefix: dict[int, str] = {}
        self._peer_words: dict[int, list[np.ndarray]] = {}
        self._peer_controls: list[area.Mapping] = []
        self._peer_data: dict[int, area.Mapping] = {}
        # (peer, slot) -> (control words, (sig, arrays)): a peer's last message of arrays in
        # that slot, parsed; the same words (layout number, area, offset) again mean the same
        # arrays at the same places
        self._parsed: dict[tuple[int, int], tuple[tuple, tuple[Any, list]]] = {}
        self._layouts = Layouts()  # our messages of arrays, laid out once per shape
        self._metas: list[tuple | None] = [None, None]  # per slot: the layout whose meta is there
        self._dask = DaskTransport(endpoint)  # for messages /dev/shm has no room for
        self._full = False  # the last message did not fit (warned once until one fits)
        self._review = AreaReview()  # when to drop an outsized data area
        self._files = threading.Lock()  # making or removing our files vs close
        self._closed = False
        self._bell = Doorbell()  # wakes peers waiting for our stamps (and us for theirs)
        self.cores = 1  # agreed by `connect`: the fewest cores any rank of the group may use
        self.spin = shm_wake.spin_seconds()  # before a wait sleeps (none if ranks > cores)

    def probe(self) -> tuple[str, str, int] | None:
        if not area.available():
            return None
        area.remove_orphans()
        try:
            self._control = area.create(self._prefix, "-control", area.CONTROL_BYTES)
        except OSError as e:  # no room even for this, or names planted: not here
            log.warning("labdist: no shared memory for replica %d: %s", self.endpoint.rank, e)
            return None
        self._prefix = self._control.path.removesuffix("-control")
        self._control.bytes[:16] = np.frombuffer(self.token.encode(), np.uint8)
        self._words = area.slot_words(self._control)
        self._bell.open(self._prefix)
        return self._control.path, self.token, _cores()

    def connect(self, probes: list[Any]) -> bool:
        """Map the peers' control files, if every one is readable here."""
        peers = {r: p for r, p in enumerate(probes) if r != self.endpoint.rank}
        if not area.can_reach([p[:2] for p in peers.values()]):
            return False
        self.cores = min(p[2] for p in probes)  # the same answer on every rank
        if self.endpoint.world > self.cores:  # a spinning rank would take the awaited one's core
            self.spin = 0.0
        for rank, (path, _, _) in peers.items():
            control = area.Mapping(path, area.CONTROL_BYTES, create=False)
            self._peer_controls.append(control)
            self._peer_words[rank] = area.slot_words(control)
            self._peer_prefix[rank] = path.removesuffix("-control")
            self._bell.connect(rank, self._peer_prefix[rank])
        return True

    def start_run(self, run: int) -> None:
        self.run, self.messages = run, 0
        data = self._data
        if self._review.start_run(None if data is None else data.size):
            self._drop(data)

    # -- one exchange -------------------------------------------------------------------------
    def exchange(self, seq: int, phase: int, sig: Any, payload: Any, what: str,
                 per_peer: bool, senders: range | None = None, readers: range | None = None
                 ) -> list[tuple[Any, Any]]:
        """Arrays that come back are read-only views of the peers' areas: valid until this
        replica's next collective.

        `senders` / `readers` (None: every rank) narrow the message to ranks `senders`
        publishing and ranks `readers` reading all of theirs: a rank outside `senders` sends
        nothing, one outside `readers` does not wait and gets its own message back alone, and
        a rank that did not send reads as (None, None). Every rank must pass the same ranges.
        Two slots stay enough as long as every rank that publishes message k + 2 read every
        sender of message k + 1 and those include every reader of its message k: the pairs
        `_segmented` makes (all -> owners, owners -> all) keep that."""
        run, rank, world = self.run, self.endpoint.rank, self.endpoint.world
        k, self.messages = self.messages, self.messages + 1  # the same count on every replica
        stamp = (run << 24) | k
        if self._retired is not None:  # every peer has read our message before last
            self._remove_retired()
        sends = senders is None or rank in senders
        if sends:
            message = payload
            if per_peer:  # peers read only their part; don't publish our own
                message = [None if r == rank else p for r, p in enumerate(payload)]
            try:
                self._publish(k % 2, stamp, (sig, message), senders, readers)
            except area.NoSpace as e:
                self._send_by_dask(k % 2, stamp, seq, phase, sig, payload, what, per_peer, e)
        own = (sig, payload[rank] if per_peer else payload) if sends else (None, None)
        if readers is not None and rank not in readers:
            return [own]
        self._wait_all(k % 2, stamp, seq, phase, what, senders)
        got: list[tuple[Any, Any]] = []
        for r in range(world):
            if r == rank:
                got.append(own)
            elif senders is None or r in senders:
                got.append(self._receive(r, k % 2, stamp, seq, phase, what, per_peer))
            else:
                got.append((None, None))
        return got

    def _publish(self, slot: int, stamp: int, message: Any, senders: range | None = None,
                 readers: range | None = None) -> None:
        layout, arrays = self._layouts.of(message)
        if layout is None:
            buffers: list[pickle.PickleBuffer] = []
            inner = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
            raws = [np.frombuffer(b.raw(), np.uint8) for b in buffers]
            meta = pickle.dumps((inner, [r.nbytes for r in raws]), protocol=5)
            offsets, end = area.layout([r.nbytes for r in raws] + [len(meta)])
            number = 0
        else:  # arrays only, laid out as last time: no pickling
            meta, offsets, end, number = layout
            raws = [a.reshape(-1).view(np.uint8) for a in arrays]
        self._review.need(2 * end)
        if self._data is None or self._data.size < 2 * end:
            self._grow(2 * end)  # NoSpace before anything is written
        self._full = False
        data = self._data
        base = slot * (data.size // 2)
        for raw, off in zip(raws, offsets, strict=False):
            data.bytes[base + off:base + off + raw.nbytes] = raw
        meta_off = base + offsets[-1]
        if not number or self._metas[slot] != (number, data.nonce, meta_off):
            data.bytes[meta_off:meta_off + len(meta)] = np.frombuffer(meta, np.uint8)
            self._metas[slot] = (number, data.nonce, meta_off) if number else None
        words = self._words[slot]
        words[1:] = (self._generation, data.nonce, data.size, meta_off, len(meta), number)
        words[0] = stamp  # last: peers may read everything above once they see it
        self._ring_if_last(slot, stamp, senders, readers)

    def _ring_if_last(self, slot: int, stamp: int, senders: range | None,
                      readers: range | None) -> None:
        """Wake the readers only if every sender has published this message already: the
        others wait for all stamps (`_wait_all`), so earlier rings would only wake them to
        sleep again (with N replicas on fewer cores, N^2 wake-ups a message). Two ranks that
        publish at once may each miss the other's stamp; then both stay silent and the
        waiters find the stamps at their next poll timeout (MAX_POLL_MS), so nothing hangs."""
        peers, rank = self._peer_words, self.endpoint.rank
        for r in (peers if senders is None else senders):  # a loop: this runs every message
            if r != rank and peers[r][slot][0] < stamp:
                return
        self._bell.ring(readers)

    def _send_by_dask(self, slot, stamp, seq, phase, sig, payload, what, per_peer, error):
        """Send this message over Dask comms: the stamp first, so that a peer that finds it in
        its mailbox also finds the stamp that says it is on its way (see _wait)."""
        words = self._words[slot]
        words[1] = area.FALLBACK
        words[0] = stamp
        self._bell.ring()
        if not self._full:
            self._full = True
            self._warn(seq, what, error)
        self._dask.send(self.run, seq, phase, sig, payload, per_peer)

    def _warn(self, seq: int, what: str, error: OSError) -> None:
        message = (
            f"replica {self.endpoint.rank}: {error.strerror} for a message of collective "
            f"#{seq} ({what}); it went over Dask comms instead, which is slower. Give "
            f"{area.SHM_DIR} more room (e.g. docker run --shm-size=1g), or pass "
            "transport='tcp' to use Dask comms throughout")
        log.warning("labdist: %s", message)
        self.endpoint.warnings.append((message, RuntimeWarning))

    def _receive(self, r: int, slot: int, stamp: int, seq: int, phase: int, what: str,
                 per_peer: bool) -> tuple[Any, Any]:
        """Peer r's message to this rank: read in place from its area, or from the mailbox
        where it came over Dask comms."""
        words = self._peer_words[r][slot]
        self._wait(r, words, stamp, seq, phase, what)
        self.last_arrival = time.time()  # peers are read in rank order: the last one's is all's
        key = tuple(words[1:].tolist())
        parsed = self._parsed.get((r, slot))
        if parsed is not None and parsed[0] == key:  # the views see the new contents
            sig, arrays = parsed[1]
            return sig, list(arrays[self.endpoint.rank] if per_peer else arrays)
        generation, nonce, size, meta_off, meta_len, number = key
        if generation == area.FALLBACK:
            return self._dask.receive(self.run, seq, phase, r, what)  # addressed to us
        data = self._peer_data.get(r)
        if data is None or data.nonce != nonce:
            if data is not None:
                self._forget_parsed(r)  # its views would keep the old mapping alive
                data.close()
            path = area.name(self._peer_prefix[r], nonce, f"-data{generation}")
            data = self._peer_data[r] = area.Mapping(path, size, create=False)
            data.nonce = nonce
        meta = bytes(data.bytes[meta_off:meta_off + meta_len])
        sig, payload = self._parse(data, slot, size, meta)
        if number:  # a layout the peer will send again: keep the views
            self._parsed[(r, slot)] = (key, (sig, list(payload)))
        return sig, payload[self.endpoint.rank] if per_peer else payload

    @staticmethod
    def _parse(data: area.Mapping, slot: int, size: int, meta: bytes) -> tuple[Any, Any]:
        """A message's (sig, payload), its arrays read-only views of the peer's area."""
        inner, sizes = pickle.loads(meta)
        base = slot * (size // 2)
        offsets, _ = area.layout(sizes)
        views = []
        for n, off in zip(sizes, offsets, strict=True):
            view = data.bytes[base + off:base + off + n].view()
            view.flags.writeable = False
            views.append(memoryview(view))
        return pickle.loads(inner, buffers=views)

    def _forget_parsed(self, r: int) -> None:
        for slot in (0, 1):
            self._parsed.pop((r, slot), None)

    def _wait_all(self, slot, stamp, seq, phase, what, senders=None) -> None:
        """Wait until every sender's stamp for this message is there (the last one rings)."""
        for r, words in self._peer_words.items():
            if words[slot][0] < stamp and (senders is None or r in senders):
                self._wait(r, words[slot], stamp, seq, phase, what)

    def _wait(self, r, words, stamp, seq, phase, what) -> None:
        """Sleep until the peer's stamp arrives (its doorbell wakes us: shm/doorbell.py); between
        wake-ups, watch the mailbox for news of that peer and the deadline."""
        if words[0] >= stamp or (self.spin and shm_wake.spin(words, stamp, self.spin)):
            return
        bell = self._bell
        deadline = time.monotonic() + self.endpoint.timeout
        mailbox, pause = self.endpoint.mailbox, 0.0
        while True:
            bell.drain()  # before the stamp is read: a ring after this wakes the poll below
            if words[0] >= stamp:
                return
            if mailbox is not None:
                if (self.run, seq, phase, r) in mailbox._messages:
                    if words[0] >= stamp:  # sent over Dask comms: its stamp came first
                        return
                    raise CollectiveMismatchError(
                        f"replicas took different paths at collective #{seq}: this replica is "
                        f"in {what}, but replica {r} made another kind of collective. Every "
                        "replica must make the same collective calls in the same order.")
                mailbox._raise_if_gone(self.run, seq, r, what)
            if time.monotonic() > deadline:
                raise CollectiveTimeoutError(
                    f"collective #{seq} ({what}) waited {self.endpoint.timeout:g} s for "
                    f"replica(s) [{r}]; it never reached it. Raise collective_timeout= on the "
                    "strategy if a step is legitimately this slow.")
            pause = bell.wait(pause)
            if words[0] >= stamp:  # the usual wake-up: its byte is drained by the next wait
                return

    # -- files --------------------------------------------------------------------------------
    def _grow(self, nbytes: int) -> None:
        """A data area of at least `nbytes` (twice the old one, if that fits), replacing ours;
        NoSpace if /dev/shm has no room, our old area untouched."""
        unit = 2 * area.ALIGN
        need = max(-(-nbytes // unit) * unit, 1 << 20)
        with self._files:
            if self._closed:
                raise RuntimeError("the shared-memory transport of this replica was closed")
            old = self._data
            suffix = f"-data{self._generation + 1}"
            try:
                new = area.create(self._prefix, suffix, max(need, 2 * old.size if old else 0))
            except area.NoSpace:
                if old is None or 2 * old.size <= need:
                    raise
                new = area.create(self._prefix, suffix, need)  # only what this one needs
            self._generation += 1
            self._data = new
            if old is not None:  # our last message is there, and a peer may not have opened
                self._retire(old)  # it yet: removed at our next message, once all read it

    def _drop(self, data: area.Mapping) -> None:
        """Stop using our data area (removed at our next message, once every peer read it)."""
        with self._files:
            if self._data is data:
                self._data = None
                self._retire(data)

    def _retire(self, mapping: area.Mapping) -> None:
        if self._retired is not None:
            self._remove(self._retired)
        self._retired = mapping

    def _remove_retired(self) -> None:
        with self._files:
            if self._retired is not None:
                self._remove(self._retired)
                self._retired = None

    @staticmethod
    def _remove(mapping: area.Mapping) -> bool:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(mapping.path)  # peers that mapped it keep their mapping
        return mapping.close()

    def close(self) -> None:
        """Remove our files (before this returns: peers that mapped them keep their mappings)
        and unmap the peers'."""
        with self._files:
            self._closed = True
            ours = [m for m in (self._control, self._data, self._retired) if m is not None]
            self._control = self._data = self._retired = None
        self._words = []
        self._bell.close()
        self._peer_words.clear()
        self._parsed.clear()  # parsed views would keep the peers' mappings alive
        mapped = [m for m in ours if not self._remove(m)]
        mapped += [m for m in [*self._peer_data.values(), *self._peer_controls] if not m.close()]
        self._peer_data.clear()
        self._peer_controls.clear()
        if mapped:  # views in a cycle (an aborted collective's traceback holds its frames):
            gc.collect()  # else the mappings and their fds stay until the next full collection
            for m in mapped:
                m.close()


def _cores() -> int:
    """The cores this process may run on (its affinity, where the platform tells)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
