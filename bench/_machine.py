"""What the benches record about the machine they ran on: the CPU share other processes took
while they ran (from /proc/stat, less the bench's own process tree), and the versions and
commit the figures depend on. Shared by bench_core.py and bench_train.py."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import numpy as np


def cpu_seconds() -> dict[str, float]:
    """Whole-machine CPU seconds by kind (/proc/stat), and this process tree's own (children
    count once reaped: a bench's subprocesses, and theirs, are, after they end)."""
    tick = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as f:
        fields = [int(x) / tick for x in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, _irq, softirq, steal = fields
    t = os.times()
    return {"busy": user + nice + system, "softirq": softirq, "steal": steal,
            "mine": t.user + t.system + t.children_user + t.children_system}


def cpu_account(before: dict[str, float], seconds: float,
                after: dict[str, float] | None = None) -> dict[str, float]:
    """Share of the machine's CPUs taken by other processes between `before` and `after`
    (default: now), `seconds` apart (approximate: kernel work done on our behalf outside our
    processes counts as someone else's)."""
    after = cpu_seconds() if after is None else after
    delta = {k: after[k] - before[k] for k in after}
    capacity = max(seconds, 1e-9) * (os.cpu_count() or 1)
    return {"others_share": max(0.0, delta["busy"] - delta["mine"]) / capacity,
            "softirq_share": delta["softirq"] / capacity, "steal_share": delta["steal"] / capacity}


def git_revision() -> str:
    """`git describe --always --dirty` of the bench's tree, or "unknown"."""
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                              text=True, check=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def machine() -> dict[str, Any]:
    """What the figures depend on, recorded next to them."""
    import dask
    import distributed

    return {"nproc": os.cpu_count(), "cpu_model": cpu_model(), "python": platform.python_version(),
            "numpy": np.__version__, "dask": dask.__version__,
            "distributed": distributed.__version__, "git": git_revision(),
            "loadavg_at_start": os.getloadavg()}
