"""The embedded cluster honours num_replicas and device: one worker per requested GPU, each
started with CUDA_VISIBLE_DEVICES naming its own, the dashboard on 127.0.0.1, and too many
replicas refused before anything starts. On CPU the GPU listing is faked at its boundary
(CUDA's GPUs as the cupy backend lists them); the cluster itself is real, and the test reads
what its workers got."""

from __future__ import annotations

import os
import time
from urllib.parse import urlparse

import pytest
from distributed import Client

import labdist as ld
from labdist.cluster import local
from labdist.devices import cupy_gpu

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(90)]


def fake_gpus(monkeypatch, listed: list[str]) -> None:
    monkeypatch.setattr(cupy_gpu, "cuda_gpus", lambda: list(listed))


def test_more_replicas_than_gpus_is_refused_up_front(monkeypatch):
    fake_gpus(monkeypatch, ["0", "1"])
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"num_replicas=3 but 2 GPU\(s\) are visible .*0, 1.*"
                                         r"at most 2 replicas, or pass device='cpu'"):
        ld.MirroredStrategy(3, device="gpu")
    assert time.monotonic() - start < 2  # no cluster was started to find out


def test_gpu_without_a_gpu_is_refused_up_front(monkeypatch):
    fake_gpus(monkeypatch, [])
    with pytest.raises(ValueError, match="device='gpu' was requested but no GPU is visible"):
        local.start_local_cluster(2, "gpu")


def test_each_worker_gets_its_own_gpu_without_dask_cuda(monkeypatch):
    """Two replicas asked for on a machine listing GPUs 4, 6 and 7: two workers, pinned to 4
    and 6 (not every visible GPU, not all on GPU 0), dashboard on localhost."""
    fake_gpus(monkeypatch, ["4", "6", "7"])
    cluster = local.start_local_cluster(2, "gpu")
    try:
        with Client(cluster, set_as_default=False) as client:
            client.wait_for_workers(2, timeout=60)
            pinned = client.run(lambda: os.environ.get("CUDA_VISIBLE_DEVICES"))
            assert sorted(pinned.values()) == ["4", "6"]
            assert urlparse(client.dashboard_link).hostname == "127.0.0.1"
    finally:
        cluster.close()


def test_host_replicas_are_not_pinned():
    cluster = local.start_local_cluster(2, "cpu")
    try:
        with Client(cluster, set_as_default=False) as client:
            client.wait_for_workers(2, timeout=60)
            seen = client.run(lambda: os.environ.get("CUDA_VISIBLE_DEVICES"))
            assert set(seen.values()) == {os.environ.get("CUDA_VISIBLE_DEVICES")}
            assert urlparse(client.dashboard_link).hostname == "127.0.0.1"
    finally:
        cluster.close()
