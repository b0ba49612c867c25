"""What a process holds, read from outside through /proc: threads, file descriptors, listening
TCP sockets, and labdist's /dev/shm files (made by it: its pid is in their names; mapped by
it: in its memory map). For tests of what a crash or a closed lab leaves behind."""

from __future__ import annotations

import os

SHM_DIR = "/dev/shm"
COUNTS = ("threads", "fds", "listening", "shm_files", "shm_mapped")


def _listening_inodes() -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.readlines()[1:]
        except OSError:
            continue
        inodes.update(r.split()[9] for r in rows if r.split()[3] == "0A")  # 0A: LISTEN
    return inodes


def shm_files(pid: int) -> list[str]:
    """labdist's files under /dev/shm whose name carries `pid` (the process that made them)."""
    return sorted(n for n in os.listdir(SHM_DIR)
                  if n.startswith("labdist-") and str(pid) in n.split("-"))


def held(pid: int) -> dict[str, int]:
    """What process `pid` holds now (see COUNTS)."""
    listening = _listening_inodes()
    fds = os.listdir(f"/proc/{pid}/fd")
    sockets = 0
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        sockets += target.startswith("socket:[") and target[8:-1] in listening
    with open(f"/proc/{pid}/maps") as f:
        mapped = {line.split(maxsplit=5)[-1].strip() for line in f
                  if f" {SHM_DIR}/labdist-" in line}
    return {"threads": len(os.listdir(f"/proc/{pid}/task")), "fds": len(fds),
            "listening": sockets, "shm_files": len(shm_files(pid)), "shm_mapped": len(mapped)}


def excess(now: dict[str, int], before: dict[str, int]) -> dict[str, tuple[int, int]]:
    """The counts above `before`: name -> (before, now)."""
    return {k: (before[k], now[k]) for k in COUNTS if now[k] > before[k]}
