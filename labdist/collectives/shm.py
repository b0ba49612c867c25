"""Same-host transport: each replica publishes its collective messages in files under /dev/shm
that its peers map and read in place, and signals with a stamp in a small control file. No
socket copies and no event-loop round trips; the Dask mailbox is still consulted while
waiting, so a peer that took another path, failed, or never comes is reported as on TCP.

Layout per replica: a control file (never resized) with, per slot, the stamp (run << 24 | k,
k counting the run's messages), the data file's generation, and where the message lies; and a
data file (grown on demand) with two slots. Message k goes to slot k % 2. Rank r writes a slot
again only with message k + 2, after it read every peer's message k + 1, which a peer publishes
only after it finished with r's message k: two slots are enough.
Files are named labdist-<group>-<rank>-<pid>-*; those of dead processes are removed on start.
Stamps rely on aligned 8-byte stores being seen in program order (x86-64's memory model).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import secrets
import time
from typing import Any

import numpy as np

from labdist.errors import CollectiveMismatchError, CollectiveTimeoutError

SHM_DIR = "/dev/shm"
ALIGN = 64
_CONTROL_BYTES = 4096
# A waiting replica yields (sleep(0)) this long before it backs off to short sleeps: peers in
# step are usually microseconds apart, and a sleep of even 20 us costs more than it saves.
SPIN_SECONDS = 2e-3
# control words per slot: stamp, generation, data size, meta offset, meta length
_WORDS = 5


def available() -> bool:
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


class _Mapping:
    def __init__(self, path: str, size: int, create: bool):
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            self.mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.path, self.size = path, size
        self.bytes = np.frombuffer(self.mm, dtype=np.uint8)

    def close(self) -> None:
        self.bytes = None
        with contextlib.suppress(BufferError):  # a view still alive: freed with the process
            self.mm.close()


def _remove_orphans() -> None:
    """Areas left by killed workers (their pid is gone) would fill /dev/shm over time."""
    for name in os.listdir(SHM_DIR):
        parts = name.split("-")
        if name.startswith("labdist-") and len(parts) >= 4 and parts[3].isdigit():
            try:
                os.kill(int(parts[3]), 0)
            except ProcessLookupError:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(SHM_DIR, name))
            except PermissionError:
                pass  # alive, someone else's


def can_reach(probes: list[tuple[str, str]]) -> bool:
    """True if every (control path, token) is readable here: the peers share this /dev/shm."""
    try:
        for path, token in probes:
            with open(path, "rb") as f:
                if f.read(len(token)).decode() != token:
                    return False
    except (OSError, UnicodeDecodeError):
        return False
    return True


class ShmChannel:
    """One replica's side of the shared-memory transport (used from its step thread)."""

    def __init__(self, group: str, rank: int):
        _remove_orphans()
        self._prefix = os.path.join(SHM_DIR, f"labdist-{group[:16]}-{rank}-{os.getpid()}")
        self.token = secrets.token_hex(8)
        self.control_path = f"{self._prefix}-control"
        self._control = _Mapping(self.control_path, _CONTROL_BYTES, create=True)
        self._control.bytes[:16] = np.frombuffer(self.token.encode(), np.uint8)
        self._words = _slot_words(self._control)
        self._data: _Mapping | None = None
        self._generation = 0
        self._peer_prefix: dict[int, str] = {}
        self._peer_words: dict[int, np.ndarray] = {}
        self._peer_controls: list[_Mapping] = []
        self._peer_data: dict[int, _Mapping] = {}
        self.messages = 0  # this run's messages so far; reset when a run starts

    def connect(self, peers: dict[int, str]) -> None:
        """Map the peers' control files (rank -> control path)."""
        for rank, path in peers.items():
            control = _Mapping(path, _CONTROL_BYTES, create=False)
            self._peer_controls.append(control)
            self._peer_words[rank] = _slot_words(control)
            self._peer_prefix[rank] = path.removesuffix("-control")

    # -- one exchange -------------------------------------------------------------------------
    def exchange(self, comm, seq: int, phase: int, sig: Any, payload: Any, what: str,
                 per_peer: bool) -> list[tuple[Any, Any]]:
        """comm.exchange's contract, through shared memory. Arrays that come back are
        read-only views of the peers' areas: valid until this replica's next collective."""
        run, rank, world = comm.run, comm.rank, comm.world
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
            peer_sig, peer_payload = self._receive(comm, r, k % 2, stamp, seq, phase, what)
            got.append((peer_sig, peer_payload[rank] if per_peer else peer_payload))
        return got

    def _publish(self, slot: int, stamp: int, message: Any) -> None:
        buffers: list[pickle.PickleBuffer] = []
        inner = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
        raws = [b.raw() for b in buffers]
        meta = pickle.dumps((inner, [r.nbytes for r in raws]), protocol=5)
        offsets, end = _layout([r.nbytes for r in raws] + [len(meta)])
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

    def _receive(self, comm, r: int, slot: int, stamp: int, seq: int, phase: int, what: str):
        words = self._peer_words[r][slot]
        self._wait(comm, r, words, stamp, seq, phase, what)
        generation, size, meta_off, meta_len = (int(w) for w in words[1:])
        path = f"{self._peer_prefix[r]}-data{generation}"
        data = self._peer_data.get(r)
        if data is None or data.path != path:
            if data is not None:
                data.close()
            data = self._peer_data[r] = _Mapping(path, size, create=False)
        inner, sizes = pickle.loads(bytes(data.bytes[meta_off:meta_off + meta_len]))
        base = slot * (size // 2)
        offsets, _ = _layout(sizes)
        views = []
        for n, off in zip(sizes, offsets, strict=True):
            view = data.bytes[base + off:base + off + n].view()
            view.flags.writeable = False
            views.append(memoryview(view))
        return pickle.loads(inner, buffers=views)

    def _wait(self, comm, r, words, stamp, seq, phase, what) -> None:
        """Poll the peer's stamp; meanwhile watch the mailbox for news of that peer."""
        if words[0] >= stamp:
            return
        now = time.monotonic()
        deadline, spin_until = now + comm.timeout, now + SPIN_SECONDS
        pause, polls = 0.0, 0
        mailbox = comm.mailbox
        while words[0] < stamp:
            polls += 1
            if polls % 16 == 0:
                if (comm.run, seq, phase, r) in mailbox._messages:
                    raise CollectiveMismatchError(
                        f"replicas took different paths at collective #{seq}: this replica is "
                        f"in {what}, but replica {r} made another kind of collective. Every "
                        "replica must make the same collective calls in the same order.")
                mailbox._raise_if_gone(comm.run, seq, r, what)
                if time.monotonic() > deadline:
                    raise CollectiveTimeoutError(
                        f"collective #{seq} ({what}) waited {comm.timeout:g} s for replica(s) "
                        f"[{r}]; it never reached it. Raise collective_timeout= on the strategy "
                        "if a step is legitimately this slow.")
            time.sleep(pause)
            if pause or time.monotonic() > spin_until:  # then back off, up to 0.25 ms
                pause = min(2.5e-4, pause * 2 if pause else 2e-5)

    # -- files --------------------------------------------------------------------------------
    def _ensure(self, nbytes: int) -> None:
        if self._data is None or self._data.size < nbytes:
            size = max(-(-nbytes // (2 * ALIGN)) * 2 * ALIGN,
                       2 * self._data.size if self._data else 0, 1 << 20)
            self._generation += 1
            new = _Mapping(f"{self._prefix}-data{self._generation}", size, create=True)
            if self._data is not None:
                os.unlink(self._data.path)  # peers that mapped it keep their mapping
                self._data.close()
            self._data = new

    def close(self) -> None:
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
        self._data = None


def _slot_words(control: _Mapping) -> list[np.ndarray]:
    words = control.bytes[64:64 + 2 * _WORDS * 8].view(np.int64)
    return [words[:_WORDS], words[_WORDS:]]


def _layout(sizes: list[int]) -> tuple[list[int], int]:
    offsets, end = [], 0
    for n in sizes:
        offsets.append(end)
        end += -(-n // ALIGN) * ALIGN
    return offsets, end
