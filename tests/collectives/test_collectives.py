"""docs/semantics.md §3: all_reduce, strategy.reduce, merge_call, run results, and what happens when
replicas disagree — through real worker processes."""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import sys
import time
import types

import numpy as np
import pytest
from numpy.testing import assert_array_equal

import labdist as ld


def per_replica(strategy, fn):
    return strategy.experimental_distribute_values_from_function(
        lambda c: fn(c.replica_id_in_sync_group))


class TestAllReduce:
    def test_nested_structures_are_reduced_leaf_by_leaf(self, strategy):
        n = strategy.num_replicas_in_sync
        xs = per_replica(strategy, lambda r: {"a": np.full(3, r + 1.0, np.float32),
                                              "b": (r, [2.0 * r])})

        def step(x):
            return ld.get_replica_context().all_reduce("SUM", x)
        out = strategy.run(step, args=(xs,))
        total = sum(range(1, n + 1))
        for local in strategy.experimental_local_results(out["a"]):
            assert_array_equal(local, np.full(3, total, np.float32))
            assert local.dtype == np.float32
        assert strategy.experimental_local_results(out["b"][0]) == (sum(range(n)),) * n
        assert all(float(x) == 2.0 * sum(range(n))
                   for x in strategy.experimental_local_results(out["b"][1][0]))

    def test_python_scalars_and_integer_mean(self, strategy):
        n = strategy.num_replicas_in_sync

        def step():
            ctx = ld.get_replica_context()
            r = ctx.replica_id_in_sync_group
            return ctx.all_reduce("SUM", 1), ctx.all_reduce(ld.ReduceOp.MEAN, r)
        total, mean = strategy.run(step)
        assert strategy.experimental_local_results(total) == (n,) * n
        means = strategy.experimental_local_results(mean)
        assert all(m.dtype == np.float64 and float(m) == (n - 1) / 2 for m in means)

    def test_results_are_bit_identical_on_every_replica(self, strategy):
        xs = per_replica(strategy, lambda r: np.random.default_rng(r).standard_normal(1000)
                         .astype(np.float32))
        out = strategy.run(lambda x: ld.get_replica_context().all_reduce("MEAN", x), args=(xs,))
        results = strategy.experimental_local_results(out)
        assert all(np.array_equal(results[0], r) for r in results[1:])
        expected = np.mean(np.stack(xs.values), axis=0)
        np.testing.assert_allclose(results[0], expected, rtol=1e-6)

    def test_collectives_go_peer_to_peer(self):
        """Over Dask comms, each worker's collectives plugin receives its peers' messages
        directly; the shared-memory transport bypasses even that."""
        from conftest import make_strategy

        def received(dask_worker):
            return dask_worker.plugins["labdist-collectives"].received
        for kind, expected in (("mirrored-3-tcp", 2), ("mirrored-3", 0)):
            s = make_strategy(kind)
            before = s.client.run(received, workers=s.workers)
            s.run(lambda: ld.get_replica_context().all_reduce("SUM", np.ones(10)))
            after = s.client.run(received, workers=s.workers)
            assert all(after[w] - before[w] == expected for w in s.workers), kind

    @pytest.mark.parametrize("kind", ["mirrored-2", "mirrored-3", "mirrored-2-strict",
                                      "mirrored-3-tcp"])
    @pytest.mark.parametrize("op", ["SUM", "MEAN"])
    def test_large_payloads_take_the_reduce_scatter_path(self, kind, op):
        """Over DIRECT_MAX_BYTES, ranks reduce one segment each (through shared memory, or
        Dask comms with transport='tcp'): the same results, bit-identical everywhere."""
        from conftest import make_strategy

        from labdist.collectives.algorithms import DIRECT_MAX_BYTES

        strategy = make_strategy(kind)

        n_elems = DIRECT_MAX_BYTES // 4 + 1001  # not a multiple of the replica count
        xs = per_replica(strategy, lambda r: (
            np.random.default_rng(r).standard_normal(n_elems).astype(np.float32),
            np.arange(7, dtype=np.int64) * (r + 1),  # a small leaf in the same call
            np.full((3, 5), r + 1.0)))
        out = strategy.run(lambda x: ld.get_replica_context().all_reduce(op, x), args=(xs,))
        results = strategy.experimental_local_results(out)
        n = strategy.num_replicas_in_sync
        for i in range(3):
            first = results[0][i]
            assert all(np.array_equal(first, r[i]) for r in results[1:])
            stacked = np.stack(strategy.experimental_local_results(xs[i]))  # a nest
            expected = stacked.sum(axis=0) if op == "SUM" else stacked.sum(axis=0) / n
            np.testing.assert_allclose(first, expected, rtol=1e-5)
            assert first.shape == stacked.shape[1:]
        assert results[0][1].dtype == (np.int64 if op == "SUM" else np.float64)

    @pytest.mark.parametrize("kind", ["mirrored-2", "mirrored-3-tcp"])
    def test_large_payload_shape_mismatch_raises(self, kind):
        from conftest import make_strategy

        s = make_strategy(kind)
        xs = s.experimental_distribute_values_from_function(
            lambda c: np.zeros(400_000 + c.replica_id_in_sync_group, np.float32))
        with pytest.raises(ValueError, match="shapes differ"):
            s.run(lambda x: ld.get_replica_context().all_reduce("SUM", x), args=(xs,))
        out = s.run(lambda: ld.get_replica_context().all_reduce("SUM", np.ones(300_000)))
        assert float(s.experimental_local_results(out)[0][0]) == s.num_replicas_in_sync

    def test_transport_choice(self, mirrored2):
        from conftest import make_strategy

        assert mirrored2.transport == ("shm" if os.path.isdir("/dev/shm") else "tcp")
        assert make_strategy("mirrored-3-tcp").transport == "tcp"
        with pytest.raises(ValueError, match="transport='ipc'.*auto, shm, tcp, nccl"):
            ld.MirroredStrategy(num_replicas=2, transport="ipc")

    def test_steps_take_the_lane_unless_told_dask_comms_only(self, mirrored2):
        from conftest import make_strategy

        assert mirrored2.group.steps.kind == "lane"
        assert make_strategy("mirrored-3-tcp").group.steps.kind == "actor"

    def test_the_lane_serves_only_the_token_holder(self):
        from labdist.cluster.lane_channel import LaneClient
        from labdist.replica import lane

        handled = []
        server = lane.LaneServer(
            "127.0.0.1", lambda raw: handled.append(pickle.loads(raw)) or lane.dumps("ok"))
        try:
            with socket.create_connection(server.address, timeout=5) as sock:
                lane.send_message(sock, b"not-the-token")
                with contextlib.suppress(OSError):
                    lane.send_message(sock, lane.dumps(("run", 1)))
                try:
                    dropped = sock.recv(1) == b""
                except ConnectionResetError:  # closed with our request unread: also dropped
                    dropped = True
                assert dropped
            client = LaneClient(server.address, server.token, timeout=5)
            client.send(lane.dumps(("run", 2)))
            assert client.receive() == "ok"
            client.close()
            assert handled == [("run", 2)]
        finally:
            server.close()

    @pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm on this system")
    def test_shared_memory_areas_are_removed_on_close(self):
        """Every file of this strategy is gone when close returns. Files of other strategies
        (another test session on this machine starting one) are not this one's: counting them
        made this test fail under load, with two of their -control files."""
        other = f"/dev/shm/labdist-{'0' * 16}-0-{os.getpid()}-{'1' * 16}-control"
        with ld.MirroredStrategy(num_replicas=2) as s:
            def ours():
                return {n for n in os.listdir("/dev/shm")
                        if n.startswith(f"labdist-{s.group.group[:16]}-")}
            def step():
                ctx = ld.get_replica_context()
                return ctx.all_reduce("SUM", ctx.xp.ones(300_000))
            s.run(step)
            assert len(ours()) >= 4  # a probe and an area per replica
            open(other, "x").close()  # another session's strategy, starting meanwhile
        try:
            assert ours() == set()
            assert os.path.exists(other)
        finally:
            os.unlink(other)

    def test_different_shapes_raise_on_every_replica_and_cluster_stays_usable(self, strategy):
        xs = per_replica(strategy, lambda r: np.zeros(r + 1))

        def step(x):
            try:
                ld.get_replica_context().all_reduce("SUM", x)
            except ValueError as e:
                return str(e)
            return "no error"
        messages = strategy.experimental_local_results(strategy.run(step, args=(xs,)))
        assert all("shapes differ" in m and "(1,)" in m and "(2,)" in m for m in messages)
        with pytest.raises(ValueError, match="shapes differ"):
            strategy.run(lambda x: ld.get_replica_context().all_reduce("SUM", x), args=(xs,))
        out = strategy.run(lambda: ld.get_replica_context().all_reduce("SUM", 1.0))
        assert {float(x) for x in strategy.experimental_local_results(out)} == {
            float(strategy.num_replicas_in_sync)}

    def test_different_dtypes_raise_type_error(self, mirrored2):
        xs = ld.PerReplica([np.zeros(2, np.float32), np.zeros(2, np.int64)])
        with pytest.raises(TypeError, match="dtypes differ.*float32.*int64"):
            mirrored2.run(lambda x: ld.get_replica_context().all_reduce("SUM", x), args=(xs,))

    def test_unknown_reduce_op(self, mirrored2):
        with pytest.raises(ValueError, match="reduce_op='MAX'.*SUM, MEAN"):
            mirrored2.run(lambda: ld.get_replica_context().all_reduce("MAX", 1.0))


