"""The lab as a newcomer meets it: JupyterLab in a 1280 x 800 browser, ten mode switches in a row,
a learning-rate blow-up and its recovery, a reset. Everything is measured on the page: the event
labels' boxes (the charts expose what they drew), each chart's drawn y range against its data,
every control's box against the viewport, the throughput chart's values after the reset, the
captions and the parameter-server note against the histogram's bars."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from harness import OUTPUT, open_lab
from playwright.sync_api import TimeoutError as PlaywrightTimeout

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("quiet_machine")]

PACE = 40
CELLS = [
    f"import labdist as ld\nprint(ld.__file__)\nlab = ld.Lab(skew=2.0, pace={PACE})\nlab.show()",
    "lab.run()",
    "lab.close()",
]
# (control, button): ten switches, through every kind, as fast as the lab applies them
SWITCHES = [("aggregation", "NONE"), ("aggregation", "SUM"), ("synchronization", "ON_READ"),
            ("synchronization", "ON_WRITE"), ("kind", "PS async"), ("kind", "PS sync"),
            ("aggregation", "MEAN"), ("kind", "mirrored"), ("aggregation", "NONE"),
            ("aggregation", "MEAN")]

OVERLAPS = """() => {
  const out = [];
  for (const el of document.querySelectorAll('.labdist-chart')) {
    const boxes = el.labdist.labels || [];
    for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
      const a = boxes[i], b = boxes[j];
      if (a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h)
        out.push([el.dataset.title, a.text, b.text]);
    }
  }
  return out;
}"""
LABELS = """() => [...document.querySelectorAll('.labdist-line-chart')].map(el => ({
  title: el.dataset.title, drawn: JSON.parse(el.dataset.labels || '[]').length,
  events: el.labdist.events.length}))"""
VIEW = """(cls) => { const s = document.querySelector(cls).labdist; return {...s.view}; }"""
# the parameter plane's drawn box (its surface's bounds): width and height
PLANE = """() => { const s = document.querySelector('.labdist-plane').labdist;
  if (!s.surface) return null; const [a0, a1, b0, b1] = s.surface.c.bounds;
  return [a1 - a0, b1 - b0]; }"""
CONTROLS = """() => {
  const sel = 'button, input, select, .widget-slider, .widget-readout, .widget-toggle-buttons,'
    + ' .widget-checkbox, .jupyter-widgets.widget-inline-hbox';
  const W = window.innerWidth, H = window.innerHeight;
  const bad = [];
  const all = '.labdist-panel ' + sel.split(',').join(', .labdist-panel ');
  for (const el of document.querySelectorAll(all)) {
    const r = el.getBoundingClientRect();
    if (!r.width) continue;
    const clip = el.closest('.jp-OutputArea-output').getBoundingClientRect();
    if (r.left < 0 || r.right > Math.min(W, clip.right) + 0.5 || r.height > H)
      bad.push([el.className, el.textContent.slice(0, 30), r.left, r.right, r.height]);
  }
  return bad;
}"""
HOVER = """() => { const el = document.querySelector('.labdist-spread');
  const labels = el.labdist.labels;
  // a shortened label if the switches came close enough together to need one, else any
  const b = labels.find(b => b.text !== b.label) || labels[0];
  if (!b) return null;
  const r = el.querySelector('canvas').getBoundingClientRect();
  return {x: r.left + b.x + b.w / 2, y: r.top + b.y + b.h / 2, label: b.label}; }"""


def _click(page, control: str, text: str) -> None:
    page.locator(f".labdist-{control} button").filter(
        has_text=re.compile(f"^{re.escape(text)}$")).click()


def _events(page) -> int:
    return page.evaluate("() => document.querySelector('.labdist-spread').labdist.events.length")


def _hovered(page, tries: int = 8) -> bool:
    """Point at a label and wait for the canvas's tooltip to name it. The run still trains,
    so the chart may scroll the label away between finding it and pointing at it: then
    find it again and point again, as a person does."""
    for _ in range(tries):
        target = page.evaluate(HOVER)
        assert target is not None  # ten switches: labels are drawn
        page.mouse.move(0, 0)
        page.mouse.move(target["x"], target["y"])
        try:
            page.wait_for_function(
                "(label) => document.querySelector('.labdist-spread canvas').title"
                ".includes(label)", arg=target["label"], timeout=1_000)
            return True
        except PlaywrightTimeout:
            continue
    return False


def _caption(page, chart: str) -> str:
    return page.locator(f".labdist-{chart} .labdist-caption").inner_text()


def _wait_caption(page, chart: str, text: str) -> None:
    """The caption follows a switch a moment after the event markers (a trait, not a delta)."""
    page.locator(f".labdist-{chart} .labdist-caption", has_text=text).wait_for(timeout=10_000)


def _set_readout(page, control: str, value: str) -> None:
    """Type a value into a slider's readout, as a person does for an exact number."""
    readout = page.locator(f".labdist-{control} .widget-readout")
    readout.click()
    page.keyboard.press("Control+A")
    page.keyboard.type(value)
    page.keyboard.press("Enter")


