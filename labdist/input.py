"""Distributing input: split global batches across replicas in order, one input pipeline per
replica (`distribute_datasets_from_function`), the `InputContext` a pipeline's `dataset_fn`
gets, and a helper that makes global batches from arrays."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
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


@dataclass(frozen=True)
class InputContext:
    """What a `dataset_fn(input_context)` learns about the input pipeline it makes (TF's
    `tf.distribute.InputContext`): `strategy.distribute_datasets_from_function` makes one per
    replica, a `ClusterCoordinator`'s per-worker dataset one per worker."""

    num_input_pipelines: int
    input_pipeline_id: int
    num_replicas_in_sync: int = 1

    def get_per_replica_batch_size(self, global_batch_size: int) -> int:
        """`global_batch_size` / `num_replicas_in_sync` (it must divide evenly, as in TF)."""
        if isinstance(global_batch_size, bool) or not isinstance(global_batch_size,
                                                                 int | np.integer):
            raise TypeError(f"global_batch_size={global_batch_size!r} must be an integer")
        if global_batch_size % self.num_replicas_in_sync:
            raise ValueError(f"global_batch_size={global_batch_size} is not divisible by "
                             f"num_replicas_in_sync={self.num_replicas_in_sync}")
        return int(global_batch_size) // self.num_replicas_in_sync


class DatasetsFromFunction:
    """One input pipeline per replica: `dataset_fn(InputContext(N, r, N))` for each replica r,
    called on the driver when this is made; iterating zips the pipelines, so each element is
    the batches' structure with a PerReplica at each leaf (replica r's batch from pipeline r).

    A step needs a batch on every replica: iteration ends when every pipeline ends, and a
    pipeline that ends before the others raises ValueError (no batch is dropped silently).
    Re-iterable where each pipeline is."""

    def __init__(self, dataset_fn: Callable[[InputContext], Iterable[Any]], num_replicas: int):
        if not callable(dataset_fn):
            raise TypeError(f"dataset_fn={dataset_fn!r} is not callable; pass a function "
                            "taking an InputContext and returning an iterable of per-replica "
                            "batches")
        self._num_replicas = num_replicas
        self._datasets = []
        for r in range(num_replicas):
            dataset = dataset_fn(InputContext(num_replicas, r, num_replicas))
            if isinstance(dataset, str | bytes) or not isinstance(dataset, Iterable):
                raise TypeError(f"dataset_fn returned {dataset!r} for input_pipeline_id={r}; "
                                "it must return an iterable of per-replica batches")
            self._datasets.append(dataset)

    def __iter__(self) -> Iterator[Any]:
        iterators = [iter(d) for d in self._datasets]
        step = 0
        while True:
            batches, ended = [], []
            for r, it in enumerate(iterators):
                try:
                    batches.append(next(it))
                except StopIteration:
                    ended.append(r)
            if len(ended) == len(iterators):
                return
            if ended:
                raise ValueError(
                    f"distribute_datasets_from_function: input pipeline(s) {ended} ended after "
                    f"{step} batches while the others had more; every pipeline must yield the "
                    "same number of batches (each step needs a batch on every replica)")
            yield _per_replica_structure(batches, step)
            step += 1


def _per_replica_structure(batches: list[Any], step: int) -> Any:
    if len(batches) == 1:
        return batches[0]
    flat = [nest.flatten(b) for b in batches]
    treedef = flat[0][1]
    for r, (_, t) in enumerate(flat):
        if t != treedef:
            raise ValueError(
                f"distribute_datasets_from_function: batch {step} has different structures in "
                f"input pipeline 0 ({nest.describe(treedef)}) and {r} ({nest.describe(t)})")
    return nest.unflatten(treedef, [PerReplica(f[0][i] for f in flat)
                                    for i in range(len(flat[0][0]))])


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
