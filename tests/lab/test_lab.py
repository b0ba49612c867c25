"""The lab, headless: a run in the background steered by plain calls, and what a switch does to
the replicas' copies. Real worker processes; the parameter-server kinds run on the same cluster."""

from __future__ import annotations

import threading
import time
import warnings

import numpy as np
import pytest

import labdist as ld
from labdist.lab import LabModel, RunHistory
from labdist.lab.batch_stream import BatchStream
from labdist.lab.config import RunConfig
from labdist.lab.models import ParamSpec
from labdist.lab.run_items import EventItem, PsStatsItem, RunItem, StepItem
from labdist.lab.runner import Runner


class Counting(LabModel):
    """Every gradient is -1 on a non-empty shard: with learning rate 1 each applied update adds
    exactly 1 (MEAN of the replicas' updates: 1; SUM over 2 replicas: 2), so the parameter
    counts the updates that landed."""

    def init_params(self):
        return {"theta": np.asarray(0.0)}

    def loss_and_grads(self, xp, params, x, y):
        g = -1.0 if len(x) else 0.0
        return xp.asarray(0.0), {"theta": xp.asarray(g)}


class Slow(Counting):
    """Counting, with a step long enough to switch in the middle of a run."""

    def loss_and_grads(self, xp, params, x, y):
        time.sleep(0.004)
        return super().loss_and_grads(xp, params, x, y)


class Failing(Counting):
    def loss_and_grads(self, xp, params, x, y):
        if float(params["theta"]) >= 3:
            raise FloatingPointError("theta reached 3")
        return super().loss_and_grads(xp, params, x, y)


DATA = (np.zeros((64, 1)), np.zeros(64))


@pytest.fixture(scope="module")
def strategy():
    s = ld.MirroredStrategy(num_replicas=2)
    yield s
    s.close()


@pytest.fixture
def skewed():
    x, y = ld.datasets.synthetic.regression(n_samples=256, n_features=1, noise=0.1, seed=1)
    return x, y


def copies(lab, name):
    return [float(v[name]) for v in lab.values()]


def spread_at(lab, step):
    """The spread rows recorded at `step` (a switch adds one after the step's own row)."""
    return [s for st, s in zip(lab.history.step, lab.history.spread, strict=True) if st == step]


# -- configuration (no cluster) -----------------------------------------------------------------
@pytest.mark.parametrize("changes, match", [
    ({"aggregation": "AVERAGE"}, r"aggregation='AVERAGE' is not a valid VariableAggregation"),
    ({"synchronization": 3}, r"synchronization=3"),
    ({"kind": "allreduce"}, r"kind='allreduce' is not allowed; allowed: mirrored, ps_async"),
    ({"learning_rate": 0}, r"learning_rate=0 is not allowed; use a finite number > 0"),
    ({"learning_rate": float("nan")}, r"learning_rate=nan"),
    ({"skew": -1}, r"skew=-1 is not allowed"),
    ({"sync_period": 1.5}, r"sync_period=1.5 is not allowed"),
    ({"resync": "median"}, r"resync='median' is not allowed; allowed: average, first"),
    ({"use_locking": 1}, r"use_locking=1 is not allowed; use True or False"),
    ({"delays": [0.1]}, r"delays=\[0.1\] must give one delay per replica \(2 values\)"),
    ({"delay": {2: 0.1}}, r"delay: worker=2 is not allowed; use 0..1"),
    ({"pace": -3}, r"pace=-3"),
])
def test_bad_settings_name_the_parameter(changes, match):
    with pytest.raises((ValueError, TypeError), match=match):
        RunConfig().replace(changes, num_replicas=2)


def test_unknown_setting_lists_the_allowed_ones():
    with pytest.raises(TypeError, match=r"unknown lab setting\(s\) \['agg'\]; allowed: kind, "):
        RunConfig().replace({"agg": "SUM"}, num_replicas=2)


def test_config_parses_names_and_merges_delays():
    c = RunConfig().replace({"synchronization": "auto", "aggregation": "sum", "kind": "PS-Async",
                             "delay": {1: 0.25}}, num_replicas=3)
    assert (c.synchronization, c.aggregation, c.kind) == (
        ld.VariableSynchronization.ON_WRITE, ld.VariableAggregation.SUM, "ps_async")
    assert c.delays == (0.0, 0.25, 0.0)
    assert c.strategy_key == ("ps_async", False)


