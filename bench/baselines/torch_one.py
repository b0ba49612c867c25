"""Baseline: the same model in torch, one process, `--threads` intra-op threads (2: both cores).
Runs under a torch interpreter (never a labdist dependency): LABDIST_BENCH_TORCH_PY.

Run: `/path/to/torch/python bench/baselines/torch_one.py --batch 64 --steps 300`.
"""

from __future__ import annotations

import itertools

from _common import CLASSES, FEATURES, LAYERS, LEARNING_RATE, data, emit, parse, timed_passes


def model(torch):
    """784-512-10 (or the LAYERS given), ReLU; softmax + cross-entropy fused in the loss (on
    logits), as Keras' softmax layer + sparse categorical cross-entropy compute it."""
    torch.manual_seed(0)
    widths, stack = (FEATURES, *LAYERS), []
    for n_in, n_out in itertools.pairwise(widths):
        stack += [torch.nn.Linear(n_in, n_out), torch.nn.ReLU()]
    return torch.nn.Sequential(*stack, torch.nn.Linear(widths[-1], CLASSES))


def trainer(torch, net, x, y, batch: int, steps: int):
    """A function running n SGD steps over the batches of (x, y), cycling."""
    opt = torch.optim.SGD(net.parameters(), lr=LEARNING_RATE)
    loss_fn = torch.nn.CrossEntropyLoss()
    state = {"step": 0}

    def run(n: int) -> None:
        for _ in range(n):
            i = state["step"] % steps
            state["step"] += 1
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(net(x[i * batch:(i + 1) * batch]), y[i * batch:(i + 1) * batch])
            loss.backward()
            opt.step()

    return run


def main() -> None:
    args = parse(__doc__.splitlines()[0], lambda p: p.add_argument("--threads", type=int,
                                                                   default=2))
    import torch

    torch.set_num_threads(args.threads)
    x, y = data(args.batch * args.steps)
    run = trainer(torch, model(torch), torch.from_numpy(x), torch.from_numpy(y),
                  args.batch, args.steps)
    run(args.warmup)
    rates = timed_passes(lambda: run(args.steps), args.steps, args.passes)
    emit(rates, torch=torch.__version__, threads=torch.get_num_threads())


if __name__ == "__main__":
    main()
