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


def close_shared_strategies(*kinds: str) -> None:
    """Close the strategies `make_strategy` shares (those of `kinds`, or all); the next call
    makes them anew. Idle, each worker process still costs a few % of a core."""
    for kind in kinds or list(_STRATEGIES):
        s = _STRATEGIES.pop(kind, None)
        if s is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                s.close()


@pytest.fixture(scope="session", autouse=True)
def _close_strategies():
    yield
    close_shared_strategies()


@pytest.fixture(scope="module")
def quiet_machine() -> None:
    """For modules that time what a user sees (■ answered, a chart drawn): the shared
    strategies' idle worker processes (ten, each a few % of a core) are closed first, so the
    machine is no busier than a user's."""
    close_shared_strategies()


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