def test_bad_lab_arguments_are_refused_before_a_cluster_starts():
    with pytest.raises(TypeError, match=r"model=42 is not a lab model"):
        ld.Lab(model=42)
    with pytest.raises(ValueError, match=r"data: x has 64 samples but y has 3"):
        ld.Lab(data=(np.zeros((64, 1)), np.zeros(3)))
    with pytest.raises(ValueError, match=r"track: 'v' is not a parameter; the model has w, b"):
        ld.Lab(track=["v"])
    with pytest.raises(ValueError, match=r"global_batch_size=1 is smaller than the 2 replicas"):
        ld.Lab(global_batch_size=1)
    with pytest.raises(ValueError, match=r"learning_rate=-1"):
        ld.Lab(learning_rate=-1)


# -- models (no cluster) -------------------------------------------------------------------------
def test_linear_gives_the_mean_squared_errors_gradients_in_float64():
    rng = np.random.default_rng(3)
    for n_features, x in ((1, rng.normal(size=17)), (3, rng.normal(size=(17, 3)))):
        y = rng.normal(size=17)
        model = ld.lab.Linear(n_features, init=(0.3, -0.2))
        params = model.init_params()
        loss, grads = model.loss_and_grads(np, params, x, y)
        err = x.reshape(17, n_features) @ params["w"].reshape(n_features) + params["b"] - y
        assert loss == pytest.approx((err * err).mean(), rel=1e-14)
        np.testing.assert_allclose(grads["w"], (2 * x.reshape(17, n_features).T @ err / 17)
                                   .reshape(params["w"].shape), rtol=1e-13)
        np.testing.assert_allclose(grads["b"], 2 * err.mean(), rtol=1e-13)
        assert {k: (g.shape, g.dtype) for k, g in grads.items()} == {
            k: (v.shape, np.float64) for k, v in params.items()}  # w, b scalars for 1 feature
        empty_loss, zero = model.loss_and_grads(np, params, x[:0], y[:0])
        assert float(empty_loss) == 0.0 and all(not g.any() for g in zero.values())


def test_softmax_regression_gives_the_cross_entropys_gradients_in_float64():
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(20, 4)), rng.integers(0, 3, 20)
    model = ld.lab.SoftmaxRegression(4, 3)
    params = model.init_params()
    loss, grads = model.loss_and_grads(np, params, x, y)
    z = x @ params["W"] + params["b"]
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    assert loss == pytest.approx(-np.log(p[np.arange(20), y]).mean(), rel=1e-13)
    p[np.arange(20), y] -= 1
    np.testing.assert_allclose(grads["W"], x.T @ p / 20, rtol=1e-12, atol=1e-17)
    np.testing.assert_allclose(grads["b"], p.sum(axis=0) / 20, rtol=1e-12, atol=1e-17)
    assert grads["W"].dtype == np.float64
    empty_loss, zero = model.loss_and_grads(np, params, x[:0], y[:0])
    assert float(empty_loss) == 0.0 and all(not g.any() for g in zero.values())


# -- running ----------------------------------------------------------------------------------
def test_run_returns_at_once_and_the_kernel_stays_free(strategy):
    with ld.Lab(strategy, model=Slow(), data=DATA, learning_rate=1.0) as lab:
        lab.step(1)  # the workers import this module once
        t0 = time.perf_counter()
        lab.run()  # no end
        started = time.perf_counter() - t0
        late = []
        for _ in range(50):  # the calling thread keeps its own timing meanwhile
            t1 = time.perf_counter()
            time.sleep(0.01)
            late.append(time.perf_counter() - t1 - 0.01)
        assert started < 0.05 and np.median(late) < 0.005
        assert lab.state == "running" and lab.step_count > 5
        with pytest.raises(RuntimeError, match=r"no end"):
            lab.wait()
        lab.pause()
        stopped = lab.step_count
        time.sleep(0.1)
        assert lab.state == "idle" and lab.step_count == stopped
        assert copies(lab, "theta") == [stopped, stopped]  # MEAN of two +1 updates: +1 a step
        assert lab.history.step[-1] == stopped


