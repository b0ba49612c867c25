"""A replica keeps its step's memory between steps, on any worker.

glibc hands freed memory back to the kernel eagerly (and Dask's nanny makes it more eager
still, `MALLOC_TRIM_THRESHOLD_=64 KiB`), so each step page-faults its temporaries in again.
A replica's steps need the same memory every step, so it asks glibc to keep it: arrays up to
32 MiB come from the heap, and the heap is trimmed only past 1 GiB free. `mallopt` sets it
at run time, alike on the embedded cluster and on workers labdist did not start (a `dask
worker`, the user's `LocalCluster`); never through the nanny's environment, which Dask also
writes into the driver's own `os.environ`.
"""

from __future__ import annotations

import ctypes
import ctypes.util

TRIM = 1 << 30  # bytes free at the top of a heap before glibc hands them back
MMAP = 32 << 20  # arrays from this size get a mapping of their own (glibc's maximum)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def keep_step_memory() -> bool:
    """Set this process's glibc thresholds; False where the C library is not glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    return bool(mallopt(_M_TRIM_THRESHOLD, TRIM)) and bool(mallopt(_M_MMAP_THRESHOLD, MMAP))
