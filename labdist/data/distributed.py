"""Distributing input: split global batches across replicas in order, the distributed
iterator and the feeds that stand for its elements in a step, the `InputContext` a pipeline's
`dataset_fn` gets (pipelines.py makes those pipelines), and a helper that makes global
batches from arrays."""

from __future__ import annotations

import itertools
import math
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from labdist import checks, nest
from labdist.errors import OutOfRangeError
from labdist.shm import placed
from labdist.shm.placed import PlacedArray, ScatteredArray
from labdist.timing import phases
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


def shard_bounds(batch_size: int, num_replicas: int) -> list[int]:
    """Where each replica's shard of a batch starts and ends: replica r takes rows
    `bounds[r]:bounds[r + 1]` (split_sizes' chunks, in order; 8 on 3 -> [0, 3, 6, 8])."""
    return list(itertools.accumulate(split_sizes(batch_size, num_replicas), initial=0))


def shard(array: Any, num_replicas: int) -> list[Any]:
    """Each replica's rows of one global batch `array`, in replica order (`shard_bounds`)."""
    bounds = shard_bounds(len(array), num_replicas)
    return [array[bounds[r]:bounds[r + 1]] for r in range(num_replicas)]


def shard_group(batches: list[tuple[Any, Any]], num_replicas: int) -> list[list[tuple]]:
    """Each replica's (x, y) shards of a group of global batches (x, y): what one step
    function call of `fit` takes on each replica, in replica order."""
    shards: list[list[tuple]] = [[] for _ in range(num_replicas)]
    for bx, by in batches:
        for mine, x, y in zip(shards, shard(bx, num_replicas), shard(by, num_replicas),
                              strict=True):
            mine.append((x, y))
    return shards


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
    bounds = shard_bounds(sizes.pop(), num_replicas)
    # the batch's structure, with a PerReplica at each leaf (as tf.distribute yields them)
    return nest.unflatten(treedef, [
        PerReplica(a[bounds[r]:bounds[r + 1]] for r in range(num_replicas)) for a in arrays])


class DistributedDataset:
    """Iterates global batches of `dataset` as PerReplica batches; re-iterable if the source is."""

    def __init__(self, dataset: Iterable[Any], num_replicas: int, placement: Any = None):
        if isinstance(dataset, str | bytes) or not isinstance(dataset, Iterable):
            raise TypeError(
                f"dataset={dataset!r} is not an iterable of global batches (arrays, or "
                "tuples/dicts of arrays)"
            )
        self._dataset = dataset
        self._num_replicas = num_replicas
        # where the strategy can place a Batches' arrays (data/dataset_placement.py)
        self._placement = placement if isinstance(dataset, Batches) else None

    def __iter__(self) -> DistributedIterator:
        n = self._num_replicas
        sources = None
        if self._placement is not None and n > 1:
            sources = self._placement.sources(self._dataset.arrays)
        if sources is None:
            return DistributedIterator(split_batch(batch, n) for batch in self._dataset)
        return DistributedIterator(_placed_pass(self._dataset, sources, n, self._placement))


def _placed_pass(batches: Batches, sources: list[tuple], num_replicas: int,
                 owner: Any) -> Iterator[Any]:
    """One pass over `batches` whose arrays are placed (`sources`, kept by `owner`): its
    elements split as `split_batch` splits them, each shard sent to its replica as indices."""
    pass_ = iter(batches)
    while True:
        try:
            index = pass_.next_index()
        except StopIteration:
            return
        yield batches.placed_split(sources, index, num_replicas, owner)