def test_a_change_applies_at_the_next_boundary_within_a_step(strategy):
    with ld.Lab(strategy, model=Slow(), data=DATA, learning_rate=1.0) as lab:
        lab.run()
        time.sleep(0.2)
        lab.set(aggregation="SUM")
        time.sleep(0.2)
        lab.pause()
        (event,) = lab.events
        assert event.changes["aggregation"][1] is ld.VariableAggregation.SUM
        assert 0 < event.step < lab.step_count
        assert event.steps_late <= 1  # at most the step in flight ran the old way
        step_s = 1 / lab.steps_per_second()
        assert event.delay <= max(2 * step_s, 0.1), (event.delay, step_s)
        # before the event +1 a step (MEAN), after it +2 (SUM of two -1 gradients)
        theta = event.step + 2 * (lab.step_count - event.step)
        assert copies(lab, "theta") == [theta, theta]


def test_set_is_all_or_nothing(strategy):
    with ld.Lab(strategy, model=Counting(), data=DATA, learning_rate=1.0) as lab:
        with pytest.raises(ValueError, match=r"learning_rate"):
            lab.set(aggregation="SUM", learning_rate=-2)
        lab.step(1)
        assert lab.config.aggregation is ld.VariableAggregation.MEAN and lab.events == []


def test_on_write_mean_to_on_read_drifts_and_back_with_average_rejoins(strategy, skewed):
    with ld.Lab(strategy, data=skewed, skew=2.0, learning_rate=0.05) as lab:
        lab.step(30)
        assert max(lab.history.spread) == 0.0  # ON_WRITE MEAN: copies identical
        lab.set(synchronization="ON_READ", sync_period=0)
        lab.step(40)
        drift = lab.history.spread[-40:]
        assert drift[-1] > 0.05 and drift[-1] > drift[4] > 0  # grows on skewed data
        before = lab.values()
        lab.set(synchronization="ON_WRITE", resync="average")
        lab.step(5)
        at_switch = spread_at(lab, 70)
        assert at_switch[0] > 0.05 and at_switch[-1] == 0.0  # back to 0 at the switch step
        assert max(lab.history.spread[-5:]) == 0.0
        first_after = lab.history.tracked("w")[-5]  # after one more MEAN step from the average
        assert abs(first_after[0] - np.mean([v["w"] for v in before])) < 0.05


def test_back_to_on_write_with_first_takes_replica_0(strategy, skewed):
    with ld.Lab(strategy, data=skewed, skew=2.0, synchronization="NONE") as lab:
        lab.step(20)
        before = lab.values()
        assert before[0]["b"] != before[1]["b"]
        lab.set(synchronization="ON_WRITE", resync="first")
        lab.step(0)
        lab.wait()
        after = lab.values()
        assert [float(v["b"]) for v in after] == [float(before[0]["b"])] * 2


def test_on_write_aggregation_none_diverges_quietly(strategy, skewed):
    """The copies drift apart (the charts show it) without a warning printed from the lab's
    thread into whatever cell runs next; the same update outside the lab still warns."""
    with warnings.catch_warnings(record=True) as caught:  # the filters a notebook has
        with ld.Lab(strategy, data=skewed, skew=1.0) as lab:
            lab.step(5)
            lab.set(aggregation="NONE")
            lab.step(10)
            assert lab.history.spread[-1] > 0
        assert not [w for w in caught if issubclass(w.category, ld.ReplicaDivergenceWarning)]
        with strategy.scope():
            v = ld.Variable(0.0, aggregation="NONE")
        strategy.run(lambda x: v.assign_add(x), args=(ld.PerReplica([1.0, 2.0]),))
        assert [w for w in caught if issubclass(w.category, ld.ReplicaDivergenceWarning)]


def test_on_read_local_sgd_averages_every_period(strategy, skewed):
    with ld.Lab(strategy, data=skewed, skew=2.0, synchronization="ON_READ",
                sync_period=4) as lab:
        lab.step(12)
        spreads = lab.history.spread[1:]  # row 0: the start
        for step, s in zip(lab.history.step[1:], spreads, strict=True):
            assert (s == 0.0) == (step % 4 == 0), (step, s)


def test_stragglers_slow_a_synchronous_run(strategy):
    with ld.Lab(strategy, model=Counting(), data=DATA, learning_rate=1.0) as lab:
        t0 = time.perf_counter()
        lab.step(10)
        fast = time.perf_counter() - t0
        lab.set(delay={1: 0.05})
        t0 = time.perf_counter()
        lab.step(10)
        slow = time.perf_counter() - t0
        assert fast < 0.3 < 10 * 0.05 <= slow  # every step waits for replica 1


