"""How responsive the lab's panel is in a real browser, measured the same way by the browser
test (tests/lab/browser/test_lab_responsive.py) and the benchmark (bench/bench_lab.py):

- a click on the aggregation control, from the click to the kernel (the change request's
  arrival), to the runner applying it at a step boundary, and to its event marker drawn on the
  spread chart in the browser;
- the browser's frame rate (requestAnimationFrame callbacks per second) and each chart's
  redraws while the run streams deltas.

Clocks: the browser's `Date.now()` and the kernel's `time.time()` read the same machine's wall
clock; the marker's appearance is timed in the page itself (`performance.now()`), so it holds
no Playwright round trip."""

from __future__ import annotations

import itertools
import json
import statistics
import time

# clicks an aggregation button; resolves, once the spread chart holds one event more, with the
# wall-clock time of the click (ms) and the time from the click to that frame (ms)
CLICK = """async (label) => {
  const chart = () => document.querySelector('.labdist-spread').labdist;
  const seen = chart().events.length;
  const b = [...document.querySelectorAll('.labdist-aggregation button')]
    .find((b) => b.textContent.trim() === label);
  const wall = Date.now(), t = performance.now();
  b.click();
  return await new Promise((resolve, reject) => {
    const poll = () => {
      if (chart().events.length > seen) resolve([wall, performance.now() - t]);
      else if (performance.now() - t > 30000) reject(new Error('no event marker within 30 s'));
      else requestAnimationFrame(poll);
    };
    requestAnimationFrame(poll);
  });
}"""

PROBE = """() => {
  if (window.__frames !== undefined) return;
  window.__frames = 0;
  const tick = () => { window.__frames += 1; requestAnimationFrame(tick); };
  requestAnimationFrame(tick);
}"""

CHARTS = """() => Object.fromEntries([...document.querySelectorAll('.labdist-chart')]
  .map((el) => [el.dataset.title, {draws: el.labdist.draws, ms: el.labdist.drawMs,
                                    updates: el.labdist.updates}]))"""

# a cell that prints, as JSON, what the kernel knows: each event's request and apply times
# (wall clock) and how many steps ran the old way meanwhile, the publisher's frames and time
KERNEL_CELL = (
    "import json\np = lab.panel.publisher\n"
    "print(json.dumps({'events': [[e.requested, e.applied, e.steps_late] for e in lab.events],"
    " 'frames': p.frames, 'publish_s': p.publish_s, 'steps': lab.step_count,"
    " 'step_times': lab.history.time,"
    " 'messages': {k: c.messages_sent for k, c in lab.panel.charts.items()}}))")


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "p90": pct(values, 0.9), "max": max(values)}


def step_time_at(times: list[float], t: float) -> float:
    """The median step duration in the second before `t` (wall clock)."""
    near = [b - a for a, b in itertools.pairwise(times) if t - 1.0 <= b <= t]
    return statistics.median(near) if near else float("nan")


def frames(page, window_s: float) -> dict:
    """The browser's frame rate and each chart's redraws and updates per second, over
    `window_s` seconds from now."""
    page.evaluate(PROBE)
    before, t0 = page.evaluate(CHARTS), time.monotonic()
    frames0 = page.evaluate("() => window.__frames")
    time.sleep(window_s)
    elapsed = time.monotonic() - t0
    rate = (page.evaluate("() => window.__frames") - frames0) / elapsed
    after = page.evaluate(CHARTS)
    charts = {k: {"redraws_per_s": (v["draws"] - before[k]["draws"]) / elapsed,
                  "updates_per_s": (v["updates"] - before[k]["updates"]) / elapsed,
                  "draw_ms": (v["ms"] - before[k]["ms"]) / max(v["draws"] - before[k]["draws"], 1)}
              for k, v in after.items() if k in before}
    return {"browser_frames_per_s": rate, "charts": charts, "window_s": window_s}


def clicks(page, n: int, pause_s: float = 0.2) -> list[tuple[float, float]]:
    """Click SUM, MEAN, SUM, ... n times, each after the previous one's marker showed:
    [(wall-clock time of the click in s, click -> marker drawn in ms)]."""
    out = []
    for i in range(n):
        wall, shown = page.evaluate(CLICK, "SUM" if i % 2 == 0 else "MEAN")
        out.append((wall / 1e3, shown))
        time.sleep(pause_s)
    return out


def kernel_view(nb, cell: int) -> dict:
    """Run the notebook's KERNEL_CELL (at index `cell`) and read what it printed."""
    nb.run(cell)
    return json.loads(nb.cell(cell).locator(".jp-OutputArea-output").last.inner_text())


def click_figures(sent: list[tuple[float, float]], kernel: dict) -> dict:
    """Join the browser's clicks with the kernel's record of the same (the last) events."""
    events = kernel["events"][-len(sent):]
    pairs = list(zip(sent, events, strict=True))
    return {
        "clicks": len(sent),
        "click_to_kernel_ms": summary([(req - t) * 1e3 for (t, _), (req, _, _) in pairs]),
        "kernel_to_applied_ms": summary([(app - req) * 1e3 for _, (req, app, _) in pairs]),
        "click_to_applied_ms": summary([(app - t) * 1e3 for (t, _), (_, app, _) in pairs]),
        "click_to_shown_ms": summary([shown for (_, shown), _ in pairs]),
        "step_ms": summary([step_time_at(kernel["step_times"], app) * 1e3
                            for _, (_, app, _) in pairs]),
        "steps_late": [late for *_, late in events],
    }


def frames_shown_vs_hidden(page, pairs: int, window_s: float) -> dict:
    """The frame rate with the panel shown and with it hidden (display: none, nothing laid
    out or drawn), in alternating windows, so that both see the same load from other
    processes: each pair's ratio, and their median."""
    hide = "(d) => { document.querySelector('.labdist-panel').style.display = d; }"
    shown, hidden = [], []
    for _ in range(pairs):
        page.evaluate(hide, "none")
        time.sleep(0.3)
        hidden.append(frames(page, window_s)["browser_frames_per_s"])
        page.evaluate(hide, "")
        time.sleep(0.3)
        shown.append(frames(page, window_s))
    ratios = [s["browser_frames_per_s"] / h for s, h in zip(shown, hidden, strict=True)]
    return {"shown_per_s": [s["browser_frames_per_s"] for s in shown], "hidden_per_s": hidden,
            "ratios": ratios, "median_ratio": statistics.median(ratios),
            "shown_median_per_s": statistics.median(s["browser_frames_per_s"] for s in shown),
            "hidden_median_per_s": statistics.median(hidden), "charts": shown[-1]["charts"]}
