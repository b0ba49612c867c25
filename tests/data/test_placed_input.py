"""fit(x, y)'s data placed once in /dev/shm (labdist/shm/placed.py): each step then sends row
indices, yet trains on exactly the batches of unplaced data, in TF's order for the seed."""

from __future__ import annotations

import glob
import os
import pickle

import numpy as np
import pytest

import labdist as ld
from labdist.data.distributed import Batches
from labdist.shm import placed


def data(n=203):
    rng = np.random.default_rng(0)
    return rng.random((n, 20), dtype=np.float32), rng.integers(0, 3, n)


def model(strategy):
    with strategy.scope():
        m = ld.models.Sequential([ld.layers.Dense(16, activation="relu", input_shape=(20,)),
                                  ld.layers.Dense(3, activation="softmax")])
        m.compile(loss="sparse_categorical_crossentropy", optimizer=ld.optimizers.SGD(0.1),
                  steps_per_execution=2)
    return m


def mapped_on_replicas(strategy) -> list[int]:
    return list(strategy.experimental_local_results(
        strategy.run(lambda: len(placed._mapped))))


def test_placed_batches_are_today_s_batches_in_the_same_order():
    x, y = data()
    arrays = placed.place([x, y])
    try:
        plain = Batches((x, y), 32, shuffle=True, seed=7)
        moved = Batches(tuple(arrays), 32, shuffle=True, seed=7)
        for _epoch in range(2):  # a new order each pass, the same on both
            for (bx, by), (px, py) in zip(plain, moved, strict=True):
                assert isinstance(px, placed.PlacedRows)
                wire = pickle.loads(pickle.dumps(px))  # what a replica gets
                assert wire.tobytes() == bx.tobytes()
                np.testing.assert_array_equal(py.rows(), by)
                shard = px[3:9]  # how the strategy splits a batch among replicas
                assert pickle.loads(pickle.dumps(shard)).tobytes() == bx[3:9].tobytes()
        rows = moved._batch(np.arange(32))[0]
        assert len(pickle.dumps(rows)) < x[:32].nbytes / 2  # indices, not rows
    finally:
        for a in arrays:
            a.close()


def files() -> set[str]:
    return set(glob.glob(f"{placed.SHM_DIR}/{placed.PREFIX}*"))


def test_fit_on_placed_data_trains_exactly_as_unplaced(monkeypatch, mirrored2):
    results = {}
    for flag in ("0", "1"):
        monkeypatch.setenv(placed.ENV, flag)
        x, y = data()
        before = files()
        m = model(mirrored2)
        history = m.fit(x, y, batch_size=32, epochs=2, shuffle=True, verbose=0)
        results[flag] = (m.get_weights(), history.history["loss"])
        assert len(files() - before) == (2 if flag == "1" else 0)  # kept while x lives
        if flag == "1":
            assert all(n >= 2 for n in mapped_on_replicas(mirrored2))  # x and y were mapped
        del x
        assert files() == before  # x gone: nobody can pass it again, its copy goes
    (w0, loss0), (w1, loss1) = results["0"], results["1"]
    assert loss0 == loss1
    assert all(a.tobytes() == b.tobytes() for a, b in zip(w0, w1, strict=True))


def test_a_replica_drops_the_mappings_of_finished_fits(mirrored2):
    x, y = data(64)
    for _ in range(3):
        model(mirrored2).fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert all(n <= 2 for n in mapped_on_replicas(mirrored2))  # only the last fit's x, y


@pytest.mark.parametrize("flag", ["0", "off"])
def test_the_switch_turns_placement_off(monkeypatch, flag):
    monkeypatch.setenv(placed.ENV, flag)
    assert placed.place([np.zeros(3)]) is None


def test_input_leaves_most_of_dev_shm_to_the_collectives(monkeypatch):
    """Arrays over a quarter of /dev/shm's free space are not placed: a small /dev/shm (a
    container's 64 MB) stays available to the all-reduce, and the batches travel as before."""
    x = np.zeros((100, 10), np.float32)  # 4000 bytes
    monkeypatch.setattr(placed, "_free_bytes", lambda: 4000 * 4)
    arrays = placed.place([x])
    assert arrays is not None
    arrays[0].close()
    monkeypatch.setattr(placed, "_free_bytes", lambda: 4000 * 4 - 1)
    assert placed.place([x]) is None


def test_fit_again_on_the_same_arrays_takes_their_copy_unless_they_changed(mirrored2):
    """The copies outlive a fit while x lives; the next fit on x and y takes them once a
    compare shows the same bytes, and copies afresh what changed in place meanwhile."""
    x, y = data()
    before = files()
    first = model(mirrored2)
    first.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    kept = files() - before
    assert len(kept) == 2
    first.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    assert files() - before == kept  # the same files: nothing copied again
    x[:50] *= -1.0  # changed in place: same address, new bytes
    changed = model(mirrored2)
    changed.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    assert len(files() - before) == 2 and files() - before != kept  # copied afresh
    fresh = model(mirrored2)
    fresh.fit(x.copy(), y.copy(), batch_size=32, epochs=1, shuffle=False, verbose=0)
    assert all(a.tobytes() == b.tobytes()  # trained on the changed rows, not the old copy
               for a, b in zip(changed.get_weights(), fresh.get_weights(), strict=True))
    del x
    assert files() == before


def test_bytes_are_compared_exactly():
    from labdist.data.placed_input import same

    a = np.arange(1001, dtype=np.float32)  # 4004 bytes: not a whole number of 8-byte words
    b = a.copy()
    assert same(a, b, block=64)
    b[1000] = np.nextafter(b[1000], 2e3)  # one bit, in the last block
    assert not same(a, b, block=64)
    c = np.zeros(0, np.float32)
    assert same(c, c.copy())



def test_a_copy_in_use_is_closed_only_when_its_fit_gives_it_back():
    """Two fits at once (two threads) on other arrays: the second takes the kept copy's place,
    yet the first's files stay until the first gives them back (a replica that had not mapped
    them yet would fail on a removed file)."""
    from labdist.data.placed_input import Kept

    kept = Kept()
    a, b = data(50), data(60)
    first = kept.take(list(a))
    second = kept.take(list(b))  # another fit, while the first runs
    paths = [p.path for p in first]
    assert all(os.path.exists(p) for p in paths)
    kept.give_back(first, keep=True)
    assert not any(os.path.exists(p) for p in paths)  # no longer kept, no longer used
    kept.give_back(second, keep=True)
    assert kept.take(list(b)) is second  # kept for the next fit on b
    kept.give_back(second, keep=False)  # unreadable on some replica: not worth keeping
    assert not any(os.path.exists(p.path) for p in second)
