"""labdist's Prometheus metrics on each worker's own /metrics route (issue 27, item 4): scraped
over HTTP and read with prometheus_client's parser, they grow with steps. Real worker
processes, each with its Dask HTTP server."""

from __future__ import annotations

import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

import labdist as ld


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) -> value, from a worker's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def ports(client) -> dict[str, int]:
    return client.run(lambda dask_worker: dask_worker.http_server.port)


@pytest.mark.timeout(120)
def test_replica_metrics_grow_with_steps(mirrored2):
    def step():
        return ld.get_replica_context().all_reduce("SUM", np.ones(100))

    mirrored2.run(step)
    where = ports(mirrored2.client)
    before = {a: scrape(p) for a, p in where.items()}
    for _ in range(5):
        mirrored2.run(step)
    grew = 0
    for address, port in where.items():
        after = scrape(port)
        if ("labdist_steps_total", ()) not in after:
            continue  # a worker of this cluster with no replica on it
        grew += 1
        was = before[address]
        assert after[("labdist_steps_total", ())] - was[("labdist_steps_total", ())] == 5
        assert after[("labdist_runs_total", ())] - was[("labdist_runs_total", ())] == 5
        comm = ("labdist_phase_seconds_count", (("phase", "comm"),))
        assert after[comm] - was.get(comm, 0) >= 5
        assert after[("labdist_phase_seconds_sum", (("phase", "compute"),))] > 0
        sent = ("labdist_collective_bytes_total", ())
        assert after[sent] - was[sent] >= 5 * 100 * 8
        inf = ("labdist_phase_seconds_bucket", (("le", "+Inf"), ("phase", "comm")))
        assert after[inf] == after[comm]  # a well-formed histogram
    assert grew == 2


@pytest.mark.timeout(120)
def test_steps_count_optimizer_steps_of_fit_and_of_runs_of_k_steps(mirrored2):
    """A fit epoch on the replicas can be one dispatch: steps_total counts its batches (the
    optimizer steps each replica took), runs_total the dispatches (issue 38: a fit of 69
    steps counted +4)."""
    with mirrored2.scope():
        model = ld.models.Sequential([ld.layers.Dense(4, input_shape=(3,))], seed=0)
        model.compile(loss="mse", optimizer="sgd")
    x = np.random.default_rng(0).normal(size=(320, 3)).astype(np.float32)
    y = np.zeros((320, 4), np.float32)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)  # warm
    where = ports(mirrored2.client)
    before = {a: scrape(p) for a, p in where.items()}
    model.fit(x, y, batch_size=32, epochs=2, verbose=0)  # 20 optimizer steps
    data = mirrored2.experimental_distribute_dataset(ld.batches((x, y), 64))
    iterator = iter(data)
    mirrored2.run(lambda bx, by: float(bx.sum()), args=next(iterator))  # 1 step, 1 run
    grew = 0
    for address, port in where.items():
        after = scrape(port)
        if ("labdist_steps_total", ()) not in after:
            continue
        grew += 1
        steps = after[("labdist_steps_total", ())] - before[address][("labdist_steps_total", ())]
        runs = after[("labdist_runs_total", ())] - before[address][("labdist_runs_total", ())]
        assert steps == 21, (steps, runs)
        assert 1 < runs < 21  # fit sends its epochs in few dispatches
    assert grew == 2


@pytest.mark.timeout(180)
def test_parameter_server_metrics_grow_with_updates():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=3, threads_per_worker=2, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        s = ld.ParameterServerStrategy(client, num_ps=1, num_workers=2, mode="async")
        try:
            coordinator = ld.ClusterCoordinator(s)
            with s.scope():
                v = ld.Variable(np.zeros(8))

            def read_then_push():  # a push quoting its read: one staleness each
                v.assign_add(np.asarray(v.read_value()) * 0 + 1)

            where = ports(client)
            coordinator.schedule(read_then_push)
            coordinator.join()
            before = {a: scrape(p) for a, p in where.items()}
            for _ in range(10):
                coordinator.schedule(read_then_push)
            coordinator.join()
            after = {a: scrape(p) for a, p in where.items()}
        finally:
            s.close()
    ps = [a for a in after if ("labdist_ps_updates_total", ()) in after[a]]
    assert len(ps) == 1
    a, b = before[ps[0]], after[ps[0]]
    assert b[("labdist_ps_updates_total", ())] - a[("labdist_ps_updates_total", ())] == 10
    assert b[("labdist_ps_staleness_count", ())] - a[("labdist_ps_staleness_count", ())] == 10
    assert b[("labdist_ps_reads_total", ())] - a[("labdist_ps_reads_total", ())] >= 10
    for name in ("labdist_ps_torn_reads_total", "labdist_ps_lost_updates_total",
                 "labdist_ps_reads_total"):
        assert b[(name, ())] >= a[(name, ())]
    workers = [w for w in after if w not in ps]
    steps = sum(after[w][("labdist_steps_total", ())] - before[w][("labdist_steps_total", ())]
                for w in workers)
    assert steps == 10
