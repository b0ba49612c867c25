"""What `ClusterCoordinator.schedule` hands out and keeps: the `RemoteValue` a caller fetches,
the `ScheduledFunction` the dispatchers run, and the `PerWorkerDataset` handle."""

from __future__ import annotations

import concurrent.futures
import itertools
import time
from collections.abc import Callable
from typing import Any

from labdist import checks
from labdist.parameter_server.worker import PerWorkerIterator

POLL_S = 0.25  # how often a waiting fetch checks whether its step can never fill (sync)


class RemoteValue:
    """The future result of a scheduled function: `fetch()` waits for it (and raises the
    function's error)."""

    def __init__(self):
        self._future: concurrent.futures.Future = concurrent.futures.Future()
        self._while_waiting: Callable[[], None] | None = None  # set when dispatched (sync)

    def fetch(self, timeout: float | None = None) -> Any:
        """Wait for the result. Sync mode: waiting for it says nothing more is coming first,
        so a step it waits at that cannot fill up is applied as it is (see `join`); without
        this `strategy.run(fn)` on two workers would wait for a partner forever."""
        if timeout is not None:
            checks.number("timeout", timeout, 0.0, allowed="None or a finite number >= 0")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
            concurrent.futures.wait([self._future], timeout=max(left, 0))
            if self._future.done() or (deadline is not None and time.monotonic() >= deadline):
                return self._future.result(0)
            if self._while_waiting is not None:
                self._while_waiting()

    get = fetch

    def done(self) -> bool:
        return self._future.done()

    @property
    def future(self) -> concurrent.futures.Future:
        """The future behind it, to wait on many at once (`concurrent.futures.wait`); unlike
        `fetch`, waiting on it never applies a sync step that cannot fill up."""
        return self._future

    def __repr__(self) -> str:
        return f"<RemoteValue {'ready' if self.done() else 'pending'}>"


class ScheduledFunction:
    """One `schedule` call: the function to ship, its arguments, its place in schedule
    order, and the RemoteValue its result goes to (retried on another worker if one dies)."""


    def __init__(self, fn_bytes: bytes, args: tuple, kwargs: dict, key: tuple):
        self.fn_bytes, self.args, self.kwargs, self.key = fn_bytes, args, kwargs, key
        self.seq = key[1]  # schedule order
        self.value = RemoteValue()
        self.attempts = 0

    def dispatched(self, while_waiting: Callable[[], None] | None) -> None:
        """A worker took it: from now on a `fetch` of its value calls `while_waiting` between
        polls (sync mode: the coordinator's check for a step that can never fill)."""
        self.value._while_waiting = while_waiting

    def set_result(self, result: Any) -> None:
        if not self.value._future.done():
            self.value._future.set_result(result)

    def set_error(self, error: BaseException) -> None:
        if not self.value._future.done():
            self.value._future.set_exception(error)

    def cancel(self) -> None:
        if not self.value._future.done():
            self.value._future.cancel()


class PerWorkerDataset:
    """A dataset made on every worker by `create_per_worker_dataset`; `iter()` of it gives a
    handle that is each worker's own iterator inside scheduled functions."""

    def __init__(self, dataset_id: str):
        self.dataset_id = dataset_id
        self._iterators = itertools.count()

    def __iter__(self) -> PerWorkerIterator:
        return PerWorkerIterator(self.dataset_id, next(self._iterators))
