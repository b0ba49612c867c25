"""A cluster the user brings keeps a replica's step memory as the embedded one does. Dask's
nanny starts workers with MALLOC_TRIM_THRESHOLD_=64 KiB: glibc then hands a freed 16 MiB
temporary straight back to the kernel, and the next step page-faults it in again. A replica
sets glibc's thresholds itself when it starts (labdist/replica/memory.py), so the freed array
stays in the heap for the next step."""

from __future__ import annotations

import ctypes
import os

import numpy as np
from distributed import Client, LocalCluster

import labdist as ld
from labdist.replica import memory


def heap_kept_after_a_16_mib_temporary() -> int:
    """MiB glibc keeps free in this process's heaps right after a 16 MiB array is freed."""

    class MallInfo2(ctypes.Structure):  # glibc's struct mallinfo2 (2.33 and later)
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    a = np.ones(4 * 1024 * 1024, np.float32)
    del a
    return int(libc.mallinfo2().fordblks >> 20)


def kept_by_replicas(strategy) -> list[int]:
    """Each replica's `heap_kept_after_a_16_mib_temporary`, the strategy closed after."""
    try:
        return [int(k) for k in strategy.experimental_local_results(
            strategy.run(heap_kept_after_a_16_mib_temporary))]
    finally:
        strategy.close()


def test_replicas_on_a_users_local_cluster_keep_their_step_memory(monkeypatch):
    # a user's own process: none of the thresholds an embedded cluster's nanny left in this
    # (the test) process's environment, so the workers get Dask's own 64 KiB
    for name in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_"):
        monkeypatch.delenv(name, raising=False)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        plain = client.run(heap_kept_after_a_16_mib_temporary)  # the nanny's setting
        assert all(kept < 16 for kept in plain.values()), plain
        kept = kept_by_replicas(ld.MirroredStrategy(cluster=client))
    assert all(k >= 16 for k in kept), kept


def test_the_embedded_cluster_keeps_step_memory_and_leaves_the_drivers_environment(
        monkeypatch):
    """The embedded cluster's replicas keep their step memory too, set in each replica (not
    through the nanny's environment, which Dask writes into the driver's own os.environ,
    where a LocalCluster the user starts later would inherit it)."""
    for name in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_"):
        monkeypatch.delenv(name, raising=False)
    kept = kept_by_replicas(ld.MirroredStrategy(num_replicas=2))
    assert all(k >= 16 for k in kept), kept

    assert os.environ.get("MALLOC_TRIM_THRESHOLD_") != str(memory.TRIM)
    assert os.environ.get("MALLOC_MMAP_THRESHOLD_") is None
