"""Shared memory does not outlive its use: an outsized collective's areas are released once
normal traffic resumes, and a process that dies (`kill -9`, a notebook kernel shut down with
its embedded workers) leaves no file in /dev/shm. Measured in /dev/shm and /proc/<pid>/maps."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from proc_usage import shm_files

import labdist as ld
from labdist.collectives.transports import shm

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm here")

ROOT = Path(__file__).resolve().parents[2]
GONE_WITHIN_S = 5.0
MiB = 2**20


def _mapped_bytes(pid: int) -> int:
    """How much of labdist's /dev/shm files process `pid` has mapped."""
    total = 0
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            if " /dev/shm/labdist-" in line:
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                total += hi - lo
    return total


def _file_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        for name in shm_files(pid):
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                total += os.stat(f"/dev/shm/{name}").st_size
    return total


def _all_reduce_sum(n: int):
    def fn():  # made on the replicas: nothing of that size travels from the driver
        ctx = ld.get_replica_context()
        return float(ctx.all_reduce("SUM", np.ones(n, dtype=np.float32))[-1])
    return fn


@pytest.mark.timeout(240)
def test_an_outsized_collective_gives_its_shared_memory_back():
    """One 256 MiB all-reduce grew 512 MiB areas on each replica; three 1 KiB all-reduces
    later they were all still there, on /dev/shm and mapped by both workers."""
    strategy = ld.MirroredStrategy(num_replicas=2, collective_timeout=120)
    try:
        pids = sorted(strategy.group.client.run(os.getpid).values())
        assert {v for v in strategy.experimental_local_results(
            strategy.run(_all_reduce_sum(64 * MiB)))} == {2.0}  # 256 MiB of float32
        grown = _file_bytes(pids)
        assert grown >= 512 * MiB, grown
        for _ in range(3):
            out = strategy.run(_all_reduce_sum(256))  # 1 KiB
            assert strategy.experimental_local_results(out) == (2.0, 2.0)
        files = _file_bytes(pids)
        mapped = {pid: _mapped_bytes(pid) for pid in pids}
        assert files <= shm.HIGH_WATER_BYTES, f"{files / MiB:.0f} MiB still in /dev/shm"
        assert all(m <= shm.HIGH_WATER_BYTES for m in mapped.values()), mapped
        # a training loop's areas stay put: the next equal steps do not make new files
        out = strategy.run(_all_reduce_sum(4 * MiB))
        again = {name for pid in pids for name in shm_files(pid)}
        for _ in range(3):
            strategy.run(_all_reduce_sum(4 * MiB))
        assert {name for pid in pids for name in shm_files(pid)} == again
    finally:
        strategy.close()


KILLED = """
import os, sys
from labdist.shm import area as shm_area
area = shm_area.create(f"/dev/shm/labdist-killtest-0-{os.getpid()}", "-control", 4096)
print(area.path, flush=True)
sys.stdin.read()
"""


def test_a_process_killed_with_sigkill_leaves_no_file():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-c", KILLED], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        path = proc.stdout.readline().strip()
        assert os.path.exists(path)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        proc.stdin.close()
        proc.stdout.close()
    deadline = time.monotonic() + GONE_WITHIN_S
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(path), f"{path} outlived its process"


CELL = """
import os, numpy as np, labdist as ld
strategy = ld.MirroredStrategy(num_replicas=2)
strategy.run(lambda: ld.get_replica_context().all_reduce("SUM", np.ones(300_000)))
print(sorted(strategy.group.client.run(os.getpid).values()))
"""


def _kernel(tmp_path: Path) -> KernelManager:
    """A kernel of exactly this interpreter, importing labdist from this checkout."""
    spec = tmp_path / "kernels" / "labdist-shm"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "labdist", "language": "python"}))
    return KernelManager(kernel_name="labdist-shm",
                         kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(spec.parent)]))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("now", [False, True], ids=["shutdown-request", "killed"])
def test_a_shut_down_kernel_leaves_no_shared_memory(tmp_path, now):
    """JupyterLab's "Shut Down Kernel" sends a shutdown request, then kills the kernel's
    process group when it is slow to go (`now`: at once); its embedded workers' 6 files
    (2 MiB) used to stay in /dev/shm after a kill."""
    km = _kernel(tmp_path)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    km.start_kernel(env={**os.environ, "PYTHONPATH": path})
    printed: list[str] = []
    try:
        client = km.client()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=60)
            reply = client.execute_interactive(
                CELL, timeout=180, output_hook=lambda m: printed.append(
                    m["content"].get("text", "") if m["msg_type"] == "stream" else ""))
        finally:
            client.stop_channels()
        assert reply["content"]["status"] == "ok", reply["content"]
        pids = json.loads("".join(printed).strip().splitlines()[-1])
        assert len(pids) == 2 and all(shm_files(pid) for pid in pids), pids
    finally:
        km.shutdown_kernel(now=now)
    asked = time.monotonic()
    while any(shm_files(pid) for pid in pids) and time.monotonic() - asked < GONE_WITHIN_S:
        time.sleep(0.1)
    left = {pid: shm_files(pid) for pid in pids if shm_files(pid)}
    assert not left, f"{GONE_WITHIN_S:g} s after the kernel shut down: {left}"
