"""The collectives' buffers and wake-ups: intermediate sums in buffers reused step after step
(not fresh arrays), the segmented paths giving exactly what the per-array path gives for every
mode and dtype, and waits that sleep in the kernel instead of spinning."""

from __future__ import annotations

import os
import re
import secrets
import sys
import threading
import time

import numpy as np
import pytest

import labdist as ld
from labdist import aggregation
from labdist.collectives.algorithms import DIRECT_MAX_BYTES, all_reduce, reduce_scatter_apply
from labdist.collectives.transports import shm
from labdist.collectives.transports.loopback import LoopbackHub
from labdist.collectives.transports.protocol import Endpoint
from labdist.devices import NUMPY
from labdist.enums import ReduceOp, VariableAggregation
from labdist.shm import doorbell

LARGE = DIRECT_MAX_BYTES // 4 + 1001  # float32 elements: segmented
DTYPES = [np.float32, np.float64, np.int32, np.int64, np.float16]


def _mixed(rank: int, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(rank)
    return [(rng.standard_normal(n if i == 0 else 7 + i) * 50).astype(d)
            for i, d in enumerate(DTYPES)]


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.MEAN, VariableAggregation.SUM,
                                VariableAggregation.MEAN,
                                VariableAggregation.ONLY_FIRST_REPLICA])
def test_the_segmented_path_gives_the_per_array_results_for_mixed_dtypes(op):
    """One all-reduce of many arrays (mixed dtypes, large: reduce-scatter + all-gather) is,
    bit for bit, what reducing each array alone (small ones: the direct path) gives."""
    hub = LoopbackHub(3)

    def step(comm):
        arrays = _mixed(comm.rank, LARGE)
        together = all_reduce(comm, 1, "all", arrays, op, NUMPY)
        alone = [all_reduce(comm, 2 + i, "one", [a], op, NUMPY)[0]
                 for i, a in enumerate(arrays)]
        return together, alone

    for together, alone in hub.run(step):
        for a, b in zip(together, alone, strict=True):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    expected = [aggregation.of(op).combine([_mixed(r, LARGE)[i] for r in range(3)])
                for i in range(len(DTYPES))]
    for a, e in zip(hub.run(step)[0][0], expected, strict=True):
        assert a.dtype == e.dtype and a.tobytes() == e.tobytes()


def test_reduce_scatter_apply_sums_into_one_buffer_reused_every_step():
    """The summed segment handed to `apply` lives in the communicator's scratch buffer: the
    same memory every step (allocated and faulted in once), and the sums stay exact."""
    hub = LoopbackHub(2)

    def steps(comm):
        seen, weights = [], [np.zeros(LARGE, np.float32), np.zeros(10, np.float64)]
        for step in range(1, 4):
            grads = [np.full(LARGE, comm.rank + step, np.float32),
                     np.full(10, 0.5 * (comm.rank + 1), np.float64)]

            def apply(i, lo, hi, summed):
                seen.append((i, _address(summed), summed.dtype))
                weights[i][lo:hi] += summed
            assert reduce_scatter_apply(comm, step, "grads", grads, weights, apply, NUMPY)
        scratch = sorted((d.str, b.size) for d, b in comm._scratch.items())
        return seen, weights, scratch, comm.rank

    for seen, weights, scratch, rank in hub.run(steps):
        per_step = len(seen) // 3
        assert seen[:per_step] == seen[per_step:2 * per_step] == seen[2 * per_step:]
        assert weights[0].tolist() == [float(2 + 4 + 6 + 3)] * LARGE  # sum of (r + step)
        assert weights[1].tolist() == [4.5] * 10
        mine = LARGE * (rank + 1) // 2 - LARGE * rank // 2  # this rank's segment, no more
        assert scratch == sorted([(np.dtype(np.float32).str, mine),
                                  (np.dtype(np.float64).str, 5)])


