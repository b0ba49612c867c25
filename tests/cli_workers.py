"""A `dask scheduler` whose `dask worker` processes a test starts, kills and adds one by one
(quorum training's tests: a lost worker is a real SIGKILL of a real process)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from clusters import DASK, START_DEADLINE_S, free_port, log_tail, stop
from distributed import Client


class CLICluster:
    """The scheduler and its workers (no nanny: killing a worker's process kills the worker,
    and nothing restarts it)."""

    def __init__(self, logs: Path):
        self.logs = logs
        self.port = free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen] = []
        self._log_paths: list[Path] = []
        self._spawn([DASK, "scheduler", "--host", "127.0.0.1", "--port", str(self.port),
                     "--no-dashboard", "--idle-timeout", "600s"])
        self.client = self._wait_client()

    def _spawn(self, cmd: list[str]) -> subprocess.Popen:
        self._log_paths.append(self.logs / f"{cmd[1]}-{len(self.procs)}.log")
        env = {**os.environ, **dict.fromkeys(  # one BLAS thread a process, as a nanny sets
            ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"), "1")}
        with open(self._log_paths[-1], "wb") as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, env=env)
        self.procs.append(proc)
        return proc

    def _wait_client(self) -> Client:
        deadline = time.monotonic() + START_DEADLINE_S
        while True:
            try:
                return Client(self.address, timeout=5, set_as_default=False,
                              direct_to_workers=True)
            except (OSError, TimeoutError):
                if time.monotonic() > deadline:
                    pytest.fail(f"no scheduler at {self.address}\n{log_tail(self._log_paths)}")
                time.sleep(0.2)

    def workers(self) -> list[str]:
        return sorted(self.client.scheduler_info(n_workers=-1)["workers"])

    def add_workers(self, n: int = 1, wait: bool = True) -> list[subprocess.Popen]:
        """Start `n` more `dask worker --no-nanny` processes; with `wait`, until listed."""
        before = len(self.workers())
        procs = [self._spawn([DASK, "worker", self.address, "--host", "127.0.0.1",
                              "--nthreads", "1", "--no-nanny", "--no-dashboard",
                              "--death-timeout", "60s"]) for _ in range(n)]
        if wait:
            self.wait_for(before + n)
        return procs

    def wait_for(self, n: int) -> None:
        deadline = time.monotonic() + START_DEADLINE_S
        while len(self.workers()) < n:
            if time.monotonic() > deadline:
                pytest.fail(f"{n} workers did not come\n{log_tail(self._log_paths)}")
            time.sleep(0.05)

    def pid_of(self, address: str) -> int:
        """The pid of the worker process at `address`."""
        return self.client.run(os.getpid, workers=[address])[address]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()
        stop(self.procs[1:])
        stop(self.procs[:1])


@contextlib.contextmanager
def cli_cluster(logs: Path, n_workers: int) -> Iterator[CLICluster]:
    cluster = CLICluster(logs)
    try:
        cluster.add_workers(n_workers)
        yield cluster
    finally:
        cluster.close()


def kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