class DistributedIterator:
    """What `iter()` of a distributed dataset returns. On the driver, `next()` gives each
    element (a PerReplica per leaf). Passed to `strategy.run` as an argument it *feeds* the
    step: each step of the call takes the iterator's next element in its place. A
    `distribute_datasets_from_function` iterator whose pipelines can travel (re-iterable and
    picklable) is then moved to the replicas (`source` says how they are shared), and its
    batches are made there: from then on only `strategy.run` may draw from it."""

    def __init__(self, elements: Iterator[Any], pipelines: list[Any] | None = None,
                 source: Any = None):
        self._elements = elements
        self._pipelines = pipelines
        self.source = source  # the DatasetsFromFunction it iterates, if any
        self._pickled: list[bytes] | None = None  # its pipelines, once they may move
        self._started = False  # next() was called here: its pipelines cannot move any more
        self.remote_key: str | None = None  # set once its pipelines live on the replicas

    def __iter__(self) -> DistributedIterator:
        return self

    def __next__(self) -> Any:
        if self.remote_key is not None:
            raise TypeError("this iterator was passed to strategy.run, which moved its input "
                            "pipelines to the replicas: its batches are made there now. Keep "
                            "passing it to strategy.run, or iterate the dataset again for "
                            "batches on the driver")
        self._started = True
        return next(self._elements)

    def draw(self, count: int) -> list[Any]:
        """Up to `count` next elements, on the driver (fewer where the input ends)."""
        return list(itertools.islice(self, count))

    @property
    def pipelines(self) -> list[Any] | None:
        """The per-replica input pipelines (`distribute_datasets_from_function`), else None."""
        return self._pipelines

    def movable_pipelines(self) -> list[bytes] | None:
        """The pipelines, pickled, if they may move to the replicas: never drawn from here,
        re-iterable (an iterator's position is shared with this process) and picklable. Each
        is pickled once, however many replicas get a copy."""
        if self._pipelines is None or self._started:
            return None
        if self._pickled is None:
            import cloudpickle

            pickled = []
            for pipeline in self._pipelines:
                if iter(pipeline) is pipeline:
                    return None
                try:
                    pickled.append(cloudpickle.dumps(pipeline))
                except Exception:
                    return None
            self._pickled = pickled
        return self._pickled

    def move(self) -> str:
        """Mark the pipelines as living on the replicas; the key they are held under there."""
        if self.remote_key is None:
            self.remote_key = "input-" + uuid.uuid4().hex
        return self.remote_key


class Feed:
    """An argument of a replica's step that stands for an input's next element."""

    def take(self, step: int, steps: int, feeds: dict[str, Any]) -> Any:
        raise NotImplementedError


def input_ended(step: int, steps: int) -> OutOfRangeError:
    """The error of a step that finds its input ended."""
    ran = f"the {step} step(s) before it ran" if step else "nothing ran"
    return OutOfRangeError(f"the input ended: step {step + 1} of this strategy.run(steps="
                           f"{steps}) has no element ({ran})")


class DrawnFeed(Feed):
    """Elements drawn on the driver, one per step of the call (this replica's components)."""

    __slots__ = ("elements",)

    def __init__(self, elements: list[Any]):
        self.elements = elements

    def take(self, step, steps, feeds):
        if step >= len(self.elements):
            raise input_ended(step, steps)
        return self.elements[step]


def run_steps(fn: Callable, args: tuple, kwargs: dict, steps: int, feeds: dict[str, Any],
              to_device: Callable[[Any], Any]) -> Any:
    """On a replica: `fn` `steps` times, each step's Feed arguments replaced by their next
    element; the last step's result. An error in step i (of several) says which."""
    leaves, treedef = nest.flatten((args, kwargs))
    slots = [i for i, x in enumerate(leaves) if isinstance(x, Feed)]
    if steps == 1 and not slots:
        return fn(*to_device(args), **to_device(kwargs))
    result = None
    for step in range(steps):
        now = list(leaves)
        with phases.RECORDER.span("input"):  # waiting for this step's batch
            for i in slots:
                now[i] = leaves[i].take(step, steps, feeds)
        a, k = to_device(nest.unflatten(treedef, now))
        try:
            result = fn(*a, **k)
        except Exception as e:
            if steps > 1:
                e.add_note(f"raised in step {step + 1} of this strategy.run(steps={steps})")
            raise
    return result


