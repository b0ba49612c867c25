"""What a step can do wrong that is not an ordinary exception (issue 13, findings 3 and 4): a
result, merge_call arguments or a warning that cannot travel to the driver, and a
BaseException (sys.exit, KeyboardInterrupt) raised in a step. Each is a clear error naming
the replica, and the strategy stays usable. Real worker processes, both step transports."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import warnings

import pytest
from conftest import make_strategy

import labdist as ld

KINDS = ["mirrored-2", "mirrored-2-tcp"]


def still_works(s: ld.Strategy) -> None:
    out = s.run(lambda: ld.get_replica_context().all_reduce("SUM", 1.0))
    assert s.experimental_local_results(out) == (2.0, 2.0)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
def test_a_result_that_cannot_be_pickled_is_a_type_error_naming_the_replica(kind):
    s = make_strategy(kind)
    for _ in range(2):  # twice: the first failure left nothing behind
        with pytest.raises(TypeError, match=r"the result of the step function on replica 0 "
                                            r"\(worker tcp://.*\) cannot be sent to the driver"):
            s.run(lambda: threading.Lock())
        still_works(s)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
def test_a_result_unpicklable_on_one_replica_only(kind):
    s = make_strategy(kind)

    def step():
        rank = ld.get_replica_context().replica_id_in_sync_group
        return threading.Lock() if rank == 1 else rank

    with pytest.raises(TypeError, match=r"step function on replica 1 .* cannot be sent"):
        s.run(step)
    still_works(s)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
def test_merge_call_arguments_that_cannot_be_pickled(kind):
    s = make_strategy(kind)

    def step():
        ctx = ld.get_replica_context()
        return ctx.merge_call(lambda strategy, lock: 1, args=(threading.Lock(),))

    with pytest.raises(TypeError, match=r"merge_call arguments .*cannot be sent to the driver"):
        s.run(step)
    still_works(s)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
def test_a_warning_that_cannot_be_pickled_arrives_as_text(kind):
    s = make_strategy(kind)

    class Text:
        def __str__(self):
            return "careful"

        def __reduce__(self):
            raise TypeError("no")

    def step():
        ld.get_replica_context().warn(Text(), UserWarning)
        return 5

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert s.experimental_local_results(s.run(step)) == (5, 5)
    assert [str(w.message) for w in caught] == ["careful"]
    still_works(s)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("raised, name", [
    ("exit", r"SystemExit\(3\)"),
    ("interrupt", "KeyboardInterrupt"),
    ("generator", r"GeneratorExit\('x'\)"),
])
def test_a_base_exception_in_a_step_is_an_error_naming_it(kind, raised, name):
    s = make_strategy(kind)

    def step():
        if raised == "exit":
            sys.exit(3)
        if raised == "interrupt":
            raise KeyboardInterrupt
        raise GeneratorExit("x")

    with pytest.raises(RuntimeError, match=rf"step function raised {name} on replica 0") as info:
        s.run(step)
    assert any("worker tcp://" in note for note in getattr(info.value, "__notes__", ()))
    still_works(s)


@pytest.mark.timeout(60)
def test_sys_exit_in_a_step_does_not_end_a_driver_script_silently(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent("""
        import sys
        import labdist as ld

        if __name__ == "__main__":
            with ld.MirroredStrategy(num_replicas=2) as s:
                s.run(lambda: sys.exit(3))
            print("not reached")
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=50, env=env)
    assert done.returncode not in (0, 3), done.stderr[-2000:]
    assert "not reached" not in done.stdout
    assert "RuntimeError: the step function raised SystemExit(3) on replica 0" in done.stderr