def _apply_twice(n: int):
    def fn():
        ctx = ld.get_replica_context()
        grads = [ctx.xp.full(n, ctx.replica_id_in_sync_group + 1.0, dtype=np.float32)]
        target = [ctx.xp.zeros(n, dtype=np.float32)]
        where = []

        def apply(i, lo, hi, summed):
            where.append(_address(summed))
            target[i][lo:hi] -= summed
        for _ in range(2):
            ctx.reduce_apply("grads", grads, target, apply)
        return np.array([*where, float(target[0].min()), float(target[0].max())])
    return fn


@pytest.mark.timeout(120)
def test_fit_gradients_reuse_the_replicas_buffers_across_steps():
    """On worker processes over shared memory: two steps' sums land in the same buffer, and
    the weights are updated exactly (-3 per step on every element, on every replica)."""
    from conftest import make_strategy

    s = make_strategy("mirrored-2")
    first = s.experimental_local_results(s.run(_apply_twice(LARGE)))
    again = s.experimental_local_results(s.run(_apply_twice(LARGE)))
    for a, b in zip(first, again, strict=True):
        assert a[0] == a[1] == b[0] == b[1]
        assert a[2:].tolist() == b[2:].tolist() == [-6.0, -6.0]


class _QuietMailbox:
    _messages: dict = {}

    def _raise_if_gone(self, *args) -> None:
        pass


def _pair(group: str) -> list[shm.ShmTransport]:
    ranks = [shm.ShmTransport(Endpoint(group, r, ["a", "b"], 10.0, mailbox=_QuietMailbox()))
             for r in range(2)]
    probes = [t.probe() for t in ranks]
    assert all(t.connect(probes) for t in ranks)
    return ranks


def _exchange_late(ranks: list[shm.ShmTransport], late_s: float) -> tuple[list, float]:
    """Rank 1 publishes `late_s` after rank 0 starts waiting; (results, rank 0's CPU s)."""
    got: dict = {}

    def run(rank: int) -> None:
        t = ranks[rank]
        t.start_run(1)
        if rank == 1:
            time.sleep(late_s)
        cpu = time.thread_time()
        out = t.exchange(1, 0, None, np.full(5, rank + 1.0), "x", False)
        got[rank] = ([float(p[0]) for _, p in out], time.thread_time() - cpu)
    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    return [got[r][0] for r in range(2)], got[0][1]


@pytest.mark.timeout(60)
def test_a_waiting_replica_sleeps_until_its_peer_rings():
    """Waiting half a second for a late peer costs the waiter almost no CPU (it blocks on its
    FIFO, which the peer's publish wakes), and the FIFOs go with the transport."""
    group = secrets.token_hex(8)
    ranks = _pair(group)
    try:
        assert all(t._bell.path and os.path.exists(t._bell.path) for t in ranks)
        values, cpu = _exchange_late(ranks, 0.5)
        assert values == [[1.0, 2.0], [1.0, 2.0]]
        assert cpu < 0.05, f"the waiter used {cpu:.3f} s of CPU in a 0.5 s wait"
    finally:
        for t in ranks:
            t.close()
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"labdist-{group}")]


@pytest.mark.timeout(60)
def test_without_fifos_waits_poll_the_stamp(monkeypatch):
    """Where no FIFO can be made, exchanges still complete (waits sleep-poll the stamp)."""
    def refuse(*args, **kwargs):
        raise PermissionError("no FIFOs here")
    monkeypatch.setattr(doorbell.os, "mkfifo", refuse)
    ranks = _pair(secrets.token_hex(8))
    try:
        assert all(t._bell.path is None for t in ranks)
        values, _ = _exchange_late(ranks, 0.05)
        assert values == [[1.0, 2.0], [1.0, 2.0]]
    finally:
        for t in ranks:
            t.close()


