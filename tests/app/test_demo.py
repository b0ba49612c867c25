"""The README's main job: `labdist demo` on an embedded cluster, and the command line."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

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
    assert f"{spreads[0]:.3g} after step 1" in story and f"{spreads[-1]:.3g} at the end" in story
    shrank = spreads[-1] < max(spreads)
    assert ("never agree" in story) == shrank and ("keep parting" in story) == (not shrank)
    assert not any("drift" in line for line in lines)  # the numbers decide the words


_STEP = re.compile(r"^\s+step\s+(\d+)\s+loss=\s*([\d.]+)\s+w per replica=\[([^\]]*)\]")


def _printed_steps(lines: list[str]) -> list[list[tuple[int, float, list[float]]]]:
    """The step lines the demo printed, one list per training experiment (2. and 3.)."""
    runs: list[list] = []
    for line in lines:
        if re.match(r"^[23]\. ", line):
            runs.append([])
        elif runs and (m := _STEP.match(line)):
            runs[-1].append((int(m[1]), float(m[2]), [float(w) for w in m[3].split()]))
    return runs


def test_printed_steps_chart_and_report_agree(tmp_path):
    """What the demo printed is what its PNG draws and its report says: the same step numbers
    (counting from 1), the same copies of w and loss at those steps, and the
    ReplicaDivergenceWarning the report mentions is one the run printed."""
    from labdist.cli.report import chart, figure, page

    steps = 12
    lines: list[str] = []
    figures = run_demo(num_replicas=2, steps=steps, say=lines.append)
    runs = _printed_steps(lines)
    assert len(runs) == 2 and all(run[0][0] == 1 and run[-1][0] == steps for run in runs)
    fig = figure(figures["traces"])
    for ax, run in zip(fig.axes, runs, strict=False):  # the w panels, MEAN then NONE
        for r, replica_line in enumerate(ax.lines[:2]):
            xs, ys = list(replica_line.get_xdata()), list(replica_line.get_ydata())
            assert xs == list(range(1, steps + 1))
            for step, _, ws in run:
                assert round(float(ys[xs.index(step)]), 3) == pytest.approx(ws[r], abs=1e-3)
    for loss_line, run in zip(fig.axes[-1].lines, runs, strict=True):
        xs, ys = list(loss_line.get_xdata()), list(loss_line.get_ydata())
        for step, loss, _ in run:
            assert float(ys[xs.index(step)]) == pytest.approx(loss, abs=1e-4)

    png = chart(figures["traces"], tmp_path / "demo.png")
    report = page(figures, png, tmp_path / "report.html").read_text()
    for trace, run in zip(figures["traces"], runs, strict=True):
        step, loss, ws = run[-1]
        row = (f"<td>{trace['aggregation']}</td><td>{step}</td>"
               f"<td>{', '.join(f'{w:.3f}' for w in ws)}</td>")
        assert row in report and f"<td>{loss:.4f}</td>" in report
    printed_warning = [line for line in lines
                       if "labdist warned: ReplicaDivergenceWarning" in line]
    assert len(printed_warning) == 1 and "'w'" in printed_warning[0]  # the NONE run, once
    assert "labdist warned: <code>ReplicaDivergenceWarning</code>: Variable &#x27;w&#x27;" \
        in report
    (none_row,) = [line for line in lines if "ON_WRITE NONE" in line]
    assert "(warned: ReplicaDivergenceWarning)" in none_row
    assert sum("warned: ReplicaDivergenceWarning" in line for line in lines[:12]) == 1
    assert report.count("<td>ReplicaDivergenceWarning</td>") == 1


def test_the_command_prints_what_its_report_shows(tmp_path):
    """`labdist demo` end to end: its last printed step and final copies are the report's."""
    done = subprocess.run(
        [sys.executable, "-m", "labdist", "demo", "--steps", "6", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=180, check=True)
    runs = _printed_steps(done.stdout.splitlines())
    report = (tmp_path / "report.html").read_text()
    assert [run[-1][0] for run in runs] == [6, 6]
    for run in runs:
        assert f"<td>6</td><td>{', '.join(f'{w:.3f}' for w in run[-1][2])}</td>" in report
    assert (tmp_path / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