@dataclass(frozen=True)
class InputContext:
    """What a `dataset_fn(input_context)` learns about the input pipeline it makes (TF's
    `tf.distribute.InputContext`): `strategy.distribute_datasets_from_function` makes one per
    input pipeline, a `ClusterCoordinator`'s per-worker dataset one per worker."""

    num_input_pipelines: int
    input_pipeline_id: int
    num_replicas_in_sync: int = 1

    def get_per_replica_batch_size(self, global_batch_size: int) -> int:
        """`global_batch_size` / `num_replicas_in_sync` (it must divide evenly, as in TF)."""
        checks.integer("global_batch_size", global_batch_size, error=TypeError)
        if global_batch_size % self.num_replicas_in_sync:
            raise ValueError(f"global_batch_size={global_batch_size} is not divisible by "
                             f"num_replicas_in_sync={self.num_replicas_in_sync}")
        return int(global_batch_size) // self.num_replicas_in_sync


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
        # placed arrays (labdist/shm/placed.py) stay as they are: their rows travel as indices
        self._arrays = [a if isinstance(a, PlacedArray | ScatteredArray) else np.asarray(a)
                        for a in leaves]
        lengths = {a.shape[0] if a.ndim else None for a in self._arrays}
        if None in lengths or len(lengths) != 1:
            raise ValueError(
                f"arrays must share a leading dimension; got shapes "
                f"{[a.shape for a in self._arrays]}"
            )
        self._n = lengths.pop()
        self.global_batch_size = int(global_batch_size)
        self.shuffle, self.seed, self.drop_remainder = shuffle, seed, drop_remainder
        # without a seed, one drawn now: every copy of this object (the replicas' copies of a
        # shared input pipeline) shuffles alike, and each pass still differs
        self._seed = np.random.SeedSequence().entropy if seed is None else seed
        self._epoch = 0

    def __len__(self) -> int:
        full, rest = divmod(self._n, self.global_batch_size)
        return full + (1 if rest and not self.drop_remainder else 0)

    def __iter__(self) -> Iterator[Any]:
        return _Pass(self)

    def _order(self) -> np.ndarray:
        """This pass's order of the samples (the next pass's, with shuffle, differs)."""
        return pass_order(self._n, self.next_pass_key())

    def next_pass_key(self) -> tuple | None:
        """Start the next pass without making its batches: what its order is drawn from
        (`pass_order`), None for the samples in order. `fit` sends it to replicas that slice
        the batches themselves, so they draw the very order iterating here would."""
        key = (self._seed, self._epoch) if self.shuffle else None
        self._epoch += 1
        return key

    def _batch(self, idx: np.ndarray) -> Any:
        return nest.unflatten(self._treedef, [a[idx] for a in self._arrays])

    @property
    def arrays(self) -> list[Any]:
        """The arrays batched, flattened (`nest.flatten` of what was given)."""
        return list(self._arrays)

    def placed_split(self, sources: list[tuple], index: np.ndarray, num_replicas: int,
                     owner: Any = None) -> Any:
        """The batch of samples `index` split across replicas as `split_batch` splits it, each
        shard read from the placed copies `sources` of the arrays (placed.local_rows, kept
        by `owner`), so that it travels to its replica as indices."""
        bounds = shard_bounds(len(index), num_replicas)
        if self.shuffle or not len(index):
            shards = [index[bounds[r]:bounds[r + 1]] for r in range(num_replicas)]
        else:  # samples in order: each shard is a slice (a view here, one copy there)
            first = int(index[0])
            shards = [slice(first + bounds[r], first + bounds[r + 1])
                      for r in range(num_replicas)]
        return nest.unflatten(self._treedef, [
            PerReplica(placed.local_rows(s, shard, owner) for shard in shards) for s in sources])


class _Pass:
    """One pass over `Batches`. `skip(k)` passes over batches without making them (a replica
    keeping its batch of every N of a shared pipeline copies only its own); `empty()` is a
    batch of no samples."""

    def __init__(self, batches: Batches):
        self._batches, self._order, self._i = batches, None, 0

    def __iter__(self) -> _Pass:
        return self

    def __next__(self) -> Any:
        return self._batches._batch(self.next_index())

    def next_index(self) -> np.ndarray:
        """The samples of the next batch (StopIteration at the end of the pass)."""
        if self._order is None:  # drawn when the pass starts, as a generator would
            self._order = self._batches._order()
        if self._i >= len(self._batches):
            raise StopIteration
        self._i += 1
        size = self._batches.global_batch_size
        return self._order[(self._i - 1) * size:self._i * size]

    def empty(self) -> Any:
        """A batch of no samples: the arrays' structure with 0 rows."""
        return nest.unflatten(self._batches._treedef, [a[:0] for a in self._batches._arrays])

    def skip(self, count: int) -> int:
        """Pass over up to `count` batches; how many there were."""
        if self._order is None:
            self._order = self._batches._order()
        skipped = min(count, len(self._batches) - self._i)
        self._i += skipped
        return skipped


def pass_order(n: int, key: tuple | None) -> np.ndarray:
    """The order of `n` samples in a pass whose key `Batches.next_pass_key` gave."""
    if key is None:
        return np.arange(n)
    return np.random.default_rng(key).permutation(n)


def batches(arrays: Any, global_batch_size: int, *, shuffle: bool = False,
            seed: int | None = None, drop_remainder: bool = False) -> Batches:
    """Make global batches from arrays: `for x, y in batches((x, y), 64, shuffle=True)`."""
    return Batches(arrays, global_batch_size, shuffle, seed, drop_remainder)
