"""bench/bench_time.py runs end to end and prints what the quiet benchmark pass reads: both
target ratios with PASS or FAIL, and the trace's gathering + writing cost per 1000 spans.
One pair of one epoch on a real 2-replica cluster: the figures themselves mean nothing here."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import bench_time as bt  # noqa: E402


@pytest.mark.timeout(300)
def test_bench_time_prints_both_targets_with_a_verdict(tmp_path, capsys):
    out = tmp_path / "time.json"
    assert bt.main(["--pairs", "1", "--epochs", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert re.search(r"recording on / off, steps/s: +\d\.\d{3} \(cost -?\d+\.\d %, "
                     r"target <= 3 %: (PASS|FAIL);", text), text
    assert re.search(r"traced / untraced, steps/s: +\d\.\d{3} \(cost -?\d+\.\d %, "
                     r"target <= 10 %: (PASS|FAIL);", text), text
    assert re.search(r"\d+\.\d ms per 1000 spans", text), text
    figures = json.loads(out.read_text())
    assert len(figures["recording"]) == len(figures["tracing"]) == 1
    assert figures["exit_ms_per_1000_spans"][0] > 0


def test_the_verdict_is_the_median_cost_against_the_target():
    assert "PASS" in bt.verdict([0.99, 0.96, 1.0], 0.03)  # median 0.99: 1 % cost
    assert "FAIL" in bt.verdict([0.90, 0.95, 0.80], 0.03)  # median 0.90: 10 % cost
    assert "cost 5.0 %" in bt.verdict([0.95], 0.10)
