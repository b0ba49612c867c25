"""The backward-overlap switch (LABDIST_OVERLAP_BACKWARD=1, off by default: it does not pay on
a machine without spare cores): with it on, `fit` takes two collectives a step on a helper
thread and the step thread, and still ends with the very bits it ends with when off, an empty
shard and the partitioned (Adam) update included."""

from __future__ import annotations

import numpy as np

import labdist as ld
from labdist.training.trainer import overlap


def _fit(strategy, x, y, batch):
    with strategy.scope():
        model = ld.models.Sequential([
            ld.layers.Dense(1024, activation="relu", input_shape=(256,)),
            ld.layers.Dropout(0.1),
            ld.layers.Dense(32, activation="tanh"),
            ld.layers.Dense(10, activation="softmax")], seed=4)
        model.compile(loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                      optimizer=ld.optimizers.Adam(1e-3), steps_per_execution=3)
    history = model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    copies = [strategy.experimental_local_results(v) for v in model.weights]
    for c in copies:
        assert all(a.tobytes() == c[0].tobytes() for a in c[1:])
    return [c[0] for c in copies], history.history


def _helper_threads():
    import threading

    return sum(t.name.startswith("labdist-collectives-") for t in threading.enumerate())


def test_overlap_on_gives_the_bits_it_gives_off(monkeypatch, mirrored2):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(7 * 32 + 1, 256)).astype(np.float32)  # a last batch of 1: a shard of 0
    y = rng.integers(0, 10, len(x))
    off = _fit(mirrored2, x, y, 32)
    monkeypatch.setenv(overlap.ENV, "1")  # the workers of a new cluster inherit it
    with ld.MirroredStrategy(num_replicas=2, device="cpu") as on_strategy:
        assert all(on_strategy.experimental_local_results(on_strategy.run(overlap.enabled)))
        on = _fit(on_strategy, x, y, 32)
        helpers = on_strategy.experimental_local_results(on_strategy.run(_helper_threads))
        assert list(helpers) == [1, 1]  # the later layers were summed on the helper thread
    for a, b in zip(off[0], on[0], strict=True):
        assert a.tobytes() == b.tobytes()
    assert off[1] == on[1]
