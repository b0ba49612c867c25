"""A replica's undo log for quorum training: the variable copies as they were when the current
run started, so survivors of a lost peer can all return to the same state before retrying a
step that some of them had applied and others had not."""

from __future__ import annotations

from typing import Any


class UndoLog:
    """One snapshot of a replica's variables, taken at the start of every run. Buffers are kept
    between runs (a copy into memory already mapped, not an allocation per step)."""

    def __init__(self) -> None:
        self._saved: dict[int, Any] = {}
        self.run_id = 0  # the run the snapshot was taken before (0: none yet)

    def keep(self, values: dict[int, Any], run_id: int) -> None:
        """Snapshot `values` (var_id -> array) before run `run_id` changes them."""
        saved = self._saved
        for var_id in [k for k in saved if k not in values]:
            del saved[var_id]
        for var_id, value in values.items():
            buf = saved.get(var_id)
            if buf is None or buf.shape != value.shape or buf.dtype != value.dtype:
                saved[var_id] = value.copy()
            else:
                buf[...] = value
        self.run_id = run_id

    def restore(self, values: dict[int, Any], run_id: int) -> bool:
        """Put back the snapshot taken before run `run_id`, in place. False (and nothing
        changed) when the last snapshot is of another run: this replica never started it."""
        if run_id != self.run_id:
            return False
        for var_id, buf in self._saved.items():
            if var_id in values:
                values[var_id][...] = buf
        return True
