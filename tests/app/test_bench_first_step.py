"""bench/bench_first_step.py runs end to end without TensorFlow (its runner is not started
without LABDIST_BENCH_TF_PY): one fresh labdist process, every phase printed, no ratio."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_first_step.py"


@pytest.mark.timeout(180)
def test_one_round_prints_labdist_phases(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "LABDIST_BENCH_TF_PY"}
    out = subprocess.run([sys.executable, str(BENCH), "--rounds", "1", "--json",
                          str(tmp_path / "out.json")], capture_output=True, text=True,
                         env=env, timeout=170)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {line.split()[0]: line for line in out.stdout.splitlines() if line.strip()}
    for phase in ("import", "strategy", "model", "first", "total", "process"):
        assert phase in rows, out.stdout
    total = float(rows["total"].split()[-1])
    assert 0 < total < 120
    assert "TensorFlow / labdist" not in out.stdout
    assert (tmp_path / "out.json").exists()
