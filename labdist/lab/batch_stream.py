"""`BatchStream`: the global batches a lab run trains on, endlessly and reproducibly (a reset
starts the same sequence again)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Batch(NamedTuple):
    """One global batch; `new_epoch`: the first of an epoch (metrics start again there)."""

    x: np.ndarray
    y: np.ndarray
    new_epoch: bool


class BatchStream:
    """Endless global batches of (x, y): a fresh seeded shuffle each epoch, full batches only."""

    def __init__(self, x: np.ndarray, y: np.ndarray, batch_size: int, seed: int):
        self.x, self.y, self.batch_size, self.seed = x, y, batch_size, seed
        self._rng = np.random.default_rng(seed)
        self._order: np.ndarray = np.empty(0, int)
        self._at = 0

    def reset(self) -> None:
        """Back to the first batch of the first epoch."""
        self._rng = np.random.default_rng(self.seed)
        self._order = np.empty(0, int)
        self._at = 0

    def next(self) -> Batch:
        new_epoch = self._at + self.batch_size > len(self._order)
        if new_epoch:
            self._order, self._at = self._rng.permutation(len(self.x)), 0
        idx = self._order[self._at:self._at + self.batch_size]
        self._at += self.batch_size
        return Batch(self.x[idx], self.y[idx], new_epoch)
