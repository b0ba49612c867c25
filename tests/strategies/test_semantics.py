"""docs/semantics.md §1-§2 through real worker processes, against the single-process reference."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from numpy.testing import assert_array_equal
from reference import MODES, RefVariable, SpecError

import labdist as ld

SYNCS = ["AUTO", "ON_WRITE", "ON_READ", "NONE"]
AGGS = ["NONE", "SUM", "MEAN", "ONLY_FIRST_REPLICA"]


def replica_values(strategy, scale=1.0):
    """PerReplica of 1.0, 2.0, ... (Python floats: distributed, since each replica's differs)."""
    return strategy.experimental_distribute_values_from_function(
        lambda ctx: scale * (ctx.replica_id_in_sync_group + 1))


def run_quietly(strategy, fn, *args):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = strategy.run(fn, args=args)
    return out, [w for w in caught if issubclass(w.category, ld.ReplicaDivergenceWarning)]


def copies(strategy, v):
    return list(strategy.experimental_local_results(v))


def assert_copies(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        assert_array_equal(a, e)
        assert np.asarray(a).dtype == np.asarray(e).dtype


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("sync", SYNCS)
def test_replica_context_update_matches_reference(strategy, sync, agg, mode):
    n = strategy.num_replicas_in_sync
    with strategy.scope():
        v = ld.Variable(10.0, synchronization=sync, aggregation=agg, name="v")
    ref = RefVariable(10.0, n, sync, agg)
    out, warned = run_quietly(strategy, lambda x: getattr(v, mode)(x), replica_values(strategy))
    expected = ref.replica_update(mode, [float(r + 1) for r in range(n)])
    assert_copies(strategy.experimental_local_results(out), expected)  # returns the local copy
    assert_copies(copies(strategy, v), ref.copies)
    should_warn = sync in ("AUTO", "ON_WRITE") and agg == "NONE" and ref.diverged()
    assert len(warned) == (1 if should_warn else 0)
    if should_warn:
        assert "'v'" in str(warned[0].message)
    # a second update continues from the same state, and the warning is not repeated
    _, warned_again = run_quietly(strategy, lambda x: getattr(v, mode)(x),
                                  replica_values(strategy, 2.0))
    ref.replica_update(mode, [2.0 * (r + 1) for r in range(n)])
    assert_copies(copies(strategy, v), ref.copies)
    assert warned_again == []


@pytest.mark.parametrize("mode", ["read", *MODES])
@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("sync", SYNCS)
def test_cross_replica_context_matches_reference(strategy, sync, agg, mode):
    n = strategy.num_replicas_in_sync
    with strategy.scope():
        v = ld.Variable(10.0, synchronization=sync, aggregation=agg)
    ref = RefVariable(10.0, n, sync, agg)
    # make the copies differ first where the spec lets them (so copy 0 / sum / mean differ)
    run_quietly(strategy, lambda x: v.assign_add(x), replica_values(strategy))
    ref.replica_update("assign_add", [float(r + 1) for r in range(n)])
    before = [c.copy() for c in ref.copies]
    with strategy.scope():
        try:
            expected = ref.read() if mode == "read" else ref.cross_update(mode, 4.0)
        except SpecError:
            with pytest.raises(ValueError, match="Variable"):
                v.read_value() if mode == "read" else getattr(v, mode)(4.0)
            assert_copies(copies(strategy, v), before)  # nothing was written
            return
        result = v.read_value() if mode == "read" else getattr(v, mode)(4.0)
    if expected is None:
        assert result is None
    else:
        assert_array_equal(result, expected)
    assert_copies(copies(strategy, v), ref.copies)


def test_semantics_examples_on_two_replicas(mirrored2):
    s = mirrored2
    xs = replica_values(s)
    expected = {"SUM": [13, 13], "MEAN": [11.5, 11.5], "ONLY_FIRST_REPLICA": [11, 11],
                "NONE": [11, 12]}
    for agg, want in expected.items():
        with s.scope():
            v = ld.Variable(10.0, aggregation=agg)
        run_quietly(s, lambda x, v=v: v.assign_add(x), xs)
        assert [float(c) for c in copies(s, v)] == want, agg
    with s.scope():
        w = ld.Variable(0.0, aggregation="SUM")
    seven_eight = s.experimental_distribute_values_from_function(
        lambda c: 7.0 + c.replica_id_in_sync_group)
    s.run(lambda x: w.assign(x), args=(seven_eight,))
    assert [float(c) for c in copies(s, w)] == [15, 15]
    with s.scope():
        r = ld.Variable(10.0, synchronization="ON_READ", aggregation="SUM")
        assert float(r.read_value()) == 20.0  # a fresh ON_READ SUM reads N x initial
        assert float(r.assign(5.0)) == 5.0
    assert [float(c) for c in copies(s, r)] == [2.5, 2.5]


@pytest.mark.parametrize("n_kind", ["mirrored-2", "mirrored-3"])
def test_on_read_sum_integer_assign_truncates(n_kind):
    from conftest import make_strategy

    s = make_strategy(n_kind)
    n = s.num_replicas_in_sync
    with s.scope():
        v = ld.Variable(0, dtype="int32", synchronization="ON_READ", aggregation="SUM")
        result = v.assign(5)
    assert [int(c) for c in copies(s, v)] == [5 // n] * n
    assert int(result) == (5 // n) * n
    assert int(v.read_value()) == (5 // n) * n
    assert copies(s, v)[0].dtype == np.int32


class TestNonDistributedValues:
    def test_sum_of_a_constant_raises_and_writes_nothing(self, strategy):
        with strategy.scope():
            v = ld.Variable(10.0, aggregation="SUM", name="counter")
        with pytest.raises(ValueError, match="counter.*non-distributed"):
            strategy.run(lambda: v.assign_add(1.0))
        assert_copies(copies(strategy, v), [np.float32(10.0)] * strategy.num_replicas_in_sync)

    def test_zero_is_a_no_op(self, strategy):
        with strategy.scope():
            v = ld.Variable(10.0, aggregation="SUM")
        strategy.run(lambda: v.assign_add(0.0))
        strategy.run(lambda: v.assign_sub(0))
        assert [float(c) for c in copies(strategy, v)] == [10.0] * strategy.num_replicas_in_sync

    @pytest.mark.parametrize("agg", ["MEAN", "ONLY_FIRST_REPLICA", "NONE"])
    def test_other_aggregations_apply_a_constant_as_is(self, strategy, agg):
        with strategy.scope():
            v = ld.Variable(10.0, aggregation=agg)
        strategy.run(lambda: v.assign_add(1.5))
        assert [float(c) for c in copies(strategy, v)] == [11.5] * strategy.num_replicas_in_sync

    def test_one_replica_applies_a_constant_sum(self):
        s = ld.OneDeviceStrategy(device="cpu")
        with s.scope():
            v = ld.Variable(10.0, aggregation="SUM")
        assert float(s.run(lambda: v.assign_add(1.0))) == 11.0


class TestCreationRules:
    @pytest.mark.parametrize("sync", SYNCS)
    def test_integer_mean_is_rejected(self, mirrored2, sync):
        with mirrored2.scope(), pytest.raises(ValueError, match="MEAN.*int32"):
            ld.Variable(1, synchronization=sync, aggregation="MEAN")

    @pytest.mark.parametrize(("sync", "trainable"),
                             [("AUTO", True), ("ON_WRITE", True), ("ON_READ", False),
                              ("NONE", True)])
    def test_trainable_defaults(self, mirrored2, sync, trainable):
        with mirrored2.scope():
            assert ld.Variable(1.0, synchronization=sync).trainable is trainable
            assert ld.Variable(1.0, synchronization=sync, trainable=not trainable).trainable is (
                not trainable)

    def test_dtype_defaults_follow_tensorflow(self, mirrored2):
        with mirrored2.scope():
            assert ld.Variable(1.0).dtype == np.float32
            assert ld.Variable(1).dtype == np.int32
            assert ld.Variable(np.zeros(3)).dtype == np.float64
            assert ld.Variable(1, dtype="float64").dtype == np.float64
            assert ld.Variable(lambda: [1.0, 2.0]).shape == (2,)

    def test_enums_accept_names_case_insensitively(self, mirrored2):
        with mirrored2.scope():
            v = ld.Variable(1.0, synchronization="on_read", aggregation="Sum")
        assert v.synchronization is ld.VariableSynchronization.ON_READ
        assert v.aggregation is ld.VariableAggregation.SUM
        assert ld.ReduceOp.parse("mean") is ld.ReduceOp.MEAN

    @pytest.mark.parametrize(("kwargs", "match"), [
        ({"synchronization": "ON_WRTE"}, "synchronization='ON_WRTE'.*ON_WRITE"),
        ({"aggregation": "AVERAGE"}, "aggregation='AVERAGE'.*ONLY_FIRST_REPLICA"),
        ({"aggregation": 3.5}, "aggregation=3.5"),
    ])
    def test_unknown_enum_names_are_rejected(self, mirrored2, kwargs, match):
        with mirrored2.scope(), pytest.raises(ValueError, match=match):
            ld.Variable(1.0, **kwargs)

    def test_bad_initial_values_and_dtypes(self, mirrored2):
        with mirrored2.scope():
            with pytest.raises(TypeError, match="initial_value"):
                ld.Variable("ten")
            with pytest.raises(TypeError, match="dtype"):
                ld.Variable(1.0, dtype="not-a-dtype")
            with pytest.raises(TypeError, match="trainable"):
                ld.Variable(1.0, trainable="yes")

    def test_variables_cannot_be_created_inside_run(self, mirrored2):
        with pytest.raises(ValueError, match="strategy.scope"):
            mirrored2.run(lambda: ld.Variable(1.0))


class TestSynchronizationNone:
    """labdist's extension: replica-local variables."""

    def test_replica_updates_are_local_whatever_the_aggregation(self, strategy):
        n = strategy.num_replicas_in_sync
        with strategy.scope():
            v = ld.Variable(10.0, synchronization="NONE", aggregation="SUM")
        strategy.run(lambda x: v.assign_add(x), args=(replica_values(strategy),))
        assert [float(c) for c in copies(strategy, v)] == [10.0 + r + 1 for r in range(n)]

    def test_cross_replica_read_points_to_local_results(self, strategy):
        with strategy.scope():
            v = ld.Variable(1.0, synchronization="NONE")
            with pytest.raises(ValueError, match="experimental_local_results"):
                v.read_value()

    def test_cross_replica_assign_writes_every_copy_and_returns_none(self, strategy):
        n = strategy.num_replicas_in_sync
        with strategy.scope():
            v = ld.Variable(1.0, synchronization="NONE")
            assert v.assign(3.0) is None
            assert v.assign_add(1.0) is None
        assert [float(c) for c in copies(strategy, v)] == [4.0] * n

    def test_integer_mean_still_rejected(self, mirrored2):
        with mirrored2.scope(), pytest.raises(ValueError, match="MEAN"):
            ld.Variable(1, synchronization="NONE", aggregation="MEAN")


class TestBadUpdates:
    def test_wrong_shape_in_replica_context_changes_nothing(self, strategy):
        with strategy.scope():
            v = ld.Variable(np.zeros(3, np.float32), aggregation="SUM", name="w")
        xs = strategy.experimental_distribute_values_from_function(lambda c: np.ones(4))
        with pytest.raises(ValueError, match=r"'w'.*shape \(4,\).*\(3,\)"):
            strategy.run(lambda x: v.assign_add(x), args=(xs,))
        assert all((c == 0).all() for c in copies(strategy, v))

    def test_wrong_shape_in_cross_replica_context_changes_nothing(self, strategy):
        with strategy.scope():
            v = ld.Variable(np.zeros(3, np.float32), name="w")
            with pytest.raises(ValueError, match=r"'w'.*shape"):
                v.assign(np.ones((2, 2)))
        assert all((c == 0).all() for c in copies(strategy, v))

    def test_float_into_int_variable_is_a_type_error(self, strategy):
        with strategy.scope():
            v = ld.Variable(1, aggregation="SUM", name="steps")
            with pytest.raises(TypeError, match="'steps'.*float64.*int32"):
                v.assign(np.float64(2.5))
            with pytest.raises(TypeError, match="not an array or a number"):
                v.assign("two")
        assert [int(c) for c in copies(strategy, v)] == [1] * strategy.num_replicas_in_sync

    def test_mismatched_shapes_across_replicas_change_nothing(self, mirrored2):
        with mirrored2.scope():
            v = ld.Variable(np.zeros(2, np.float32), synchronization="ON_READ")
            w = ld.Variable(np.zeros(2, np.float32), aggregation="MEAN")
        xs = ld.PerReplica([np.ones(2), np.ones(3)])
        with pytest.raises(ValueError):
            mirrored2.run(lambda x: w.assign_add(x), args=(xs,))
        assert all((c == 0).all() for c in copies(mirrored2, w))
        assert all((c == 0).all() for c in copies(mirrored2, v))


class TestContexts:
    def test_replica_context_inside_run(self, strategy):
        def step():
            ctx = ld.get_replica_context()
            return ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync
        n = strategy.num_replicas_in_sync
        ids, nums = strategy.run(step)
        assert strategy.experimental_local_results(ids) == tuple(range(n))
        assert strategy.experimental_local_results(nums) == (n,) * n

    def test_cross_replica_context_inside_scope(self, mirrored2):
        with mirrored2.scope():
            assert ld.get_replica_context() is None
            assert ld.in_cross_replica_context()
            assert ld.get_strategy() is mirrored2
            assert ld.has_strategy()
        assert not ld.in_cross_replica_context()

    def test_default_context_without_a_strategy(self):
        ctx = ld.get_replica_context()
        assert ctx.replica_id_in_sync_group == 0 and ctx.num_replicas_in_sync == 1
        assert ctx.all_reduce("SUM", 3.0) == 3.0
        assert ctx.merge_call(lambda s, x: x * 2, args=(4,)) == 8
        assert not ld.has_strategy()
        v = ld.Variable(1.0, synchronization="ON_READ", aggregation="NONE")
        assert float(v.assign_add(2.0)) == 3.0  # no strategy: a plain variable
        assert float(v.read_value()) == 3.0

    def test_one_device_strategy(self):
        s = ld.OneDeviceStrategy(device="cpu")
        with s.scope():
            v = ld.Variable(1.0, aggregation="MEAN")
            assert ld.get_replica_context() is None
        assert s.num_replicas_in_sync == 1
        assert float(s.run(lambda: v.assign_add(2.0))) == 3.0
        assert s.experimental_local_results(v)[0] == 3.0
        assert s.run(lambda: ld.get_replica_context().num_replicas_in_sync) == 1

    def test_replica_read_value_is_a_snapshot(self, mirrored2):
        with mirrored2.scope():
            v = ld.Variable(1.0, aggregation="MEAN")

        def step():
            before = v.read_value()
            v.assign_add(1.0)
            return before, v.read_value(), v.numpy()
        before, after, host = mirrored2.run(step)
        assert mirrored2.experimental_local_results(before) == (1.0, 1.0)
        assert mirrored2.experimental_local_results(after) == (2.0, 2.0)
        assert all(isinstance(h, np.ndarray) for h in mirrored2.experimental_local_results(host))

    def test_variables_work_as_arrays(self, mirrored2):
        with mirrored2.scope():
            v = ld.Variable(np.arange(3.0), aggregation="MEAN")
            assert_array_equal(np.asarray(v), [0, 1, 2])
            assert_array_equal(v * 2, [0, 2, 4])
        out = mirrored2.run(lambda: (v + 1).sum())
        assert mirrored2.experimental_local_results(out) == (6.0, 6.0)
        assert "shape=(3,)" in repr(v)
