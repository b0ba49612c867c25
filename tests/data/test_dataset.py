"""`ld.data.Dataset`, tf.data's small core: what each step does to the elements and to the
count, that each pass runs the pipeline again (a new shuffle order), and that `fit`,
`evaluate`, `predict` and `experimental_distribute_dataset` take a batched dataset as
TensorFlow's do."""

from __future__ import annotations

import numpy as np
import pytest

import labdist as ld

X = np.arange(20, dtype=np.float32).reshape(10, 2)
Y = np.arange(10)


def test_slices_batches_and_counts():
    ds = ld.data.Dataset.from_tensor_slices((X, Y))
    first = next(iter(ds))
    assert np.array_equal(first[0], X[0]) and first[1] == 0
    batches = list(ds.batch(4))
    assert [len(b[1]) for b in batches] == [4, 4, 2] and len(ds.batch(4)) == 3
    assert [len(b[1]) for b in ds.batch(4, drop_remainder=True)] == [4, 4]
    np.testing.assert_array_equal(np.concatenate([b[0] for b in batches]), X)
    assert ds.batch(4).batch_size == 4 and ds.cardinality() == 10


def test_map_repeat_take_shard():
    ds = ld.data.Dataset.from_tensor_slices((X, Y)).map(lambda x, y: (x / 2, y + 1))
    assert [int(y) for _, y in ds.take(3)] == [1, 2, 3]
    assert len(ds.repeat(3)) == 30 and ds.repeat().cardinality() == -1
    assert [int(y) for _, y in ds.shard(3, 1)] == [2, 5, 8]
    assert len(ds.shard(3, 1)) == 3
    assert ds.prefetch(ld.data.AUTOTUNE) is ds and ds.cache() is ds
    assert [int(v) for v in ld.data.Dataset.range(2, 5)] == [2, 3, 4]


def test_shuffle_draws_a_new_order_each_pass_from_its_seed():
    ds = ld.data.Dataset.from_tensor_slices(Y).shuffle(10, seed=3)
    a, b = [int(v) for v in ds], [int(v) for v in ds]
    assert sorted(a) == list(range(10)) and a != b
    assert [int(v) for v in ld.data.Dataset.from_tensor_slices(Y).shuffle(10, seed=3)] == a
    fixed = ld.data.Dataset.from_tensor_slices(Y).shuffle(10, seed=3,
                                                         reshuffle_each_iteration=False)
    assert [int(v) for v in fixed] == [int(v) for v in fixed]
    assert [int(v) for v in ld.data.Dataset.from_tensor_slices(Y).shuffle(1)] == list(range(10))
    window = [int(v) for v in ld.data.Dataset.from_tensor_slices(Y).shuffle(2, seed=0)]
    assert all(v <= i + 1 for i, v in enumerate(window))  # a buffer of 2 looks one ahead


def model(strategy):
    with strategy.scope():
        m = ld.Sequential([ld.Input((64,)), ld.layers.Dense(10, activation="softmax")])
        m.compile(loss="sparse_categorical_crossentropy", optimizer=ld.optimizers.SGD(0.1),
                  metrics=["accuracy"])
    return m


def test_fit_on_a_dataset_is_fit_on_its_arrays(mirrored2):
    (x, y), (x_val, y_val) = ld.datasets.digits.load_data()
    ds = ld.data.Dataset.from_tensor_slices((x, y)).batch(64).prefetch(ld.data.AUTOTUNE)
    val = ld.data.Dataset.from_tensor_slices((x_val, y_val)).batch(100)
    a, b = model(mirrored2), model(mirrored2)
    history = a.fit(ds, epochs=2, validation_data=val, verbose=0)
    b.fit(x, y, batch_size=64, epochs=2, shuffle=False, validation_data=(x_val, y_val),
          verbose=0)
    for wa, wb in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_array_equal(wa, wb)
    assert "val_accuracy" in history.history
    assert a.evaluate(val, verbose=0) == b.evaluate(x_val, y_val, batch_size=100, verbose=0)
    np.testing.assert_array_equal(
        a.predict(ld.data.Dataset.from_tensor_slices(x_val).batch(50), verbose=0),
        b.predict(x_val, batch_size=50, verbose=0))


def test_a_shuffled_pipeline_trains_and_each_epoch_reshuffles(mirrored2):
    (x, y), (x_val, y_val) = ld.datasets.digits.load_data()
    ds = ld.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0).batch(64)
    m = model(mirrored2)
    m.fit(ds, epochs=4, verbose=0)
    assert m.evaluate(x_val, y_val, verbose=0, return_dict=True)["accuracy"] > 0.85


def test_a_distributed_dataset_feeds_a_custom_loop(mirrored2):
    ds = ld.data.Dataset.from_tensor_slices((X, Y)).batch(4)
    seen = []
    for xb, yb in mirrored2.experimental_distribute_dataset(ds):
        out = mirrored2.run(lambda x, y: len(y), args=(xb, yb))
        seen.append([int(v) for v in mirrored2.experimental_local_results(out)])
    assert seen == [[2, 2], [2, 2], [1, 1]]


@pytest.mark.parametrize(("make", "match"), [
    (lambda: ld.data.Dataset.from_tensor_slices((X, Y)).batch(4).repeat(),
     r"fit: the dataset repeats forever, so an epoch has no end; give steps_per_epoch=n"),
    (lambda: ld.data.Dataset.from_tensor_slices((X, Y)),
     r"fit: the dataset is not batched; add \.batch\(batch_size\)"),
    (lambda: ld.data.Dataset.from_tensor_slices(X).batch(4),
     r"fit: the dataset gives x alone; allowed: \(x, y\) batches"),
])
def test_datasets_fit_cannot_take_are_refused(make, match):
    m = model(ld.OneDeviceStrategy(device="cpu"))
    with pytest.raises(ValueError, match=match):
        m.fit(make(), verbose=0)


def test_y_beside_a_dataset_or_missing_is_named():
    m = model(ld.OneDeviceStrategy(device="cpu"))
    ds = ld.data.Dataset.from_tensor_slices((X, Y)).batch(4)
    with pytest.raises(ValueError, match=r"x is a dataset, so y comes from it"):
        m.fit(ds, Y, verbose=0)
    with pytest.raises(TypeError, match=r"fit: y is missing"):
        m.fit(X, verbose=0)
    with pytest.raises(ValueError, match=r"must share a first dimension"):
        ld.data.Dataset.from_tensor_slices((X, Y[:3]))
