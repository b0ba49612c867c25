"""Batch norm and a metric in the lab, where TensorFlow itself uses aggregation NONE and
ON_READ: `ld.lab.BatchNormMLP`'s moving statistics are each replica's own (ON_WRITE / NONE)
and drift apart, `synchronized_bn` makes every copy take the global batch's statistics, and
the loss metric (a `Mean`, ON_READ / SUM) gives each replica's partial result beside the
cross-replica one. Checked against a replay of the same steps in one process."""

from __future__ import annotations

import time

import numpy as np
import pytest

import labdist as ld
from labdist.data.distributed import shard
from labdist.lab.batch_stream import BatchStream
from labdist.lab.models import BatchNormMLP
from labdist.ui import LabPanel


@pytest.fixture(scope="module")
def strategy():
    s = ld.MirroredStrategy(num_replicas=2)
    yield s
    s.close()


def replay(steps: int, lr: float = 0.05, synchronized_from: int | None = None):
    """The lab's mirrored ON_WRITE / MEAN steps on 2 replicas, in one process: each replica's
    gradients from its own shard, averaged into one update; each replica's moving statistics
    from its own shard (or, from step `synchronized_from` on, from the global batch's).
    Returns (parameters, [state of replica 0, state of replica 1], [[loss per replica]] of
    the steps before that)."""
    model = BatchNormMLP()
    x, y = model.default_data(0)
    batches = BatchStream(x, y, 64, seed=0)
    params = model.init_params()
    states = [model.init_state(), model.init_state()]
    losses = []
    for step in range(1, steps + 1):
        batch = batches.next()
        if synchronized_from is not None and step > synchronized_from:
            # the all-reduced sums: both copies move toward the global batch's statistics,
            # and the averaged gradients are the global batch's
            h = batch.x @ params["dense_kernel"] + params["dense_bias"]
            for state in states:
                for name, value in (("moving_mean", h.mean(axis=0)),
                                    ("moving_variance", h.var(axis=0))):
                    state[name] = state[name] * model.momentum + value * (1 - model.momentum)
            _, g = model.loss_and_grads(np, params, batch.x, batch.y)
            grads = [g, g]
        else:
            xs, ys = shard(batch.x, 2), shard(batch.y, 2)
            grads, step_losses = [], []
            for r in range(2):
                loss, g = model.loss_and_grads(np, params, xs[r], ys[r], state=states[r])
                grads.append(g)
                step_losses.append(float(loss))
            losses.append(step_losses)
        params = {k: params[k] - lr * (grads[0][k] + grads[1][k]) / 2 for k in params}
    return params, states, losses


def test_the_moving_statistics_drift_per_replica_while_the_parameters_stay_one(strategy):
    with ld.Lab(strategy, model=BatchNormMLP()) as lab:
        assert lab.track == ["moving_mean[0]", "moving_mean[1]", "dense_kernel[0]"]
        lab.step(40)
        copies = lab.values()
        params, states, losses = replay(40)
        for r in range(2):
            for name in ("moving_mean", "moving_variance"):
                np.testing.assert_allclose(copies[r][name], states[r][name], rtol=1e-9)
            for name in params:
                np.testing.assert_allclose(copies[r][name], params[name], rtol=1e-9,
                                           atol=1e-12)
        np.testing.assert_allclose(lab.history.loss[-1], losses[-1], rtol=1e-9)
        gap = np.abs(copies[0]["moving_mean"] - copies[1]["moving_mean"]).max()
        assert gap > 1e-3  # the copies part: nothing combines them (aggregation NONE)
        assert all(s == 0.0 for s in lab.history.spread)  # the parameters: one value
        drift = lab.history.tracked("moving_mean[0]")
        assert drift[-1, 0] != drift[-1, 1]


def test_synchronized_batch_norm_closes_the_gap_by_the_momentum_each_step(strategy):
    with ld.Lab(strategy, model=BatchNormMLP()) as lab:
        lab.step(30)
        gap = np.subtract(*(c["moving_mean"] for c in lab.values()))
        lab.set(synchronized_bn=True)
        lab.step(10)
        assert lab.history.events[-1].text == "synchronized_bn False → True"
        after = lab.values()
        # both copies take the same update m <- 0.9 m + 0.1 batch: their gap shrinks by 0.9
        np.testing.assert_allclose(after[0]["moving_mean"] - after[1]["moving_mean"],
                                   gap * BatchNormMLP.momentum ** 10, rtol=1e-6, atol=1e-12)
        params, states, _ = replay(40, synchronized_from=30)
        for r in range(2):
            np.testing.assert_allclose(after[r]["moving_mean"], states[r]["moving_mean"],
                                       rtol=1e-9)
        np.testing.assert_allclose(after[0]["gamma"], params["gamma"], rtol=1e-9)


