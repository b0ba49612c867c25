"""Lab benchmark, in a real JupyterLab and headless Debian chromium (as tests/lab/browser/):

1. click -> applied -> shown: a button of the aggregation control is clicked while the run
   trains; the kernel records when the change request arrived and when the runner had
   applied it at a step boundary, and the page when its marker reached the spread chart.
   Reported: browser -> kernel, kernel -> applied, click -> applied, click -> shown, and the
   step time then (the target is "within one step, <= 100 ms at small models").
2. charts at 20 updates/s: while the run streams deltas (the publisher sends at most 20
   frames a second), the browser's frame rate (requestAnimationFrame callbacks/s), each
   chart's redraws/s and draw time, and the kernel's Python time per frame.

Run: `python bench/bench_lab.py [--quick] [--json PATH]`; both commsOverSubshells settings
(--quick: "on" only, fewer clicks). Never fails on a number. Figures: docs/benchmarks.md.
The measuring code is tests/lab/browser/responsiveness.py, shared with the browser test that
holds the bars (tests/lab/browser/test_lab_responsive.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

# the harness and the measuring code the browser tests use (tests/lab/browser/)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "lab" / "browser"))
from harness import JupyterLab, Notebook, browser, write_notebook
from responsiveness import KERNEL_CELL, click_figures, clicks, frames, kernel_view

CELLS = [
    "import json, time\nimport labdist as ld\nlab = ld.Lab(num_replicas=2, skew=1.0, pace={pace})\n"
    "lab.show()",
    "lab.run()",
    KERNEL_CELL,
    "lab.close()",
]


def measure(subshells: str, n_clicks: int, window_s: float, pace: float) -> dict:
    root = Path(tempfile.mkdtemp(prefix="bench-lab-"))
    write_notebook(root / "lab.ipynb", [CELLS[0].format(pace=pace), *CELLS[1:]])
    with JupyterLab(root, subshells) as server, browser() as page:
        nb = Notebook(page, server, "lab.ipynb")
        nb.run(0)
        page.locator(".labdist-panel").wait_for()
        nb.run(1)
        time.sleep(3.0)  # warm: the charts have data, the kernel's caches are filled
        drawn = frames(page, window_s)
        sent = clicks(page, n_clicks)
        got = kernel_view(nb, 2)
        nb.run(3)
    figures = click_figures(sent, got)
    late = figures.pop("steps_late")
    return {
        "subshells": subshells, **figures,
        "steps_late": {"max": max(late), "mean": sum(late) / len(late)},
        "browser_frames_per_s": drawn["browser_frames_per_s"], "charts": drawn["charts"],
        "python_ms_per_frame": got["publish_s"] / max(got["frames"], 1) * 1e3,
        "lab_steps": got["steps"], "window_s": window_s, "pace": pace,
    }


def report(r: dict) -> None:
    def row(name: str, s: dict) -> str:
        return f"  {name:<22} median {s['median']:7.1f}  p90 {s['p90']:7.1f}  max {s['max']:7.1f}"

    pace = f"at most {r['pace']:g} steps/s" if r["pace"] else "as fast as it goes"
    print(f"commsOverSubshells {r['subshells']}, the lab {pace}: {r['clicks']} clicks")
    for key in ("click_to_kernel_ms", "kernel_to_applied_ms", "click_to_applied_ms",
                "click_to_shown_ms", "step_ms"):
        print(row(key, r[key]))
    print(f"  steps that ran the old way after the request: max {r['steps_late']['max']}, "
          f"mean {r['steps_late']['mean']:.2f} (the step in flight)")
    print(f"  browser frames/s {r['browser_frames_per_s']:.1f}; python per frame "
          f"{r['python_ms_per_frame']:.2f} ms")
    for title, c in r["charts"].items():
        print(f"    {title[:52]:<52} updates/s {c['updates_per_s']:5.1f}  redraws/s "
              f"{c['redraws_per_s']:5.1f}  draw {c['draw_ms']:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="subshells on only, 6 clicks")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--subshells", choices=["on", "off", "both"], default="both",
                        help="JupyterLab's commsOverSubshells setting(s) to measure")
    parser.add_argument("--pace", type=float, default=100.0,
                        help="the lab's steps/s cap (0: as fast as it goes; default 100)")
    args = parser.parse_args()
    settings = ["on", "off"] if args.subshells == "both" else [args.subshells]
    if args.quick:
        settings = settings[:1]
    n_clicks, window = (6, 3.0) if args.quick else (20, 6.0)
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs "
          "(the browser, JupyterLab, the kernel and both workers share them)")
    results = [measure(s, n_clicks, window, args.pace) for s in settings]
    for r in results:
        report(r)
    if args.json:
        args.json.write_text(json.dumps({"machine": platform.platform(),
                                         "cpus": os.cpu_count(), "results": results},
                                        indent=1))


if __name__ == "__main__":
    main()
