"""Baseline: the same layers, loss and optimizer in one process with numpy, no distribution.
numpy's BLAS uses its own thread pool (both cores here unless OPENBLAS_NUM_THREADS / OMP_NUM_THREADS
says otherwise): the JSON line records the pool. Runs under labdist's interpreter (it uses
labdist.training's layers, so it computes exactly what a replica computes).

Run: `python bench/baselines/numpy_one.py --batch 64 --steps 300`.
"""

from __future__ import annotations

import numpy as np
from _common import HIDDEN, LEARNING_RATE, data, emit, parse, timed_passes

from labdist.training import layers, losses, optimizers


def blas_threads() -> list[dict]:
    """numpy's BLAS thread pools (threadpoolctl, when installed)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    return [{k: p.get(k) for k in ("internal_api", "num_threads", "version")}
            for p in threadpool_info()]


def main() -> None:
    args = parse(__doc__.splitlines()[0])
    x, y = data(args.batch * args.steps)
    rng = np.random.default_rng(0)
    net = [layers.Dense(HIDDEN, activation="relu"), layers.Dense(10, activation="softmax")]
    params = [net[0].build(x.shape[1], rng), net[1].build(HIDDEN, rng)]
    opt = optimizers.SGD(LEARNING_RATE)
    state = {"step": 0}

    def run(steps: int) -> None:
        for _ in range(steps):
            i = state["step"] % args.steps
            state["step"] += 1
            bx, by = x[i * args.batch:(i + 1) * args.batch], y[i * args.batch:(i + 1) * args.batch]
            h, c0 = net[0].forward(np, params[0], bx)
            p, c1 = net[1].forward(np, params[1], h)
            dz = losses.fused_softmax_grad(np, by, p)
            dh, g1 = net[1].backward_linear(np, params[1], c1[0], dz)
            _, g0 = net[0].backward(np, params[0], c0, dh, input_grad=False)
            for p_, g_ in zip(params, (g0, g1), strict=True):
                for k in p_:
                    opt.apply(np, p_[k], g_[k], {}, state["step"])

    run(args.warmup)
    rates = timed_passes(lambda: run(args.steps), args.steps, args.passes)
    emit(rates, blas=blas_threads())


if __name__ == "__main__":
    main()
