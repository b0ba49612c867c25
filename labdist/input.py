"""Distributing input: split global batches across replicas in order, and a
helper that makes global batches from arrays."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from labdist import nest
from labdist.values import PerReplica


def split_sizes(batch_size: int, num_replicas: int) -> list[int]:
    """Chunks of ceil(b / N) in order; later replicas get the rest (8 on 3 -> [3, 3, 2])."""
    chunk = math.ceil(batch_size / num_replicas) if batch_size else 0
    sizes = []
    left = batch_size
    for _ in range(num_replicas):
        take = min(chunk, left)
        sizes.append(take)
        left -= take
    return sizes


def split_batch(batch: Any, num_replicas: int) -> Any:
    """One global batch (an array, or a tuple/dict of arrays sharing their leading size) as
    the same structure of PerReplica values."""
    leaves, treedef = nest.flatten(batch)
    arrays = [np.asarray(x) for x in leaves]
    if any(a.ndim == 0 for a in arrays):
        if num_replicas == 1:
            return batch
        raise ValueError(
            f"experimental_distribute_dataset: an element has no batch dimension (a 0-d value) "
            f"and cannot be split across {num_replicas} replicas; batch the dataset first "
            "(e.g. labdist.batches(x, global_batch_size=...))"
        )
    sizes = {a.shape[0] for a in arrays}
    if len(sizes) > 1:
        raise ValueError(
            f"experimental_distribute_dataset: the arrays of one batch have different leading "
            f"sizes {sorted(sizes)}; they must share the batch dimension"
        )
    if num_replicas == 1:
        return batch
    bounds = np.cumsum([0, *split_sizes(sizes.pop(), num_replicas)])
    # the batch's structure, with a PerReplica at each leaf (as tf.distribute yields them)
    return nest.unflatten(treedef, [
        PerReplica(a[bounds[r]:bounds[r + 1]] for r in range(num_replicas)) for a in arrays])


class DistributedDataset:
    """Iterates global batches of `dataset` as PerReplica batches; re-iterable if the source is."""

    def __init__(self, dataset: Iterable[Any], num_replicas: int):
        if isinstance(dataset, str | bytes) or not isinstance(dataset, Iterable):
            raise TypeError(
                f"dataset={dataset!r} is not an iterable of global batches (arrays, or "
                "tuples/dicts of arrays)"
            )
        self._dataset = dataset
        self._num_replicas = num_replicas

    def __iter__(self) -> Iterator[PerReplica]:
        for batch in self._dataset:
            yield split_batch(batch, self._num_replicas)


class Batches:
    """Global batches of `arrays` (an array or a tuple/dict of arrays). Re-iterable: with
    `shuffle`, each pass draws a new order from `seed` and the pass number."""

    def __init__(self, arrays: Any, global_batch_size: int, shuffle: bool = False,
                 seed: int | None = None, drop_remainder: bool = False):
        if not isinstance(global_batch_size, int | np.integer) or global_batch_size < 1:
            raise ValueError(
                f"global_batch_size={global_batch_size!r} must be a positive integer"
            )
        leaves, self._treedef = nest.flatten(arrays)
        self._arrays = [np.asarray(a) for a in leaves]
        lengths = {a.shape[0] if a.ndim else None for a in self._arrays}
        if None in lengths or len(lengths) != 1:
            raise ValueError(
                f"arrays must share a leading dimension; got shapes "
                f"{[a.shape for a in self._arrays]}"
            )
        self._n = lengths.pop()
        self.global_batch_size = int(global_batch_size)
        self.shuffle, self.seed, self.drop_remainder = shuffle, seed, drop_remainder
        self._epoch = 0

    def __len__(self) -> int:
        full, rest = divmod(self._n, self.global_batch_size)
        return full + (1 if rest and not self.drop_remainder else 0)

    def __iter__(self) -> Iterator[Any]:
        order = np.arange(self._n)
        if self.shuffle:
            seed = None if self.seed is None else (self.seed, self._epoch)
            order = np.random.default_rng(seed).permutation(self._n)
        self._epoch += 1
        for i in range(len(self)):
            idx = order[i * self.global_batch_size:(i + 1) * self.global_batch_size]
            yield nest.unflatten(self._treedef, [a[idx] for a in self._arrays])


def batches(arrays: Any, global_batch_size: int, *, shuffle: bool = False,
            seed: int | None = None, drop_remainder: bool = False) -> Batches:
    """Make global batches from arrays: `for x, y in batches((x, y), 64, shuffle=True)`."""
    return Batches(arrays, global_batch_size, shuffle, seed, drop_remainder)