def test_pace_limits_steps_per_second(strategy):
    with ld.Lab(strategy, model=Counting(), data=DATA, pace=40) as lab:
        t0 = time.perf_counter()
        lab.step(20)
        assert time.perf_counter() - t0 > 19 / 40 * 0.9


def test_a_failing_step_stops_the_run_and_reset_recovers(strategy):
    with ld.Lab(strategy, model=Failing(), data=DATA, learning_rate=1.0) as lab:
        lab.run(10)
        with pytest.raises(FloatingPointError, match=r"theta reached 3"):
            lab.wait()
        assert lab.state == "failed" and lab.step_count == 3
        lab.reset()
        assert lab.step_count == 0 and copies(lab, "theta") == [0.0, 0.0]
        assert len(lab.history) == 0
        lab.step(2)
        assert copies(lab, "theta") == [2.0, 2.0]


def test_calls_from_many_threads_queue_safely(strategy):
    with ld.Lab(strategy, model=Slow(), data=DATA, learning_rate=1.0) as lab:
        lab.run()
        rates = [0.1, 0.2, 0.3, 0.4]
        threads = [threading.Thread(target=lab.set, kwargs={"learning_rate": r}) for r in rates]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        lab.pause()
        assert lab.config.learning_rate in rates
        assert all(e.changes.keys() == {"learning_rate"} for e in lab.events)


# -- parameter servers ------------------------------------------------------------------------
def test_mirrored_to_async_ps_and_back_moves_the_value(strategy, skewed):
    with ld.Lab(strategy, data=skewed, skew=1.0, synchronization="ON_READ",
                sync_period=0) as lab:
        lab.step(15)
        mirrored = lab.values()
        lab.set(kind="ps_async", resync="average")
        lab.step(0)
        lab.wait()
        (ps,) = lab.values()
        for k in ("w", "b"):  # the PS starts from the (averaged) mirrored value
            assert float(ps[k]) == pytest.approx(np.mean([float(v[k]) for v in mirrored]),
                                                 abs=1e-12)
        lab.step(10)
        (ps,) = lab.values()
        lab.set(kind="mirrored", synchronization="ON_READ")
        lab.step(0)
        lab.wait()
        for replica in lab.values():  # every replica loads the PS value
            for k in ("w", "b"):
                assert float(replica[k]) == float(ps[k])
        assert lab.history.spread[-1] == 0.0


def test_no_update_is_lost_or_applied_twice_across_switches(strategy):
    """Switch mirrored -> async PS -> sync PS -> mirrored while the run goes on; the counter
    parameter must equal the updates the history says were applied."""
    with ld.Lab(strategy, model=Slow(), data=DATA, learning_rate=1.0) as lab:
        lab.run()
        for kind in ("ps_async", "ps_sync", "mirrored", "ps_async", "mirrored"):
            time.sleep(0.3)
            lab.set(kind=kind)
        time.sleep(0.3)
        lab.pause()
        kinds = set(lab.history.kind)
        assert kinds == {"mirrored", "ps_async", "ps_sync"}
        # mirrored MEAN and sync-PS MEAN: one averaged update a step; async PS: each push
        expected = sum(c if k == "ps_async" else (1 if c else 0)
                       for k, c in zip(lab.history.kind, lab.history.contributions, strict=True))
        assert len(lab.events) == 5
        assert copies(lab, "theta") == [expected, expected]
        pushes = sum(c for k, c in zip(lab.history.kind, lab.history.contributions, strict=True)
                     if k == "ps_async")
        assert pushes > 0  # async: a step is one worker's push, each recorded once


def test_async_ps_counts_staleness_and_stragglers(strategy, skewed):
    seen = []
    with ld.Lab(strategy, data=skewed, kind="ps_async", delays=[0.0, 0.03]) as lab:
        lab.subscribe(lambda item: seen.append(item) if isinstance(item, PsStatsItem) else None)
        lab.step(30)
        stats = seen[-1]
        assert stats.kind == "ps_async" and stats.use_locking is False
        assert stats.updates == 30  # a step is one worker's push of the parameter vector
        assert sum(stats.staleness.values()) == 30
        assert max(stats.staleness) >= 1  # reads overlapped others' updates
        assert stats.lost_updates <= stats.updates  # counted, each lost update once
        per_worker = lab.history.updates_per_worker
        assert sum(per_worker.values()) == 30 and lab.history.contributions[-30:] == [1] * 30
        assert per_worker[0] > per_worker[1]  # the straggler does fewer, nobody waits for it


