"""The NCCL double (labdist/devices/strict/nccl.py) and the NCCL transport over it, in one
process: ranks are threads (or, for a peer that dies, a child process), so every case runs in
well under a second. The same transport on real worker processes is
tests/collectives/test_nccl_cluster.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from labdist import aggregation
from labdist.collectives.transports.nccl import NcclTransport
from labdist.collectives.transports.protocol import Endpoint
from labdist.devices import get_backend
from labdist.devices.strict import cuda as strict_cuda
from labdist.devices.strict import nccl as strict_nccl
from labdist.devices.strict.array import host_transfers
from labdist.errors import CollectiveTimeoutError

xp = get_backend("strict").xp
nccl = xp.cuda.nccl
pytestmark = pytest.mark.timeout(60)


def ranks(world: int, fn, uid=None) -> list:
    """Run fn(comm, rank) on `world` threads joined to one communicator; results (or errors)."""
    uid = uid or nccl.get_unique_id()
    out: list = [None] * world

    def one(r):
        try:
            comm = nccl.NcclCommunicator(world, uid, r)
            try:
                out[r] = fn(comm, r)
            finally:
                comm.abort()
        except BaseException as e:
            out[r] = e
    threads = [threading.Thread(target=one, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def run(comm, call, *args) -> None:
    stream = xp.cuda.Stream()  # ranks as threads: one stream each (one null stream per process)
    getattr(comm, call)(*args, stream.ptr)
    stream.synchronize()


NP_TO_NCCL = {np.int8: "NCCL_INT8", np.uint8: "NCCL_UINT8", np.int32: "NCCL_INT32",
              np.uint32: "NCCL_UINT32", np.int64: "NCCL_INT64", np.uint64: "NCCL_UINT64",
              np.float16: "NCCL_FLOAT16", np.float32: "NCCL_FLOAT32", np.float64: "NCCL_FLOAT64"}
FOLDS = {"NCCL_SUM": np.sum, "NCCL_PROD": np.prod, "NCCL_MAX": np.max, "NCCL_MIN": np.min}


@pytest.mark.parametrize("op", [*FOLDS, "NCCL_AVG"])
def test_all_reduce_every_op_and_dtype_as_nccl(op):
    """Three ranks, every NCCL dtype: each element folds the ranks' values in rank order."""
    def step(comm, r):
        got = {}
        for dtype, name in NP_TO_NCCL.items():
            a = xp.asarray((np.arange(6) % 3 + r + 1).astype(dtype))
            run(comm, "allReduce", a.data.ptr, a.data.ptr, a.size, getattr(nccl, name),
                getattr(nccl, op))
            got[dtype] = a.get()
        return got
    results = ranks(3, step)
    for dtype in NP_TO_NCCL:
        parts = np.stack([(np.arange(6) % 3 + r + 1).astype(dtype) for r in range(3)])
        want = (parts.sum(axis=0, dtype=dtype) // 3 if np.dtype(dtype).kind in "iu" else
                parts.sum(axis=0, dtype=dtype) / 3) if op == "NCCL_AVG" else \
            FOLDS[op](parts, axis=0).astype(dtype)
        for r in range(3):
            got = results[r][dtype]
            assert got.dtype == dtype
            np.testing.assert_array_equal(got, want.astype(dtype), err_msg=f"{dtype} rank {r}")


def test_broadcast_all_gather_and_reduce_scatter():
    def step(comm, r):
        b = xp.asarray(np.full(4, r + 1.0))
        run(comm, "bcast", b.data.ptr, 4, nccl.NCCL_FLOAT64, 1)
        send, gathered = xp.asarray(np.full(2, r, np.int32)), xp.zeros(6, dtype=np.int32)
        run(comm, "allGather", send.data.ptr, gathered.data.ptr, 2, nccl.NCCL_INT32)
        full, mine = xp.asarray(np.arange(6.0) * (r + 1)), xp.zeros(2)
        run(comm, "reduceScatter", full.data.ptr, mine.data.ptr, 2, nccl.NCCL_FLOAT64,
            nccl.NCCL_SUM)
        nccl.groupStart()
        nccl.groupEnd()
        return b.get(), gathered.get(), mine.get()
    results = ranks(3, step)
    for r, (b, gathered, mine) in enumerate(results):
        assert list(b) == [2.0] * 4
        assert list(gathered) == [0, 0, 1, 1, 2, 2]
        assert list(mine) == list(np.arange(6.0)[2 * r:2 * r + 2] * 6)
    with pytest.raises(nccl.NcclError, match="ncclInvalidUsage"):
        nccl.groupEnd()


