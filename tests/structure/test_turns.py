"""The suite's turns under `pytest -n 2` (tests/turns.py), in a pytest run of its own: a test
marked alone overlaps no other test, a module of them keeps its turn from first to last, the
other tests do run side by side, and a process that has to wait lets its idle clusters go
first. The wait for a turn is not part of a test's time (pytest-timeout's)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

RECORD = """
import os, time
import pytest

def record(name, seconds):
    start = time.monotonic()
    time.sleep(seconds)
    line = f"{name} {start} {time.monotonic()}\\n"
    fd = os.open(os.environ["TURNS_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, line.encode())
    os.close(fd)
"""


def _write(folder: Path) -> None:
    (folder / "conftest.py").write_text(textwrap.dedent("""
        import os
        import turns
        from turns import pytest_configure, pytest_runtest_protocol

        def _waited():
            fd = os.open(os.environ["TURNS_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            os.write(fd, b"waited\\n")
            os.close(fd)

        turns.BEFORE_WAITING.append(_waited)
    """))
    for m, n in (("a", 3), ("c", 16)):  # unequal: whatever the order, two files overlap
        (folder / f"test_{m}.py").write_text(RECORD + "".join(
            f"\ndef test_{i}():\n    record('{m}-{i}', 0.15)\n" for i in range(n)))
    alone = "".join(f"\ndef test_{i}():\n    record('alone-{i}', 0.6)\n" for i in range(3))
    (folder / "test_b_alone.py").write_text(RECORD + "\npytestmark = pytest.mark.alone\n"
                                            + alone)


def test_alone_tests_run_alone_and_the_rest_side_by_side(tmp_path):
    _write(tmp_path)
    log = tmp_path / "turns.log"
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile",
         "-p", "no:cacheprovider", "-o", "markers=alone: runs alone", str(tmp_path),
         "--timeout=1.2"],  # each test takes under it; the wait for a turn (1.8 s) does not
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(TESTS), "TURNS_LOG": str(log)})
    assert out.returncode == 0, out.stdout + out.stderr
    lines = log.read_text().split()
    assert "waited" in lines  # the shared tests' process found an alone one running
    spans = [(n, float(s), float(e)) for n, s, e in
             (line.split() for line in log.read_text().splitlines() if line != "waited")]
    assert len(spans) == 3 + 16 + 3

    def overlap(x, y):
        return x[1] < y[2] and y[1] < x[2]

    alone = sorted((s for s in spans if s[0].startswith("alone")), key=lambda s: s[1])
    others = [s for s in spans if not s[0].startswith("alone")]
    for a in alone:
        assert not [o for o in others if overlap(a, o)], a
    # the module's turn is kept: no other test starts between its first and its last
    assert not [o for o in others if alone[0][1] < o[1] < alone[-1][2]]
    assert any(overlap(x, y) for x in others for y in others if x[0][0] != y[0][0])
