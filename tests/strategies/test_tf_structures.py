"""What `strategy.run` and `experimental_distribute_values_from_function` return, as TF 2.21's
MirroredStrategy does (tf.distribute's `regroup`): the function's structure with a per-replica
value at each leaf; with one replica `run` gives the plain value (TF 2.21 on one device: an
EagerTensor, not a PerReplica) while values_from_function still gives a one-component
PerReplica (TF's `always_wrap`); a leaf that is None everywhere stays None; a variable comes
back as the variable itself; cross-replica calls (and any `scope()`) inside a step raise TF's
RuntimeError.
Each on 1, 2 and 3 replicas (real worker processes), for a fresh function (pickled with the call)
and for one sent again (the replicas' cached copy)."""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest
from conftest import make_strategy

import labdist as ld

Point = namedtuple("Point", "x y")


@pytest.fixture(params=[1, 2, 3])
def mirrored(request) -> ld.Strategy:
    return make_strategy(f"mirrored-{request.param}")


def twice(strategy, fn, *args, **kwargs):
    """`fn` run as a new function, then again from the replicas' cache (same object)."""
    return [strategy.run(fn, *args, **kwargs) for _ in range(2)]


def parts(value, n: int) -> list:
    """A run result leaf's components: with one replica, TF's plain value is the one."""
    if n == 1:
        assert not isinstance(value, ld.PerReplica)
        return [value]
    return wrapped(value, n)


def wrapped(value, n: int) -> list:
    """A values_from_function leaf's components: a PerReplica of n, one replica included
    (TF 2.21's MirroredStrategy on one device: PerReplica:{0: 5})."""
    assert isinstance(value, ld.PerReplica) and len(value) == n
    return list(value.values)


def ids(strategy):
    return [int(c) for c in strategy.experimental_local_results(
        strategy.run(lambda: ld.get_replica_context().replica_id_in_sync_group))]


# -- run's results ---------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_run_returning_none_gives_none(mirrored):
    def nothing():
        ld.get_replica_context()  # a step that returns nothing

    def pair():
        return None, ld.get_replica_context().replica_id_in_sync_group

    assert twice(mirrored, nothing) == [None, None]
    for out in twice(mirrored, pair):
        assert type(out) is tuple and out[0] is None
        n = mirrored.num_replicas_in_sync
        assert [int(c) for c in parts(out[1], n)] == list(range(n))
    assert mirrored.run(nothing, steps=3) is None


@pytest.mark.timeout(120)
def test_run_gives_a_per_replica_value_for_any_replica_count(mirrored):
    n = mirrored.num_replicas_in_sync

    def step(x):
        return {"id": ld.get_replica_context().replica_id_in_sync_group, "x": x * 2}

    for out in twice(mirrored, step, args=(np.float32(1.5),)):
        parts(out["id"], n)
        assert [float(c) for c in parts(out["x"], n)] == [3.0] * n
        assert mirrored.experimental_local_results(out["id"]) == tuple(range(n))
        assert float(mirrored.reduce("SUM", out["x"], axis=None)) == 3.0 * n
    assert ids(mirrored) == list(range(n))


@pytest.mark.timeout(60)
def test_one_device_strategy_returns_the_plain_value():
    one = make_strategy("one-device")
    assert one.run(lambda: 7) == 7
    assert one.run(lambda: None) is None
    assert one.experimental_distribute_values_from_function(lambda ctx: {"a": 1}) == {"a": 1}


@pytest.mark.timeout(120)
def test_run_returning_a_variable_gives_the_variable_itself(mirrored):
    with mirrored.scope():
        v = ld.Variable(np.zeros(2, np.float32), aggregation="MEAN")

    def update(x):
        v.assign_add(x)
        return v

    def both():
        return v, ld.get_replica_context().replica_id_in_sync_group

    for out in twice(mirrored, update, args=(np.ones(2, np.float32),)):
        assert out is v
    for out in twice(mirrored, both):
        assert out[0] is v and len(parts(out[1], mirrored.num_replicas_in_sync)) >= 1
    with mirrored.scope():
        np.testing.assert_array_equal(v.read_value(), [2.0, 2.0])


