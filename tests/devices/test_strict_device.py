"""The strict device double (labdist/devices/strict/array.py): a numpy-backed stand-in for cupy
whose arrays refuse to become host arrays implicitly, so host/device mix-ups fail on a laptop the
way they fail on a GPU. First the double on its own, then through real strategies on it
(docs/semantics.md §1: values returned to the driver are host numpy arrays, whatever the device).
"""

from __future__ import annotations

import operator
import pickle

import numpy as np
import pytest

import labdist as ld
from labdist.devices import get_backend, to_host
from labdist.devices.strict.array import StrictDeviceArray

BACKEND = get_backend("strict")
xp = BACKEND.xp


@pytest.fixture
def x() -> StrictDeviceArray:
    return xp.asarray([1.0, 2.0, 3.0])


# -- the double on its own ----------------------------------------------------------------------
def test_backend_is_a_device_backend():
    assert BACKEND.name == "strict" and BACKEND.is_device
    assert xp.ndarray is StrictDeviceArray
    d = BACKEND.to_device(np.arange(3.0))
    assert isinstance(d, StrictDeviceArray) and BACKEND.is_array(d)
    assert not BACKEND.is_array(np.arange(3.0))


@pytest.mark.parametrize("convert", [np.asarray, np.array, np.ascontiguousarray],
                         ids=["asarray", "array", "ascontiguousarray"])
def test_implicit_conversion_to_host_raises(x, convert):
    with pytest.raises(TypeError, match="to_host"):
        convert(x)


def test_implicit_conversion_to_host_raises_for_0d_and_with_dtype():
    with pytest.raises(TypeError):
        np.asarray(xp.asarray(2.5))
    with pytest.raises(TypeError):
        np.asarray(xp.asarray([1, 2]), dtype="float64")


def test_writing_a_device_array_into_a_host_array_raises(x):
    host = np.zeros(3)
    with pytest.raises(TypeError):
        host[...] = x
    assert host.tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "mix",
    [
        lambda d, h: d + h,
        lambda d, h: h + d,
        lambda d, h: d * h,
        lambda d, h: h - d,
        lambda d, h: d @ h,
        lambda d, h: d < h,
        lambda d, h: d == h,
        lambda d, h: np.add(d, h),
        lambda d, h: xp.add(d, h),
        lambda d, h: xp.maximum(h, d),
        lambda d, h: xp.concatenate([d, h]),
        lambda d, h: xp.stack((h, d)),
        lambda d, h: xp.where(d > 1, d, h),
        lambda d, h: np.dot(d, h),
        lambda d, h: d + np.ones(()),  # a 0-d host array is a host array too
    ],
    ids=["add", "radd", "mul", "rsub", "matmul", "lt", "eq", "np.add", "xp.add", "xp.maximum",
         "xp.concatenate", "xp.stack", "xp.where", "np.dot", "0d"],
)
def test_mixing_with_a_host_array_raises(x, mix):
    with pytest.raises(TypeError, match="host numpy array"):
        mix(x, np.ones(3))


def test_in_place_ops_with_a_host_array_raise_and_change_nothing(x):
    with pytest.raises(TypeError):
        x += np.ones(3)
    with pytest.raises(TypeError):
        x[...] = np.ones(3)
    with pytest.raises(TypeError):
        np.add(x, x, out=np.empty(3))
    assert to_host(x).tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize(
    "op",
    [operator.add, operator.sub, operator.mul, operator.truediv, operator.pow,
     lambda a, b: b - a, lambda a, b: b / a],
    ids=["add", "sub", "mul", "truediv", "pow", "rsub", "rtruediv"],
)
def test_arithmetic_with_python_scalars_stays_on_device(x, op):
    result = op(x, 2.0)
    assert isinstance(result, StrictDeviceArray)
    np.testing.assert_allclose(to_host(result), op(np.array([1.0, 2.0, 3.0]), 2.0))
    assert isinstance(op(x, 2), StrictDeviceArray)


def test_arithmetic_between_device_arrays_stays_on_device(x):
    y = xp.asarray([10.0, 20.0, 30.0])
    for result, want in [
        (x + y, [11.0, 22.0, 33.0]),
        (y - x, [9.0, 18.0, 27.0]),
        (x * y, [10.0, 40.0, 90.0]),
        (-x, [-1.0, -2.0, -3.0]),
        (abs(-x), [1.0, 2.0, 3.0]),
        (x > 1.5, [False, True, True]),
        (xp.maximum(x, 2.0), [2.0, 2.0, 3.0]),
        (np.add(x, y), [11.0, 22.0, 33.0]),
        (xp.concatenate([x, y])[2:4], [3.0, 10.0]),
        (xp.zeros(2), [0.0, 0.0]),
        (x.reshape(3, 1)[:, 0], [1.0, 2.0, 3.0]),
        (x.astype("float32"), [1.0, 2.0, 3.0]),
        (x[1:], [2.0, 3.0]),
        (x.T, [1.0, 2.0, 3.0]),
    ]:
        assert isinstance(result, StrictDeviceArray), type(result)
        np.testing.assert_array_equal(to_host(result), want)
    assert x.astype("float32").dtype == np.float32
    assert x.shape == (3,) and x.ndim == 1 and x.size == 3 and len(x) == 3
    assert float(x @ y) == 140.0
    # numpy scalars are not arrays: fine to mix, as with cupy
    assert isinstance(x * np.float32(2), StrictDeviceArray)


