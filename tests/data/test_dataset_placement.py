"""A distributed dataset of `labdist.batches(...)` placed once in /dev/shm
(data/dataset_placement.py): its elements travel to the replicas as row indices, yet
every element, every shard and every step's result is what unplaced batches give."""

from __future__ import annotations

import gc
import glob
import os
import pickle
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import labdist as ld
from labdist.shm import placed


def data(n=75):
    rng = np.random.default_rng(0)
    return rng.random((n, 6), dtype=np.float32), rng.integers(0, 4, n)


def files() -> set[str]:
    return set(glob.glob(f"{placed.SHM_DIR}/{placed.PREFIX}*"))


def elements(strategy, dataset, passes=2):
    """Each replica's components of every element, pass after pass, as plain arrays."""
    dist = strategy.experimental_distribute_dataset(dataset)
    out = []
    for _ in range(passes):
        for bx, by in dist:
            out.append([(np.array(a), np.array(b)) for a, b in zip(
                strategy.experimental_local_results(bx),
                strategy.experimental_local_results(by), strict=True)])
    return dist, out


def shard_sums(x, y):
    return float(x.sum()), int(y.sum()), len(x)


@pytest.mark.parametrize("shuffle", [False, True])
def test_placed_elements_are_the_unplaced_elements(mirrored2, monkeypatch, shuffle):
    x, y = data()
    seen = {}
    for flag in ("0", "1"):
        monkeypatch.setenv(placed.ENV, flag)
        dist, seen[flag] = elements(mirrored2, ld.batches((x, y), 16, shuffle=shuffle, seed=3))
        bx, _ = next(iter(dist))
        component = mirrored2.experimental_local_results(bx)[1]
        assert isinstance(component, placed.Rows) == (flag == "1")
    assert len(seen["1"]) == 2 * 5  # 75 samples: 4 batches of 16 and one of 11, twice
    for plain, moved in zip(seen["0"], seen["1"], strict=True):
        for (a, b), (c, d) in zip(plain, moved, strict=True):
            assert a.tobytes() == c.tobytes() and b.tobytes() == d.tobytes()


def test_a_placed_shard_travels_as_indices_and_cannot_be_changed_on_the_driver(mirrored2):
    x, y = data(640)
    bx, _ = next(iter(mirrored2.experimental_distribute_dataset(ld.batches((x, y), 128))))
    shard = mirrored2.experimental_local_results(bx)[1]
    assert shard.tobytes() == x[64:128].tobytes()
    assert len(pickle.dumps(shard)) < shard.nbytes / 4  # a file name and a slice, not rows
    arrived = pickle.loads(pickle.dumps(shard))  # what the replica gets: rows of its own
    assert type(arrived) is np.ndarray and arrived.flags.writeable
    assert arrived.tobytes() == shard.tobytes()
    with pytest.raises(ValueError, match="read-only"):
        shard[0, 0] = 1.0  # a tf.data element is immutable: what was sent is what is shown
    derived = shard * 2  # anything computed from it is an ordinary array, sent by value
    assert pickle.loads(pickle.dumps(derived)).tobytes() == (x[64:128] * 2).tobytes()
    assert type(derived) is np.ndarray and repr(derived).startswith("array(")
    assert type(shard[:3]) is np.ndarray and type(shard.mean(axis=0)) is np.ndarray
    assert isinstance(shard.sum(), np.floating) and shard[0, 0] == x[64, 0]


@pytest.mark.parametrize("steps", [1, 3])
def test_steps_on_placed_elements_compute_what_unplaced_ones_do(mirrored2, monkeypatch, steps):
    x, y = data()
    results = {}
    for flag in ("0", "1"):
        monkeypatch.setenv(placed.ENV, flag)
        dist = mirrored2.experimental_distribute_dataset(ld.batches((x, y), 10, shuffle=True,
                                                                    seed=1))
        got = []
        if steps == 1:
            for bx, by in dist:  # the README's loop: one run per element
                got.append(mirrored2.experimental_local_results(
                    mirrored2.run(shard_sums, args=(bx, by))))
        else:  # the iterator as the argument: each step of the call takes its next element
            it = iter(dist)
            for _ in range(2):
                got.append(mirrored2.experimental_local_results(mirrored2.run(
                    lambda batch: shard_sums(*batch), args=(it,), steps=steps)))
        results[flag] = got
    assert results["0"] == results["1"]
    assert len(results["1"]) == (8 if steps == 1 else 2)


def test_the_copy_is_taken_once_and_goes_with_the_dataset(mirrored2):
    x, y = data()
    before = files()
    dist = mirrored2.experimental_distribute_dataset(ld.batches((x, y), 25))
    first = [mirrored2.run(shard_sums, args=batch) for batch in dist]
    assert len(files() - before) == 2  # x and y, once for every pass
    x[:] = 0.0  # as with tf.data, which copied the arrays: a later change does not show
    again = [mirrored2.run(shard_sums, args=batch) for batch in dist]
    assert [mirrored2.experimental_local_results(r) for r in again] == [
        mirrored2.experimental_local_results(r) for r in first]
    assert len(files() - before) == 2
    del dist, first, again
    gc.collect()
    assert files() == before


def test_datasets_that_cannot_be_placed_travel_as_before(mirrored2, monkeypatch):
    before = files()
    words = np.array([{"a": i} for i in range(8)], dtype=object)  # objects: nothing to map
    dist = mirrored2.experimental_distribute_dataset(ld.batches(words, 4))
    assert [mirrored2.experimental_local_results(b)[1][0] for b in dist] == [{"a": 2},
                                                                              {"a": 6}]
    plain = mirrored2.experimental_distribute_dataset([np.arange(4.0)])  # not ld.batches
    assert type(mirrored2.experimental_local_results(next(iter(plain)))[0]) is np.ndarray
    monkeypatch.setenv(placed.ENV, "0")
    x, _ = data(8)
    off = mirrored2.experimental_distribute_dataset(ld.batches(x, 4))
    assert type(mirrored2.experimental_local_results(next(iter(off)))[0]) is np.ndarray
    assert files() == before


def test_one_process_strategies_do_not_place():
    x, _ = data(8)
    strategy = ld.OneDeviceStrategy(device="cpu")
    element = next(iter(strategy.experimental_distribute_dataset(ld.batches(x, 4))))
    assert type(element) is np.ndarray


KILLED = """
import numpy as np
import labdist as ld
from labdist.shm import placed

with ld.MirroredStrategy(num_replicas=2) as strategy:
    dist = strategy.experimental_distribute_dataset(ld.batches(np.ones((8, 3)), 4))
    element = next(iter(dist))
    print(element.values[0]._placed[0][0], flush=True)  # the placed file's path
    input()  # until killed
"""


@pytest.mark.timeout(120)
def test_a_driver_killed_with_its_dataset_placed_leaves_no_file():
    """The files carry the driver's pid, so its janitor removes them after `kill -9`."""
    driver = subprocess.Popen([sys.executable, "-c", KILLED], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        path = driver.stdout.readline().strip()
        assert path.startswith(f"{placed.SHM_DIR}/{placed.PREFIX}"), driver.stderr.read()
        assert os.path.exists(path)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(30)
        for pipe in (driver.stdin, driver.stdout, driver.stderr):
            pipe.close()
    deadline = time.monotonic() + 10
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(path)