def test_subscribe_delivers_the_run_until_unsubscribed(strategy):
    with ld.Lab(strategy, model=Counting(), data=DATA, learning_rate=1.0) as lab:
        seen: list[RunItem] = []
        stop = lab.subscribe(seen.append)
        lab.step(3)
        lab.set(aggregation="SUM")
        lab.step(1)
        assert [i.step for i in seen if isinstance(i, StepItem)] == [1, 2, 3, 3, 4]  # 3: switch
        (event,) = [i for i in seen if isinstance(i, EventItem)]
        assert event.text == "aggregation MEAN → SUM" and event.step == 3
        row = next(i for i in seen if isinstance(i, StepItem))
        assert row.loss == lab.history.loss[0] and row.tracked == [[1.0, 1.0]]
        stop()
        lab.step(2)
        assert seen[-1].step == 4 and lab.step_count == 6  # nothing after unsubscribing
        other: list[RunItem] = []
        lab.subscribe(other.append)
        lab.unsubscribe(other.append)
        lab.step(1)
        assert other == []
        with pytest.raises(TypeError, match=r"callback=3 is not callable"):
            lab.subscribe(3)


def test_pending_config_and_spec_are_public(strategy):
    with ld.Lab(strategy, delays=[0.0, 0.2]) as lab:
        assert lab.spec.names == ["w", "b"] and lab.spec.index("b") == 1
        assert lab.spec.unflatten(lab.spec.flatten({"w": 2.0, "b": 3.0})) == {"w": 2.0, "b": 3.0}
        lab.run()  # every step waits 0.2 s for replica 1: a change stays queued a while
        time.sleep(0.3)
        lab.set(learning_rate=0.2)
        assert lab.pending_config().learning_rate == 0.2
        assert lab.config.learning_rate == 0.05  # not applied before the step boundary
        lab.pause()
        assert lab.config == lab.pending_config()


class _FailedInFlight:
    """An engine whose step in flight failed: the next boundary's drain raises it (once)."""

    def __init__(self):
        self.failed = True

    def use(self, config, copies):
        pass

    def drain(self):
        if self.failed:
            self.failed = False
            raise FloatingPointError("a step in flight failed")
        return []


class _OneEngine:
    num_replicas = 1

    def __init__(self, engine):
        self.only = engine

    def engine(self, key, model, spec):
        return self.only

    def fresh(self):  # a pool's: the engines' communication state afresh (none here)
        pass


def test_a_failure_found_at_a_boundary_still_answers_the_calls_waiting_there():
    """The error stops the run; a call queued for that boundary (e.g. a reset) still runs,
    instead of leaving its caller waiting forever."""
    model = Counting()
    runner = Runner(_OneEngine(_FailedInFlight()), model, ParamSpec(model.init_params()),
                    BatchStream(*DATA, 8, seed=0), RunConfig(), RunHistory(["theta"], [0]))
    try:
        runner.call(lambda: runner.start(RunConfig())).result(timeout=10)
        assert runner.call(lambda: "answered").result(timeout=10) == "answered"
        assert runner.state == "failed" and isinstance(runner.error, FloatingPointError)
    finally:
        runner.close()
    assert runner.state == "closed"


def test_a_failing_parameter_server_step_stops_the_run_and_reset_recovers(strategy):
    with ld.Lab(strategy, model=Failing(), data=DATA, learning_rate=1.0,
                kind="ps_async") as lab:
        lab.run(20)
        with pytest.raises(FloatingPointError, match=r"theta reached 3"):
            lab.wait()
        assert lab.state == "failed"
        lab.reset()
        lab.step(1)
        assert [float(v["theta"]) for v in lab.values()] == [1.0]  # a step: one push


