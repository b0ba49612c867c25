"""How many BLAS / OpenMP threads each replica of an embedded cluster computes with: the
machine's CPUs split evenly among the replicas, so that replicas never oversubscribe the
cores (two replicas each spinning two BLAS threads on two cores run slower than one thread
each) and a lone replica still uses them all.

The rule: `max(1, cpus // replicas)`, with `cpus` the CPUs this process may run on. Set the
environment variable LABDIST_BLAS_THREADS (an integer >= 1) before the strategy starts its
cluster to choose the count yourself. Workers of a cluster you start (`dask worker`) are not
touched: Dask's nanny gives them one thread each unless you set OMP_NUM_THREADS and friends.
"""

from __future__ import annotations

import os

from labdist.checks import refuse
from labdist.cluster import capacity

ENV = "LABDIST_BLAS_THREADS"
# What OpenBLAS, MKL, BLIS and OpenMP each read at start-up (only the thread counts: any
# other OpenBLAS tuning the user set is inherited untouched).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "BLIS_NUM_THREADS")


def blas_threads(replicas: int, cpus: int | None = None) -> int:
    """Threads per replica: LABDIST_BLAS_THREADS if set, else the CPUs split evenly."""
    chosen = os.environ.get(ENV)
    if chosen is not None and chosen.strip() != "":
        try:
            count = int(chosen)
        except ValueError:
            count = 0
        if count < 1:
            refuse(ENV, chosen, "an integer >= 1 (BLAS threads per replica), or unset it")
        return count
    cpus = capacity.cpus() if cpus is None else cpus
    return max(1, cpus // max(1, replicas))


def spawn_environ(replicas: int) -> dict[str, str]:
    """The thread variables each of `replicas` worker processes starts with."""
    return dict.fromkeys(THREAD_VARIABLES, str(blas_threads(replicas)))


def export(replicas: int) -> int:
    """Put `spawn_environ(replicas)` into this process's environment, where Dask's nanny reads
    them when it spawns a worker (its `pre-spawn-environ` config yields to variables already
    in the environment, and it leaves its own there: so the driver's environment, not the
    config, is what decides). The driver's BLAS is loaded already and keeps its threads.
    Returns the count; raises before touching anything if LABDIST_BLAS_THREADS is bad."""
    environ = spawn_environ(replicas)
    os.environ.update(environ)
    return int(environ[THREAD_VARIABLES[0]])