def test_scalar_results_stay_on_device(x):
    """cupy gives 0-d device arrays for elements and full reductions, never host scalars: only
    to_host / .get() / float() / .item() move data to the host."""
    for result in (x[0], x.sum(), xp.sum(x), x.max(), xp.mean(x), x @ x, next(iter(x))):
        assert isinstance(result, StrictDeviceArray), type(result)
        assert result.shape == ()
        with pytest.raises(TypeError):
            np.asarray(result)
    assert float(x.sum()) == 6.0 and x[2].item() == 3.0


def test_to_host_and_get_return_numpy_copies(x):
    for host in (to_host(x), x.get(), ld.to_host(x), BACKEND.to_host(x)):
        assert type(host) is np.ndarray
        assert host.tolist() == [1.0, 2.0, 3.0]
        host[0] = 100.0
        assert to_host(x)[0] == 1.0, "a host copy must not alias the device array"
    assert ld.to_host(5) == 5 and ld.to_host(np.ones(2)).tolist() == [1.0, 1.0]


def test_float_and_item_move_scalars_explicitly():
    s = xp.asarray(2.5)
    assert float(s) == 2.5 and s.item() == 2.5 and isinstance(s.item(), float)
    assert int(xp.asarray(7)) == 7
    assert bool(xp.asarray(1.0))
    assert float(xp.sum(xp.asarray([1.0, 2.0]))) == 3.0


def test_in_place_ops_keep_the_same_object(x):
    same = x
    x += 1.0
    assert x is same
    x *= xp.asarray([2.0, 2.0, 2.0])
    assert x is same
    x[...] = xp.asarray([7.0, 8.0, 9.0])
    assert x is same
    x[0] = 0.5
    assert x is same
    assert to_host(same).tolist() == [0.5, 8.0, 9.0]


def test_ufunc_out_writes_into_the_given_device_array(x):
    out = xp.zeros(3)
    result = np.add(x, x, out=out)
    assert to_host(out).tolist() == [2.0, 4.0, 6.0]
    assert result is out


def test_asarray_copies_host_input_and_keeps_device_input():
    host = np.array([1.0, 2.0])
    d = xp.asarray(host)
    host[0] = 50.0
    assert to_host(d).tolist() == [1.0, 2.0]
    assert xp.asarray(d) is d
    # nested sequences of device arrays are allowed, as in cupy.asarray
    stacked = xp.asarray([xp.asarray(1.0), xp.asarray(2.0)])
    assert isinstance(stacked, StrictDeviceArray) and to_host(stacked).tolist() == [1.0, 2.0]
    assert xp.asarray(d, dtype="float32").dtype == np.float32


def test_pickling_a_device_array_raises(x):
    with pytest.raises(TypeError, match="pickled"):
        pickle.dumps(x)
    with pytest.raises(TypeError):
        pickle.dumps({"nested": [x]})
    import cloudpickle

    with pytest.raises(TypeError):
        cloudpickle.dumps(x)
    assert isinstance(x.copy(), StrictDeviceArray) and x.copy() is not x


# -- through real strategies ------------------------------------------------------------------
@pytest.fixture(scope="module")
def mirrored_strict():
    strategy = ld.MirroredStrategy(num_replicas=2, device="strict", collective_timeout=20)
    yield strategy
    strategy.close()


@pytest.fixture(scope="module")
def one_device_strict():
    strategy = ld.OneDeviceStrategy(device="strict")
    yield strategy
    strategy.close()


@pytest.fixture(params=["mirrored", "one-device"])
def strict_strategy(request, mirrored_strict, one_device_strict) -> ld.Strategy:
    return mirrored_strict if request.param == "mirrored" else one_device_strict


def _results(strategy: ld.Strategy, value) -> tuple:
    return strategy.experimental_local_results(value)


@pytest.mark.cluster
def test_variables_live_on_the_device_and_come_back_as_numpy(strict_strategy):
    s = strict_strategy
    n = s.num_replicas_in_sync
    with s.scope():
        v = ld.Variable([1.0, 2.0], dtype="float32", aggregation="SUM")
    kinds = _results(s, s.run(lambda: (type(v.read_value()).__name__,
                                       type(ld.get_replica_context().xp.zeros(1)).__name__)))
    assert kinds == (("StrictDeviceArray", "StrictDeviceArray"),) * n
    for copy_ in _results(s, v):
        assert type(copy_) is np.ndarray and copy_.tolist() == [1.0, 2.0]
    out = s.run(lambda: v.read_value() * 2.0)
    for r in _results(s, out):
        assert type(r) is np.ndarray and r.dtype == np.float32 and r.tolist() == [2.0, 4.0]
    with s.scope():
        assert type(v.read_value()) is np.ndarray
        assert type(v.numpy()) is np.ndarray


