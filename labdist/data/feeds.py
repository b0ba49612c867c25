"""Iterators of distributed datasets as arguments of `strategy.run`: each becomes a *feed*
for every replica (labdist/data/distributed.py), so the step takes its next element on the replica.

Elements drawn on the driver travel with the call (all k of a `steps=k` call in one message).
A `distribute_datasets_from_function` iterator whose pipelines can travel goes further: they
move once to the replicas (a copy of the shared pipeline to every replica, or each replica's
own), which make their batches there (data/pipeline_feed.py); nothing travels per step.
The driver sends a pipeline with every call until its replica has answered a call that used
it (so a failed first call cannot lose it); the replica keeps the first it gets."""

from __future__ import annotations

import weakref
from typing import Any

from labdist import nest
from labdist.data.distributed import DistributedIterator, DrawnFeed
from labdist.data.pipeline_feed import PipelineFeed
from labdist.errors import OutOfRangeError
from labdist.strategies import regroup
from labdist.values import PerReplica


class Inputs:
    """One strategy's iterator arguments: which pipelines live on which replicas."""

    def __init__(self, strategy, remote: bool):
        self._strategy = strategy
        self._remote = remote  # the replica group can hold pipelines on its workers
        self._held: dict[str, tuple[Any, set[int]]] = {}  # key -> (group, ranks holding it)
        self._dropped: list[str] = []  # moved iterators gone on the driver: forget them there

    def feed(self, tree: Any, steps: int) -> tuple[Any, list[str]]:
        """`tree` with each DistributedIterator leaf replaced by its feeds (a PerReplica of
        one per replica); the keys of the pipelines that live on the replicas."""
        leaves, treedef = nest.flatten(tree)
        if not any(isinstance(x, DistributedIterator) for x in leaves):
            return tree, []
        n = self._strategy.num_replicas_in_sync
        moved: list[str] = []
        out = []
        for leaf in leaves:
            if not isinstance(leaf, DistributedIterator):
                out.append(leaf)
                continue
            source = leaf.source
            if leaf.remote_key is None and self._remote and source is not None and \
                    source.num_replicas == n:
                pipelines = leaf.movable_pipelines()
                if pipelines is not None:
                    key = leaf.move()
                    self._held[key] = (self._group(), set())
                    weakref.finalize(leaf, self._dropped.append, key)
            if leaf.remote_key is not None:
                key = leaf.remote_key
                group, holding = self._held[key]
                if group is not self._group():
                    raise RuntimeError(
                        "this iterator's input pipelines lived on replicas that were re-formed "
                        "since (strategy.recover or a refresh); their positions are gone. Make "
                        "a new iterator of the dataset")
                moved.append(key)
                feeds = _pipeline_feeds(key, leaf, holding, n)
            else:
                elements = leaf.draw(steps)
                if not elements:
                    raise OutOfRangeError(f"the input ended: no element left for step 1 of "
                                          f"this strategy.run(steps={steps}) (nothing ran)")
                feeds = [DrawnFeed([regroup.select(e, r, "the input's element", n,
                                                   self._strategy.id) for e in elements])
                         for r in range(n)]
            out.append(PerReplica(feeds))
        return nest.unflatten(treedef, out), moved

    def _group(self) -> Any:
        return self._strategy.group

    def sent(self, moved: list[str], events: list) -> None:
        """Replicas that answered "done" or "merge" to a call using a pipeline hold it now
        (after an error the pipeline is sent again: a replica keeps the one it has)."""
        for key in moved:
            holding = self._held[key][1]
            for r, e in enumerate(events):
                if e.kind in ("done", "merge"):
                    holding.add(r)

    def forget(self) -> tuple[str, ...]:
        """The keys of moved iterators gone on the driver, once: the replicas drop them."""
        if not self._dropped:
            return ()
        gone, self._dropped[:] = tuple(self._dropped), []
        for key in gone:
            self._held.pop(key, None)
        return gone


def _pipeline_feeds(key: str, leaf: DistributedIterator, holding: set[int],
                    n: int) -> list[PipelineFeed]:
    """Each replica's feed of a moved iterator: the shared pipeline (a copy each) or its own,
    with what it needs to end as TF does without asking the driver."""
    source, pickled = leaf.source, leaf.movable_pipelines()
    shared = source.shared
    lengths = source.lengths() if not shared else None
    return [PipelineFeed(key, None if r in holding else pickled[0 if shared else r], r, n,
                         shared, lengths, source.drop_remainder) for r in range(n)]


def uneven_pipelines(events: list) -> ValueError | None:
    """For a call whose input lived on the replicas: some replicas found their input ended
    and others did not, which TF's rules (inputs.py) never give: the replicas' copies of a
    shared pipeline yielded different batches, or a pipeline's `len()` was not its length."""
    ended = [r for r, e in enumerate(events) if isinstance(e.error, OutOfRangeError)]
    if not ended or len(ended) == len(events):
        return None
    return ValueError(
        f"distribute_datasets_from_function: the input of replica(s) {ended} ended while the "
        f"others' did not ({events[ended[0]].error}); the replicas' copies of a shared pipeline "
        "must yield the same batches (seed its shuffle), and a pipeline's len() must be its "
        "number of batches")