def test_a_lab_on_a_parameter_server_strategy_switches_to_mirrored(strategy):
    ps = ld.ParameterServerStrategy(cluster=strategy.client, num_workers=2, mode="sync")
    try:
        with ld.Lab(ps, model=Counting(), data=DATA, learning_rate=1.0) as lab:
            assert lab.config.kind == "ps_sync" and lab.strategy is ps
            lab.step(3)  # sync, MEAN of two -1 gradients: +1 a step
            lab.set(kind="mirrored")
            lab.step(2)
            assert copies(lab, "theta") == [5.0, 5.0]
            assert isinstance(lab.strategy, ld.MirroredStrategy)
        with pytest.raises(RuntimeError, match="closed"):
            lab.run(1)
        assert not ps._closed  # the lab closes only what it made
    finally:
        ps.close()


def test_throughput_never_divides_by_a_tiny_interval():
    from labdist.lab.engines import StepRecord
    from labdist.lab.history import MIN_SPAN_S, RunHistory

    history = RunHistory(["w"], [0])
    t0 = time.time()
    for k in range(3):  # three steps 10 µs apart, as right after a reset or a drain
        history.add(StepRecord(k + 1, "mirrored", [0.0], [1], np.zeros((1, 2)), 1,
                               time=t0 + k * 1e-5))
    assert history.steps_per_second() <= 2 / MIN_SPAN_S  # not 2e5
    history.clear()
    assert history.steps_per_second() == 0.0


def test_digits_cnn_gives_its_layers_gradients():
    """The lab's CNN: its gradients are those of its mean loss (central differences on a
    few entries of every parameter), and an empty shard gives zeros."""
    from gradients import numeric_grad

    rng = np.random.default_rng(5)
    x, y = rng.uniform(0, 1, (6, 64)), rng.integers(0, 10, 6)
    model = ld.lab.DigitsCNN(filters=2)
    params = model.init_params()
    params["conv_bias"] = rng.normal(0, 0.1, 2)  # no ReLU kink exactly at a difference step
    loss, grads = model.loss_and_grads(np, params, x, y)
    assert float(loss) == pytest.approx(float(model.loss(np, params, x, y)))
    assert {k: g.shape for k, g in grads.items()} == {k: v.shape for k, v in params.items()}
    for name in params:
        flat = params[name].reshape(-1)
        picked = rng.choice(flat.size, min(flat.size, 6), replace=False)

        def f(values, name=name, picked=picked, flat=flat):
            changed = dict(params)
            p = flat.copy()
            p[picked] = values
            changed[name] = p.reshape(params[name].shape)
            return float(model.loss(np, changed, x, y))

        np.testing.assert_allclose(grads[name].reshape(-1)[picked],
                                   numeric_grad(f, flat[picked].copy()), rtol=1e-5, atol=1e-8)
    empty_loss, zero = model.loss_and_grads(np, params, x[:0], y[:0])
    assert float(empty_loss) == 0.0 and all(not g.any() for g in zero.values())
    with pytest.raises(ValueError, match="8x8 images"):
        ld.Lab(model=model, data=(np.zeros((64, 10)), np.zeros(64, np.int64)))


def test_the_digits_cnn_trains_in_the_lab_on_its_own_data(strategy):
    """`ld.Lab(model=ld.lab.DigitsCNN())` with no data: the digits; it learns under the
    mirrored replicas and goes on after a switch to asynchronous parameter servers."""
    with ld.Lab(strategy, model=ld.lab.DigitsCNN(), learning_rate=0.5) as lab:
        assert lab.track == ["conv_kernel[0]", "conv_kernel[1]", "conv_bias[0]",
                             "conv_bias[1]"]
        lab.step(60)
        losses = lab.history.global_loss
        assert np.mean(losses[-10:]) < 0.6 * np.mean(losses[:5]), losses
        sent = {}  # compression pays on a model this size: bytes a replica sends a step
        for compression in ("none", "fp16", "topk", "powersgd"):
            lab.set(compression=compression)
            lab.step(3)
            sent[compression] = lab.history.sent[-1][0]
        assert sent["none"] == 810 * 8 and sent["fp16"] == 810 * 2, sent
        assert sent["topk"] < sent["fp16"] and sent["powersgd"] < sent["none"], sent
        lab.set(compression="none", kind="ps_async")
        lab.step(20)
        assert lab.config.kind.value == "ps_async" and lab.step_count == 92
        assert np.isfinite(lab.history.global_loss[-20:]).all()
