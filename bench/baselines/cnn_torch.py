"""torch: the tutorial CNN, one process with 2 intra-op threads (`--replicas 1`), or
DistributedDataParallel over gloo with that many processes x 1 thread, each on its share of
every global batch. Runs under a torch interpreter (never a labdist dependency):
LABDIST_BENCH_TORCH_PY. Rank 0 times the steps between barriers.

Run: `/path/to/torch/python bench/baselines/cnn_torch.py --batch 64 --steps 60 --replicas 2`.
"""

from __future__ import annotations

import os

from _common import emit, parse, timed_passes
from cnn_common import CLASSES, data
from torch_ddp import free_port
from torch_one import trainer  # the same SGD(0.01) loop over (x, y) batches, cycling


def net(torch):
    torch.manual_seed(0)
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(64 * 2 * 2, 64), nn.ReLU(), nn.Linear(64, CLASSES))


def images(torch, x):
    return torch.from_numpy(x.transpose(0, 3, 1, 2).copy())  # channels first


def worker(rank: int, args, port: int, results) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=args.replicas)
    try:
        x, y = data(args.batch * args.steps)
        share = args.batch // args.replicas
        x = x.reshape(args.steps, args.batch, *x.shape[1:])[:, rank * share:(rank + 1) * share]
        y = y.reshape(args.steps, args.batch)[:, rank * share:(rank + 1) * share]
        model = torch.nn.parallel.DistributedDataParallel(net(torch))
        run = trainer(torch, model, images(torch, x.reshape(-1, *x.shape[2:])),
                      torch.from_numpy(y.reshape(-1).copy()), share, args.steps)
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
    args = parse(__doc__.splitlines()[0],
                 lambda p: p.add_argument("--replicas", type=int, default=2))
    import torch

    if args.replicas == 1:
        torch.set_num_threads(2)
        x, y = data(args.batch * args.steps)
        run = trainer(torch, net(torch), images(torch, x), torch.from_numpy(y), args.batch,
                      args.steps)
        run(args.warmup)
        emit(timed_passes(lambda: run(args.steps), args.steps, args.passes), replicas=1,
             torch=torch.__version__)
        return
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.start_processes(worker, args=(args, free_port(), results), nprocs=args.replicas,
                       start_method="spawn")
    rates, version = results.get()
    emit(rates, replicas=args.replicas, torch=version, backend="gloo")


if __name__ == "__main__":
    main()
