"""A script that makes a strategy at its top level, outside `if __name__ == "__main__":`,
gets one line saying so, before any worker starts (Dask's spawned workers would run that
line again: before, 12 tracebacks and "Nanny failed to start"); so does a script read from
stdin. A guarded script, `python -c` and a function called under the guard run."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

UNGUARDED = """
import labdist as ld
strategy = ld.MirroredStrategy(num_replicas=2)
print(strategy.num_replicas_in_sync)
"""

MAIN_CALLED_BARE = """
import labdist as ld

def main():
    strategy = ld.MirroredStrategy(num_replicas=2)
    print(strategy.num_replicas_in_sync)

main()
"""

GUARDED = """
import labdist as ld

def main():
    strategy = ld.MirroredStrategy(num_replicas=2)
    print("replicas:", strategy.num_replicas_in_sync)
    strategy.close()

if __name__ == "__main__":
    main()
"""


def run(tmp_path, source, stdin=False):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(source))
    command = [sys.executable, "-"] if stdin else [sys.executable, str(script)]
    return subprocess.run(command, input=script.read_text() if stdin else None,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)


@pytest.mark.parametrize(("source", "line"), [(UNGUARDED, 3), (MAIN_CALLED_BARE, 8)])
def test_a_strategy_at_a_scripts_top_level_is_one_clear_error(tmp_path, source, line):
    done = run(tmp_path, source)
    assert done.returncode != 0
    assert (f"RuntimeError: labdist starts worker processes that import train.py again, "
            f"which would run its line {line} again in each: put the script's top-level code "
            'under `if __name__ == "__main__":`') in done.stderr, done.stderr
    assert done.stderr.count("Traceback") == 1 and "Nanny" not in done.stderr


def test_a_script_from_stdin_is_one_clear_error(tmp_path):
    done = run(tmp_path, GUARDED, stdin=True)
    assert done.returncode != 0
    assert "'<stdin>' cannot be imported: save the script to a file" in done.stderr, done.stderr
    assert done.stderr.count("Traceback") == 1 and "Nanny" not in done.stderr


def test_a_guarded_script_and_python_c_run(tmp_path):
    done = run(tmp_path, GUARDED)
    assert done.returncode == 0 and "replicas: 2" in done.stdout, done.stderr
    code = ("import labdist as ld; s = ld.MirroredStrategy(num_replicas=2); "
            "print(s.num_replicas_in_sync); s.close()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip().endswith("2"), done.stderr
