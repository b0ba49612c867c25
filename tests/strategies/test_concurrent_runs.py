"""Several threads sending steps to one strategy's replicas (issue 13, finding 1): each call
gets its own results, on the socket lane and over Dask comms, and a lab training in the
background shares its strategy with the notebook's own calls. Real worker processes."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from conftest import make_strategy

import labdist as ld

CALLS = 40


def tagged_step(tag: int, i: int):
    """A step that makes a collective and a merge_call and returns what it was given."""
    def step():
        ctx = ld.get_replica_context()
        total = ctx.all_reduce("SUM", float(i))
        merged = ctx.merge_call(lambda s, x: x, args=(tag * 1000 + i,))
        return tag, i, ctx.replica_id_in_sync_group, total, merged
    return step


def hammer(s: ld.Strategy, tag: int, wrong: list, errors: list) -> None:
    try:
        for i in range(CALLS):
            out = s.experimental_local_results(s.run(tagged_step(tag, i)))
            for r, got in enumerate(out):
                expect = (tag, i, r, 2.0 * i, tag * 1000 + i)
                if tuple(got) != expect:
                    wrong.append((tag, i, r, got))
    except BaseException as e:  # reported by the test thread
        errors.append(e)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["mirrored-2", "mirrored-2-tcp"])
def test_two_threads_each_get_their_own_results(kind):
    s = make_strategy(kind)
    wrong: list = []
    errors: list = []
    threads = [threading.Thread(target=hammer, args=(s, tag, wrong, errors)) for tag in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(100)
    assert not any(t.is_alive() for t in threads), "a thread is still waiting for its run"
    assert errors == []
    assert wrong == []
    assert s.experimental_local_results(s.run(lambda: 7)) == (7, 7)  # and still usable


@pytest.mark.timeout(120)
def test_a_lab_in_the_background_and_the_notebook_share_a_strategy():
    s = make_strategy("mirrored-2")
    x = np.zeros((64, 1))
    with ld.Lab(s, data=(x, np.zeros(64)), learning_rate=0.01) as lab:
        lab.run(400)
        wrong: list = []
        errors: list = []
        hammer(s, 3, wrong, errors)
        with s.scope():
            v = ld.Variable(np.arange(3.0))
        v.assign_add(np.ones(3))
        np.testing.assert_array_equal(s.experimental_local_results(v)[1], np.arange(3.0) + 1)
        lab.wait(timeout=90)
        assert errors == []
        assert wrong == []
        assert lab.error is None
        assert lab.step_count == 400


@pytest.mark.timeout(60)
def test_a_merge_call_function_uses_the_strategy_but_cannot_start_a_run():
    """The lock is reentrant for what a merge_call function does on the driver (variables,
    extended.update, reduce); a run inside a run is refused with a clear error."""
    s = make_strategy("mirrored-2")
    with s.scope():
        v = ld.Variable(0.0)

    def merge_fn(strategy, x):
        strategy.extended.update(v, lambda var, d: var.assign_add(d), args=(x,))
        return float(strategy.reduce("SUM", v, axis=None)) + v.numpy()

    out = s.run(lambda: ld.get_replica_context().merge_call(merge_fn, args=(1.0,)))
    assert s.experimental_local_results(out) == (3.0, 3.0)

    def nested():
        return ld.get_replica_context().merge_call(lambda strategy: strategy.run(lambda: 1))

    with pytest.raises(RuntimeError, match="strategy.run cannot be called inside merge_call"):
        s.run(nested)
    with ld.OneDeviceStrategy(device="cpu") as here:  # its steps run in this process
        with pytest.raises(RuntimeError, match="strategy.run cannot be called inside a step"):
            here.run(lambda: here.run(lambda: 1))
        assert here.run(lambda: 2) == 2
    assert s.experimental_local_results(s.run(lambda: 7)) == (7, 7)