class TestMismatchedControlFlow:
    def test_a_skipped_collective_fails_fast_not_at_the_timeout(self, strategy):
        def step():
            ctx = ld.get_replica_context()
            if ctx.replica_id_in_sync_group == 0:
                ctx.all_reduce("SUM", 1.0)
            return 0
        start = time.monotonic()
        with pytest.raises(ld.CollectiveMismatchError, match="different paths"):
            strategy.run(step)
        assert time.monotonic() - start < 10  # the collective timeout is 20 s here
        assert strategy.run(lambda: 1) is not None  # still usable

    def test_different_collectives_at_the_same_point(self, mirrored2):
        with mirrored2.scope():
            v = ld.Variable(0.0, aggregation="SUM", name="v")
        xs = per_replica(mirrored2, float)

        def step(x):
            if ld.get_replica_context().replica_id_in_sync_group == 0:
                return v.assign_add(x)
            return ld.get_replica_context().all_reduce("SUM", x)
        with pytest.raises(ld.CollectiveMismatchError, match="'v'.*all_reduce"):
            mirrored2.run(step, args=(xs,))
        assert [float(c) for c in mirrored2.experimental_local_results(v)] == [0.0, 0.0]

    def test_merge_call_on_one_replica_only(self, mirrored2):
        def step():
            ctx = ld.get_replica_context()
            if ctx.replica_id_in_sync_group == 1:
                return ctx.merge_call(lambda s: 1)
            return 0
        with pytest.raises(ld.CollectiveMismatchError):
            mirrored2.run(step)
        assert mirrored2.experimental_local_results(mirrored2.run(lambda: 5)) == (5, 5)

    def test_a_failing_replica_reports_its_own_error(self, mirrored3):
        def step():
            ctx = ld.get_replica_context()
            if ctx.replica_id_in_sync_group == 2:
                raise KeyError("boom on 2")
            return ctx.all_reduce("SUM", 1.0)
        start = time.monotonic()
        with pytest.raises(KeyError, match="boom on 2") as info:
            mirrored3.run(step)
        assert time.monotonic() - start < 10
        assert any("replica 2" in note for note in info.value.__notes__)
        assert mirrored3.experimental_local_results(mirrored3.run(lambda: 1)) == (1, 1, 1)

    def test_collective_timeout(self):
        with ld.MirroredStrategy(num_replicas=2, collective_timeout=1) as s:
            def step():
                ctx = ld.get_replica_context()
                if ctx.replica_id_in_sync_group == 1:
                    time.sleep(2.5)
                return ctx.all_reduce("SUM", 1.0)
            start = time.monotonic()
            with pytest.raises(ld.CollectiveTimeoutError, match="waited 1 s.*replica"):
                s.run(step)
            assert time.monotonic() - start < 15
            assert s.experimental_local_results(s.run(lambda: 2)) == (2, 2)


