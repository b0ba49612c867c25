"""How many worker processes an embedded cluster may start on this machine, checked before
any starts: a million replicas would otherwise have Dask build worker specs until memory or
the process limit runs out, with no error.

The rule (each bound names its figure when it refuses):
- CPUs: at most `PER_CPU` processes per CPU this process may run on, and never fewer than
  `MIN_ALLOWED` (a few replicas per core are fine for a lab; hundreds only thrash);
- memory: `WORKER_BYTES` per process must fit in the memory available now (MemAvailable);
- process limit: where RLIMIT_NPROC is finite, `TASKS_PER_WORKER` tasks (a worker process and
  its threads) per process must fit in what the limit leaves this user.
An existing cluster is not checked here: asking for more replicas than it has workers is
refused when the workers are counted.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

PER_CPU = 4
MIN_ALLOWED = 8
WORKER_BYTES = 150 * 2**20  # a labdist worker process, idle, holds ~70-120 MiB
TASKS_PER_WORKER = 4  # a Dask worker process runs 3 threads; 1 more for its nanny's share


def cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def available_memory() -> int | None:
    """MemAvailable in bytes (None where /proc/meminfo does not say)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def tasks_left() -> int | None:
    """How many more tasks (processes and threads) RLIMIT_NPROC lets this user start (None:
    no limit)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft == resource.RLIM_INFINITY:
        return None
    return soft - tasks_in_use()


def tasks_in_use() -> int:
    """The tasks (processes and their threads) this user runs now, as RLIMIT_NPROC counts."""
    uid, used = os.getuid(), 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines()
                          if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                used += int(fields["Threads"])
        except (OSError, KeyError, ValueError):
            continue
    return used


def limits() -> dict[str, int | None]:
    """The most worker processes each bound allows now (None: that bound does not apply)."""
    memory, tasks = available_memory(), tasks_left()
    return {"cpus": max(MIN_ALLOWED, PER_CPU * cpus()),
            "memory": None if memory is None else memory // WORKER_BYTES,
            "process limit": None if tasks is None else max(0, (tasks - 2) // TASKS_PER_WORKER)}


def check_local_workers(count: int, what: str) -> None:
    """ValueError naming `what` (the parameters that asked, e.g. "num_replicas=1000000"), the
    count and this machine's limits, if an embedded cluster of `count` worker processes cannot
    be held here. Starts nothing."""
    allowed = limits()
    exceeded = [name for name, most in allowed.items() if most is not None and count > most]
    if not exceeded:
        return
    most = min(m for m in allowed.values() if m is not None)
    memory = available_memory()
    figures = [f"{cpus()} CPU(s): at most {allowed['cpus']}"]
    if memory is not None:
        figures.append(f"{memory / 2**30:.1f} GiB available at {WORKER_BYTES // 2**20} MiB per "
                       f"process: at most {allowed['memory']}")
    if allowed["process limit"] is not None:
        soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
        figures.append(f"process limit {soft} (ulimit -u): at most {allowed['process limit']}")
    raise ValueError(
        f"{what} asks an embedded cluster for {count} worker processes, more than this machine "
        f"holds ({'; '.join(figures)}); allowed: at most {most} here, or pass cluster= (a "
        "scheduler address or a Dask cluster object) to run on a bigger cluster")
