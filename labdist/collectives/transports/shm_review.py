"""How long the shared-memory transport (shm.py) keeps its data area.

A data area never shrinks within a step. One larger than HIGH_WATER_BYTES (what an outsized
collective, say a 1 GiB all-reduce, grew) is dropped when a run starts after one that needed
less than 1/SHRINK_FACTOR of it; below that, every REVIEW_RUNS runs (steps), one larger than
max(KEEP_BYTES, SHRINK_FACTOR x the largest area those runs needed) is. The next message
makes one of the size it needs. A training loop's areas stay put (every step needs about the
same), and an outsized collective's memory is gone by the end of the second run after it.
"""

from __future__ import annotations

REVIEW_RUNS = 16  # runs between reviews of the data area's size
KEEP_BYTES = 16 << 20  # a data area this small is kept whatever the recent need
HIGH_WATER_BYTES = 64 << 20  # a larger one is kept only while every run needs it
SHRINK_FACTOR = 4  # larger than this many times the recent need: dropped at the review


class AreaReview:
    """One replica's record of the data area its runs needed, which says when to drop it."""

    def __init__(self) -> None:
        self.runs = self.peak = 0  # since the last review: runs, largest area needed
        self.run_peak = 0  # the largest area this run needed so far

    def need(self, nbytes: int) -> None:
        """A message of this run needs a data area of `nbytes`."""
        if nbytes > self.run_peak:
            self.run_peak = nbytes
            self.peak = max(self.peak, nbytes)

    def start_run(self, size: int | None) -> bool:
        """A run starts while our data area has `size` bytes (None: there is none): whether
        to drop it now."""
        self.runs += 1
        last, self.run_peak = self.run_peak, 0
        if size is not None and size > HIGH_WATER_BYTES and size > SHRINK_FACTOR * last:
            self.runs = self.peak = 0  # outsized, and the last run did not need it
            return True
        if self.runs < REVIEW_RUNS:
            return False
        drop = size is not None and size > max(KEEP_BYTES, SHRINK_FACTOR * self.peak)
        self.runs = self.peak = 0
        return drop
