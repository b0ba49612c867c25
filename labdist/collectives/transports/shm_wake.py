"""Wake-ups for the shared-memory transport: a FIFO per replica under /dev/shm (next to its
control file, so whoever shares the /dev/shm reaches it). A rank that publishes a message
writes one byte to each peer's FIFO after its stamp; a rank waiting for a stamp blocks in
poll() on its own FIFO. The kernel wakes it within microseconds, and it burns no CPU while it
waits: a spin or sleep loop would take the core its peer needs (2 replicas on 2 cores) and
adds up to its pause to every late message.

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

SUFFIX = "-wake"
MAX_POLL_MS = 10  # a waiter looks at its mailbox (news of peers) and deadline this often


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
