"""A driver killed with `kill -9` on an external cluster (`dask scheduler` + `dask worker`
processes that outlive it): its replicas tear themselves down, so each crash leaves nothing
on the workers (threads, listening sockets, file descriptors, /dev/shm files, actors,
mailboxes), over the lane and over actor calls alike."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import cloudpickle
import numpy as np
import pytest
from distributed import Client

import labdist as ld

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # _held runs on the workers

DRIVER = """
import sys
import numpy as np
import labdist as ld

strategy = ld.MirroredStrategy(cluster=sys.argv[1], transport=sys.argv[2], connect_timeout=20)
for _ in range(3):  # 1.2 MB all-reduces: shared-memory data areas exist under "auto"
    strategy.run(lambda: ld.get_replica_context().all_reduce("SUM", np.ones(300_000)))
print(strategy.group.steps.kind, flush=True)
sys.stdin.read()  # until killed
"""


def _held(dask_worker) -> dict:
    """What a worker holds (run there by client.run)."""
    import psutil

    from labdist.collectives.plugin import _MAILBOXES

    me = psutil.Process()
    pid = str(os.getpid())
    return {
        "threads": me.num_threads(),
        "listening": sum(c.status == psutil.CONN_LISTEN for c in me.net_connections("inet")),
        "fds": me.num_fds(),
        "shm": sorted(n for n in os.listdir("/dev/shm")
                      if n.startswith("labdist-") and pid in n.split("-")),
        "actors": len(dask_worker.state.actors),
        "mailboxes": len(_MAILBOXES),
    }


def _exceeds(now: dict, baseline: dict) -> dict:
    return {w: {k: (baseline[w][k], v) for k, v in held.items()
                if (len(v) > len(baseline[w][k]) if k == "shm" else v > baseline[w][k])}
            for w, held in now.items()}


def _settled(client: Client, baseline: dict, timeout: float = 30) -> dict:
    """What still exceeds the baseline once the workers had `timeout` s to let go."""
    deadline = time.monotonic() + timeout
    while True:
        over = _exceeds(client.run(_held), baseline)
        if not any(over.values()) or time.monotonic() > deadline:
            return {w: o for w, o in over.items() if o}
        time.sleep(0.25)


def _crash_a_driver(address: str, transport: str, while_running) -> str:
    """Start a driver process, let it run steps, call `while_running()`, kill -9 it; the
    kind of its step channel."""
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, address, transport],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        timer = threading.Timer(90, driver.kill)  # a driver that never gets ready
        timer.start()
        kind = driver.stdout.readline().strip()
        timer.cancel()
        assert kind, f"the driver did not start: {driver.stderr.read()[-2000:]}"
        while_running()
        return kind
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(30)
        for pipe in (driver.stdin, driver.stdout, driver.stderr):
            pipe.close()


@pytest.fixture(scope="module")
def baseline(external):
    """What the workers hold once strategies have come and gone (the pools Dask and asyncio
    keep are warm), measured by one client that stays."""
    client = Client(external.address, timeout=20, set_as_default=False)
    for transport in ("auto", "tcp"):  # "tcp": the workers' pooled connections to each other
        strategy = ld.MirroredStrategy(cluster=external.address, transport=transport,
                                       connect_timeout=20)
        strategy.run(lambda: ld.get_replica_context().all_reduce("SUM", np.ones(300_000)))
        strategy.close()
    time.sleep(1)
    yield client, client.run(_held)
    client.close()


@pytest.mark.cluster
@pytest.mark.timeout(240)
@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_killed_drivers_leave_nothing_on_the_workers(external, baseline, transport):
    client, before = baseline
    def holds_more():  # what the driver's replicas hold, so there is something to leak
        over = _exceeds(client.run(_held), before)
        for held in over.values():
            assert "threads" in held and "actors" in held and "mailboxes" in held, over
            assert ("shm" in held) == (transport == "auto"), over

    for crash in range(3 if transport == "auto" else 1):
        kind = _crash_a_driver(external.address, transport, holds_more)
        assert kind == ("lane" if transport == "auto" else "actor")
        left = _settled(client, before)
        assert not left, f"after crash {crash + 1} over {kind}: (baseline, now) {left}"
    assert external.alive()
    # the workers still serve a new strategy
    strategy = ld.MirroredStrategy(cluster=external.address, connect_timeout=20)
    try:
        out = strategy.run(lambda: ld.get_replica_context().all_reduce("SUM", 2.0))
        assert strategy.experimental_local_results(out) == (4.0, 4.0)
    finally:
        strategy.close()
