"""Clusters for tests: a LocalCluster for tests that place parameter servers and workers
themselves or kill them, and the real `dask scheduler` / `dask worker` command line."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from distributed import Client

from labdist.cluster import start_local_cluster


@contextlib.contextmanager
def local_client(n_workers: int) -> Iterator[Client]:
    """A Client on a LocalCluster of its own (`n_workers` worker processes), for tests that
    place parameter servers and workers themselves or kill them; both closed after."""
    cluster = start_local_cluster(n_workers)
    client = Client(cluster, direct_to_workers=True, set_as_default=False)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


DASK = str(Path(sys.executable).parent / "dask")
START_DEADLINE_S = 90.0


# -- the command-line cluster: helpers ---------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(procs: list[subprocess.Popen]) -> None:
    """terminate, then kill whatever is still there after a grace period; always reap."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.terminate()
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait(timeout=15)


def log_tail(paths: list[Path], n: int = 2000) -> str:
    out = []
    for path in paths:
        with contextlib.suppress(OSError):
            out.append(f"--- {path.name} ---\n{path.read_text(errors='replace')[-n:]}")
    return "\n".join(out)


def workers_of(address: str, timeout: float = 10) -> list[str]:
    with Client(address, timeout=timeout, set_as_default=False) as c:
        return sorted(c.scheduler_info(n_workers=-1)["workers"])


# -- the command-line cluster -----------------------------------------------------------------
@dataclass
class ExternalCluster:
    address: str
    workers: list[str]
    procs: list[subprocess.Popen]

    @property
    def worker_procs(self) -> list[subprocess.Popen]:
        return self.procs[1:]

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)


@contextlib.contextmanager
def dask_cli_cluster(logs: Path) -> Iterator[ExternalCluster]:
    """A real `dask scheduler` and two `dask worker --nthreads 1` processes on 127.0.0.1, their
    logs in `logs`; stopped (workers first) when the block ends. The `external` fixture."""
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    commands = [
        # --idle-timeout: a scheduler orphaned by a killed test run goes away on its own.
        [DASK, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard",
         "--idle-timeout", "600s"],
        *[[DASK, "worker", address, "--host", "127.0.0.1", "--nthreads", "1",
           "--nworkers", "1", "--no-dashboard", "--death-timeout", "60s"]] * 2,
    ]
    procs: list[subprocess.Popen] = []
    log_paths: list[Path] = []
    try:
        for i, cmd in enumerate(commands):
            log_paths.append(logs / f"{cmd[1]}-{i}.log")
            with open(log_paths[-1], "wb") as log:
                procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                              stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + START_DEADLINE_S
        workers: list[str] = []
        while True:
            dead = [p.args[1] for p in procs if p.poll() is not None]
            if dead:
                pytest.fail(f"`dask {dead[0]}` exited at start-up\n{log_tail(log_paths)}")
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"the dask CLI cluster at {address} did not show 2 workers within "
                            f"{START_DEADLINE_S:g} s\n{log_tail(log_paths)}")
            try:
                with Client(address, timeout=min(5, left), set_as_default=False) as c:
                    c.wait_for_workers(2, timeout=max(1, deadline - time.monotonic()))
                    workers = sorted(c.scheduler_info(n_workers=-1)["workers"])
                break
            except (OSError, TimeoutError):
                time.sleep(0.2)
        yield ExternalCluster(address, workers, procs)
    finally:
        stop(procs[1:])  # workers first, so they do not wait for a vanished scheduler
        stop(procs[:1])
    assert all(p.returncode is not None for p in procs)
