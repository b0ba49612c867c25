"""Contexts as TensorFlow 2.21 measures them (MirroredStrategy on 2 and 3 logical CPUs, on one
CPU, OneDeviceStrategy and the default strategy; each test says what TF gave). Inside a step
`get_strategy()` is the running strategy, `has_strategy()` True and
`in_cross_replica_context()` False; the running strategy's `scope()` inside a step raises
RuntimeError ("requires being in cross-replica context"), another strategy's scope anywhere
"Mixing different tf.distribute.Strategy objects"; an `extended.update` function runs in
cross-replica context; one replica gives plain values from run and all_gather, but a
one-component PerReplica from values_from_function; `reduce_to` / `batch_reduce_to` give a
Mirrored value for a variable destination and the plain value for a device string; and a
merge_call answer that cannot travel fails that run only."""

from __future__ import annotations

import multiprocessing
import os
from collections import namedtuple

import numpy as np
import pytest
from conftest import make_strategy

import labdist as ld
from labdist.values import Mirrored

Point = namedtuple("Point", "x y")


def refusal(fn) -> str:
    """The RuntimeError `fn()` raises ("" if it raises none)."""
    try:
        fn()
    except RuntimeError as e:
        return str(e)
    return ""


def enter(strategy) -> str:
    def body():
        with strategy.scope():
            pass
    return refusal(body)


@pytest.fixture
def mirrored1() -> ld.Strategy:
    return make_strategy("mirrored-1")


# -- 1. inside strategy.run ---------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_inside_a_step_the_strategy_is_there_and_no_scope_may_be_entered(mirrored2, mirrored3):
    def step():
        strategy = ld.get_strategy()
        ctx = ld.get_replica_context()
        seen = (strategy.num_replicas_in_sync, ld.has_strategy(), ld.in_cross_replica_context(),
                ctx.replica_id_in_sync_group, ctx.strategy is strategy,
                ld.get_strategy() is strategy)
        return seen, [enter(strategy), enter(mirrored2), enter(mirrored3),
                      refusal(lambda: strategy.reduce("SUM", 1.0, axis=None)),
                      refusal(lambda: strategy.extended.reduce_to("SUM", 1.0, "/cpu:0")),
                      refusal(lambda: mirrored2.extended.batch_reduce_to("SUM", []))]

    results = mirrored2.experimental_local_results(mirrored2.run(step))
    for rank, (seen, refused) in enumerate(results):
        # TF: get_strategy() is the strategy (num_replicas_in_sync 2), has_strategy() True,
        # in_cross_replica_context() False, get_replica_context().strategy is it too
        assert seen == (2, True, False, rank, True, True)
        # TF: its own scope -> RuntimeError "Method requires being in cross-replica context,
        # use get_replica_context().merge_call()" (through get_strategy() or captured)
        assert "cross-replica context" in refused[0] and "merge_call" in refused[0]
        assert "cross-replica context" in refused[1] and "Mixing" not in refused[1]
        # TF: another strategy's scope -> RuntimeError "Mixing different ... objects"
        assert refused[2].startswith("Mixing different tf.distribute.Strategy objects")
        # TF: reduce, extended.reduce_to, extended.batch_reduce_to -> the same RuntimeError
        assert "strategy.reduce requires being in cross-replica context" in refused[3]
        assert "extended.reduce_to requires being in cross-replica context" in refused[4]
        assert "extended.batch_reduce_to requires being in cross-replica context" in refused[5]
    assert ld.get_strategy() is not mirrored2 and not ld.in_cross_replica_context()


def test_in_process_steps_see_the_strategy_itself():
    one = ld.OneDeviceStrategy(device="cpu")
    default = ld.get_strategy()
    try:
        for strategy, has in ((one, True), (default, False)):
            def step(strategy=strategy):
                return (ld.get_strategy() is strategy, ld.has_strategy(),
                        ld.in_cross_replica_context(), enter(strategy), enter(ld.get_strategy()))

            seen = strategy.run(step)
            # TF: get_strategy() is s; has_strategy() True under OneDeviceStrategy, False
            # under the default strategy; in_cross_replica_context() False
            assert seen[:3] == (True, has, False)
            # TF: OneDeviceStrategy's scope in its step -> RuntimeError "Method requires being
            # in cross-replica context"; the default strategy's may be entered
            if has:
                assert "cross-replica context" in seen[3] and seen[3] == seen[4]
            else:
                assert seen[3:] == ("", "")
            # a merge_call result of the user's class comes back whole (packed, unpacked)
            assert strategy.run(lambda: ld.get_replica_context().merge_call(
                lambda s: Point(1, s.num_replicas_in_sync))) == Point(1, 1)
    finally:
        one.close()


