"""The README's main job: `labdist demo` on an embedded cluster, and the command line."""

from __future__ import annotations

import subprocess
import sys

from labdist.demo import run_demo


def test_demo_converges_with_mean_and_drifts_with_none():
    lines: list[str] = []
    figures = run_demo(num_replicas=2, steps=8, say=lines.append)
    assert figures["spread_mean"] == 0.0  # all-reduced updates keep copies bit-identical
    assert figures["spread_none"] > 0.1  # skewed shards, no aggregation: the copies drift
    assert any("ON_READ  SUM" in line and "read=23" in line for line in lines)


def test_command_line():
    out = subprocess.run([sys.executable, "-m", "labdist", "info"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert "labdist" in out and "distributed" in out
    bad = subprocess.run([sys.executable, "-m", "labdist", "demo", "--replicas", "0"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--replicas" in bad.stderr and "Traceback" not in bad.stderr


def test_demo_text_says_what_the_spread_did():
    lines: list[str] = []
    figures = run_demo(num_replicas=2, steps=30, say=lines.append)
    ws = figures["traces"][1]["w"]
    spreads = [max(w) - min(w) for w in ws]
    (story,) = [line for line in lines if "spread of w:" in line]
    assert f"{spreads[0]:.3g} after step 0" in story and f"{spreads[-1]:.3g} at the end" in story
    shrank = spreads[-1] < max(spreads)
    assert ("never agree" in story) == shrank and ("keep parting" in story) == (not shrank)
    assert not any("drift" in line for line in lines)  # the numbers decide the words