class TestMergeCall:
    def test_runs_once_on_the_driver_with_per_replica_args(self, strategy):
        calls = []  # merge functions run on the driver: this list is the driver's

        def merge_fn(s, x, scale):
            calls.append((type(x).__name__, scale))
            assert ld.get_replica_context() is None  # cross-replica context
            return s.reduce("SUM", x, axis=None) * scale

        def step(x):
            return ld.get_replica_context().merge_call(merge_fn, args=(x, 10))
        n = strategy.num_replicas_in_sync
        out = strategy.run(step, args=(per_replica(strategy, lambda r: r + 1.0),))
        assert calls == [("PerReplica", 10)]
        assert strategy.experimental_local_results(out) == (10.0 * n * (n + 1) / 2,) * n

    def test_per_replica_result_gives_each_replica_its_component(self, mirrored3):
        def step():
            ctx = ld.get_replica_context()
            mine = ctx.merge_call(lambda s: ld.PerReplica(["a", "b", "c"]))
            return mine, ctx.replica_id_in_sync_group
        mine, _ = mirrored3.run(step)
        assert mirrored3.experimental_local_results(mine) == ("a", "b", "c")

    def test_extended_update_in_merge_call(self, strategy):
        """The tf.distribute optimizer pattern: reduce gradients, update every copy once."""
        n = strategy.num_replicas_in_sync
        with strategy.scope():
            w = ld.Variable(np.ones(2, np.float32), name="w")

        def apply(s, grad):
            total = s.reduce("SUM", grad, axis=None)
            return s.extended.update(w, lambda var, g: var.assign_sub(0.5 * g), args=(total,))

        def step(g):
            return ld.get_replica_context().merge_call(apply, args=(g,))
        grads = per_replica(strategy, lambda r: np.full(2, r + 1.0, np.float32))
        strategy.run(step, args=(grads,))
        expected = 1 - 0.5 * n * (n + 1) / 2
        for c in strategy.experimental_local_results(w):
            assert_array_equal(c, np.full(2, expected, np.float32))

    def test_extended_update_rejects_foreign_variables(self, mirrored2, mirrored3):
        with mirrored3.scope():
            v = ld.Variable(1.0)
        with pytest.raises(ValueError, match="not a variable of"):
            mirrored2.extended.update(v, lambda var: var.assign(2.0))


