"""The files behind the shared-memory transport: memory-mapped areas under /dev/shm, named
labdist-<group>-<rank>-<pid>-*, and their layout. Areas of dead processes are removed when a
new one is made, so killed workers do not fill /dev/shm.

A replica's control file (never resized) holds, per slot, the stamp, the data file's
generation, and where the message lies; its data file (grown on demand) holds two slots.
"""

from __future__ import annotations

import contextlib
import mmap
import os

import numpy as np

SHM_DIR = "/dev/shm"
ALIGN = 64
CONTROL_BYTES = 4096
# control words per slot: stamp, generation, data size, meta offset, meta length
WORDS = 5


def available() -> bool:
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


class Mapping:
    """One file, mapped read-write."""

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
