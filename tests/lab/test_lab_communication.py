"""The lab's communication modes (compression, local SGD / DiLoCo), headless: switched at step
boundaries without losing or repeating an update, and what the charts are fed (the replicas
drift for H steps and snap together; residual norms and bytes per step)."""

from __future__ import annotations

import time

import numpy as np
import pytest

import labdist as ld
from labdist.lab import LabModel
from labdist.lab.config import RunConfig


class Counting(LabModel):
    """Every gradient is -1 (a vector of 4, so top-k keeps fewer than all): with learning
    rate 1 each averaged update adds exactly 1, so the parameters count the updates."""

    def init_params(self):
        return {"theta": np.zeros(4)}

    def loss_and_grads(self, xp, params, x, y):
        time.sleep(0.003)
        return xp.asarray(0.0), {"theta": -xp.ones(4) if len(x) else xp.zeros(4)}


DATA = (np.zeros((64, 1)), np.zeros(64))


@pytest.fixture(scope="module")
def strategy():
    s = ld.MirroredStrategy(num_replicas=2)
    yield s
    s.close()


@pytest.fixture
def skewed():
    return ld.datasets.synthetic.regression(n_samples=256, n_features=1, noise=0.1, seed=1)


@pytest.mark.parametrize("changes, match", [
    ({"compression": "zip"}, r"compression='zip' is not allowed; allowed: none, fp16, bf16, "
                             r"topk, powersgd"),
    ({"topk_ratio": 0}, r"topk_ratio=0 is not allowed; use a finite number > 0 and <= 1"),
    ({"topk_ratio": 1.5}, r"topk_ratio=1.5"),
    ({"powersgd_rank": 0}, r"powersgd_rank=0 is not allowed; use an integer in 1\.\."),
    ({"local_steps": -1}, r"local_steps=-1 is not allowed; use an integer in 0\.\."),
    ({"local_steps": 2.5}, r"local_steps=2.5"),
    ({"outer_lr": 0}, r"outer_lr=0 is not allowed"),
    ({"outer_momentum": 1.0}, r"outer_momentum=1.0 is not allowed"),
    ({"compression": "fp16", "synchronization": "ON_READ"},
     r"compression='fp16' is not allowed with mirrored ON_READ.*ON_WRITE, aggregation MEAN"),
    ({"local_steps": 4, "kind": "ps_async"}, r"local_steps=4 is not allowed with PS async"),
])
def test_bad_communication_settings_are_refused(changes, match):
    with pytest.raises(ValueError, match=match):
        RunConfig().replace(changes, 2)


def test_describe_names_the_modes():
    config = RunConfig().replace({"compression": "topk", "topk_ratio": 0.05,
                                  "local_steps": 8}, 2)
    assert config.describe() == ("mirrored ON_WRITE, MEAN, topk 0.05, DiLoCo H=8 "
                                 "(outer lr 0.7, momentum 0.9)")


def test_a_refused_mode_changes_nothing(strategy):
    with ld.Lab(strategy, model=Counting(), data=DATA, learning_rate=1.0) as lab:
        with pytest.raises(ValueError, match=r"aggregation MEAN or SUM"):
            lab.set(compression="fp16", aggregation="NONE")
        lab.step(2)
        lab.wait()
        assert lab.config.compression == "none" and lab.events == []
        assert strategy.compression is None


def test_no_update_is_lost_or_applied_twice_across_mode_switches(strategy):
    """Compressors, local SGD (outer SGD(1): plain averaging, exact on the counter) and back,
    switched while the run goes on; a switch from compression off sends the residuals owed."""
    with ld.Lab(strategy, model=Counting(), data=DATA, learning_rate=1.0) as lab:
        lab.run()
        for changes in ({"compression": "fp16"},
                        {"compression": "topk", "topk_ratio": 0.25},
                        {"local_steps": 3, "outer_lr": 1.0, "outer_momentum": 0.0},
                        {"compression": "bf16", "local_steps": 5},
                        {"local_steps": 0},
                        {"compression": "powersgd", "powersgd_rank": 1},
                        {"compression": "none"},
                        {"synchronization": "ON_READ"},
                        {"synchronization": "ON_WRITE", "compression": "topk",
                         "topk_ratio": 0.5},
                        {"compression": "none"}):
            time.sleep(0.25)
            lab.set(**changes)
        time.sleep(0.25)
        lab.pause()
        lab.step(1)  # one step with every mode off: owed residuals go out
        lab.wait()
        # one event per change (two queued before one boundary would apply as one event)
        assert 6 <= len(lab.events) <= 10
        assert lab.config.compression == "none" and lab.config.local_steps == 0
        steps = sum(1 for c in lab.history.contributions if c)
        values = [v["theta"] for v in lab.values()]
        for v in values:
            np.testing.assert_array_equal(v, np.full(4, float(steps)))
        comm = [c for c in lab.history.communication if c is not None]
        assert comm and any(c["since"] > 0 for c in comm)  # local SGD rounds were open
        stats = strategy.communication_stats()
        assert all(s["residual_norm"] == 0.0 for s in stats)  # nothing left owed
    assert strategy.compression is None and strategy.local_steps is None  # the lab's undone