class TestStrategyReduce:
    def test_axis_none_elementwise(self, mirrored2):
        pr = ld.PerReplica([np.array([1.0, 2.0]), np.array([3.0, 4.0])])
        assert_array_equal(mirrored2.reduce("SUM", pr, axis=None), [4, 6])
        assert_array_equal(mirrored2.reduce("MEAN", pr, axis=None), [2, 3])

    def test_axis_k_divides_by_the_total_count(self, mirrored2):
        pr = ld.PerReplica([np.array([1, 2, 3]), np.array([4])])
        assert mirrored2.reduce("SUM", pr, axis=0) == 10
        mean = mirrored2.reduce("MEAN", pr, axis=0)
        assert mean == 2.5 and mean.dtype == np.float64

    def test_integer_mean_is_float64(self, mirrored2):
        pr = ld.PerReplica([np.array([1, 2]), np.array([2, 3])])
        out = mirrored2.reduce("MEAN", pr, axis=None)
        assert out.dtype == np.float64
        assert_array_equal(out, [1.5, 2.5])

    def test_shapes_must_match_with_axis_none(self, mirrored2):
        pr = ld.PerReplica([np.zeros(2), np.zeros(3)])
        with pytest.raises(ValueError, match=r"equal shapes.*\(2,\).*\(3,\)"):
            mirrored2.reduce("SUM", pr, axis=None)

    def test_non_distributed_values(self, mirrored2, mirrored3):
        x = np.array([1.0, 2.0, 3.0])
        assert mirrored2.reduce("MEAN", x, axis=None) is x
        assert mirrored2.reduce("MEAN", x, axis=0) == 2.0
        with pytest.raises(ValueError, match="ambiguous"):
            mirrored2.reduce("SUM", x, axis=None)
        assert mirrored2.reduce("SUM", x, axis=0) == 12.0
        assert mirrored3.reduce("SUM", x, axis=0) == 18.0
        one = ld.OneDeviceStrategy(device="cpu")
        assert one.reduce("SUM", x, axis=None) is x

    def test_bad_axis(self, mirrored2):
        pr = ld.PerReplica([np.zeros(2), np.zeros(2)])
        with pytest.raises(ValueError, match="axis=3"):
            mirrored2.reduce("SUM", pr, axis=3)

    def test_reduce_a_run_result_and_a_variable(self, mirrored2):
        out = mirrored2.run(lambda: float(ld.get_replica_context().replica_id_in_sync_group))
        assert mirrored2.reduce("SUM", out, axis=None) == 1.0
        with mirrored2.scope():
            v = ld.Variable(2.0, synchronization="ON_READ", aggregation="SUM")
        assert mirrored2.reduce("SUM", v, axis=None) == 4.0


