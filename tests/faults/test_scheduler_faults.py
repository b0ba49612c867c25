"""The scheduler's side of a strategy's life: a TLS address without credentials, a scheduler
killed under a running loop of steps, and a close that leaves nothing red in the log — with
real `dask scheduler` / `dask worker` processes."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from distributed import Client, Security

import labdist as ld

DASK = str(Path(sys.executable).parent / "dask")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("security", [None, Security()])
def test_a_tls_address_without_credentials_says_to_pass_security(security):
    """distributed raised a bare TypeError ("TLS expects a `ssl_context` argument...") and left
    a Client that timed out in its finalizer."""
    address = "tls://127.0.0.1:8786"
    t0 = time.monotonic()
    with pytest.raises(ld.ClusterConnectionError, match=r"'tls://127\.0\.0\.1:8786'.*security="):
        ld.MultiWorkerMirroredStrategy(cluster=address, security=security, connect_timeout=3)
    assert time.monotonic() - t0 < 3  # refused before any connection attempt


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _cli_cluster(tmp_path: Path, n_workers: int = 2):
    """A `dask scheduler` and `n_workers` `dask worker`s of this test's own (it kills them)."""
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    commands = [[DASK, "scheduler", "--host", "127.0.0.1", "--port", str(port),
                 "--no-dashboard", "--idle-timeout", "300s"]]
    commands += [[DASK, "worker", address, "--host", "127.0.0.1", "--nthreads", "1",
                  "--no-dashboard", "--death-timeout", "60s"]] * n_workers
    procs = []
    try:
        for i, cmd in enumerate(commands):
            with open(tmp_path / f"{cmd[1]}-{i}.log", "wb") as log:
                procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                              stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 60
        while True:
            try:
                with Client(address, timeout=5, set_as_default=False) as c:
                    c.wait_for_workers(n_workers, timeout=max(1, deadline - time.monotonic()))
                break
            except (OSError, TimeoutError):
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    raise
                time.sleep(0.2)
        yield address, procs
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait(timeout=15)


@pytest.mark.cluster
@pytest.mark.timeout(90)
def test_a_killed_scheduler_gives_a_clear_error_and_nothing_hangs(tmp_path):
    """SIGKILL the scheduler while a loop of steps runs: the workers close under the step, and
    the run failed with "RuntimeError: Event loop is closed" (or a ReplicaLostError saying the
    worker left). Now a ClusterConnectionError naming the scheduler, from every later call too,
    and close returns."""
    with _cli_cluster(tmp_path) as (address, procs):
        s = ld.MultiWorkerMirroredStrategy(cluster=address, collective_timeout=10,
                                           connect_timeout=20)
        closed = threading.Event()
        try:
            def step():
                time.sleep(0.02)
                return ld.get_replica_context().all_reduce("SUM", 1.0)
            s.run(step)
            killer = threading.Timer(0.5, procs[0].send_signal, (signal.SIGKILL,))
            killer.start()
            t0 = time.monotonic()
            with pytest.raises(ld.ClusterConnectionError, match=address) as caught:
                while time.monotonic() - t0 < 30:
                    s.run(step)
            killer.join()
            assert "scheduler" in str(caught.value)
            # the strategy is cleanly broken: every call says why, at once
            with pytest.raises(ld.ClusterConnectionError, match=address):
                s.run(step)
            with pytest.raises(ld.ClusterConnectionError, match=address), s.scope():
                ld.Variable(1.0)
        finally:
            threading.Thread(target=lambda: (s.close(), closed.set()), daemon=True).start()
            assert closed.wait(30), "strategy.close() hung after the scheduler was killed"
