"""strategy.run sends a step function once, and never a stale one: the driver pickles a
function again only when something its pickle holds may have changed (shipping.snapshot),
replicas keep what they ran under the pickle's digest (cluster/sent_functions.py)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import labdist as ld
from labdist import shipping
from labdist.cluster.sent_functions import LIMIT, SentFunctions
from labdist.replica.actor import StepEvent

SCALE = 1.0


def results(strategy, out):
    return tuple(float(v) for v in strategy.experimental_local_results(out))


@pytest.fixture
def dumps_count(monkeypatch):
    calls = []
    real = shipping.dumps
    monkeypatch.setattr(shipping, "dumps", lambda fn: calls.append(fn) or real(fn))
    return calls


def test_a_loop_pickles_its_function_once_or_twice(mirrored2, dumps_count):
    with mirrored2.scope():
        v = ld.Variable(0.0, aggregation="MEAN")
    lr = 0.5

    def step():
        v.assign_add(lr)
        return lr

    for _ in range(10):
        assert results(mirrored2, mirrored2.run(step)) == (0.5, 0.5)
    assert len(dumps_count) <= 2  # the first pickling tags the function (its __dict__)
    assert float(v.numpy()) == 5.0


def test_a_rebound_closure_cell_is_sent_again(mirrored2):
    scale = 1.0

    def step():
        return scale

    assert results(mirrored2, mirrored2.run(step)) == (1.0, 1.0)
    assert results(mirrored2, mirrored2.run(step)) == (1.0, 1.0)
    scale = 2.0
    assert results(mirrored2, mirrored2.run(step)) == (2.0, 2.0)


def test_a_rebound_global_is_sent_again(mirrored2, monkeypatch):
    def step():
        return SCALE  # a global of this module: pickled by value with the nested function

    for _ in range(3):
        assert results(mirrored2, mirrored2.run(step)) == (1.0, 1.0)
    monkeypatch.setattr(f"{__name__}.SCALE", 3.0)
    assert results(mirrored2, mirrored2.run(step)) == (3.0, 3.0)


@pytest.mark.parametrize("holder", ["list", "array", "dict"])
def test_values_changed_in_place_are_sent_again(mirrored2, holder):
    box = {"list": [1.0], "array": np.array([1.0]), "dict": {0: 1.0}}[holder]

    def step():
        return box[0]

    for _ in range(3):
        assert results(mirrored2, mirrored2.run(step)) == (1.0, 1.0)
    before = shipping.snapshot(step)
    box[0] = 4.0
    assert results(mirrored2, mirrored2.run(step)) == (4.0, 4.0)
    if holder == "array":
        assert before is None  # an array changes in place unseen: never cached
    else:  # a list or dict is listed by content: the change shows
        assert before is not None and not shipping.same(before, shipping.snapshot(step))


def test_containers_and_optimizers_are_listed_by_content(mirrored2, dumps_count):
    """A loop's step holding a list of variables and an optimizer is pickled once; a change
    to the optimizer (a new learning rate) or to the list sends it again, and the replicas
    use the new value."""
    with mirrored2.scope():
        variables = [ld.Variable(np.zeros(2, np.float32), aggregation="MEAN")]
    opt = ld.optimizers.SGD(1.0)

    def step():
        opt.apply_gradients([(np.ones(2, np.float32), v) for v in variables])
        return variables[0].read_value()[0]

    for _ in range(5):
        mirrored2.run(step)
    assert len(dumps_count) <= 2
    assert float(variables[0].numpy()[0]) == -10.0  # 5 steps of -(1 + 1)
    opt.learning_rate = 0.5
    assert results(mirrored2, mirrored2.run(step)) == (-11.0, -11.0)
    with mirrored2.scope():
        variables.append(ld.Variable(np.zeros(2, np.float32)))
    mirrored2.run(step)
    assert float(variables[1].numpy()[0]) == -1.0  # the new list reached the replicas
    big = list(range(shipping.MAX_ITEMS + 1))
    assert shipping.snapshot(lambda: big) is None  # too long to walk on every call


def test_defaults_partials_and_bound_methods(mirrored2):
    def step(a=1.0):
        return a

    mirrored2.run(step)
    mirrored2.run(step)
    step.__defaults__ = (5.0,)
    assert results(mirrored2, mirrored2.run(step)) == (5.0, 5.0)

    def add(a, b):
        return a + b

    part = functools.partial(add, 1.0)
    assert results(mirrored2, mirrored2.run(part, args=(1.0,))) == (2.0, 2.0)
    assert results(mirrored2, mirrored2.run(part, args=(1.0,))) == (2.0, 2.0)
    assert results(mirrored2, mirrored2.run(functools.partial(add, 2.0), args=(1.0,))) == (
        3.0, 3.0)
    args = [1.0]
    listed = functools.partial(lambda xs: xs[0], args)
    mirrored2.run(listed)
    args[0] = 7.0
    assert results(mirrored2, mirrored2.run(listed)) == (7.0, 7.0)

    class Scaled:
        def __init__(self):
            self.k = 1.0

        def __call__(self):
            return self.k

        def get(self):
            return self.k

    obj = Scaled()
    method = obj.get
    assert results(mirrored2, mirrored2.run(method)) == (1.0, 1.0)
    assert results(mirrored2, mirrored2.run(obj)) == (1.0, 1.0)
    obj.k = 8.0
    assert results(mirrored2, mirrored2.run(method)) == (8.0, 8.0)
    assert results(mirrored2, mirrored2.run(obj)) == (8.0, 8.0)


def test_a_nested_helper_is_part_of_the_snapshot(mirrored2):
    factor = 1.0

    def helper():
        return factor

    def step():
        return helper() * 2

    assert results(mirrored2, mirrored2.run(step)) == (2.0, 2.0)
    mirrored2.run(step)
    factor = 3.0
    assert results(mirrored2, mirrored2.run(step)) == (6.0, 6.0)


def test_more_functions_than_replicas_keep_stay_right(mirrored2):
    steps = [(lambda i=i: float(i)) for i in range(LIMIT + 4)]
    for _ in range(2):
        for i, fn in enumerate(steps):
            assert results(mirrored2, mirrored2.run(fn)) == (float(i), float(i))


def test_a_failed_call_sends_the_function_again():
    sent = SentFunctions()

    def fn():
        return 1

    first = sent.refs(fn, 2)
    assert all(ref[1] is not None for ref in first)
    sent.answered([StepEvent("done", 0), StepEvent("error", 0, error=ValueError())])
    again = sent.refs(fn, 2)
    assert again[0][1] is None and again[1][1] is not None  # rank 1 may not hold it
    assert again[0][0] == again[1][0] == first[0][0]


def test_evicted_functions_are_dropped_on_the_replicas():
    sent = SentFunctions()
    fns = [(lambda i=i: i) for i in range(LIMIT + 1)]
    first = sent.refs(fns[0], 1)[0][0]
    sent.answered([StepEvent("done", 0)])
    dropped = []
    for fn in fns[1:]:
        dropped += sent.refs(fn, 1)[0][2]
        sent.answered([StepEvent("done", 0)])
    assert dropped == [first]  # the replica is told, in the call that evicts it
    ref = sent.refs(fns[0], 1)[0]
    assert ref[0] == first and ref[1] is not None  # sent again, under the same key


def test_layers_named_tuples_and_registered_state_are_listed_by_content():
    """What a README-style step holds (labdist.training's layers, whose activation is a named
    tuple, an optimizer) is cacheable, and any change to it shows in the snapshot."""
    from labdist.training import layers

    net = [layers.Dense(5, activation="relu"), layers.Dropout(0.5)]
    opt = ld.optimizers.Adam(0.01)

    def step():
        return net, opt

    first = shipping.snapshot(step)
    assert first is not None and shipping.same(first, shipping.snapshot(step))
    for change in (lambda: setattr(net[0], "units", 6), lambda: setattr(opt, "beta_1", 0.8),
                   lambda: net.append(layers.Dense(2)), lambda: setattr(net[1], "rate", 0.1)):
        before = shipping.snapshot(step)
        change()
        assert not shipping.same(before, shipping.snapshot(step))
    net[0].cache = np.zeros(3)  # an array held anywhere: no cache at all
    assert shipping.snapshot(step) is None