# -- 2. the extended.update function ---------------------------------------------------------
@pytest.mark.timeout(120)
def test_an_update_function_runs_in_cross_replica_context(mirrored2, mirrored3):
    with mirrored2.scope():
        v = ld.Variable(np.float32(1.0))

    def update(var, x):
        return var.assign_add(x)

    def merge(strategy, x):
        return strategy.extended.update(v, update, args=(x,))

    mirrored2.run(lambda: ld.get_replica_context().merge_call(merge, args=(np.float32(1.0),)))
    assert float(v.numpy()) == 2.0

    def probe(var):  # on the replicas, in the update context itself
        return (ld.in_cross_replica_context(), ld.get_replica_context() is None,
                ld.has_strategy(), ld.get_strategy().num_replicas_in_sync,
                enter(mirrored2), enter(ld.get_strategy()), enter(mirrored3))

    # TF, in the update function: in_cross_replica_context() True, get_replica_context()
    # None, has_strategy() True, get_strategy() the strategy; its own scope may be entered,
    # another strategy's is "Mixing different tf.distribute.Strategy objects"
    for seen in mirrored2.extended.update(v, probe, group=False):
        assert seen[:6] == (True, True, True, 2, "", "")
        assert seen[6].startswith("Mixing different tf.distribute.Strategy objects")


def test_the_default_strategys_update_function_is_in_its_replica_context():
    one = ld.OneDeviceStrategy(device="cpu")
    try:
        with one.scope():
            v = ld.Variable(np.float32(1.0))
        with ld.get_strategy().scope():
            w = ld.Variable(np.float32(1.0))

        def probe(var):
            return ld.in_cross_replica_context(), ld.get_replica_context()

        # TF: OneDeviceStrategy's update function: (True, None); the default strategy's:
        # (False, its default replica context)
        assert one.extended.update(v, probe, group=False) == ((True, None),)
        ((cross, ctx),) = ld.get_strategy().extended.update(w, probe, group=False)
        assert cross is False and ctx.num_replicas_in_sync == 1
    finally:
        one.close()


# -- 3. scopes on the driver ------------------------------------------------------------------
def test_another_strategys_scope_inside_one_is_mixing(mirrored2, mirrored3):
    with mirrored2.scope():
        # TF: RuntimeError "Mixing different tf.distribute.Strategy objects: <3> is not <2>"
        with (pytest.raises(RuntimeError, match="Mixing different tf.distribute.Strategy"),
              mirrored3.scope()):
            pass
        assert ld.get_strategy() is mirrored2  # nothing entered by the failed attempt
        with mirrored2.scope():  # the same one again: fine, as in TF
            assert ld.get_strategy() is mirrored2
        assert ld.get_strategy() is mirrored2
    assert not ld.has_strategy()


# -- 4. extended.reduce_to / batch_reduce_to ----------------------------------------------------
@pytest.mark.timeout(120)
def test_reduce_to_gives_mirrored_for_a_variable_and_the_value_for_a_device(mirrored2):
    with mirrored2.scope():
        v = ld.Variable(np.float32(0.0))
    twos = mirrored2.run(lambda: np.float32(ld.get_replica_context().replica_id_in_sync_group
                                            + 2))
    # TF: a variable (or per-replica) destination -> Mirrored:{0: 5.0, 1: 5.0}
    for destinations in (v, twos):
        to_mirror = mirrored2.extended.reduce_to("SUM", twos, destinations)
        assert type(to_mirror) is Mirrored
        assert mirrored2.experimental_local_results(to_mirror) == (5.0, 5.0)
    # TF: a device string -> the reduced tensor itself (5.0); "sum" is accepted
    to_device = mirrored2.extended.reduce_to("sum", twos, "/cpu:0")
    assert not isinstance(to_device, ld.PerReplica) and float(to_device) == 5.0
    # TF: a structure reduces leaf by leaf ({"a": Mirrored})
    nested = mirrored2.extended.reduce_to(ld.ReduceOp.MEAN, {"a": twos}, v)
    assert type(nested["a"]) is Mirrored and list(nested["a"]) == [2.5, 2.5]
    # TF: batch_reduce_to gives a list, each pair as reduce_to does
    got = mirrored2.extended.batch_reduce_to(ld.ReduceOp.MEAN, [(twos, "/cpu:0"), (twos, v)])
    assert type(got) is list and float(got[0]) == 2.5 and type(got[1]) is Mirrored
    # a Mirrored goes where a PerReplica goes: each replica gets its component
    assert mirrored2.experimental_local_results(
        mirrored2.run(lambda x: x * 2, args=(to_mirror,))) == (10.0, 10.0)

    def merge(strategy, x):
        return strategy.extended.reduce_to("SUM", x, v)

    # TF: reduce_to in a merge_call function, its Mirrored handed back: 2.0 on each replica
    out = mirrored2.run(lambda: ld.get_replica_context().merge_call(merge,
                                                                     args=(np.float32(1.0),)))
    assert [float(x) for x in mirrored2.experimental_local_results(out)] == [2.0, 2.0]


