"""`ld.data.Dataset`: tf.data's small core, so a TensorFlow input pipeline ports with the
import changed. A dataset is a re-iterable recipe: each `iter()` runs the pipeline from its
source again (a new shuffle order each pass, as tf.data's `reshuffle_each_iteration`).

Elements are numpy arrays, or tuples / dicts of them (`from_tensor_slices((x, y))` gives
(x[i], y[i]) pairs; `batch` stacks them). `strategy.experimental_distribute_dataset` takes a
batched dataset as it takes any iterable of global batches; `fit`, `evaluate` and `predict`
take one in place of (x, y). `prefetch` and `cache` change nothing here (the replicas' input
is fed by labdist itself), and are kept so that a pipeline ports whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from labdist import checks, nest

AUTOTUNE = -1  # tf.data.AUTOTUNE: accepted wherever a buffer size or parallelism is


class Dataset:
    """A pipeline: a source, then steps, each a function from an iterator of elements to
    another. Immutable: every method returns a new dataset."""

    def __init__(self, source: Callable[[], Iterator[Any]], length: int | None,
                 batched: int | None = None, finite: bool = True, shuffled: bool = False):
        self._source = source
        self._length = length  # elements per pass, where known
        self.batch_size = batched  # set by `batch` (what `fit` reads)
        self.finite = finite
        self.shuffled = shuffled  # a shuffle step in the pipeline (fit then reshuffles)

    # -- sources --------------------------------------------------------------------------
    @staticmethod
    def from_tensor_slices(tensors: Any) -> Dataset:
        """Element i is row i of every array (the arrays share their first dimension)."""
        leaves, treedef = nest.flatten(tensors)
        arrays = [np.asarray(a) for a in leaves]
        lengths = {a.shape[0] if a.ndim else None for a in arrays}
        if not arrays or None in lengths or len(lengths) != 1:
            raise ValueError(f"from_tensor_slices: the arrays must share a first dimension; "
                             f"got shapes {[a.shape for a in arrays]}")
        n = lengths.pop()

        def rows() -> Iterator[Any]:
            for i in range(n):
                yield nest.unflatten(treedef, [a[i] for a in arrays])

        return Dataset(rows, n)

    @staticmethod
    def range(*args: int) -> Dataset:
        values = range(*args)
        return Dataset(lambda: (np.int64(v) for v in values), len(values))

    # -- steps ----------------------------------------------------------------------------
    def _then(self, step: Callable[[Iterator[Any]], Iterator[Any]], length: int | None,
              batched: int | None = None, finite: bool | None = None,
              shuffled: bool = False) -> Dataset:
        source = self._source
        return Dataset(lambda: step(source()), length,
                       self.batch_size if batched is None else batched,
                       self.finite if finite is None else finite, self.shuffled or shuffled)

    def batch(self, batch_size: int, drop_remainder: bool = False,
              num_parallel_calls: Any = None, deterministic: Any = None) -> Dataset:
        """Consecutive elements stacked into batches of `batch_size` (the last one shorter
        unless `drop_remainder`)."""
        size = checks.integer("batch_size", batch_size, 1)
        drop = checks.boolean("drop_remainder", drop_remainder)

        def step(elements: Iterator[Any]) -> Iterator[Any]:
            chunk = []
            for e in elements:
                chunk.append(e)
                if len(chunk) == size:
                    yield _stack(chunk)
                    chunk = []
            if chunk and not drop:
                yield _stack(chunk)

        n = self._length
        length = None if n is None else (n // size if drop else -(-n // size))
        return self._then(step, length, batched=size)

    def shuffle(self, buffer_size: int, seed: int | None = None,
                reshuffle_each_iteration: bool = True) -> Dataset:
        """tf.data's buffered shuffle: a buffer of `buffer_size` elements, each output drawn
        from it at random and replaced by the next input (a buffer at least as large as the
        data is a full shuffle). A new order each pass unless reshuffle_each_iteration=False."""
        size = checks.integer("buffer_size", buffer_size, 1)
        again = checks.boolean("reshuffle_each_iteration", reshuffle_each_iteration)
        base = np.random.SeedSequence(seed).entropy if seed is None else seed
        passes = [0]

        def step(elements: Iterator[Any]) -> Iterator[Any]:
            rng = np.random.default_rng((base, passes[0]) if again else base)
            passes[0] += 1
            buffer = []
            for e in elements:
                if len(buffer) < size:
                    buffer.append(e)
                    continue
                i = int(rng.integers(len(buffer)))
                yield buffer[i]
                buffer[i] = e
            while buffer:
                yield buffer.pop(int(rng.integers(len(buffer))))

        return self._then(step, self._length, shuffled=True)

    def map(self, map_func: Callable, num_parallel_calls: Any = None,
            deterministic: Any = None) -> Dataset:
        """`map_func` on each element (a tuple element is passed as separate arguments)."""
        if not callable(map_func):
            raise TypeError(f"map: map_func={map_func!r} is not callable")

        def step(elements: Iterator[Any]) -> Iterator[Any]:
            for e in elements:
                yield map_func(*e) if isinstance(e, tuple) else map_func(e)

        return self._then(step, self._length)

    def repeat(self, count: int | None = None) -> Dataset:
        """The pipeline `count` times over (None or -1: forever)."""
        forever = count is None or count == -1
        times = None if forever else checks.integer("count", count, 0)
        source = self._source

        def repeated() -> Iterator[Any]:
            k = 0
            while forever or k < times:
                yield from source()
                k += 1

        n = self._length
        return Dataset(repeated, None if forever or n is None else n * times, self.batch_size,
                       finite=self.finite and not forever, shuffled=self.shuffled)

    def take(self, count: int) -> Dataset:
        count = checks.integer("count", count, 0)

        def step(elements: Iterator[Any]) -> Iterator[Any]:
            for i, e in enumerate(elements):
                if i >= count:
                    return
                yield e

        n = self._length
        return self._then(step, count if n is None else min(n, count), finite=True)

    def shard(self, num_shards: int, index: int) -> Dataset:
        """Every `num_shards`-th element, from element `index`."""
        shards = checks.integer("num_shards", num_shards, 1)
        index = checks.integer("index", index, 0, shards - 1)

        def step(elements: Iterator[Any]) -> Iterator[Any]:
            for i, e in enumerate(elements):
                if i % shards == index:
                    yield e

        n = self._length
        return self._then(step, None if n is None else len(range(index, n, shards)))

    def prefetch(self, buffer_size: Any = None) -> Dataset:
        return self

    def cache(self, filename: str = "") -> Dataset:
        return self

    # -- reading --------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        return iter(self._source())

    def __len__(self) -> int:
        if not self.finite or self._length is None:
            raise TypeError("this dataset's length is not known (repeated forever, or "
                            "after a step that does not say)")
        return self._length

    def cardinality(self) -> int:
        """The number of elements, -1 for infinite, -2 when unknown (tf.data's codes)."""
        if not self.finite:
            return -1
        return -2 if self._length is None else self._length

    def as_numpy_iterator(self) -> Iterator[Any]:
        return iter(self)

    def __repr__(self) -> str:
        return f"<ld.data.Dataset batch_size={self.batch_size} cardinality={self.cardinality()}>"


def _stack(elements: list[Any]) -> Any:
    leaves = [nest.flatten(e) for e in elements]
    treedef = leaves[0][1]
    return nest.unflatten(treedef, [np.stack([lv[0][j] for lv in leaves])
                                    for j in range(len(leaves[0][0]))])


def one_pass(dataset: Dataset, what: str) -> tuple[Any, Any, int]:
    """(x, y or None, batch size) from one pass of a batched dataset of (x, y) or x batches:
    what `fit`, `evaluate` and `predict` take from a dataset."""
    if not dataset.finite:
        raise ValueError(f"{what}: the dataset repeats forever; give a finite one (drop "
                         ".repeat(), or .take(n) the batches an epoch should have)")
    if dataset.batch_size is None:
        raise ValueError(f"{what}: the dataset is not batched; add .batch(batch_size), as "
                         "Keras' fit needs")
    xs, ys = [], []
    for element in dataset:
        if isinstance(element, tuple) and len(element) == 2:
            xs.append(np.asarray(element[0]))
            ys.append(np.asarray(element[1]))
        elif isinstance(element, tuple):
            raise ValueError(f"{what}: the dataset's elements are {len(element)}-tuples; "
                             "allowed: (x, y) batches, or x alone (sample weights from a "
                             "dataset are not supported yet)")
        else:
            xs.append(np.asarray(element))
    if not xs:
        raise ValueError(f"{what}: the dataset gave no batches")
    return (np.concatenate(xs), np.concatenate(ys) if ys else None, dataset.batch_size)