@pytest.mark.timeout(480)
def test_a_newcomer_session_at_1280x800(tmp_path):
    with open_lab(tmp_path, CELLS, points=40, name="lab-newcomer") as nb:
        page = nb.page
        printed = nb.cell(0).locator(".jp-OutputArea-output").first.inner_text().strip()
        assert Path(printed).parent.parent == Path(__file__).resolve().parents[3]

        # every control fits the 1280 px width, and each is no taller than the viewport
        assert page.evaluate(CONTROLS) == []
        assert "spread stays 0" in _caption(page, "spread")

        for n, (control, text) in enumerate(SWITCHES, start=1):
            _click(page, control, text)
            page.wait_for_function(
                f"() => document.querySelector('.labdist-spread').labdist.events.length"
                f" >= {n}", timeout=90_000)
            if text == "NONE" and n == 1:
                _wait_caption(page, "spread", "replicas update on their own — spread grows")
            if text == "PS async":  # the PS panel explains itself, and its numbers add up
                _wait_caption(page, "throughput", "a straggler slows only its own")
                _wait_caption(page, "staleness", "torn read: a worker read")
                page.wait_for_function(
                    "() => { const el = document.querySelector('.labdist-staleness');"
                    " const m = el.textContent.match(/(\\d+) updates/);"
                    " return m && Number(m[1]) > 0"
                    " && Number(m[1]) === Number(el.dataset.total); }", timeout=30_000)
            assert page.evaluate(OVERLAPS) == []
        assert _events(page) == 10
        page.wait_for_timeout(500)
        labels = page.evaluate(LABELS)
        assert all(c["events"] == 10 for c in labels), labels
        assert all(c["drawn"] >= 3 for c in labels), labels  # readable, not all hidden
        assert page.evaluate(OVERLAPS) == []
        # a label (shortened where the switches crowd) shows its full text on hover
        page.locator(".labdist-spread").scroll_into_view_if_needed()
        assert _hovered(page), "no label showed its full text under the pointer"
        (OUTPUT / "lab-newcomer-labels.json").write_text(json.dumps(page.evaluate(
            "() => [...document.querySelectorAll('.labdist-chart')].map(el =>"
            " [el.dataset.title, el.labdist.labels || []])"), indent=1))
        for chart in ("spread", "loss", "track-w", "staleness", "plane"):
            el = page.locator(f".labdist-{chart}")  # to look at: ten labels, readable
            el.scroll_into_view_if_needed()
            el.screenshot(path=str(OUTPUT / f"lab-newcomer-{chart}.png"))

        # a learning-rate blow-up, and its recovery
        page.wait_for_timeout(1500)
        calm = page.evaluate(VIEW, ".labdist-loss")
        calm_box = page.evaluate(PLANE)
        _set_readout(page, "learning-rate", "0.3")
        page.locator(".labdist-log", has_text="learning_rate → 0.3").wait_for(
            timeout=30_000)
        page.wait_for_timeout(2000)
        # the plane's box widens to hold the excursion (measured: 0.39 x 0.68 -> 2.8 x 1.3);
        # the rate stays high until it is 4 x as wide, so that the way back is unmistakable
        page.wait_for_function(
            f"() => {{ const b = ({PLANE})(); return b && b[0] > 4 * {calm_box[0]}; }}",
            timeout=30_000)
        wide_box = page.evaluate(PLANE)
        peak = page.evaluate(VIEW, ".labdist-loss")
        assert peak["dataHi"] > calm["dataHi"]  # the blow-up shows
        _set_readout(page, "learning-rate", "0.05")
        page.locator(".labdist-log", has_text="learning_rate → 0.05").wait_for(
            timeout=30_000)
        recovered = time.monotonic()
        page.wait_for_function(
            """(peak) => { const v = document.querySelector('.labdist-loss').labdist.view;
              return v.y1 < peak && v.dataHi < peak; }""",
            arg=peak["dataHi"], timeout=10_000)
        back = time.monotonic() - recovered
        assert back <= 10.0
        # ... and the plane's axes come back once the last 200 points are near the optimum
        # again (they used to stay at the blow-up's box for good). The rule: a box 3 x wider
        # than the recent paths need on an axis is redrawn around them
        page.wait_for_function(
            f"() => {{ const b = ({PLANE})(); return b && (b[0] < {wide_box[0]} / 3"
            f" || b[1] < {wide_box[1]} / 3); }}", timeout=30_000)
        for chart in (".labdist-loss", ".labdist-spread", ".labdist-track-w"):
            v = page.evaluate(VIEW, chart)  # the axis hugs the visible window's data
            span = max(v["dataHi"] - v["dataLo"], 1e-9)
            assert v["y0"] <= v["dataLo"] or v["clipLo"], v  # or marked "off scale"
            assert v["y1"] >= v["dataHi"] or v["clipHi"], v
            assert v["y1"] - v["y0"] <= 1.5 * span + 2e-12 or span < 1e-6, (chart, v)
            assert v["x1"] - v["x0"] <= 200 + 1e-9, v  # the default window

        # reset in PS async (updates land as they finish): the throughput starts again
        # without a spike
        _click(page, "kind", "PS async")
        _wait_caption(page, "throughput", "a straggler slows only its own")
        page.wait_for_function(
            "() => { const s = document.querySelector('.labdist-throughput').labdist;"
            " if (!s || !s.events.length) return false;"  # moved up: a new view, filling
            " const ev = s.events[s.events.length - 1].x;"
            " return s.x.filter(x => x > ev + 20).length > 0; }", timeout=30_000)
        before = page.evaluate(
            "() => document.querySelector('.labdist-throughput').labdist.x.length")
        page.locator(".labdist-reset").click()
        page.locator(".labdist-log", has_text="reset: back to").wait_for(timeout=30_000)
        page.locator(".labdist-run").click()
        page.wait_for_function(
            f"() => {{ const s = document.querySelector('.labdist-throughput').labdist;"
            f" return s.x.length >= 30 && s.x[0] < {max(before, 1)}; }}", timeout=30_000)
        rates = page.evaluate(
            "() => document.querySelector('.labdist-throughput').labdist.y[0]")
        assert 0 < max(rates) <= 1.5 * PACE, rates

        assert page.evaluate(CONTROLS) == []
        assert page.evaluate(OVERLAPS) == []
        # the plane's event labels sit beside the paths, never over them
        assert page.evaluate(
            "() => document.querySelector('.labdist-plane').labdist.labelsOnPaths") == 0
        assert "panel error" not in page.locator(".labdist-log").inner_text()
        page.locator(".labdist-panel").scroll_into_view_if_needed()
        page.screenshot(path=str(OUTPUT / "lab-newcomer-1280x800.png"))
        page.locator(".labdist-panel").screenshot(path=str(OUTPUT / "lab-newcomer-panel.png"))
        nb.run(2)
        assert nb.errors() == []
