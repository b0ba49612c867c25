"""Baseline: torch DistributedDataParallel, gloo, 2 processes x 1 thread on this host, each on
its share of every global batch (the usual per-step loop); LABDIST_BENCH_REPLICAS processes
and LABDIST_BENCH_HIDDEN layers where given (_common.py). Runs under a torch interpreter (never
a labdist dependency): LABDIST_BENCH_TORCH_PY. Rank 0 times the steps between barriers.

Run: `/path/to/torch/python bench/baselines/torch_ddp.py --batch 64 --steps 300`.
"""

from __future__ import annotations

import os
import socket
import sys

from _common import LAYERS, REPLICAS, data, emit, parse, timed_passes
from torch_one import model, trainer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank: int, args, port: int, results) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=REPLICAS)
    try:
        x, y = data(args.batch * args.steps)
        half = args.batch // REPLICAS  # this rank's share
        # this rank's shard of each global batch, laid out batch after batch
        x = x.reshape(args.steps, args.batch, -1)[:, rank * half:(rank + 1) * half]
        y = y.reshape(args.steps, args.batch)[:, rank * half:(rank + 1) * half]
        net = torch.nn.parallel.DistributedDataParallel(model(torch))
        run = trainer(torch, net, torch.from_numpy(x.reshape(-1, x.shape[-1]).copy()),
                      torch.from_numpy(y.reshape(-1).copy()), half, args.steps)
        run(args.warmup)

        def timed() -> None:
            run(args.steps)
            dist.barrier()

        dist.barrier()
        rates = timed_passes(timed, args.steps, args.passes)
        if rank == 0:
            results.put((rates, torch.__version__))
    finally:
        dist.destroy_process_group()


def main() -> None:
    args = parse(__doc__.splitlines()[0])
    import torch.multiprocessing as mp

    if args.batch % REPLICAS:
        sys.exit(f"--batch {args.batch} must split evenly over {REPLICAS} processes")
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.start_processes(worker, args=(args, free_port(), results), nprocs=REPLICAS,
                       start_method="spawn")
    rates, version = results.get()
    emit(rates, torch=version, processes=REPLICAS, threads_per_process=1, backend="gloo",
         layers=LAYERS)


if __name__ == "__main__":
    main()
