"""Wake-ups for the shared-memory transport: a FIFO per replica under /dev/shm (next to its
control file, so whoever shares the /dev/shm reaches it). A rank that publishes a message
writes one byte to each peer's FIFO after its stamp; a rank waiting for a stamp blocks in
poll() on its own FIFO. The kernel wakes it within tens of microseconds, and it burns no CPU
while it waits.

A waiter first spins a little (`spin_seconds`: 300 µs unless LABDIST_SPIN_US says otherwise),
only where the group has no more ranks than cores: there each rank has a core of its own, the
peer usually arrives within that time, and a sleep and wake-up (on a VM, an idle virtual CPU
woken by the host) cost more than the spin: 2 replicas train ~1.1x faster. With more ranks
than cores a spinning rank would take the core the awaited one needs, so it never spins.

No wake-up is lost: the waiter drains its FIFO, then reads the stamp, then polls; the
publisher stores the stamp, then writes. Stale bytes only cause an extra look at the stamp. A
full FIFO (a peer that never had to wait) refuses the byte, which is harmless: it is not
empty, so its reader wakes. Where the FIFO cannot be made or opened, waits poll the stamp
with short sleeps instead (`pause`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import time

from labdist.checks import refuse

SUFFIX = "-wake"
MAX_POLL_MS = 10  # a waiter looks at its mailbox (news of peers) and deadline this often
SPIN_ENV = "LABDIST_SPIN_US"
SPIN_US = 300  # the default: past poll()'s wake-up latency on a VM and most step-to-step jitter
MAX_SPIN_US = 10_000


def spin_seconds() -> float:
    """How long a waiter spins before it sleeps, where ranks do not outnumber cores:
    LABDIST_SPIN_US (microseconds, 0 turns spinning off) or SPIN_US."""
    chosen = os.environ.get(SPIN_ENV, "").strip()
    if not chosen:
        return SPIN_US * 1e-6
    try:
        micros = int(chosen)
    except ValueError:
        micros = -1
    if not 0 <= micros <= MAX_SPIN_US:
        refuse(SPIN_ENV, chosen, f"an integer from 0 (no spinning) to {MAX_SPIN_US} "
               "(microseconds a collective waits before it sleeps), or unset it")
    return micros * 1e-6


def spin(words, stamp: int, seconds: float) -> bool:
    """Watch `words[0]` (a peer's stamp) for `seconds`; whether `stamp` arrived."""
    now = time.perf_counter
    end = now() + seconds
    while now() < end:
        if words[0] >= stamp:
            return True
    return False


class Doorbell:
    """This replica's FIFO (read end) and its peers' (write ends)."""

    def __init__(self) -> None:
        self.path: str | None = None
        self._fd: int | None = None
        self._poll: select.poll | None = None
        self._peers: dict[int, int] = {}  # rank -> write end of its FIFO

    def open(self, prefix: str) -> None:
        """Make and open this replica's FIFO; without one, waits sleep-poll (`pause`)."""
        path = prefix + SUFFIX
        try:
            os.mkfifo(path, 0o600)
        except OSError:
            return
        try:  # read-write: never blocks on open, and never reads end-of-file
            self._fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(path)
            return
        self.path = path
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLIN)

    def connect(self, rank: int, peer_prefix: str) -> None:
        """Open peer `rank`'s FIFO for writing (if it has one: it may sleep-poll instead)."""
        with contextlib.suppress(OSError):
            self._peers[rank] = os.open(peer_prefix + SUFFIX, os.O_WRONLY | os.O_NONBLOCK)

    def ring(self, ranks=None) -> None:
        """Wake the peers `ranks` (None: every peer), after this replica's stamp is stored."""
        peers = self._peers
        for fd in (peers.values() if ranks is None else
                   [peers[r] for r in ranks if r in peers]):
            try:
                os.write(fd, b"\0")
            except OSError as e:  # full: it wakes anyway; gone: nobody waits
                if e.errno not in (errno.EAGAIN, errno.EPIPE):
                    raise

    def drain(self) -> None:
        """Forget earlier rings: call before reading the stamp that decides to wait."""
        fd = self._fd
        if fd is None:
            return
        try:  # not contextlib.suppress: this runs before every wait
            while len(os.read(fd, 4096)) == 4096:
                pass
        except BlockingIOError:
            pass

    def wait(self, pause: float) -> float:
        """Block until a peer rings (at most MAX_POLL_MS), or sleep `pause` without a FIFO;
        returns the next pause for FIFO-less waits (backing off to 0.25 ms)."""
        if self._poll is not None:
            self._poll.poll(MAX_POLL_MS)
            return 0.0
        time.sleep(pause)
        return min(2.5e-4, pause * 2 if pause else 2e-5)

    def close(self) -> None:
        for fd in [*self._peers.values(), *([self._fd] if self._fd is not None else [])]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._peers, self._fd, self._poll = {}, None, None
        if self.path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            self.path = None
