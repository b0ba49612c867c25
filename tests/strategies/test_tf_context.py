"""Contexts as TensorFlow 2.21 measures them (MirroredStrategy on 2 logical CPUs): inside a
step `get_strategy()` is the running strategy, `has_strategy()` True and
`in_cross_replica_context()` False; any strategy's `scope()` inside a step raises
RuntimeError, and another strategy's scope inside one's on the driver raises "Mixing
different tf.distribute.Strategy objects"; an `extended.update` function runs in
cross-replica context (no replica context); one replica gives plain values; `reduce_to` and
`batch_reduce_to` reduce."""

from __future__ import annotations

import multiprocessing
import os

import numpy as np
import pytest

import labdist as ld


def test_inside_a_step_the_strategy_is_there_and_no_scope_may_be_entered(mirrored2, mirrored3):
    def step():
        strategy = ld.get_strategy()
        seen = (strategy.num_replicas_in_sync, ld.has_strategy(),
                ld.in_cross_replica_context())
        refused = []
        for s in (strategy, mirrored2, mirrored3):  # mirrored3: another strategy
            try:
                with s.scope():
                    pass
            except RuntimeError as e:
                refused.append("cross-replica context" in str(e))
        try:
            strategy.reduce("SUM", 1.0, axis=None)
        except RuntimeError as e:
            refused.append("requires being in cross-replica context" in str(e))
        return seen, refused

    for seen, refused in mirrored2.experimental_local_results(mirrored2.run(step)):
        assert seen == (2, True, False)
        assert refused == [True, True, True, True]


def test_another_strategys_scope_inside_one_is_mixing(mirrored2, mirrored3):
    with mirrored2.scope():
        with (pytest.raises(RuntimeError, match="Mixing different tf.distribute.Strategy"),
              mirrored3.scope()):
            pass
        with mirrored2.scope():  # the same one again: fine, as in TF
            assert ld.get_strategy() is mirrored2


def test_an_update_function_runs_in_cross_replica_context(mirrored2):
    with mirrored2.scope():
        v = ld.Variable(np.float32(1.0))
    def update(var, x):
        return var.assign_add(x)

    def merge(strategy, x):
        return strategy.extended.update(v, update, args=(x,))

    def step():
        ld.get_replica_context().merge_call(merge, args=(np.float32(1.0),))
        return ld.get_strategy().num_replicas_in_sync

    def probe(var):  # on the replicas, in the update context itself
        return ld.in_cross_replica_context(), ld.get_replica_context() is None

    mirrored2.run(step)
    assert float(v.numpy()) == 2.0
    results = mirrored2.extended.update(v, probe, group=False)
    assert results == ((True, True), (True, True))


def test_one_replica_gives_plain_values():
    one = ld.MirroredStrategy(num_replicas=1)
    try:
        out = one.run(lambda: np.float32(3.0))
        assert not isinstance(out, ld.PerReplica) and float(out) == 3.0
        gathered = one.run(lambda: ld.get_replica_context().all_gather(np.ones(2), axis=0))
        assert not isinstance(gathered, ld.PerReplica) and gathered.shape == (2,)
        values = one.experimental_distribute_values_from_function(lambda ctx: 5)
        assert values == 5 and type(values) is int
    finally:
        one.close()


def test_reduce_to_and_batch_reduce_to(mirrored2):
    with mirrored2.scope():
        v = ld.Variable(np.float32(0.0))
    twos = mirrored2.run(lambda: np.float32(ld.get_replica_context().replica_id_in_sync_group
                                            + 2))
    assert float(mirrored2.extended.reduce_to("SUM", twos, v)) == 5.0  # 2 + 3
    got = mirrored2.extended.batch_reduce_to(ld.ReduceOp.MEAN, [(twos, "/cpu:0"), (twos, v)])
    assert [float(x) for x in got] == [2.5, 2.5]
    with pytest.raises(ValueError, match="destinations=3"):
        mirrored2.extended.reduce_to("SUM", twos, 3)
    with pytest.raises(ValueError, match="reduce_op"):
        mirrored2.extended.reduce_to("MAX", twos, v)
    values = mirrored2.experimental_distribute_values_from_function(
        lambda ctx: ctx.replica_id_in_sync_group + 1)
    assert [type(x) for x in mirrored2.experimental_local_results(values)] == [int, int]


class RebuiltOnlyOnWorkers:
    """Pickles on a replica; unpickling it on the driver raises (a class only workers have)."""

    def __reduce__(self):
        return (_rebuild_on_a_worker, (os.getpid(),))


def _rebuild_on_a_worker(made_in: int):
    if multiprocessing.parent_process() is None:  # the driver (the test process itself)
        raise RuntimeError("cannot be rebuilt on the driver")
    return made_in


@pytest.mark.parametrize("where", ["merge_call arguments", "the step's result"])
def test_an_answer_the_driver_cannot_read_fails_that_run_only(mirrored2, where):
    """The README's promise: after a failed step the next run works, also when a replica's
    answer cannot be unpickled on the driver while it waits in merge_call."""
    def merge(strategy, value):
        return 1

    def step():
        if where == "merge_call arguments":
            return ld.get_replica_context().merge_call(merge, args=(RebuiltOnlyOnWorkers(),))
        return RebuiltOnlyOnWorkers()

    with pytest.raises(TypeError, match="cannot be unpickled on the driver"):
        mirrored2.run(step)
    assert mirrored2.experimental_local_results(mirrored2.run(lambda: 7)) == (7, 7)