def test_a_switch_unifies_the_parameters_but_not_the_moving_statistics(strategy):
    with ld.Lab(strategy, model=BatchNormMLP(), synchronization="NONE") as lab:
        lab.step(20)
        before = lab.values()
        assert not np.array_equal(before[0]["dense_kernel"], before[1]["dense_kernel"])
        lab.set(synchronization="ON_WRITE")  # resync "average": the parameters become one
        lab.step(0)
        lab.wait()
        after = lab.values()
        np.testing.assert_allclose(after[0]["dense_kernel"],
                                   (before[0]["dense_kernel"] + before[1]["dense_kernel"]) / 2)
        assert np.array_equal(after[0]["dense_kernel"], after[1]["dense_kernel"])
        for r in range(2):  # each replica keeps its own statistics (ON_WRITE / NONE)
            assert np.array_equal(after[r]["moving_mean"], before[r]["moving_mean"])


def test_the_loss_metric_gives_partial_results_and_the_cross_replica_one(strategy):
    model = BatchNormMLP()
    with ld.Lab(strategy, model=model) as lab:
        lab.step(30)
        # the digits give 1437 // 64 = 22 steps an epoch: the metric restarted at step 23
        losses = np.array(lab.history.loss[22:30])
        partial, whole = lab.history.metric[-1][:2], lab.history.metric[-1][2]
        np.testing.assert_allclose(partial, losses.mean(axis=0), rtol=1e-5)
        np.testing.assert_allclose(whole, losses.mean(), rtol=1e-5)
        assert partial[0] != partial[1]
        # the driver's read of the ON_READ / SUM copies gives the same cross-replica figure
        runner = lab._runner
        read = runner.call(lambda: float(runner.engine.metric.result())).result()
        assert read == pytest.approx(whole, rel=1e-6)
        copies = runner.call(lambda: [float(c) for c in strategy.experimental_local_results(
            runner.engine.metric.variables[1])]).result()
        assert copies == [8 * 32.0, 8 * 32.0]  # each replica counts its own samples


def test_the_models_limits_are_refused_naming_the_setting(strategy):
    with ld.Lab(strategy, model=BatchNormMLP()) as lab:
        with pytest.raises(ValueError, match=r"kind='ps_async' is not allowed with "
                           r"BatchNormMLP\(hidden=8\): its batch-norm statistics"):
            lab.set(kind="ps_async")
        assert lab.pending_config().kind == "mirrored"
    with ld.Lab(strategy) as lab:
        with pytest.raises(ValueError, match=r"synchronized_bn=True is not allowed with "
                           r"Linear\(n_features=1\): it has no batch norm"):
            lab.set(synchronized_bn=True)
        with pytest.raises(ValueError, match=r"synchronized_bn=1 is not allowed; use True"):
            lab.set(synchronized_bn=1)
        assert lab.pending_config().synchronized_bn is False


def test_the_panel_shows_the_statistics_per_replica_and_the_metric(strategy):
    with ld.Lab(strategy, model=BatchNormMLP()) as lab:
        panel = LabPanel(lab)
        assert {"state:moving_mean[0]", "state:moving_mean[1]", "track:dense_kernel[0]",
                "metric"} <= panel.charts.keys()
        assert "each replica updates its own copy" in \
            panel.charts["state:moving_mean[0]"].caption
        assert panel.controls.synchronized_bn.layout.display != "none"
        panel.controls.synchronized_bn.value = True  # as a click does
        assert lab.pending_config().synchronized_bn is True
        lab.step(2)
        deadline = time.monotonic() + 10  # the publisher rewrites the captions on its thread
        while "synchronized_bn: every replica" not in \
                panel.charts["state:moving_mean[0]"].caption and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "the copies take the same update" in panel.charts["state:moving_mean[0]"].caption
        panel.close()
    with ld.Lab(strategy) as lab:  # no batch norm: no checkbox to tick
        panel = LabPanel(lab)
        assert panel.controls.synchronized_bn.layout.display == "none"
        assert panel.controls.learning_rate.layout.display != "none"
        panel.close()
