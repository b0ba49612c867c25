"""A replica's part in quorum training (quorum/membership.py drives it): keep an undo
snapshot of every run's starting state, roll a run back, and hand the replica's copies to its
successor on the same worker when an epoch re-forms the group. The `Replica` actor holds one
and answers the driver's calls with it."""

from __future__ import annotations

from typing import Any

from labdist.quorum import handover
from labdist.quorum.undo import UndoLog


class QuorumSide:
    """Quorum training's state on one replica, over its `ReplicaCore` (`values`, `undo`)."""

    def __init__(self, core: Any, where: str):
        self.core, self.where = core, where

    def keep_undo(self) -> None:
        """From now on, snapshot the variables at the start of every run (UndoLog)."""
        if self.core.undo is None:
            self.core.undo = UndoLog()

    def rollback(self, run_id: int) -> bool:
        """Return to the state before run `run_id` (False: this replica never started it)."""
        return self.core.undo is not None and self.core.undo.restore(self.core.values, run_id)

    def handover(self, token: str) -> None:
        """Park this replica's copies in the process for its successor (`adopt`)."""
        handover.park(token, self.core.values)

    def adopt(self, token: str) -> int:
        """Take the copies a predecessor on this worker parked; how many there were."""
        values = handover.take(token)
        if values is None:
            raise RuntimeError(f"{self.where} found no variables handed over to it ({token})")
        self.core.values = values
        return len(values)
