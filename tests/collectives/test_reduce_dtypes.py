"""What `ctx.all_reduce` and `strategy.reduce` accept and which dtype they give back
(docs/semantics.md §3): numbers only, a clear TypeError for anything else (strings used to
concatenate), and the input's dtype kept as TensorFlow keeps it, except the MEAN of integers
(float64, TensorFlow's true division) — through real worker processes."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_strategy

import labdist as ld

OPS = ["SUM", "MEAN"]
DTYPES = ["int32", "int64", "float32", "float64", "complex64"]


@pytest.fixture(scope="module")
def s():
    return make_strategy("mirrored-2")


def _vectors(s, dtype):
    """Replica r's value: [1, 2, 3] * (r + 1), as `dtype`, made on the replicas."""
    return s.run(lambda: (np.arange(1, 4) * (ld.get_replica_context().replica_id_in_sync_group
                                              + 1)).astype(dtype))


def _expected_dtype(op, dtype):
    """TensorFlow's: SUM keeps the dtype, MEAN of integers is a true division (float64)."""
    if op == "MEAN" and np.dtype(dtype).kind in "iu":
        return np.dtype("float64")
    return np.dtype(dtype)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("axis", [None, 0])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_strategy_reduce_keeps_the_dtype(s, dtype, op, axis):
    value = _vectors(s, dtype)
    out = s.reduce(op, value, axis=axis)
    stacked = np.stack([np.arange(1, 4), 2 * np.arange(1, 4)])  # replica 0, replica 1
    if axis is None:
        want = stacked.sum(axis=0) if op == "SUM" else stacked.sum(axis=0) / 2
    else:
        want = stacked.sum() if op == "SUM" else stacked.sum() / stacked.size
    np.testing.assert_allclose(out, want)
    assert np.asarray(out).dtype == _expected_dtype(op, dtype), (dtype, op, axis)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce_keeps_the_dtype(s, dtype, op):
    value = _vectors(s, dtype)
    out = s.run(lambda x: ld.get_replica_context().all_reduce(op, x), args=(value,))
    for local in s.experimental_local_results(out):
        want = np.arange(1, 4) * 3 if op == "SUM" else np.arange(1, 4) * 1.5
        np.testing.assert_allclose(local, want)
        assert local.dtype == _expected_dtype(op, dtype)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("value", "type_name"), [
    ("hello", "str"), (b"bytes", "bytes"), (object(), "object"), (True, "bool"),
    (np.array([True, False]), "ndarray"), (np.array(["a", "b"]), "ndarray"),
    (np.datetime64("2024-01-01"), "datetime64"),
])
def test_all_reduce_refuses_what_is_not_a_number(s, value, type_name):
    """'hello' + 'hello' is not a sum across replicas: a TypeError naming the value's type and
    what is allowed, on every replica alike; the strategy stays usable."""
    with pytest.raises(TypeError, match=rf"all_reduce.*{type_name}.*allowed"):
        s.run(lambda: ld.get_replica_context().all_reduce("SUM", {"k": [1.0, value]}))
    out = s.run(lambda: ld.get_replica_context().all_reduce("SUM", 1))
    assert s.experimental_local_results(out) == (2, 2)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("value", ["hello", np.array([True, False]), b"x"])
def test_strategy_reduce_refuses_what_is_not_a_number(s, value):
    per_replica = s.run(lambda: value)
    for axis in (None, 0) if np.ndim(value) else (None,):
        with pytest.raises(TypeError, match=r"strategy.reduce.*allowed"):
            s.reduce("SUM", per_replica, axis=axis)


@pytest.mark.timeout(60)
def test_complex_all_reduce_is_a_complex_sum(s):
    """TensorFlow sums complex values across replicas; so does labdist (bit-identical)."""
    value = s.run(lambda: np.complex64(1 + 2j) * (ld.get_replica_context()
                                                  .replica_id_in_sync_group + 1))
    out = s.run(lambda x: ld.get_replica_context().all_reduce("MEAN", x), args=(value,))
    assert s.experimental_local_results(out) == (1.5 + 3j, 1.5 + 3j)
    assert s.experimental_local_results(out)[0].dtype == np.complex64
