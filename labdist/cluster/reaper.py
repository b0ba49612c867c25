"""Strategies that nobody can reach any more let go of their replicas and embedded cluster.

A notebook user re-runs the cell that builds `ld.MirroredStrategy(num_replicas=2)`: the name
now points at a new strategy, the old one is garbage, and its worker processes (~150 MiB
each) used to stay until the kernel died. Each strategy's `Lifetime` holds what it must close
(its replica group, and what else its kind registers); when the strategy is collected, the
lifetime is handed to one background thread that closes it there, never on the thread that
happened to collect it (that may be the cluster's own event loop). Before an embedded cluster
starts, `collect()` runs Python's collector and waits for that thread, so the processes of a
kernel are bounded by the strategies it still holds, plus the one starting.
"""

from __future__ import annotations

import gc
import logging
import queue
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("labdist")

_work: queue.Queue[Lifetime] = queue.Queue()
_thread: threading.Thread | None = None
_lock = threading.Lock()
_live: weakref.WeakSet[Lifetime] = weakref.WeakSet()
_born = 0  # lifetimes begun since the collector last ran after a notebook cell
_watching: set[int] = set()  # the IPython shells whose cells we follow (by id)


class Lifetime:
    """What one strategy (or lab) owns: `group`, closed last (a strategy's replica group,
    replaced when the replicas re-form; a lab's strategies), and further things to close
    first (`also_close`). `close()` closes them now, once; when the owner is collected
    without a `close()`, the reaper's thread closes them."""

    def __init__(self, owner: Any, group: Any):
        self.group = group
        self._first: list[Callable[[], None]] = []
        self._closed = False
        self._finalizer = weakref.finalize(owner, _reap, self)
        self._finalizer.atexit = False  # at exit Dask closes its clusters itself
        _live.add(self)
        _follow_cells()

    def also_close(self, close: Callable[[], None]) -> None:
        """`close` runs before the group closes (a coordinator's threads, a join watch)."""
        self._first.append(close)

    def close(self) -> None:
        self._finalizer.detach()
        if self._closed:
            return
        self._closed = True
        first, self._first = self._first, []
        try:
            for close in first:
                close()
        finally:
            self.group.close()


def live_owners() -> list[Any]:
    """The strategies (and labs) alive and not closed, in no order: what `ld.profile` records
    when no cluster is named."""
    owners = []
    for lifetime in list(_live):
        found = None if lifetime._closed else lifetime._finalizer.peek()
        if found is not None:
            owners.append(found[0])
    return owners


def _follow_cells() -> None:
    """In a notebook, collect once after a cell that began a strategy: the cell that is run
    again rebinds its name, and the strategy it held goes now, not at the next one."""
    global _born
    _born += 1
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or id(shell) in _watching:
        return
    _watching.add(id(shell))
    shell.events.register("post_run_cell", _after_cell)


def _after_cell(*_: Any) -> None:
    global _born
    if _born:
        _born = 0
        gc.collect()


def _reap(lifetime: Lifetime) -> None:
    """The strategy is garbage (called wherever the collector ran): close it elsewhere."""
    global _thread
    _work.put(lifetime)
    with _lock:
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_serve, name="labdist-reaper", daemon=True)
            _thread.start()


def _serve() -> None:
    while True:
        lifetime = _work.get()
        try:
            lifetime.close()
        except Exception as e:  # best effort: the strategy is gone, nobody else would see it
            logger.warning("labdist: closing an unreachable strategy failed: %r", e)
        finally:
            _work.task_done()


def collect(timeout: float = 30.0) -> None:
    """Close every strategy that is no longer reachable, and wait (up to `timeout`) until
    their clusters are down: called before a new embedded cluster starts."""
    if not _live:
        return
    gc.collect()
    with _work.all_tasks_done:  # the queue's own condition, notified as the last task ends
        _work.all_tasks_done.wait_for(lambda: not _work.unfinished_tasks, timeout)
