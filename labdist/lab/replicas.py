"""What the lab's "kill replica" and "add replica" do: a real SIGKILL of a replica's worker
process, and one more worker on the embedded cluster. Only a quorum-trained mirrored strategy
goes on through both (quorum/training.py); the runner logs each change as an event."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

from labdist import checks
from labdist.lab.config import Kind

MAX_ADDED = 2  # replicas add_replica may add beyond the starting count (a trace each)


class ReplicaChanges:
    """The lab's kill and add of replicas, checked against its strategy and kind."""

    def __init__(self, strategy: Any, num_replicas: int):
        self.strategy = strategy
        self.quorum = strategy.fault_tolerance == "quorum"
        self.slots = num_replicas + (MAX_ADDED if self.quorum else 0)
        self._added = 0
        self._killed: set[str] = set()  # worker addresses this lab killed (never back)
        self._polling = threading.Lock()  # a kill waits for a poll of the workers to end

    @contextlib.contextmanager
    def workers_to_poll(self, client: Any) -> Iterator[list[str]]:
        """The worker addresses a poll of every worker (the timeline) may ask now, held steady
        while the poll runs: a kill waits for it, and a worker this lab killed is never asked
        (the ask would fail, and Dask's scheduler prints each failed broadcast as an ERROR
        in the notebook, for a kill the user asked for)."""
        with self._polling:
            yield [a for a in client.scheduler_info(n_workers=-1)["workers"]
                   if a not in self._killed]

    def check(self, kind: Kind) -> None:
        if not self.quorum:
            raise RuntimeError("kill_replica / add_replica need quorum training: make the lab "
                               "with ld.Lab(..., fault_tolerance='quorum')")
        if kind.is_ps:
            raise RuntimeError(f"kind={kind.value!r}: kill_replica / add_replica act on the "
                               "mirrored replicas; switch to kind='mirrored' first")

    def kill(self, rank: int, num_replicas: int) -> None:
        checks.integer("rank", rank, 0, num_replicas - 1, meaning="a replica number")
        if num_replicas < 2:
            raise ValueError(f"rank={rank!r}: it is the last replica; training needs one "
                             "(add_replica first)")
        info = self.strategy.replicas[rank]
        with self._polling:
            self._killed.add(info["address"])
            os.kill(int(info["pid"]), signal.SIGKILL)

    def add(self) -> None:
        if self._added >= MAX_ADDED:
            raise RuntimeError(f"add_replica: this lab already added {MAX_ADDED} replicas, "
                               f"its most ({self.slots} replicas in all)")
        self.strategy.add_local_replica()
        self._added += 1