def test_diloco_replicas_drift_then_snap_together(strategy, skewed):
    """On skewed data the replicas' copies drift apart for H steps; the round's outer step
    puts every replica on the same weights (spread 0 at that step, and only then)."""
    with ld.Lab(strategy, data=skewed, skew=2.0, learning_rate=0.05, local_steps=4,
                outer_lr=0.7, outer_momentum=0.9) as lab:
        lab.step(12)
        lab.wait()
        comm = lab.history.communication[-12:]
        spread = lab.history.spread[-12:]
        closed = [c["pseudo_norm"] is not None for c in comm]
        assert closed == [False, False, False, True] * 3
        for c, s, done in zip(comm, spread, closed, strict=True):
            if done:
                assert s == 0.0 and c["since"] == 0 and c["outer_norm"] > 0
                assert all(b > 0 for b in c["bytes"])
            else:
                assert s > 0 and all(b == 0 for b in c["bytes"])  # inner steps send nothing
        # Nesterov momentum 0.9: the outer step is longer than lr x the pseudo-gradient
        last = comm[-1]
        assert last["outer_norm"] > 0.7 * last["pseudo_norm"]
        lab.set(local_steps=2)  # a new H for the next rounds
        lab.step(4)
        lab.wait()
        assert [c["pseudo_norm"] is not None for c in lab.history.communication[-4:]] \
            == [False, True] * 2