def test_a_collective_a_peer_never_makes_waits_until_aborted():
    """NCCL has no timeout: the stream stays busy, no async error, until abort() ends it;
    after that the communicator refuses every call."""
    uid = nccl.get_unique_id()
    seen: dict = {}

    def step(comm, r):
        if r == 1:
            time.sleep(0.6)  # joined, but never makes the collective
            return None
        a = xp.ones(3)
        stream = xp.cuda.Stream()
        comm.allReduce(a.data.ptr, a.data.ptr, 3, nccl.NCCL_FLOAT64, nccl.NCCL_SUM, stream.ptr)
        time.sleep(0.3)
        seen["done before"] = stream.done
        comm.check_async_error()  # nothing to report: a late peer is not an error
        comm.abort()
        seen["done after"] = stream.done
        with pytest.raises(nccl.NcclError, match="ncclInvalidArgument"):
            comm.allReduce(a.data.ptr, a.data.ptr, 3, nccl.NCCL_FLOAT64, nccl.NCCL_SUM, 0)
        return a.get()
    out = ranks(2, step, uid)
    assert seen == {"done before": False, "done after": True}
    assert list(out[0]) == [1.0] * 3  # unfinished: the buffer is as it was


def test_calls_that_differ_never_complete_and_report_invalid_usage():
    def step(comm, r):
        a = xp.ones(4 + r, dtype=np.float32)  # different counts: NCCL would hang or read junk
        stream = xp.cuda.Stream()
        comm.allReduce(a.data.ptr, a.data.ptr, a.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM,
                       stream.ptr)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                comm.check_async_error()
            except nccl.NcclError as e:
                return stream.done, e
            time.sleep(0.01)
        return stream.done, None
    for done, error in ranks(2, step):
        assert not done and error.status == nccl.ncclInvalidUsage
        assert "count=4" in str(error) and "count=5" in str(error)


PEER = """
import sys, time
from labdist.devices.strict import nccl as strict_nccl
uid = tuple(int(x) for x in sys.argv[1].split(","))
comm = strict_nccl.NcclCommunicator(2, uid, 1)
print("joined", flush=True)
time.sleep(60)
"""