@pytest.mark.cluster
def test_host_arguments_arrive_on_the_device(strict_strategy):
    s = strict_strategy
    out = s.run(lambda a, b: (type(a).__name__, type(b).__name__, a * 2.0),
                args=(np.arange(3.0), 1.5))
    for kind_a, kind_b, doubled in _results(s, out):
        assert (kind_a, kind_b) == ("StrictDeviceArray", "float")
        assert type(doubled) is np.ndarray and doubled.tolist() == [0.0, 2.0, 4.0]


@pytest.mark.cluster
def test_mixing_host_and_device_in_a_step_raises_at_the_driver(strict_strategy):
    s = strict_strategy
    with s.scope():
        v = ld.Variable(10.0, dtype="float32", aggregation="SUM")
    with pytest.raises(TypeError, match="host numpy array"):
        s.run(lambda: v.read_value() + np.ones(()))
    with pytest.raises(TypeError, match="host numpy array"):
        s.run(lambda: v.read_value() * np.full((), 2.0, dtype="float32"))
    # the explicit move works, and the strategy is still usable after the errors
    out = s.run(lambda: v.read_value() + ld.get_replica_context().xp.asarray(np.ones(())))
    assert [float(r) for r in _results(s, out)] == [11.0] * s.num_replicas_in_sync
    assert [float(r) for r in _results(s, v)] == [10.0] * s.num_replicas_in_sync


@pytest.mark.cluster
def test_implicit_host_conversion_in_a_step_raises_at_the_driver(strict_strategy):
    s = strict_strategy
    with s.scope():
        v = ld.Variable([1.0, 2.0], dtype="float32")
    with pytest.raises(TypeError, match="[Ii]mplicit conversion"):
        s.run(lambda: np.asarray(v))
    with pytest.raises(TypeError, match="to_host"):
        s.run(lambda: np.asarray(v.read_value()))
    out = s.run(lambda: ld.to_host(v.read_value()) + np.ones(2))  # the explicit move works
    for r in _results(s, out):
        assert type(r) is np.ndarray and r.tolist() == [2.0, 3.0]


@pytest.mark.cluster
def test_collectives_and_updates_on_the_device(mirrored_strict):
    s = mirrored_strict
    with s.scope():
        on_write = ld.Variable(10.0, dtype="float32", aggregation="SUM")
        on_read = ld.Variable(10.0, dtype="float32", synchronization="ON_READ",
                              aggregation="SUM")
    xs = s.experimental_distribute_values_from_function(
        lambda vctx: vctx.replica_id_in_sync_group + 1.0)

    def step(x):
        ctx = ld.get_replica_context()
        on_write.assign_add(x)
        on_read.assign_add(x)
        total = ctx.all_reduce("SUM", ctx.xp.asarray([x, 2 * x]))
        return type(x).__name__, type(total).__name__, total

    out = s.run(step, args=(xs,))
    for kind_x, kind_total, total in _results(s, out):
        assert (kind_x, kind_total) == ("StrictDeviceArray", "StrictDeviceArray")
        assert type(total) is np.ndarray and total.tolist() == [3.0, 6.0]
    assert [float(r) for r in _results(s, on_write)] == [13.0, 13.0]
    assert [float(r) for r in _results(s, on_read)] == [11.0, 12.0]
    with s.scope():
        assert float(on_read.read_value()) == 23.0
    _, _, totals = out
    reduced = s.reduce("SUM", totals, axis=None)
    assert type(reduced) is np.ndarray and reduced.tolist() == [6.0, 12.0]
    # a host numpy array handed to a collective on a device replica is refused
    with pytest.raises(TypeError, match="host numpy array"):
        s.run(lambda: ld.get_replica_context().all_reduce("SUM", np.ones(2)))


@pytest.mark.cluster
def test_one_device_strict_returns_plain_host_values(one_device_strict):
    s = one_device_strict
    assert s.num_replicas_in_sync == 1
    with s.scope():
        v = ld.Variable([1.0, 2.0], dtype="float32")
    out = s.run(lambda: v.assign_add(ld.get_replica_context().xp.asarray([1.0, 1.0])))
    assert type(out) is np.ndarray and out.tolist() == [2.0, 3.0]
    out[0] = 99.0  # a copy: the device copy is untouched
    assert _results(s, v)[0].tolist() == [2.0, 3.0]
    with pytest.raises(TypeError):
        s.run(lambda: v.read_value() + np.ones(2))
