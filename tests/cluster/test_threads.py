"""BLAS threads per replica: the rule, its override, and what a real worker process runs."""

from __future__ import annotations

import pytest
from distributed import Client

from labdist.cluster import capacity, start_local_cluster, threads


def worker_blas_threads() -> tuple[int, str | None]:
    """In the worker: the BLAS pool's size numpy really uses, and the variable it started with."""
    import os

    import numpy  # noqa: F401  (loads the BLAS threadpoolctl reads)
    from threadpoolctl import threadpool_info

    blas = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
    return blas[0], os.environ.get("OPENBLAS_NUM_THREADS")


def threads_on_workers(n_workers: int) -> list[tuple[int, str | None]]:
    cluster = start_local_cluster(n_workers)
    try:
        with Client(cluster, set_as_default=False) as client:
            return list(client.run(worker_blas_threads).values())
    finally:
        cluster.close()


@pytest.mark.parametrize(("replicas", "cpus", "expected"),
                         [(1, 2, 2), (2, 2, 1), (8, 2, 1), (3, 16, 5), (2, 16, 8), (4, 1, 1)])
def test_the_cpus_are_split_among_the_replicas(monkeypatch, replicas, cpus, expected):
    monkeypatch.delenv(threads.ENV, raising=False)
    assert threads.blas_threads(replicas, cpus) == expected


def test_the_environment_variable_overrides_the_rule(monkeypatch):
    monkeypatch.setenv(threads.ENV, "3")
    assert threads.blas_threads(8, 2) == 3
    assert threads.spawn_environ(8)["OPENBLAS_NUM_THREADS"] == "3"
    assert "OPENBLAS_CORETYPE" not in threads.spawn_environ(8)


@pytest.mark.parametrize("bad", ["0", "-2", "two", "1.5"])
def test_a_bad_override_is_refused_before_any_worker_starts(monkeypatch, bad):
    monkeypatch.setenv(threads.ENV, bad)
    with pytest.raises(ValueError, match=rf"{threads.ENV}='{bad}' is not allowed.*>= 1"):
        start_local_cluster(1)


def test_a_lone_worker_gets_every_cpu_and_the_override_wins(monkeypatch):
    monkeypatch.delenv(threads.ENV, raising=False)
    n = capacity.cpus()
    assert threads_on_workers(1) == [(n, str(n))]
    monkeypatch.setenv(threads.ENV, "1")
    assert threads_on_workers(1) == [(1, "1")]


def test_replicas_do_not_oversubscribe_the_cores(monkeypatch):
    monkeypatch.delenv(threads.ENV, raising=False)
    expected = max(1, capacity.cpus() // 2)
    assert threads_on_workers(2) == [(expected, str(expected))] * 2
