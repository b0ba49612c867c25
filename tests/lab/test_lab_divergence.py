"""A run that diverges (learning rate 0.9 on the default model) pauses at the first step whose
loss or parameters are not finite and says where, in words; run/step/wait raise until reset."""

from __future__ import annotations

import time

import numpy as np
import pytest

import labdist as ld
from labdist.lab import DivergenceError
from labdist.lab.run_items import DivergedItem


@pytest.fixture(scope="module")
def strategy():
    s = ld.MirroredStrategy(num_replicas=2)
    yield s
    s.close()


def diverge(lab, timeout: float = 30.0) -> DivergenceError:
    lab.run()
    t0 = time.monotonic()
    while lab.state != "diverged":
        assert time.monotonic() - t0 < timeout, f"no divergence by step {lab.step_count}"
        time.sleep(0.05)
    with pytest.raises(DivergenceError) as raised:
        lab.wait(timeout=10)
    return raised.value


@pytest.mark.parametrize("kind, aggregation, rate", [("mirrored", "SUM", 0.9),
                                                     ("ps_async", "MEAN", 2.5)])
def test_a_learning_rate_too_large_pauses_the_run_and_says_why(strategy, kind, aggregation,
                                                               rate):
    """Mirrored SUM doubles each step (two replicas' updates add up): at 0.9 it blows up
    within seconds. Async PS at 0.9 blows up only when its gradients happen to be stale
    enough (3 of 4 runs went 20 s without; with a 10 ms straggler, 4 of 4 did): at 2.5, past
    2 / E[x^2] of the default model's data, every push grows the error (~300 steps)."""
    seen: list[DivergedItem] = []
    with ld.Lab(strategy, kind=kind, aggregation=aggregation, learning_rate=rate) as lab:
        lab.subscribe(lambda item: seen.append(item) if isinstance(item, DivergedItem) else None)
        error = diverge(lab, timeout=60.0)
        who = "replica" if kind == "mirrored" else "worker"
        assert f"{who} " in error.where and ("nan" in error.where or "inf" in error.where)
        assert str(error).endswith("lower the learning rate and reset")
        assert f"at step {error.step}" in str(error)
        assert lab.history.diverged_at == error.step and lab.divergence is not None
        (item,) = seen
        assert item.step == error.step and item.text == str(error)
        stopped = lab.step_count
        time.sleep(0.3)
        assert lab.step_count == stopped and lab.state == "diverged"  # paused there
        row = lab.history.step.index(error.step)  # the marked step holds what is not finite
        assert not (np.isfinite(lab.history.loss[row]).all()
                    and np.isfinite(lab.history.values[row]).all())
        with pytest.raises(DivergenceError, match="lower the learning rate and reset"):
            lab.run()
        with pytest.raises(DivergenceError):
            lab.step(1)
        lab.set(learning_rate=0.05)
        lab.reset()
        assert lab.state == "idle" and lab.divergence is None and lab.error is None
        lab.step(20)
        assert all(np.isfinite(float(v["w"])) for v in lab.values())
        assert lab.history.diverged_at is None


def test_a_finite_run_never_reports_divergence(strategy):
    with ld.Lab(strategy, learning_rate=0.05) as lab:
        lab.step(50)
        assert lab.divergence is None and lab.state == "idle"
