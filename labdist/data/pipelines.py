"""`distribute_datasets_from_function`'s input pipelines, as TF's MirroredStrategy makes them.

Under `MirroredStrategy` (one host, TF's PER_WORKER replication) `dataset_fn` is called once,
with `InputContext(num_input_pipelines=1, input_pipeline_id=0)`, and the one pipeline's
consecutive batches go to the replicas in turn: step k gives replica r batch k*N + r.
`InputReplicationMode.PER_REPLICA` calls it once per replica (`InputContext(N, r)`), and
`MultiWorkerMirroredStrategy` once per worker, which here is once per replica.

Ends, as TF: a step runs while any replica has a batch; a replica whose input ran out gets an
*empty* batch (its earlier batches' structure, dtype and trailing shape, with 0 rows). A
pipeline that declares `drop_remainder = True` (`ld.batches(..., drop_remainder=True)`; TF
knows it from the static batch size) instead stops at the first step some replica cannot
fill.

Where the pipelines live on the replicas (`data/feeds.py` moves them), every replica
keeps a copy of the shared pipeline, iterates it in full and keeps its own batch of each N
(`ld.batches` skips the others' without making them):
nothing travels per step, and each replica knows where the pipeline ended without asking the
others. This needs a pipeline that yields the same batches on every replica (seed its
shuffle: `ld.batches` fixes a seed of its own when given none). Separate pipelines (PER_REPLICA,
multi-worker) learn whether any replica still has a batch from their declared lengths
(`len(pipeline)`) or, lacking those, from one small all-reduce per step.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from labdist import checks, nest
from labdist.data.distributed import DistributedIterator, InputContext
from labdist.enums import InputReplicationMode
from labdist.values import PerReplica

END = object()  # a replica's input has ended for every replica


@dataclass(frozen=True)
class InputOptions:
    """TF's `tf.distribute.InputOptions`. Only `experimental_replication_mode` changes what
    labdist does (PER_WORKER: one pipeline per worker, the default; PER_REPLICA: one per
    replica); the others are accepted with TF's defaults for portability and have no effect
    (batches are made on the replicas' workers and moved to their device by the step)."""

    experimental_fetch_to_device: bool | None = None
    experimental_replication_mode: InputReplicationMode | str = InputReplicationMode.PER_WORKER
    experimental_place_dataset_on_device: bool = False
    experimental_per_replica_buffer_size: int = 1

    def __post_init__(self):
        mode = InputReplicationMode.parse(self.experimental_replication_mode,
                                          "experimental_replication_mode")
        object.__setattr__(self, "experimental_replication_mode", mode)
        for name in ("experimental_fetch_to_device", "experimental_place_dataset_on_device"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise TypeError(f"{name}={value!r} must be True, False or None")
        size = self.experimental_per_replica_buffer_size
        checks.integer("experimental_per_replica_buffer_size", size, 1)


def declares_drop_remainder(pipeline: Any) -> bool:
    """Whether a pipeline says its batches are all full (TF: a static batch size)."""
    return getattr(pipeline, "drop_remainder", False) is True


def empty_like(batch: Any, what: str) -> Any:
    """`batch`'s structure with each leaf's first dimension cut to 0 rows: the empty batch a
    replica whose input ran out gets while others still have one (as TF gives it)."""
    def empty(leaf):
        a = np.asarray(leaf)
        if a.ndim == 0:
            raise ValueError(f"{what}: a replica's input ran out while others still had "
                             "batches, and its batch has a value without a batch dimension "
                             f"({leaf!r}), so no empty batch can stand in for it")
        return a[:0]

    return nest.map_structure(empty, batch)


def chunk_for(chunk: list[Any], rank: int, num_replicas: int, drop: bool) -> Any:
    """Replica `rank`'s batch of a step of the shared pipeline, from the step's `chunk` (up
    to N consecutive batches), or END where the input has ended for every replica."""
    if not chunk or (drop and len(chunk) < num_replicas):
        return END
    if rank < len(chunk):
        return chunk[rank]
    return empty_like(chunk[0], "distribute_datasets_from_function")


class DatasetsFromFunction:
    """The pipelines `dataset_fn` makes (called here, on the driver, when this is made): one
    shared by every replica, or one per replica (`per_replica`). Iterating gives each step's
    batches as the batch structure with a PerReplica at each leaf. Re-iterable where each
    pipeline is."""

    def __init__(self, dataset_fn: Callable[[InputContext], Iterable[Any]], num_replicas: int,
                 per_replica: bool):
        if not callable(dataset_fn):
            raise TypeError(f"dataset_fn={dataset_fn!r} is not callable; pass a function "
                            "taking an InputContext and returning an iterable of per-replica "
                            "batches")
        self.num_replicas = num_replicas
        count = num_replicas if per_replica else 1
        self._datasets = []
        for r in range(count):
            dataset = dataset_fn(InputContext(count, r, num_replicas))
            if isinstance(dataset, str | bytes) or not isinstance(dataset, Iterable):
                raise TypeError(f"dataset_fn returned {dataset!r} for input_pipeline_id={r}; "
                                "it must return an iterable of per-replica batches")
            self._datasets.append(dataset)
        self.shared = count == 1
        self.drop_remainder = any(declares_drop_remainder(d) for d in self._datasets)

    def lengths(self) -> list[int] | None:
        """Each pipeline's declared number of batches, where every one declares it."""
        if all(hasattr(d, "__len__") for d in self._datasets):
            return [len(d) for d in self._datasets]
        return None

    def __iter__(self) -> DistributedIterator:
        steps = self._shared_steps() if self.shared else self._zipped_steps()
        return DistributedIterator(steps, self._datasets, self)

    def _shared_steps(self) -> Iterator[Any]:
        n = self.num_replicas
        iterator = iter(self._datasets[0])
        for step in itertools.count():
            chunk = list(itertools.islice(iterator, n))
            batches = [chunk_for(chunk, r, n, self.drop_remainder) for r in range(n)]
            if batches[0] is END:
                return
            yield per_replica_structure(batches, step)

    def _zipped_steps(self) -> Iterator[Any]:
        n = self.num_replicas
        iterators = [iter(d) for d in self._datasets]
        for step in itertools.count():
            batches = [next(it, END) for it in iterators]
            live = [b for b in batches if b is not END]
            if not live or (self.drop_remainder and len(live) < n):
                return
            batches = [empty_like(live[0], "distribute_datasets_from_function")
                       if b is END else b for b in batches]
            yield per_replica_structure(batches, step)


def per_replica_structure(batches: list[Any], step: int) -> Any:
    """One batch per replica as the batch structure with a PerReplica at each leaf."""
    if len(batches) == 1:
        return batches[0]
    flat = [nest.flatten(b) for b in batches]
    treedef = flat[0][1]
    for r, (_, t) in enumerate(flat):
        if t != treedef:
            raise ValueError(
                f"distribute_datasets_from_function: batch {step} has different structures for "
                f"replica 0 ({nest.describe(treedef)}) and {r} ({nest.describe(t)})")
    return nest.unflatten(treedef, [PerReplica(f[0][i] for f in flat)
                                    for i in range(len(flat[0][0]))])
