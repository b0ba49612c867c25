"""The kernel's interrupt (JupyterLab's ■, a terminal's Ctrl-C) stops a call, never the replicas.

JupyterLab interrupts a kernel by sending SIGINT to its whole process group, and a terminal
sends Ctrl-C's SIGINT to the foreground group: every process labdist starts from the driver
would get it too. Two tools keep that signal where it belongs:

- `deaf_children()`: processes and threads started inside never hear SIGINT (the embedded
  cluster's workers), while staying in the kernel's group so that a kernel killed with its
  group takes them along.
- `deferred()`: the driver's KeyboardInterrupt is held back until a short block ends, so a
  message to or from a replica is never cut in half (a half-sent request, or a half-read
  answer that the next read would take for a new one).
"""

from __future__ import annotations

import _signal
import contextlib
import signal
import threading
from collections.abc import Iterator
from multiprocessing import resource_tracker
from typing import Any


@contextlib.contextmanager
def deaf_children() -> Iterator[None]:
    """Whatever starts inside this block never hears SIGINT.

    SIGINT is blocked in this thread for the block, so a thread started meanwhile (an embedded
    cluster's event-loop thread) is born with it blocked, and so is every thread and process
    that thread starts later (the nanny's worker processes, restarts and added workers
    included: a blocked signal survives fork and exec). This thread gets its mask back at the
    end; an interrupt that arrived meanwhile is delivered then.

    multiprocessing's resource tracker, started on first need, *unblocks* SIGINT in the thread
    that starts it (CPython sets no mask back): it is started here first, so that later
    semaphores find it running and leave the event-loop thread's mask alone."""
    resource_tracker.ensure_running()
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


class _Deferred:
    """`deferred()`'s context manager: one object, re-entered. While the outermost block
    runs, the main thread's SIGINT handler is a function that only notes the interrupt; at
    the end the handler before it is put back and, if an interrupt came, called (Python's
    default handler raises KeyboardInterrupt). The C-level `_signal` functions: the Python
    wrappers in `signal` convert to enums and cost ~5 µs a call, the block's budget is ~1 µs
    (it is around every step's requests and answers)."""

    def __init__(self) -> None:
        self.depth = 0  # blocks entered on the main thread
        self.caught = False
        self.previous: Any = None
        self.handler = self.note  # bound once

    def note(self, signum: int, frame: Any) -> None:
        self.caught = True

    def __enter__(self) -> None:
        if threading.get_ident() != _MAIN:  # only the main thread receives KeyboardInterrupt
            return
        self.depth += 1
        if self.depth > 1:
            return
        previous = _signal.getsignal(_SIGINT)
        if not callable(previous):  # ignored, or a handler Python did not install: leave it
            self.previous = None
            return
        self.previous, self.caught = previous, False
        _signal.signal(_SIGINT, self.handler)

    def __exit__(self, *exc: Any) -> None:
        if threading.get_ident() != _MAIN:
            return
        self.depth -= 1
        if self.depth or self.previous is None:
            return
        previous, self.previous = self.previous, None
        _signal.signal(_SIGINT, previous)
        if self.caught:
            self.caught = False
            previous(_SIGINT, None)


_MAIN = threading.main_thread().ident
_SIGINT = int(signal.SIGINT)
_deferred = _Deferred()


def deferred() -> _Deferred:
    """Hold a KeyboardInterrupt back until the block ends, then raise it (blocks nest; only
    the main thread receives one). For short blocks that must not be cut: one message."""
    return _deferred
