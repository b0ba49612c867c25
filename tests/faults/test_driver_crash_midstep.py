"""A driver `kill -9`ed while its replicas all-reduce 8 MiB in a loop, on an external cluster
(`dask scheduler` + two `dask worker` processes that outlive it): within 20 s of each crash
every worker holds no more threads, file descriptors, listening sockets or /dev/shm files
and mappings than after one clean driver run, measured from outside through /proc.

The hard case is a replica left waiting in a collective that its peer will never join (the
driver died between sending the step to one replica and the other, or after one replica
finished): it must stop waiting when its driver is gone, not at its collective timeout. A
replica waiting in merge_call for the driver's answer must let go too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from distributed import Client
from proc_usage import excess, held

RELEASE_S = 20.0  # what the replicas of a vanished driver may take to let go
COLLECTIVE_TIMEOUT_S = 60  # a replica that waited for its collective would hold on this long

DRIVER = """
import os, signal, sys
import numpy as np
import labdist as ld

strategy = ld.MirroredStrategy(cluster=sys.argv[1], transport=sys.argv[2], connect_timeout=20,
                               collective_timeout=float(sys.argv[3]))
x = np.ones(1 << 20)  # 8 MiB


def step():
    return ld.get_replica_context().all_reduce("SUM", x)


for _ in range(3):
    strategy.run(step)
print("running", flush=True)
if sys.argv[4] == "close":
    strategy.close()
    sys.exit(0)
driver = os.getpid()


def last_step():  # replica 1 kills the driver (kill -9) while replica 0 waits for it
    ctx = ld.get_replica_context()
    if ctx.replica_id_in_sync_group == 1:
        os.kill(driver, signal.SIGKILL)
        return 0.0
    return ctx.all_reduce("SUM", x)


def merge_step():  # both replicas wait in merge_call for a driver replica 1 kills first
    ctx = ld.get_replica_context()
    if ctx.replica_id_in_sync_group == 1:
        os.kill(driver, signal.SIGKILL)
    return ctx.merge_call(lambda strategy: 1.0)


while True:
    strategy.run({"midstep": last_step, "merge": merge_step}.get(sys.argv[4], step))
"""


def _driver(address: str, transport: str, how: str) -> subprocess.Popen:
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, address, transport, str(COLLECTIVE_TIMEOUT_S), how],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    timer = threading.Timer(120, driver.kill)  # a driver that never gets going
    timer.start()
    line = driver.stdout.readline().strip()
    timer.cancel()
    if line != "running":
        driver.kill()
        pytest.fail(f"the driver did not start: {driver.communicate()[1][-3000:]}")
    return driver


def _usage(pids: dict[str, int]) -> dict[str, dict[str, int]]:
    return {w: held(pid) for w, pid in pids.items()}


def _left_after(pids: dict[str, int], before: dict, timeout: float) -> dict:
    """What still exceeds `before` on some worker once `timeout` s have passed (or nothing,
    as soon as every worker is back to it)."""
    deadline = time.monotonic() + timeout
    while True:
        over = {w: o for w, u in _usage(pids).items() if (o := excess(u, before[w]))}
        if not over or time.monotonic() > deadline:
            return over
        time.sleep(0.25)


@pytest.mark.cluster
@pytest.mark.timeout(300)
@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_drivers_killed_mid_collective_leave_nothing(external, transport):
    with Client(external.address, timeout=20, set_as_default=False) as client:
        pids = client.run(os.getpid)
    clean = _driver(external.address, transport, "close")  # warms the workers' pools
    assert clean.wait(60) == 0, clean.communicate()[1][-3000:]
    clean.communicate()
    time.sleep(1)
    before = _usage(pids)

    # two kills from outside in the middle of the loop, then one at the worst moment, and one
    # while the replicas wait in merge_call (over the lane, the step thread reads its resume)
    for crash, how in enumerate(["loop", "loop", "midstep", "merge"]):
        driver = _driver(external.address, transport, how)
        try:
            if how == "loop":
                time.sleep(0.3 + 0.4 * crash)
                driver.send_signal(signal.SIGKILL)
            assert driver.wait(60) == -signal.SIGKILL
        finally:
            driver.kill()
            driver.communicate()
        killed = time.monotonic()
        left = _left_after(pids, before, RELEASE_S)
        assert not left, (f"{time.monotonic() - killed:.0f} s after crash {crash + 1} ({how}), "
                          f"(after a clean run, now): {left}")
    assert external.alive()