class TestRun:
    def test_returns_per_replica_even_when_equal_and_keeps_structure(self, strategy):
        n = strategy.num_replicas_in_sync
        out = strategy.run(lambda: {"same": np.ones(2), "pair": (1, "x")})
        assert isinstance(out["same"], ld.PerReplica) and len(out["same"]) == n
        assert strategy.experimental_local_results(out["pair"][1]) == ("x",) * n
        assert len(strategy.experimental_local_results(out)) == n

    def test_one_replica_returns_the_plain_value(self):
        s = ld.OneDeviceStrategy(device="cpu")
        assert s.run(lambda x: x + 1, args=(1,)) == 2

    def test_results_are_host_arrays(self, strategy):
        out = strategy.run(lambda: ld.get_replica_context().xp.ones(3))
        assert all(type(x) is np.ndarray for x in strategy.experimental_local_results(out))

    def test_kwargs_and_broadcast_arguments(self, mirrored2):
        out = mirrored2.run(lambda a, b=0: a + b, args=(np.arange(3),), kwargs={"b": 1})
        for x in mirrored2.experimental_local_results(out):
            assert_array_equal(x, [1, 2, 3])

    def test_steps_run_concurrently(self, mirrored2):
        def step():
            time.sleep(0.5)
            return 1
        mirrored2.run(step)
        start = time.monotonic()
        mirrored2.run(step)
        assert time.monotonic() - start < 0.9  # two replicas sleeping in parallel, not 1.0 s

    @pytest.mark.parametrize(("call", "error", "match"), [
        (lambda s: s.run(42), TypeError, "fn=42 is not callable"),
        (lambda s: s.run(lambda x: x, args=5), TypeError, "args=5"),
        (lambda s: s.run(lambda x: x, args=(ld.PerReplica([1, 2, 3]),)), ValueError,
         "3 components.*2 replicas"),
        (lambda s: s.run(lambda: 1, kwargs=[1]), TypeError, "kwargs"),
        (lambda s: s.run(lambda v: v.read_value(), args=(ld.Variable(1.0),)), ValueError,
         "belongs to another strategy"),
        (lambda s: s.run(lambda x: x, args=(__import__("threading").Lock(),)), TypeError,
         "cannot be sent"),
    ])
    def test_bad_arguments(self, mirrored2, call, error, match):
        with pytest.raises(error, match=match):
            call(mirrored2)
        assert mirrored2.experimental_local_results(mirrored2.run(lambda: 3)) == (3, 3)

    def test_arguments_the_workers_cannot_import(self, mirrored2, monkeypatch):
        module = types.ModuleType("only_on_the_driver")
        exec("class Thing:\n    pass", module.__dict__)
        monkeypatch.setitem(sys.modules, "only_on_the_driver", module)
        with pytest.raises(ModuleNotFoundError, match="only_on_the_driver") as info:
            mirrored2.run(lambda thing: 1, args=(module.Thing(),))
        assert any("replica" in note for note in info.value.__notes__)
        assert mirrored2.experimental_local_results(mirrored2.run(lambda: 2)) == (2, 2)

    def test_closed_strategy(self):
        s = ld.OneDeviceStrategy(device="cpu")
        s.close()
        with pytest.raises(RuntimeError, match="closed"):
            s.run(lambda: 1)


def test_nccl_takes_only_what_it_reduces_like_the_host_path():
    """The NCCL path must give the host path's result dtypes: integer MEANs (float64 on the
    host) and dtypes NCCL lacks (bool, complex) stay on the host path."""
    from labdist.aggregation import of
    from labdist.collectives.transports.nccl import supports

    f32, i32 = np.zeros(3, np.float32), np.zeros(3, np.int32)
    total, mean, first = of("SUM"), of("MEAN"), of("ONLY_FIRST_REPLICA")
    assert supports([f32, i32], total) and supports([f32], mean) and supports([i32], first)
    assert not supports([i32], mean)
    assert not supports([np.zeros(2, bool)], total)
    assert not supports([np.zeros(2, np.complex64)], total)
    assert not supports([], total) and not supports([f32], of("NONE"))
