"""A lost worker: mirrored mode stops with a clear error naming it (docs/design.md, Reliability)."""

from __future__ import annotations

import os
import signal
import time

import pytest

import labdist as ld


def test_killed_worker_raises_replica_lost_error_naming_it():
    with ld.MirroredStrategy(num_replicas=2, collective_timeout=10) as s:
        pids = s.experimental_local_results(s.run(os.getpid))
        lost = s.workers[1]
        os.kill(pids[1], signal.SIGKILL)
        time.sleep(0.5)
        start = time.monotonic()
        with pytest.raises(ld.ReplicaLostError, match=lost.replace(".", r"\.")):
            s.run(lambda: ld.get_replica_context().all_reduce("SUM", 1.0))
        assert time.monotonic() - start < 20
