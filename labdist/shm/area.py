"""The files behind the shared-memory transport: memory-mapped areas under /dev/shm and their
layout. Names are labdist-<group>-<rank>-<pid>-<random>-control for a replica's control file
and ...-data<generation>-<random> for its data files: the random parts make them unguessable
(a file planted under the next name would otherwise fail a run), and a name that exists all
the same is retried with another. A process's files are removed when it dies by its janitor
(janitor.py), and those of dead processes whose janitor could not run when a new area is
made, so killed workers do not fill /dev/shm.

A replica's control file (never resized) holds, per slot, the stamp, the data file's
generation and random part, and where the message lies; its data file (grown on demand,
dropped when outsized) holds two slots.

Every area reserves its memory when it is made (`posix_fallocate`): a file that is only
truncated to size reserves nothing, and touching a page that /dev/shm has no room for kills
the process with SIGBUS. Reserving turns that into `NoSpace`, raised before anything is
written.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import secrets

import numpy as np

from labdist.shm import janitor as shm_janitor

SHM_DIR = "/dev/shm"
ALIGN = 64
CONTROL_BYTES = 4096
# control words per slot: stamp, generation, random part of the data file's name, data size,
# meta offset, meta length, layout (nonzero: the same layout number means the same meta bytes,
# so a reader may reuse its parse). Generation FALLBACK: the message went over Dask comms.
WORDS = 7
FALLBACK = -1
TRIES = 8  # names tried before a planted file under each of them is reported as an error


class NoSpace(OSError):
    """/dev/shm has no room for an area: its message must take another path."""


def available() -> bool:
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


def nonce() -> int:
    """The random part of a file name (63 bits: it travels in a control word)."""
    return secrets.randbits(63)


def space() -> str:
    """How big /dev/shm is and how much of it is free, for messages."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return f"{SHM_DIR} (size unknown)"
    mib = 2**20
    return (f"{SHM_DIR} ({st.f_blocks * st.f_frsize / mib:.0f} MiB, "
            f"{st.f_bavail * st.f_frsize / mib:.0f} MiB free)")


class Mapping:
    """One file, mapped read-write. Made with `create`, its memory is reserved (else NoSpace,
    and no file is left behind)."""

    def __init__(self, path: str, size: int, create: bool):
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                _reserve(fd, path, size)
            self.mm = mmap.mmap(fd, size)
        except BaseException:
            if create:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            raise
        finally:
            os.close(fd)
        self.path, self.size, self.nonce = path, size, 0
        self.bytes = np.frombuffer(self.mm, dtype=np.uint8)

    def close(self) -> bool:
        """Unmap; False while a view of it is still alive (it is unmapped, and its fd closed,
        when the last view goes)."""
        self.bytes = None
        try:
            self.mm.close()
        except BufferError:
            return False
        return True


def _reserve(fd: int, path: str, size: int) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.ENOMEM):
            raise NoSpace(e.errno, f"no room for {size / 2**20:.1f} MiB in {space()}",
                          path) from None
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        os.ftruncate(fd, size)  # a file system that cannot reserve: sized as before


def create(prefix: str, suffix: str, size: int) -> Mapping:
    """A new area named `prefix` + random + `suffix`, retried under another name while one
    exists (someone planted it). The first one starts this process's janitor (janitor.py),
    which removes its files when it dies, however it dies."""
    shm_janitor.ensure(SHM_DIR)
    for _ in range(TRIES):
        n = nonce()
        try:
            mapping = Mapping(name(prefix, n, suffix), size, create=True)
        except FileExistsError:
            continue
        mapping.nonce = n
        return mapping
    raise FileExistsError(
        f"{TRIES} random names under {prefix}* already existed in {SHM_DIR}: another process "
        "is creating files there under labdist's names. Remove them, or pass transport='tcp'")


def name(prefix: str, n: int, suffix: str) -> str:
    return f"{prefix}-{n:016x}{suffix}"


def remove_orphans() -> None:
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


def slot_words(control: Mapping) -> list[np.ndarray]:
    words = control.bytes[64:64 + 2 * WORDS * 8].view(np.int64)
    return [words[:WORDS], words[WORDS:]]


def layout(sizes: list[int]) -> tuple[list[int], int]:
    offsets, end = [], 0
    for n in sizes:
        offsets.append(end)
        end += -(-n // ALIGN) * ALIGN
    return offsets, end