def test_a_peer_killed_mid_collective_shows_as_a_remote_error():
    """The peer's process joins, then is SIGKILLed while this rank waits in allReduce: the
    collective never completes, and check_async_error() raises ncclRemoteError."""
    uid = nccl.get_unique_id()
    peer = subprocess.Popen([sys.executable, "-c", PEER, ",".join(map(str, uid))],
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        comm = nccl.NcclCommunicator(2, uid, 0)
        assert peer.stdout.readline().strip() == "joined"
        a = xp.ones(1000)
        stream = xp.cuda.Stream()
        comm.allReduce(a.data.ptr, a.data.ptr, 1000, nccl.NCCL_FLOAT64, nccl.NCCL_SUM,
                       stream.ptr)
        os.kill(peer.pid, signal.SIGKILL)
        peer.wait(10)
        deadline = time.monotonic() + 5
        with pytest.raises(nccl.NcclError, match="ncclRemoteError") as info:
            while time.monotonic() < deadline:
                comm.check_async_error()
                time.sleep(0.01)
        assert info.value.status == nccl.ncclRemoteError
        assert not stream.done
        comm.abort()
        assert stream.done
    finally:
        peer.kill()
        peer.wait(10)


def test_the_bootstrap_thread_lives_until_every_rank_joined():
    def bootstraps():
        return [t for t in threading.enumerate() if t.name == strict_nccl.BOOTSTRAP_THREAD]
    before = len(bootstraps())
    uid = nccl.get_unique_id()
    assert len(bootstraps()) == before + 1
    ranks(2, lambda comm, r: comm.rank_id(), uid)
    deadline = time.monotonic() + 5
    while len(bootstraps()) > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(bootstraps()) == before


def test_device_pointers_must_lie_in_live_arrays():
    a = xp.zeros(8, dtype=np.float32)
    ptr = a.data.ptr
    view = strict_cuda.buffer_at(ptr + 8, 2, np.float32)
    view[:] = 7
    assert list(a.get()) == [0, 0, 7, 7, 0, 0, 0, 0]
    with pytest.raises(strict_cuda.CUDARuntimeError, match="cudaErrorIllegalAddress"):
        strict_cuda.buffer_at(ptr, 9, np.float32)  # one element too many
    with pytest.raises(strict_cuda.CUDARuntimeError, match="cudaErrorIllegalAddress"):
        strict_cuda.buffer_at(np.zeros(4).ctypes.data, 1, np.float64)  # host memory


def test_the_cuda_namespace_follows_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert xp.cuda.runtime.getDeviceCount() == 2
    fifth = xp.cuda.Device(1).pci_bus_id
    assert xp.cuda.Device().pci_bus_id != fifth
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")  # a worker pinned to GPU 5 sees it as 0
    assert xp.cuda.Device(0).pci_bus_id == fifth
    with pytest.raises(strict_cuda.CUDARuntimeError, match="invalid device"):
        xp.cuda.Device(1)
    event = xp.cuda.Event()
    event.record()
    assert event.done and xp.cuda.get_current_stream().ptr == 0


def test_device_arrays_refuse_host_arrays_with_cupys_type_error():
    d = xp.zeros((2, 3))
    with pytest.raises(TypeError):
        d[...] = np.ones((2, 3))
    with pytest.raises(TypeError):
        d[0] = np.ones(3)
    with pytest.raises(TypeError):
        np.ones((2, 3))[...] = d
    with pytest.raises(ValueError):  # a shape that does not broadcast: ValueError in cupy too
        d[0] = xp.ones(4)
    before = host_transfers()
    float(d[0, 0])
    d.get()
    assert host_transfers() == before + 2


# -- the transport over the double ---------------------------------------------------------------
def transports(world: int, timeout: float) -> list[NcclTransport]:
    peers = [f"w{r}" for r in range(world)]
    made = [NcclTransport(Endpoint("g", r, peers, timeout, backend=get_backend("strict")))
            for r in range(world)]
    probes = [{"host": "h", "gpu": str(r)} for r in range(world)]
    uid = made[0].bootstrap(probes)
    joined = [None] * world
    threads = [threading.Thread(target=lambda r=r: joined.__setitem__(
        r, made[r].connect(probes, uid))) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert joined == [True] * world
    return made


def test_the_transport_refuses_replicas_that_share_a_gpu():
    made = [NcclTransport(Endpoint("g", r, ["a", "b", "c"], 5.0, backend=get_backend("strict")))
            for r in range(3)]
    probes = [{"host": "h", "gpu": "0"}, {"host": "h", "gpu": "1"}, {"host": "h", "gpu": "0"}]
    assert made[0].bootstrap(probes) is None  # no id, no bootstrap thread
    assert [t.connect(probes, None) for t in made] == [False, True, False]
    assert all(t.comm is None for t in made)


def test_a_transport_wait_is_bounded_aborts_and_leaves_the_group_broken():
    t0, t1 = transports(2, timeout=0.5)
    agg = aggregation.of("SUM")
    start = time.monotonic()
    with pytest.raises(CollectiveTimeoutError, match=r"replica 0 for replica\(s\) \[1\]"):
        t0.all_reduce(xp, [xp.ones(3)], agg, seq=1, what="test", states=[None, None])
    assert 0.4 < time.monotonic() - start < 5
    assert t0.broken and t0.comm is None
    # the next collective's signature exchange carries the news: every rank refuses at once
    with pytest.raises(RuntimeError, match="replica 0: collective #1 timed out.*close"):
        t1.all_reduce(xp, [xp.ones(3)], agg, seq=2, what="test", states=[t0.broken, None])
    assert t1.broken and t1.comm is None
    t0.close()
    t1.close()


def test_close_during_a_collective_aborts_it_instead_of_waiting():
    t0, t1 = transports(2, timeout=30.0)
    failed: list = []

    def waiting():
        try:
            t0.all_reduce(xp, [xp.ones(3)], aggregation.of("SUM"), seq=1, what="test",
                          states=[None, None])
        except Exception as e:
            failed.append(e)
    thread = threading.Thread(target=waiting)
    thread.start()
    time.sleep(0.3)
    start = time.monotonic()
    t0.close()  # destroy would wait for the collective rank 1 never makes
    thread.join(5)
    assert not thread.is_alive() and time.monotonic() - start < 5
    assert "aborted during collective #1" in str(failed[0])
    t1.close()