@pytest.mark.timeout(60)
def test_reduce_to_refuses_what_tf_refuses(mirrored2, mirrored3):
    with mirrored2.scope():
        v = ld.Variable(np.float32(0.0))
    with mirrored3.scope():
        w = ld.Variable(np.float32(0.0))
    twos = ld.PerReplica([np.float32(2.0), np.float32(3.0)])
    ext = mirrored2.extended
    # TF: ValueError "'MAX' is not a valid ReduceOp" (reduce_to and batch_reduce_to)
    with pytest.raises(ValueError, match="reduce_op='MAX' is not a valid ReduceOp"):
        ext.reduce_to("MAX", twos, v)
    with pytest.raises(ValueError, match="reduce_op='MAX' is not a valid ReduceOp"):
        ext.batch_reduce_to("MAX", [(twos, v)])
    # TF: ValueError "A non-DistributedValues value 1.0 cannot be reduced with ... SUM";
    # its MEAN is itself
    with pytest.raises(ValueError, match="not a per-replica value"):
        ext.reduce_to("SUM", 1.0, "/cpu:0")
    assert ext.reduce_to("MEAN", 1.0, "/cpu:0") == 1.0
    # TF: a pair that is not one fails to unpack (TypeError); labdist checks every pair
    # before reducing any
    with pytest.raises(TypeError, match=r"value_destination_pairs\[1\]"):
        ext.batch_reduce_to("SUM", [(twos, v), twos])
    # TF fails with AttributeError on destinations=3 / None; labdist names the parameter
    for bad in (3, None, ""):
        with pytest.raises(ValueError, match=f"destinations={bad!r} is not allowed"):
            ext.reduce_to("SUM", twos, bad)
    with pytest.raises(ValueError, match="PerReplica of 3 components"):
        ext.reduce_to("SUM", twos, ld.PerReplica([1, 2, 3]))
    with pytest.raises(ValueError, match="variable of another strategy"):
        ext.reduce_to("SUM", twos, w)
    with pytest.raises(ValueError, match="options=.*CommunicationOptions"):
        ext.reduce_to("SUM", twos, v, options="fast")


# -- 5. one replica ------------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_one_replica_gives_plain_values_but_values_from_function_wraps(mirrored1):
    # TF, MirroredStrategy(["/cpu:0"]): run -> an EagerTensor, not a PerReplica
    out = mirrored1.run(lambda: np.float32(3.0))
    assert not isinstance(out, ld.PerReplica) and float(out) == 3.0
    assert mirrored1.experimental_local_results(out) == (3.0,)  # TF: (3.0,)
    assert float(mirrored1.reduce("SUM", out, axis=None)) == 3.0  # TF: 3.0 (and MEAN 3.0)
    assert float(mirrored1.reduce("MEAN", out, axis=None)) == 3.0
    # TF: all_gather -> the plain tensor [1. 1.]
    gathered = mirrored1.run(lambda: ld.get_replica_context().all_gather(np.ones(2), axis=0))
    assert not isinstance(gathered, ld.PerReplica) and gathered.shape == (2,)
    # TF: values_from_function -> PerReplica:{0: 5} (an int), run sees 5: 6 back
    values = mirrored1.experimental_distribute_values_from_function(lambda ctx: 5)
    assert isinstance(values, ld.PerReplica) and values.values == (5,)
    assert [type(x) for x in mirrored1.experimental_local_results(values)] == [int]
    assert int(mirrored1.run(lambda x: x + 1, args=(values,))) == 6
    # TF: reduce_to a variable with one replica -> the plain tensor (one device's Mirrored)
    with mirrored1.scope():
        v = ld.Variable(np.float32(0.0))
    assert float(mirrored1.extended.reduce_to("SUM", out, v)) == 3.0
    # TF: OneDeviceStrategy's values_from_function -> 5 itself
    one = ld.OneDeviceStrategy(device="cpu")
    try:
        assert one.experimental_distribute_values_from_function(lambda ctx: 5) == 5
    finally:
        one.close()