@pytest.mark.timeout(120)
def test_cross_replica_calls_inside_a_step_raise_tf_runtime_error(mirrored):
    n = mirrored.num_replicas_in_sync

    def gather():
        return mirrored.gather(np.zeros(2), axis=0)

    def reduce():
        return mirrored.reduce("SUM", np.zeros(2), axis=None)

    def scoped():
        with mirrored.scope():  # TF 2.21: RuntimeError, "requires being in cross-replica
            return mirrored.num_replicas_in_sync  # context, use ... merge_call()"

    for _ in range(2):  # fresh, then the cached function
        with pytest.raises(RuntimeError, match=r"strategy\.gather requires being in "
                                               r"cross-replica context.*all_gather"):
            mirrored.run(gather)
        with pytest.raises(RuntimeError, match=r"strategy\.reduce requires being in "
                                               r"cross-replica context.*all_reduce"):
            mirrored.run(reduce)
        with pytest.raises(RuntimeError, match=r"cross-replica context.*merge_call"):
            mirrored.run(scoped)
    assert ids(mirrored) == list(range(n))  # the strategy still works


# -- experimental_distribute_values_from_function ---------------------------------------------
@pytest.mark.timeout(120)
def test_values_from_function_returning_a_nest_gives_a_nest_of_per_replica_values(mirrored):
    n = mirrored.num_replicas_in_sync
    nested = mirrored.experimental_distribute_values_from_function(
        lambda ctx: {"a": 0.5, "b": {"c": [1, ctx.replica_id_in_sync_group]}})
    assert set(nested) == {"a", "b"} and type(nested["b"]["c"]) is list
    for leaf in (nested["a"], nested["b"]["c"][0], nested["b"]["c"][1]):
        wrapped(leaf, n)
    # TF: Python numbers stay Python objects in the local results, also inside a structure
    local = mirrored.experimental_local_results(nested)
    assert [type(d["a"]) for d in local] == [float] * n
    assert [d["b"]["c"] for d in local] == [[1, r] for r in range(n)]
    assert all(type(x) is int for d in local for x in d["b"]["c"])
    total = mirrored.reduce("SUM", nested, axis=None)
    # TF, 2 replicas: {"a": 1.0, "b": {"c": [2, 1]}}
    assert total == {"a": 0.5 * n, "b": {"c": [n, sum(range(n))]}}
    assert type(total["b"]["c"]) is list

    point = mirrored.experimental_distribute_values_from_function(
        lambda ctx: Point(1.0, ctx.replica_id_in_sync_group))
    assert type(point) is Point and len(wrapped(point.x, n)) == n
    summed = mirrored.reduce("SUM", point, axis=None)
    assert type(summed) is Point and summed == Point(1.0 * n, sum(range(n)))  # TF: Point(2.0, 1)
    mean = mirrored.reduce("MEAN", point, axis=None)
    assert type(mean) is Point and mean.x == 1.0

    pair = mirrored.experimental_distribute_values_from_function(
        lambda ctx: (ctx.replica_id_in_sync_group, np.full(2, ctx.replica_id_in_sync_group)))
    assert type(pair) is tuple and len(pair) == 2

    # each replica gets its own components of the nest
    def step(d, p):
        return d["b"]["c"][1] * 10 + p.y

    out = mirrored.run(step, args=(nested, point))
    assert [int(c) for c in mirrored.experimental_local_results(out)] == \
        [11 * r for r in range(n)]


@pytest.mark.timeout(60)
def test_values_from_function_structures_must_agree(mirrored2):
    with pytest.raises(ValueError, match="different structures on different replicas"):
        mirrored2.experimental_distribute_values_from_function(
            lambda ctx: {"a": 1} if ctx.replica_id_in_sync_group else {"b": 1})
    # a PerReplica of structures is refused by reduce rather than turned into an array
    with pytest.raises(TypeError, match="replica 0's component is a Point"):
        mirrored2.reduce("SUM", ld.PerReplica([Point(1.0, 0), Point(1.0, 1)]), axis=None)
    with pytest.raises(TypeError, match="component is a dict"):
        mirrored2.reduce("SUM", ld.PerReplica([{"a": 1}, {"a": 2}]), axis=None)
