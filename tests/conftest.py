"""Shared strategies: real LocalClusters with worker processes, started once per session."""

from __future__ import annotations

import warnings

import pytest
from clusters import ExternalCluster, dask_cli_cluster

import labdist as ld

_STRATEGIES: dict[str, ld.Strategy] = {}


def make_strategy(kind: str) -> ld.Strategy:
    """'mirrored-N' (N worker processes), with '-strict' (the cupy-like double) or '-tcp' (no
    shared memory: large collectives over Dask comms); or 'one-device'."""
    if kind not in _STRATEGIES:
        if kind == "one-device":
            _STRATEGIES[kind] = ld.OneDeviceStrategy(device="cpu")
        else:
            parts = kind.split("-")
            device = "strict" if "strict" in parts else "cpu"
            transport = "tcp" if "tcp" in parts else "auto"
            _STRATEGIES[kind] = ld.MirroredStrategy(num_replicas=int(parts[1]), device=device,
                                                    transport=transport, collective_timeout=20)
    return _STRATEGIES[kind]


@pytest.fixture(scope="session", autouse=True)
def _close_strategies():
    yield
    for s in _STRATEGIES.values():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            s.close()
    _STRATEGIES.clear()


@pytest.fixture(params=["mirrored-2", "mirrored-3", "mirrored-2-strict", "mirrored-3-tcp"])
def strategy(request) -> ld.Strategy:
    """Every multi-replica strategy the semantics must hold on (real worker processes), over
    shared memory and over Dask comms."""
    return make_strategy(request.param)


@pytest.fixture
def mirrored2() -> ld.Strategy:
    return make_strategy("mirrored-2")


@pytest.fixture
def mirrored3() -> ld.Strategy:
    return make_strategy("mirrored-3")


@pytest.fixture(scope="module")
def external(tmp_path_factory) -> ExternalCluster:
    """A real `dask scheduler` and two `dask worker --nthreads 1` processes on 127.0.0.1, shared
    by one test module (start-ups are expensive on a 2-core machine)."""
    with dask_cli_cluster(tmp_path_factory.mktemp("dask-cli")) as cluster:
        yield cluster