def _waits_that_slept(monkeypatch, spin_us: str, late_s: float, cores: int | None = None
                      ) -> tuple[int, float]:
    """How often rank 0 slept in poll() waiting for a peer `late_s` late, and its CPU s."""
    monkeypatch.setenv(doorbell.SPIN_ENV, spin_us)
    if cores is not None:
        monkeypatch.setattr(shm, "_cores", lambda: cores)
    slept = []
    real_wait = doorbell.Doorbell.wait

    def wait(self, pause):
        slept.append(threading.get_ident())
        return real_wait(self, pause)
    monkeypatch.setattr(doorbell.Doorbell, "wait", wait)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)  # both ranks are threads here: let the late one take the GIL
    ranks = _pair(secrets.token_hex(8))
    try:
        values, cpu = _exchange_late(ranks, late_s)
        assert values == [[1.0, 2.0], [1.0, 2.0]]
    finally:
        sys.setswitchinterval(old)
        for t in ranks:
            t.close()
    return len(slept), cpu


@pytest.mark.timeout(60)
def test_a_peer_a_moment_late_is_awaited_spinning_not_sleeping(monkeypatch):
    """With no more ranks than cores a waiter spins a little before it sleeps, so a peer that
    comes within the spin costs no sleep and wake-up; with spinning off it sleeps."""
    slept, _ = _waits_that_slept(monkeypatch, "10000", 0.001, cores=2)
    assert slept == 0
    slept, _ = _waits_that_slept(monkeypatch, "0", 0.002, cores=2)
    assert slept >= 1


@pytest.mark.timeout(60)
def test_ranks_outnumbering_cores_never_spin(monkeypatch):
    """A spinning rank would take the core the awaited one needs: with 2 ranks and 1 core the
    waiter sleeps at once, even for a peer that comes well within the spin."""
    slept, _ = _waits_that_slept(monkeypatch, "10000", 0.002, cores=1)
    assert slept >= 1


@pytest.mark.parametrize("value", ["abc", "-1", "10001", "1.5"])
def test_a_bad_spin_setting_is_refused_naming_it(monkeypatch, value):
    monkeypatch.setenv(doorbell.SPIN_ENV, value)
    with pytest.raises(ValueError, match=rf"LABDIST_SPIN_US='{re.escape(value)}' is not "
                                         r"allowed; use an integer from 0"):
        doorbell.spin_seconds()
    with pytest.raises(ValueError, match="LABDIST_SPIN_US"):  # before any worker starts
        ld.MirroredStrategy(num_replicas=2)


def test_the_spin_setting_defaults_and_turns_off(monkeypatch):
    monkeypatch.delenv(doorbell.SPIN_ENV, raising=False)
    assert doorbell.spin_seconds() == doorbell.SPIN_US * 1e-6
    monkeypatch.setenv(doorbell.SPIN_ENV, " 0 ")
    assert doorbell.spin_seconds() == 0.0


def _blas_threads() -> dict:
    env = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                          "MKL_NUM_THREADS")}
    try:
        import threadpoolctl
    except ImportError:
        return env
    return {**env, "blas": {p["num_threads"] for p in threadpoolctl.threadpool_info()
                            if p["user_api"] == "blas"}}


@pytest.mark.timeout(120)
def test_the_embedded_clusters_replicas_use_one_blas_thread_each():
    """One worker process per replica: BLAS threads on top would oversubscribe the cores
    (2 replicas x 2 threads on 2 cores). Dask's nanny sets the thread variables to 1; the
    embedded cluster keeps them."""
    from conftest import make_strategy

    for got in make_strategy("mirrored-2").client.run(_blas_threads).values():
        assert got.pop("blas", {1}) == {1}
        assert got == dict.fromkeys(got, "1")


def _spin_of_each_replica():
    from labdist.replica.replica_context import current_replica

    return current_replica().comm.host.spin  # what its collectives and step thread use


@pytest.mark.timeout(180)
@pytest.mark.parametrize("replicas", [2, 3])
def test_a_groups_replicas_spin_only_where_they_do_not_outnumber_the_cores(replicas, request):
    strategy = request.getfixturevalue(f"mirrored{replicas}")
    cores = len(os.sched_getaffinity(0))
    expected = doorbell.SPIN_US * 1e-6 if replicas <= cores else 0.0
    got = strategy.experimental_local_results(strategy.run(_spin_of_each_replica))
    assert list(got) == [expected] * replicas
