"""A notebook's other gestures, in real kernels: re-running the set-up cell, restarting and
shutting down the kernel, two notebooks at once. Re-running used to leave one more embedded
cluster each time (the kernel's processes went 6 -> 10 -> 14 -> 18)."""

from __future__ import annotations

import os
import time

import pytest
from kernels import Kernel, descendants
from proc_usage import shm_files

pytestmark = pytest.mark.usefixtures("quiet_machine")

SETUP = """
import numpy as np, labdist as ld
strategy = ld.MirroredStrategy(num_replicas=2)
with strategy.scope():
    model = ld.models.Sequential([ld.layers.Dense(8, activation="relu", input_shape=(4,)),
                                  ld.layers.Dense(1)])
    model.compile(loss="mse", optimizer=ld.optimizers.SGD(0.01))
x = np.random.default_rng(0).standard_normal((256, 4)).astype("float32")
model.fit(x, x.sum(1, keepdims=True), epochs=1, batch_size=32, verbose=0)
"""
SETTLE_S = 20.0  # a dropped strategy's cluster closes in the background


def _workers(kernel: Kernel) -> list[int]:
    """The kernel's Dask worker processes (spawned by multiprocessing)."""
    found = []
    for pid in kernel.children():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"multiprocessing.spawn" in f.read():
                    found.append(pid)
        except OSError:
            continue
    return found


def _settled_count(kernel: Kernel, want: int) -> int:
    deadline = time.monotonic() + SETTLE_S
    while len(_workers(kernel)) > want and time.monotonic() < deadline:
        time.sleep(0.2)
    return len(_workers(kernel))


@pytest.mark.timeout(300)
def test_running_the_set_up_cell_again_keeps_one_cluster(tmp_path):
    kernel = Kernel(tmp_path)
    try:
        kernel.run_ok(SETUP)
        first = len(_workers(kernel))
        counts = []
        for _ in range(3):
            kernel.run_ok(SETUP)
            counts.append(_settled_count(kernel, first))
        assert counts == [first] * 3, f"after the first run: {first}; then {counts}"
        # and a Lab beside it, made twice, is one more cluster, not two
        kernel.run_ok("lab = ld.Lab(num_replicas=2); lab.step(3)")
        with_lab = len(_workers(kernel))
        kernel.run_ok("lab = ld.Lab(num_replicas=2); lab.step(3)")
        assert _settled_count(kernel, with_lab) == with_lab
        # close() still releases at once
        kernel.run_ok("lab.close(); strategy.close()")
        assert _settled_count(kernel, 0) == 0, _workers(kernel)
    finally:
        kernel.shutdown(now=True)


def _running(pid: int) -> bool:
    """Alive, and not a zombie (a killed kernel waits for its manager to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _gone(pids: list[int], within: float) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = [p for p in pids if _running(p)]
        if not alive:
            return []
        time.sleep(0.1)
    return alive


def _sems() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("sem.mp-")}


FIT_AND_LAB = SETUP + """
lab = ld.Lab(num_replicas=2)
lab.run()
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["restart", "shutdown", "kill-9"])
def test_a_kernel_restarted_or_killed_leaves_nothing(tmp_path, how):
    """No process, no /dev/shm file (labdist's, multiprocessing's semaphores), after
    JupyterLab's restart or shutdown, or a `kill -9` of the kernel alone, with a strategy and
    a running lab in it, interrupted once."""
    sems_before = _sems()
    kernel = Kernel(tmp_path)
    try:
        kernel.run_ok(FIT_AND_LAB)
        kernel.interrupted("import time; time.sleep(30)", 0.5)
        pids = [kernel.pid, *kernel.children()]
        if how == "restart":
            kernel.restart()
            assert kernel.run_ok("print(1 + 1)").text.strip() == "2"
        elif how == "shutdown":
            kernel.shutdown()
        else:
            os.kill(kernel.pid, 9)
        alive = _gone(pids, 15.0)
        assert not alive, f"{how}: still running: {alive}"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (any(shm_files(p) for p in pids)
                                               or _sems() - sems_before):
            time.sleep(0.2)
        assert not [f for p in pids for f in shm_files(p)], f"{how}: labdist files left"
        assert not _sems() - sems_before, f"{how}: semaphores left: {_sems() - sems_before}"
    finally:
        kernel.shutdown(now=True)


@pytest.mark.timeout(300)
def test_two_notebooks_at_once_interrupt_only_themselves(tmp_path):
    """Two kernels, each with its embedded cluster: ■ in one stops that one's fit; the other
    trains on, and both go on working."""
    a, b = Kernel(tmp_path / "a"), Kernel(tmp_path / "b")
    try:
        a.run_ok(SETUP)
        b.run_ok(SETUP)
        b_workers = b.children()
        b_cell = b.client.execute("h = model.fit(x, x.sum(1, keepdims=True), epochs=200, "
                                  "batch_size=32, verbose=0); print(len(h.history['loss']))")
        cell = a.interrupted("model.fit(x, x.sum(1, keepdims=True), epochs=10000, "
                             "batch_size=32, verbose=0)", 1.0)
        assert cell.ename == "KeyboardInterrupt", (cell.ename, cell.evalue)
        finished = b._collect(b_cell, None, 240)
        assert finished.status == "ok" and finished.text.strip() == "200", finished.traceback
        assert descendants(b.pid) == b_workers or set(b_workers) <= set(descendants(b.pid))
        a.run_ok("model.fit(x, x.sum(1, keepdims=True), epochs=1, verbose=0)")
    finally:
        a.shutdown(now=True)
        b.shutdown(now=True)
