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


class _Held:
    """The main thread's SIGINT handler while a `deferred` block runs: it notes the interrupt."""

    def __init__(self) -> None:
        self.depth = 0
        self.caught = False
        self.previous: Any = None

    def __call__(self, signum: int, frame: Any) -> None:
        self.caught = True


_held = _Held()


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold a KeyboardInterrupt back until the block ends, then raise it (blocks nest; only
    the main thread receives one). For short blocks that must not be cut: one message."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _held.depth:  # inside another deferred block: that one raises
        _held.depth += 1
        try:
            yield
        finally:
            _held.depth -= 1
        return
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous):  # ignored, or a handler Python did not install: leave it
        yield
        return
    _held.previous, _held.caught, _held.depth = previous, False, 1
    signal.signal(signal.SIGINT, _held)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _held.depth, caught = 0, _held.caught
        _held.caught = False
        if caught:
            previous(signal.SIGINT, None)  # Python's default handler raises KeyboardInterrupt
