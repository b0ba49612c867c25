"""labdist: the tutorial CNN trained by `fit` on `--replicas` replicas (1: OneDeviceStrategy on
the host; 2: MirroredStrategy's embedded cluster). `--profile` instead times each layer's
forward and backward pass in this process (where a step's time goes).

Run: `python bench/baselines/cnn_labdist.py --batch 64 --steps 60 --replicas 2`.
"""

from __future__ import annotations

import time

import numpy as np
from _common import emit, parse, timed_passes
from cnn_common import CLASSES, LEARNING_RATE, SIDE, data


def model(ld):
    return ld.Sequential([
        ld.Input((SIDE, SIDE, 1)),
        ld.layers.Conv2D(32, 3, activation="relu"), ld.layers.MaxPooling2D(),
        ld.layers.Conv2D(64, 3, activation="relu"), ld.layers.MaxPooling2D(),
        ld.layers.Flatten(), ld.layers.Dense(64, activation="relu"), ld.layers.Dense(CLASSES)])


def profile(ld, batch: int, steps: int) -> dict:
    """Median ms per layer, forward and backward, over `steps` batches, in this process."""
    m = model(ld)
    x, y = data(batch)
    params = [{k: v.numpy() for k, v in w.items()} for w in m.weight_dicts()]
    forward = {i: [] for i in range(len(m.layers))}
    backward = {i: [] for i in range(len(m.layers))}
    loss = ld.losses.SparseCategoricalCrossentropy(from_logits=True)
    for _ in range(steps):
        h, caches = x, []
        for i, (layer, p) in enumerate(zip(m.layers, params, strict=True)):
            t = time.perf_counter()
            h, cache = layer.forward(np, p, h, training=True)
            forward[i].append(time.perf_counter() - t)
            caches.append(cache)
        _, g = loss.value_and_grad(np, y, h)
        for i in range(len(m.layers) - 1, -1, -1):
            t = time.perf_counter()
            g, _ = m.layers[i].backward(np, params[i], caches[i], g, input_grad=i > 0)
            backward[i].append(time.perf_counter() - t)
    return {f"{i}: {layer!r}": {"forward_ms": 1e3 * float(np.median(forward[i])),
                          "backward_ms": 1e3 * float(np.median(backward[i]))}
            for i, layer in enumerate(m.layers)}


def main() -> None:
    args = parse(__doc__.splitlines()[0], lambda p: (
        p.add_argument("--replicas", type=int, default=2),
        p.add_argument("--profile", action="store_true")))
    import labdist as ld

    if args.profile:
        emit([0.0], layers=profile(ld, args.batch, args.steps))
        return
    strategy = (ld.OneDeviceStrategy("cpu") if args.replicas == 1
                else ld.MirroredStrategy(num_replicas=args.replicas))
    try:
        with strategy.scope():
            m = model(ld)
            m.compile(optimizer=ld.optimizers.SGD(LEARNING_RATE),
                      loss=ld.losses.SparseCategoricalCrossentropy(from_logits=True))
        x, y = data(args.batch * args.steps)
        m.fit(x[:args.batch * args.warmup], y[:args.batch * args.warmup],
              batch_size=args.batch, shuffle=False, verbose=0)
        rates = timed_passes(lambda: m.fit(x, y, batch_size=args.batch, shuffle=False,
                                           verbose=0), args.steps, args.passes)
    finally:
        strategy.close()
    emit(rates, replicas=args.replicas, labdist=ld.__version__)


if __name__ == "__main__":
    main()
