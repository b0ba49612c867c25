"""A training step's gradients in views of one flat buffer kept across steps (issue 26): the
backward pass writes the same bits there as into arrays of its own, an empty shard zeroes
them, and a replica hands out the same buffer step after step."""

from __future__ import annotations

import numpy as np
import pytest

import labdist as ld
from labdist.devices import get_backend, to_host
from labdist.training import layers, losses
from labdist.training.trainer.steps import gradients


class _Views:
    """What `gradient_buffer` asks of a replica context, on one buffer."""

    def __init__(self, xp):
        self.xp = xp
        self.made = 0

    def persistent_buffer(self, key, n, dtype):
        self.made += 1
        return self.xp.full(n, np.nan, dtype=dtype)  # stale contents must not leak through


def _mlp(seed=0):
    rng = np.random.default_rng(seed)
    net = [layers.Dense(16, activation="relu"), layers.Dropout(0.25),
           layers.Dense(8, activation="tanh"), layers.Dense(3, activation="softmax")]
    params, width = [], 5
    for layer in net:
        params.append(layer.build(width, rng))
        width = getattr(layer, "units", width)
    return net, params


@pytest.mark.parametrize("device", ["cpu", "strict"])
@pytest.mark.parametrize("loss", ["sparse_categorical_crossentropy", "mean_squared_error"])
def test_gradients_written_into_the_buffer_are_the_same_bits(device, loss):
    from labdist.training.trainer.steps import DeviceRNG, gradient_buffer

    backend = get_backend(device)
    xp = backend.xp
    net, host = _mlp()
    params = [{k: xp.asarray(v) for k, v in p.items()} for p in host]
    rng = np.random.default_rng(1)
    x = xp.asarray(rng.standard_normal((7, 5)).astype(np.float32))
    labels = rng.integers(0, 3, 7)
    y = xp.asarray(labels if loss.startswith("sparse") else
                   np.eye(3, dtype=np.float32)[labels])
    fn = losses.get(loss)
    out = gradient_buffer(_Views(xp), params)
    for local in (7, 0):  # a full shard, then an empty one (zeros into the buffer)
        xs, ys = (x, y) if local else (x[:0], y[:0])
        want, want_stats = gradients(xp, net, params, fn, xs, ys, DeviceRNG(backend, (0, 0, 1)),
                                     local, 10)
        got, got_stats = gradients(xp, net, params, fn, xs, ys, DeviceRNG(backend, (0, 0, 1)),
                                   local, 10, out=out)
        assert all(g is o for g, o in zip(got, out, strict=True) if o)  # written in place
        for w, g in zip(want, got, strict=True):
            assert w.keys() == g.keys()
            for k in w:
                assert to_host(g[k]).tobytes() == to_host(w[k]).tobytes()
        assert to_host(got_stats).tobytes() == to_host(want_stats).tobytes()


def test_the_buffer_is_the_replica_s_across_steps(mirrored2):
    def step():
        ctx = ld.get_replica_context()
        buf = ctx.persistent_buffer(("test", 5), 5, np.float32)
        buf[:] = ctx.replica_id_in_sync_group  # the caller's contents, kept
        return id(buf)

    def again():
        ctx = ld.get_replica_context()
        buf = ctx.persistent_buffer(("test", 5), 5, np.float32)
        return id(buf), float(buf[0])

    first = mirrored2.experimental_local_results(mirrored2.run(step))
    second = mirrored2.experimental_local_results(mirrored2.run(again))
    assert [int(i) for i, _ in second] == [int(i) for i in first]
    assert [float(v) for _, v in second] == [0.0, 1.0]
