"""Removes a process's /dev/shm files the moment it dies, however it dies.

A worker that is killed (`kill -9`, a notebook kernel shut down: its embedded workers get
SIGKILL with the kernel's process group, or exit at once when their parent vanishes) runs no
clean-up code, and its shared-memory files would hold their memory until some later labdist
process swept orphans. So the first time a process makes a labdist file under /dev/shm, it
starts a janitor: a tiny Python process in a session of its own (a signal to the worker's
process group does not reach it) that reads a pipe only the worker holds open. When the
worker dies, for any reason, the system closes the pipe; the janitor removes every labdist
file whose name carries the worker's pid, and exits.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
import sys
import threading

# Run with -I -S: no site-packages, no labdist, nothing but os (starts in ~20 ms, ~8 MiB).
_JANITOR = """
import os, sys
pid, folder = sys.argv[1], sys.argv[2]
try:
    while os.read(0, 4096):
        pass
except OSError:
    pass
for name in os.listdir(folder):
    parts = name.split("-")
    if name.startswith("labdist-") and len(parts) > 3 and parts[3] == pid:
        try:
            os.unlink(os.path.join(folder, name))
        except OSError:
            pass
"""

_lock = threading.Lock()
_watched: tuple[int, int, subprocess.Popen] | None = None  # pid, the pipe's write end, janitor


def ensure(folder: str) -> None:
    """Start this process's janitor for `folder`, once (again in a forked child). Where it
    cannot start, files are still removed by `close` and by the next orphan sweep."""
    global _watched
    with _lock:
        pid = os.getpid()
        if _watched is not None and _watched[0] == pid:
            return
        read_end, write_end = os.pipe()  # both close-on-exec: no other child inherits them
        try:
            janitor = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _JANITOR, str(pid), folder],
                stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True, close_fds=True)
        except OSError:
            os.close(write_end)
            return
        finally:
            os.close(read_end)
        if _watched is not None:  # the parent's, inherited through fork
            with contextlib.suppress(OSError):
                os.close(_watched[1])
        if _watched is None:
            atexit.register(_release)
        _watched = (pid, write_end, janitor)


def _release() -> None:
    """At a normal exit: let the janitor go now (it removes what is left, then exits) and
    reap it, rather than leave a running child behind (Python warns of one)."""
    watched = _watched
    if watched is None or watched[0] != os.getpid():
        return
    with contextlib.suppress(OSError):
        os.close(watched[1])
    with contextlib.suppress(subprocess.TimeoutExpired):
        watched[2].wait(timeout=2)
