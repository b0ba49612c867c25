"""`labdist info`: what labdist runs with, the GPUs it sees, and (given a scheduler) the
workers of a cluster, the GPUs each of them sees and the GPU it is pinned to
(CUDA_VISIBLE_DEVICES)."""

from __future__ import annotations

import platform
import sys
from importlib import metadata

from labdist.cli.mistakes import UserError, check_scheduler

PACKAGES = ("labdist", "numpy", "dask", "distributed", "cloudpickle", "matplotlib",
            "jupyterlab", "ipywidgets", "anywidget", "cupy-cuda12x", "dask-cuda")


def versions() -> dict[str, str | None]:
    """Installed version of each package labdist uses (None when it is not installed)."""
    found: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def gpus() -> list[str]:
    """Names of the CUDA GPUs this process sees (empty without cupy or CUDA)."""
    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
        names = []
        for i in range(count):
            name = cupy.cuda.runtime.getDeviceProperties(i)["name"]
            names.append(name.decode() if isinstance(name, bytes) else str(name))
        return names
    except Exception:
        return []


def _worker_gpus() -> tuple[list[str], str | None]:  # runs on each worker
    import os

    from labdist.cli.info import gpus as local_gpus

    return local_gpus(), os.environ.get("CUDA_VISIBLE_DEVICES")


def workers(address: str, timeout: float) -> list[dict]:
    """Each worker of the cluster at `address`: its address, threads, memory and GPUs."""
    from distributed import Client

    with Client(address, timeout=timeout, set_as_default=False) as client:
        described = client.scheduler_info(n_workers=-1)["workers"]
        seen = client.run(_worker_gpus)
    return [{"address": addr, "name": w.get("name"), "nthreads": w.get("nthreads"),
             "memory_limit": w.get("memory_limit"), "gpus": seen.get(addr, ([], None))[0],
             "cuda_visible_devices": seen.get(addr, ([], None))[1]}
            for addr, w in sorted(described.items())]


def info(scheduler: str | None, connect_timeout: float) -> int:
    print(f"python {sys.version.split()[0]} on {platform.system()} {platform.machine()}")
    for name, version in versions().items():
        print(f"  {name:14s} {version or '-'}")
    names = gpus()
    print(f"GPUs seen here: {len(names)}" + "".join(f"\n  {i}: {n}" for i, n in enumerate(names)))
    if scheduler:
        address = check_scheduler(scheduler, connect_timeout)
        try:
            found = workers(address, connect_timeout)
        except (OSError, TimeoutError) as e:
            raise UserError(f"could not talk to the scheduler at {address}: {e}") from None
        print(f"Cluster {address}: {len(found)} worker(s)")
        for w in found:
            memory = f"{w['memory_limit'] / 2**30:.1f} GiB" if w["memory_limit"] else "-"
            print(f"  {w['address']}  threads {w['nthreads']}  memory {memory}  "
                  f"GPUs {len(w['gpus'])}" + (f" ({', '.join(w['gpus'])})" if w["gpus"] else "")
                  + (f"  CUDA_VISIBLE_DEVICES={w['cuda_visible_devices']}"
                     if w["cuda_visible_devices"] is not None else ""))
    return 0
