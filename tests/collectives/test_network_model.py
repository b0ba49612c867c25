"""The network model (issue 27, item 5): a measured all-reduce and a PS pull/push take what
`NetworkModel.predict` says for their bytes and algorithm (±20 %), it is off by default and
after `off`, and bad values name themselves and the accepted forms. Real worker processes."""

from __future__ import annotations

import statistics
import time

import numpy as np
import pytest

import labdist as ld
from labdist.timing import timeline

MODEL = dict(latency="5ms", bandwidth="100MB/s")
N = 2 << 20  # float32 elements: 8 MiB, the reduce-scatter path


def big_all_reduce():
    ctx = ld.get_replica_context()
    return ctx.all_reduce("SUM", np.ones(N, np.float32))[0]


def collective_seconds(strategy, steps: int) -> list[float]:
    """Per step of replica 0: the seconds its all-reduce took (wait + comm, as recorded)."""
    since = time.time()
    time.sleep(0.1)  # a margin for the clock offsets measured later (~ms)
    for _ in range(steps):
        strategy.run(big_all_reduce)
    proc = next(p for p in timeline.collect(strategy.client, since)
                if any(s[0] == "step" and s[4] and s[4].get("rank") == 0 for s in p["spans"]))
    return [w + c for w, c in zip(timeline.phase_totals(proc, "wait"),
                                  timeline.phase_totals(proc, "comm"), strict=True)]


@pytest.mark.timeout(120)
def test_all_reduce_takes_the_modelled_time(mirrored2):
    model = ld.NetworkModel(**MODEL)
    mirrored2.run(big_all_reduce)
    free = statistics.median(collective_seconds(mirrored2, 5))
    model.apply(mirrored2)
    try:
        slowed = statistics.median(collective_seconds(mirrored2, 5))
    finally:
        ld.NetworkModel.off(mirrored2)
    predicted = model.predict(N * 4, 2, "reduce_scatter")  # 2 x (5 ms + 4 MiB / 100 MB/s)
    assert 0.8 * predicted <= slowed <= 1.2 * predicted, (slowed, predicted, free)
    again = statistics.median(collective_seconds(mirrored2, 3))
    assert again < 0.5 * predicted, again  # off again: full speed


@pytest.mark.timeout(180)
def test_ps_pull_and_push_take_the_modelled_time():
    from distributed import Client, LocalCluster

    n = 1 << 20  # float32: 4 MiB each way
    model = ld.NetworkModel(**MODEL)
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        s = ld.ParameterServerStrategy(client, num_ps=1, num_workers=1, mode="async")
        try:
            coordinator = ld.ClusterCoordinator(s)
            with s.scope():
                v = ld.Variable(np.zeros(n, np.float32))

            def pull_push():
                v.assign_add(np.asarray(v.read_value()) * 0 + 1)

            coordinator.schedule(pull_push)
            coordinator.join()
            model.apply(s)
            since = time.time()
            time.sleep(0.1)  # a margin for the clock offsets measured later (~ms)
            for _ in range(4):
                coordinator.schedule(pull_push)
                coordinator.join()
            spans = [sp for p in timeline.collect(client, since) for sp in p["spans"]]
        finally:
            ld.NetworkModel.off(s)
            s.close()
    predicted = model.predict(n * 4, 1, "pull")
    for name in ("pull", "push"):
        took = statistics.median(e - b for n_, b, e, _, _ in spans if n_ == name)
        assert 0.8 * predicted <= took <= 1.2 * predicted, (name, took, predicted)


@pytest.mark.parametrize("bad, match", [
    (dict(latency=-0.001), r"latency=-0.001 .*'5ms'"),
    (dict(latency="5 parsecs"), r"latency='5 parsecs' .*'200us'"),
    (dict(latency=float("nan")), r"latency=nan"),
    (dict(bandwidth="-100MB/s"), r"bandwidth='-100MB/s' .*'100MB/s'"),
    (dict(bandwidth=0), r"bandwidth=0 .*> 0"),
    (dict(bandwidth="100 furlongs/s"), r"bandwidth='100 furlongs/s' .*Gbit"),
    (dict(latency=True), r"latency=True"),
])
def test_bad_values_name_themselves_and_the_accepted_forms(bad, match):
    with pytest.raises(ValueError, match=match):
        ld.NetworkModel(**bad)


def test_units_parse_as_documented():
    m = ld.NetworkModel(latency="200us", bandwidth="1Gbit/s")
    assert m.latency == pytest.approx(200e-6) and m.bandwidth == pytest.approx(125e6)
    assert ld.NetworkModel(latency=0.01, bandwidth="1MiB/s").seconds(1 << 20) == \
        pytest.approx(1.01)
    assert ld.NetworkModel().seconds(1 << 30) == 0.0  # the default: no latency, unlimited
