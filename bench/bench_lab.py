"""Lab benchmark, in a real JupyterLab and headless Debian chromium (as tests/lab/browser/):

1. click -> applied: a button of the aggregation control is clicked while the run trains as
   fast as it can; the kernel records when the change request arrived and when the runner had
   applied it at a step boundary. Reported: browser -> kernel, kernel -> applied, the total,
   and the step time then (the target is "within one step, <= 100 ms at small models").
2. charts at 20 updates/s: while the run streams deltas (the publisher sends at most 20
   frames a second), the browser's frame rate (requestAnimationFrame callbacks/s), each
   chart's redraws/s and draw time, and the kernel's Python time per frame.

Run: `python bench/bench_lab.py [--quick] [--json PATH]`; both commsOverSubshells settings
(--quick: "on" only, fewer clicks). Never fails on a number. Figures: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "browser"))
from harness import JupyterLab, Notebook, browser, write_notebook

CELLS = [
    "import json, time\nimport labdist as ld\nlab = ld.Lab(num_replicas=2, skew=1.0, pace={pace})\n"
    "lab.show()",
    "lab.run()",
    "p = lab.panel.publisher\n"
    "print(json.dumps({'events': [[e.requested, e.applied, e.steps_late] for e in lab.events],"
    " 'frames': p.frames, 'publish_s': p.publish_s, 'steps': lab.step_count,"
    " 'step_times': lab.history.time,"
    " 'messages': {k: c.messages_sent for k, c in lab.panel.charts.items()}}))",
    "lab.close()",
]

CLICK = """(label) => {
  const b = [...document.querySelectorAll('.labdist-aggregation button')]
    .find((b) => b.textContent.trim() === label);
  const t = Date.now();
  b.click();
  return t;
}"""

PROBE = """() => {
  window.__frames = 0;
  const tick = () => { window.__frames += 1; requestAnimationFrame(tick); };
  requestAnimationFrame(tick);
}"""

CHARTS = """() => Object.fromEntries([...document.querySelectorAll('.labdist-chart')]
  .map((el) => [el.dataset.title, {draws: el.labdist.draws, ms: el.labdist.drawMs,
                                    updates: el.labdist.updates}]))"""


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def step_time_at(times: list[float], t: float) -> float:
    """The median step duration in the second before `t` (wall clock)."""
    near = [b - a for a, b in itertools.pairwise(times) if t - 1.0 <= b <= t]
    return statistics.median(near) if near else float("nan")


def measure(subshells: str, clicks: int, window_s: float, pace: float) -> dict:
    root = Path(tempfile.mkdtemp(prefix="bench-lab-"))
    write_notebook(root / "lab.ipynb", [CELLS[0].format(pace=pace), *CELLS[1:]])
    with JupyterLab(root, subshells) as server, browser() as page:
        nb = Notebook(page, server, "lab.ipynb")
        nb.run(0)
        page.locator(".labdist-panel").wait_for()
        nb.run(1)
        time.sleep(3.0)  # warm: the charts have data, the kernel's caches are filled
        page.evaluate(PROBE)
        before, t0 = page.evaluate(CHARTS), time.monotonic()
        frames0 = page.evaluate("() => window.__frames")
        time.sleep(window_s)
        elapsed = time.monotonic() - t0
        frames = (page.evaluate("() => window.__frames") - frames0) / elapsed
        after = page.evaluate(CHARTS)
        charts = {k: {"redraws_per_s": (v["draws"] - before[k]["draws"]) / elapsed,
                      "updates_per_s": (v["updates"] - before[k]["updates"]) / elapsed,
                      "draw_ms": (v["ms"] - before[k]["ms"])
                      / max(v["draws"] - before[k]["draws"], 1)}
                  for k, v in after.items()}
        sent = []
        marks = "() => document.querySelector('.labdist-spread').labdist.events.length"
        for i in range(clicks):  # each click waits for the previous one's marker
            seen = page.evaluate(marks)
            sent.append(page.evaluate(CLICK, "SUM" if i % 2 == 0 else "MEAN") / 1e3)
            page.wait_for_function(f"() => ({marks[6:]}) > {seen}", timeout=30_000)
            time.sleep(0.2)
        nb.run(2)
        got = json.loads(nb.cell(2).locator(".jp-OutputArea-output").inner_text())
        nb.run(3)
    events = got["events"][-clicks:]
    to_kernel = [(req - t) * 1e3 for t, (req, _, _) in zip(sent, events, strict=True)]
    to_apply = [(app - req) * 1e3 for req, app, _ in events]
    total = [(app - t) * 1e3 for t, (_, app, _) in zip(sent, events, strict=True)]
    steps = [step_time_at(got["step_times"], app) * 1e3 for _, app, _ in events]
    late = [n for *_, n in events]
    return {
        "subshells": subshells, "clicks": clicks,
        "click_to_kernel_ms": summary(to_kernel), "kernel_to_applied_ms": summary(to_apply),
        "click_to_applied_ms": summary(total), "step_ms": summary(steps),
        "steps_late": {"max": max(late), "mean": statistics.mean(late)},
        "browser_frames_per_s": frames, "charts": charts,
        "python_ms_per_frame": got["publish_s"] / max(got["frames"], 1) * 1e3,
        "lab_steps": got["steps"], "window_s": window_s, "pace": pace,
    }


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "p90": pct(values, 0.9),
            "max": max(values)}


def report(r: dict) -> None:
    def row(name: str, s: dict) -> str:
        return f"  {name:<22} median {s['median']:7.1f}  p90 {s['p90']:7.1f}  max {s['max']:7.1f}"

    pace = f"at most {r['pace']:g} steps/s" if r["pace"] else "as fast as it goes"
    print(f"commsOverSubshells {r['subshells']}, the lab {pace}: {r['clicks']} clicks")
    for key in ("click_to_kernel_ms", "kernel_to_applied_ms", "click_to_applied_ms", "step_ms"):
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
    clicks, window = (6, 3.0) if args.quick else (20, 6.0)
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs "
          "(the browser, JupyterLab, the kernel and both workers share them)")
    results = [measure(s, clicks, window, args.pace) for s in settings]
    for r in results:
        report(r)
    if args.json:
        args.json.write_text(json.dumps({"machine": platform.platform(),
                                         "cpus": os.cpu_count(), "results": results},
                                        indent=1))


if __name__ == "__main__":
    main()
