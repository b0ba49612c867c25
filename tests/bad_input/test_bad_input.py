"""Bad input to the Python API is refused before anything starts, trains, allocates or waits:
the exception names the parameter, the value and what is allowed, and nothing changed (no
worker process started, weights and files as they were, the strategy still usable)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest

import labdist as ld
from labdist import checks
from labdist.cluster import capacity

NAN, INF = float("nan"), float("inf")


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.fixture
def no_new_processes():
    """The call under test starts no process (and so no cluster)."""
    before = children()
    start = time.monotonic()
    yield
    assert time.monotonic() - start < 5, "refused, but not at once"
    assert children() <= before, "a refused call left processes behind"


# -- 1. process counts ----------------------------------------------------------------------
@pytest.mark.parametrize(("make", "names"), [
    (lambda: ld.MirroredStrategy(num_replicas=10**6), "num_replicas=1000000"),
    (lambda: ld.MultiWorkerMirroredStrategy(num_replicas=10**6), "num_replicas=1000000"),
    (lambda: ld.ParameterServerStrategy(num_workers=10**6), "num_workers=1000000 + num_ps=1"),
    (lambda: ld.ParameterServerStrategy(num_ps=10**6), "num_workers=2 + num_ps=1000000"),
])
def test_process_counts_the_machine_cannot_hold_are_refused(make, names, no_new_processes):
    with pytest.raises(ValueError) as info:
        make()
    text = str(info.value)
    assert names in text, text
    assert "worker processes" in text and "CPU(s)" in text and "GiB available" in text, text
    assert f"allowed: at most {min(m for m in capacity.limits().values() if m)}" in text, text
    assert "cluster=" in text, text  # where a bigger run goes


def test_the_cpu_bound_allows_a_few_replicas_per_core():
    allowed = capacity.limits()
    assert allowed["cpus"] == max(capacity.MIN_ALLOWED, capacity.PER_CPU * capacity.cpus())
    capacity.check_local_workers(4, "num_replicas=4")  # what the tests themselves start
    with pytest.raises(ValueError, match=r"num_replicas=\d+ asks .* \(\d+ CPU\(s\): at most"):
        capacity.check_local_workers(allowed["cpus"] + 1, f"num_replicas={allowed['cpus'] + 1}")


def test_the_process_limit_is_a_bound_too():
    """Under a tight RLIMIT_NPROC (ulimit -u) a few replicas are already too many: refused
    naming the limit, in a process of its own so the limit binds nothing else."""
    code = textwrap.dedent("""
        import resource, labdist as ld
        from labdist.cluster import capacity
        hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
        resource.setrlimit(resource.RLIMIT_NPROC, (capacity.tasks_in_use() + 12, hard))
        try:
            ld.MirroredStrategy(num_replicas=4)
        except ValueError as e:
            print(e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert "num_replicas=4 asks an embedded cluster for 4 worker processes" in out.stdout, \
        out.stdout + out.stderr
    assert "(ulimit -u)" in out.stdout, out.stdout


# -- 2. non-finite numbers ------------------------------------------------------------------
@pytest.mark.parametrize("value", [NAN, INF, -INF, 0, -1, True, "5"])
@pytest.mark.parametrize("name", ["collective_timeout", "connect_timeout"])
def test_mirrored_timeouts_must_be_finite_and_positive(name, value, no_new_processes):
    with pytest.raises(ValueError) as info:
        ld.MirroredStrategy(num_replicas=2, **{name: value})
    assert f"{name}={value!r} is not allowed; use a finite number of seconds > 0" \
        in str(info.value)


@pytest.mark.parametrize("value", [NAN, INF, 0])
def test_parameter_server_connect_timeout_must_be_finite(value, no_new_processes):
    with pytest.raises(ValueError, match=rf"connect_timeout={value!r} is not allowed; use a "
                                         "finite number of seconds > 0"):
        ld.ParameterServerStrategy(num_workers=1, connect_timeout=value)


@pytest.mark.parametrize(("make", "needle"), [
    (lambda: ld.optimizers.SGD(learning_rate=INF), "learning_rate=inf is not allowed; use a "
                                                   "finite number > 0"),
    (lambda: ld.optimizers.SGD(learning_rate=NAN), "learning_rate=nan is not allowed"),
    (lambda: ld.optimizers.SGD(momentum=NAN), "momentum=nan is not allowed; use a finite "
                                              "number in [0, 1)"),
    (lambda: ld.optimizers.SGD(nesterov="yes"), "nesterov='yes' is not allowed; use True or "
                                                "False"),
    (lambda: ld.optimizers.Adam(beta_1=INF), "beta_1=inf is not allowed"),
    (lambda: ld.optimizers.Adam(epsilon=INF), "epsilon=inf is not allowed"),
    (lambda: ld.optimizers.Adagrad(initial_accumulator_value=NAN),
     "initial_accumulator_value=nan is not allowed; use a finite number >= 0"),
    (lambda: ld.layers.Dropout(NAN), "rate=nan is not allowed; use a finite number in [0, 1)"),
    (lambda: ld.callbacks.EarlyStopping(min_delta=NAN), "min_delta=nan is not allowed"),
    (lambda: ld.datasets.synthetic.regression(noise=INF), "noise=inf is not allowed"),
])
def test_non_finite_hyperparameters_are_refused(make, needle):
    with pytest.raises((ValueError, TypeError)) as info:
        make()
    assert needle in str(info.value), str(info.value)


def test_huge_finite_learning_rates_are_allowed():
    """Documented: labdist cannot know a problem's scale, so only non-finite rates are
    refused (the command line reports the diverged run instead: test_bad_input_cli.py)."""
    assert ld.optimizers.SGD(learning_rate=1e30).learning_rate == 1e30


def test_checks_read_the_same_everywhere():
    with pytest.raises(ValueError, match=r"^x=nan is not allowed; use a finite number in "
                                         r"\[0, 1\)$"):
        checks.fraction("x", NAN)
    assert checks.positive("t", INF, infinite_ok=True) == INF
    assert checks.integer("n", np.int64(3), 1) == 3
    with pytest.raises(ValueError, match=r"^n=True is not allowed; use an integer >= 1$"):
        checks.integer("n", True, 1)
    assert math.isnan(NAN)  # (the module's constants are what they say)


# -- 4. sizes ---------------------------------------------------------------------------------
def test_a_variable_of_an_enormous_shape_is_refused_by_labdist():
    huge = np.broadcast_to(np.float32(0), (10**6, 10**6))  # a view: 4 TB if copied
    with pytest.raises(ValueError) as info:
        ld.Variable(huge)
    text = str(info.value)
    assert "initial_value of shape (1000000, 1000000)" in text, text
    assert "GiB" in text and "allowed: at most" in text, text


def test_a_dense_layer_too_large_to_hold_is_refused_when_built():
    with pytest.raises(ValueError, match=r"Dense\(units=1000000000\) kernel of shape "
                                         r"\(5, 1000000000\) would take .* allowed: at most"):
        ld.models.Sequential([ld.layers.Dense(10**9, input_shape=(5,))])


# -- 7. smaller -------------------------------------------------------------------------------
def test_variable_name_must_be_a_string():
    with pytest.raises(TypeError, match=r"name=123 is not allowed; use a string or None"):
        ld.Variable(1.0, name=123)
    assert ld.Variable(1.0, name="w").name == "w"


def test_reduce_names_axis_when_it_is_a_bool(mirrored2):
    values = mirrored2.run(lambda: np.ones(3, np.float32))
    with pytest.raises(TypeError, match=r"axis=True is not allowed; use an integer or None"):
        mirrored2.reduce("SUM", values, axis=True)
    np.testing.assert_array_equal(mirrored2.reduce("SUM", values, axis=None), [2, 2, 2])


@pytest.mark.parametrize("timeout", [NAN, -1.0, INF])
def test_remote_value_fetch_timeout_must_be_finite(timeout):
    """A nan deadline compares false forever: fetch would never time out."""
    from labdist.parameter_server.remote_values import RemoteValue

    with pytest.raises(ValueError, match=rf"timeout={timeout!r} is not allowed; use None or a "
                                         "finite number >= 0"):
        RemoteValue().fetch(timeout=timeout)


@pytest.mark.parametrize("shape", [(0,), (-3,), ("4",), (4, 0), (), [4]])
def test_dense_input_shape_must_be_positive_integers(shape):
    """A tuple of positive integers: (features,), or (steps, features) for a Dense applied at
    every step, as in Keras."""
    with pytest.raises(ValueError) as info:
        ld.layers.Dense(2, input_shape=shape)
    assert f"input_shape={shape!r} is not allowed; use a tuple of positive integers, like " \
           "(64,)" == str(info.value)


def test_numpy_integers_are_integers(tmp_path):
    """`checks.integer` takes numpy's integers, and stores them as Python ints (a saved
    model's JSON config could not hold np.int64)."""
    layer = ld.layers.Dense(np.int64(3), input_shape=(4,))
    assert type(layer.units) is int
    model = ld.models.Sequential([layer])
    model.save(tmp_path / "m")
    assert ld.models.load_model(tmp_path / "m").layers[0].units == 3