def test_compression_shows_residuals_and_fewer_bytes(strategy):
    """Each replica's error-feedback residual norm and bytes per step reach the history:
    top-k drops values (a residual), fp16 a quarter of what a plain step sends (float64)."""
    data = ld.datasets.synthetic.regression(n_samples=256, n_features=8, noise=0.1, seed=2)
    with ld.Lab(strategy, model=ld.lab.Linear(8), data=data, skew=1.0,
                learning_rate=0.05) as lab:
        lab.step(2)
        lab.wait()
        before = [s["bytes_sent"] for s in strategy.communication_stats()]
        lab.step(1)
        lab.wait()
        plain = [s["bytes_sent"] - b for s, b in zip(strategy.communication_stats(), before,
                                                      strict=True)]
        assert lab.history.communication[-1] is None and min(plain) > 0
        assert lab.history.sent[-1] == plain  # the uncompressed baseline, shown every step
        lab.set(compression="fp16")
        lab.step(3)
        lab.wait()
        fp16 = lab.history.communication[-1]
        assert lab.history.sent[-1] == fp16["bytes"]
        assert fp16["bytes"] == [p // 4 for p in plain]  # float64 weights, sent as fp16
        lab.set(compression="topk", topk_ratio=0.5)
        lab.step(3)
        lab.wait()
        topk = lab.history.communication[-1]
        assert all(r > 0 for r in topk["residual_norm"])
        assert all(0 < b < p for b, p in zip(topk["bytes"], plain, strict=True))
        assert topk["residual_norm"][0] != topk["residual_norm"][1]  # each replica its own


@pytest.mark.parametrize("move, then", [
    ({"aggregation": "SUM"}, 2.0),  # ON_WRITE SUM: both replicas' -1 summed, lr 1
    ({"synchronization": "ON_READ"}, 1.0),  # each replica's own step
])
def test_leaving_diloco_mid_round_for_another_mode_applies_the_outer_step_once(
        strategy, move, then):
    """A switch that moves the copies to other variables (another synchronization or
    aggregation) while a DiLoCo round is open closes that round with its outer step first:
    with outer SGD(0.5), two inner steps of +1 count as +1, not +2 (the drifted copies taken
    as they are) nor twice. The counter then goes on from there, and coming back to DiLoCo
    starts a fresh round."""
    with ld.Lab(strategy, model=Counting(), data=DATA, learning_rate=1.0, local_steps=3,
                outer_lr=0.5, outer_momentum=0.0) as lab:
        lab.step(2)  # a round open: two inner steps, +1 each on every replica
        lab.wait()
        assert lab.history.communication[-1]["since"] == 2
        lab.set(local_steps=0, **move)
        lab.step(1)
        lab.wait()
        expected = 0.5 * 2 + then
        for v in lab.values():
            np.testing.assert_array_equal(v["theta"], np.full(4, expected))
        lab.set(local_steps=3, synchronization="ON_WRITE", aggregation="MEAN")
        lab.step(3)  # one whole round: +0.5 x 3
        lab.wait()
        for v in lab.values():
            np.testing.assert_array_equal(v["theta"], np.full(4, expected + 1.5))


def test_leaving_compression_for_another_mode_sends_the_residuals_owed(strategy):
    """top-k keeps one of four values a step; switching to ON_READ in the same call as turning
    compression off first sends what error feedback still owes, so every update lands once."""
    with ld.Lab(strategy, model=Counting(), data=DATA, learning_rate=1.0,
                compression="topk", topk_ratio=0.25) as lab:
        lab.step(3)
        lab.wait()
        assert all(r > 0 for r in lab.history.communication[-1]["residual_norm"])
        lab.set(compression="none", synchronization="ON_READ")
        lab.step(2)
        lab.wait()
        for v in lab.values():
            np.testing.assert_array_equal(v["theta"], np.full(4, 5.0))
        assert all(s["residual_norm"] == 0.0 for s in strategy.communication_stats())


def test_reset_sends_no_residual_owed_from_before_it(strategy):
    """top-k keeps three of four values a step back; a reset puts the values back to 0 and
    forgets what error feedback owed with them, so after it the counter counts only the steps
    taken since (turning compression off then has nothing left to send)."""
    with ld.Lab(strategy, model=Counting(), data=DATA, learning_rate=1.0,
                compression="topk", topk_ratio=0.25) as lab:
        lab.step(3)
        lab.wait()
        assert all(r > 0 for r in lab.history.communication[-1]["residual_norm"])
        lab.reset()
        assert all(s["residual_norm"] == 0.0 for s in strategy.communication_stats())
        lab.set(compression="none")
        lab.step(2)
        lab.wait()
        for v in lab.values():
            np.testing.assert_array_equal(v["theta"], np.full(4, 2.0))


@pytest.mark.parametrize("modes", [
    {"compression": "topk", "topk_ratio": 0.25},  # the gradients' residuals
    {"compression": "powersgd", "powersgd_rank": 1},  # and PowerSGD's warm-start factors
    # DiLoCo's rounds and outer momentum, with the pseudo-gradients' residuals and factors
    {"compression": "powersgd", "powersgd_rank": 1, "local_steps": 2, "outer_lr": 0.7,
     "outer_momentum": 0.9},
])
def test_a_run_after_reset_replays_the_first_one(strategy, modes):
    """A reset starts the communication state afresh with the values: the same steps after
    it give the same weights, bit for bit, and the same communication record (a round left
    open by the first run is not carried into the second)."""
    rng = np.random.default_rng(8)
    x, y = rng.normal(size=(128, 16)), rng.integers(0, 4, 128)
    with ld.Lab(strategy, model=ld.lab.SoftmaxRegression(16, 4), data=(x, y), skew=0.5,
                learning_rate=0.1, **modes) as lab:
        lab.step(5)
        lab.wait()
        first = [dict(v) for v in lab.values()]
        record = list(lab.history.communication)
        lab.reset()
        lab.step(5)
        lab.wait()
        for a, b in zip(first, lab.values(), strict=True):
            for k in a:
                np.testing.assert_array_equal(a[k], b[k])
        assert list(lab.history.communication) == record


def test_powersgd_in_the_lab_sends_the_low_rank_factors(strategy):
    """The lab's synchronous steps all-reduce each parameter in its shape, so PowerSGD
    approximates the 16 x 4 matrix: rank 1 sends P (16 values) then Q (4), and the bias (4)
    whole, float64: 192 bytes a step instead of the 544 of every parameter."""
    rng = np.random.default_rng(8)
    x, y = rng.normal(size=(128, 16)), rng.integers(0, 4, 128)
    with ld.Lab(strategy, model=ld.lab.SoftmaxRegression(16, 4), data=(x, y),
                learning_rate=0.1, compression="powersgd", powersgd_rank=1) as lab:
        lab.step(3)
        lab.wait()
        assert [c["bytes"] for c in lab.history.communication] == [[192, 192]] * 3
        assert all(r > 0 for r in lab.history.communication[-1]["residual_norm"])