# -- 6. Python numbers from values_from_function -------------------------------------------------
def test_python_numbers_stay_python_objects_in_local_results(mirrored2):
    values = mirrored2.experimental_distribute_values_from_function(
        lambda ctx: {"a": ctx.replica_id_in_sync_group + 1, "b": (0.5, True)})
    # TF: ({'a': 1, 'b': (0.5, True)}, {'a': 2, 'b': (0.5, True)}), int / float / bool
    local = mirrored2.experimental_local_results(values)
    assert local == ({"a": 1, "b": (0.5, True)}, {"a": 2, "b": (0.5, True)})
    assert [[type(d["a"]), *map(type, d["b"])] for d in local] == [[int, float, bool]] * 2
    flat = mirrored2.experimental_distribute_values_from_function(lambda ctx: 2.5)
    assert [type(x) for x in mirrored2.experimental_local_results(flat)] == [float, float]


# -- 7. a merge_call answer that cannot travel ----------------------------------------------------
class RebuiltOnlyOnWorkers:
    """Pickles on a replica; unpickling it on the driver raises (a class only workers have)."""

    def __reduce__(self):
        return (_rebuild_on_a_worker, (os.getpid(),))


def _rebuild_on_a_worker(made_in: int):
    if multiprocessing.parent_process() is None:  # the driver (the test process itself)
        raise RuntimeError("cannot be rebuilt on the driver")
    return made_in


class RebuiltOnlyOnTheDriver:
    """Pickles on the driver; unpickling it on a worker raises."""

    def __reduce__(self):
        return (_rebuild_on_the_driver, ())


def _rebuild_on_the_driver():
    if multiprocessing.parent_process() is not None:  # a worker process
        raise RuntimeError("cannot be rebuilt on a worker")
    return "driver"


class Unpicklable:
    def __reduce__(self):
        raise TypeError("this object refuses to be pickled")


ANSWERS = {
    # where it fails: (what the step sends or the merge function returns, the error)
    "merge_call arguments": ("cannot be unpickled on the driver: RuntimeError: cannot be "
                             "rebuilt on the driver"),
    "the step's result": "cannot be unpickled on the driver",
    "a merge result the driver cannot pickle": (
        r"the result of the merge_call function .*merge for replica 0 cannot be sent to the "
        r"replicas \(TypeError: this object refuses to be pickled\)"),
    "a merge result a replica cannot unpickle": (
        r"the merge_call result sent to replica 1 cannot be unpickled on its worker "
        r"\(RuntimeError: cannot be rebuilt on a worker\)"),
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["mirrored-2", "mirrored-3-tcp"])  # the lane, actor calls
@pytest.mark.parametrize("where", list(ANSWERS))
def test_an_answer_that_cannot_travel_fails_that_run_only(kind, where):
    """The README's promise: after a failed step the next run works, also when an answer
    cannot be unpickled where it goes while replicas wait in merge_call (over the lane and
    over Dask's actor calls, which left the replicas waiting before)."""
    strategy = make_strategy(kind)

    def merge(strategy, value):
        if where == "a merge result the driver cannot pickle":
            return ld.PerReplica([Unpicklable()] + [1] * (strategy.num_replicas_in_sync - 1))
        if where == "a merge result a replica cannot unpickle":
            return ld.PerReplica([1, RebuiltOnlyOnTheDriver()]
                                 + [1] * (strategy.num_replicas_in_sync - 2))
        return 1

    def step():
        ctx = ld.get_replica_context()
        if where == "the step's result":
            return RebuiltOnlyOnWorkers()
        arg = RebuiltOnlyOnWorkers() if where == "merge_call arguments" else 0
        ctx.merge_call(merge, args=(arg,))
        return ctx.all_reduce("SUM", 1.0)

    with pytest.raises(TypeError, match=ANSWERS[where]):
        strategy.run(step)
    n = strategy.num_replicas_in_sync
    again = strategy.run(lambda: ld.get_replica_context().all_reduce("SUM", 1.0))
    assert [float(x) for x in strategy.experimental_local_results(again)] == [n] * n
    # and merge_call works again: the driver's answer reaches every replica
    back = strategy.run(lambda: ld.get_replica_context().merge_call(lambda s: Point(1, 2)))
    assert strategy.experimental_local_results(back) == (Point(1, 2),) * n
