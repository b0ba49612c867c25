"""The communication modes in a real JupyterLab and browser: a person opens the "less
communication" section, sets DiLoCo's H and a compressor mid-run, and the panel shows what
they do — the spread grows for H steps and snaps to 0, the pseudo-gradient / outer-step chart
and the bytes chart fill."""

from __future__ import annotations

import math

import pytest
from harness import OUTPUT, open_lab

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("quiet_machine"),
              pytest.mark.timeout(300)]

CELLS = ["import labdist as ld\nlab = ld.Lab(skew=2.0, pace=40)\nlab.show()", "lab.run()",
         "lab.close()"]

AFTER = """(name) => {
  const s = document.querySelector('.labdist-' + name).labdist;
  const spread = document.querySelector('.labdist-spread').labdist;
  const ev = spread.events.length ? spread.events[spread.events.length - 1].x : null;
  if (ev === null) return null;
  return s.y.map((ys) => ys.filter((_, i) => s.x[i] > ev + 1));
}"""


def test_diloco_and_topk_set_by_clicks_show_on_the_charts(tmp_path):
    with open_lab(tmp_path, CELLS, name="lab-communication") as nb:
        page = nb.page
        try:
            page.locator(".labdist-communication").get_by_text("less communication").click()
            page.locator(".labdist-compression select").select_option("topk")
            page.locator(".labdist-log", has_text="compression → topk").wait_for(
                timeout=30_000)
            readout = page.locator(".labdist-local-steps .widget-readout")
            readout.click()
            page.keyboard.press("Control+A")
            page.keyboard.type("4")
            page.keyboard.press("Enter")
            page.locator(".labdist-log", has_text="local_steps → 4").wait_for(timeout=30_000)
            page.wait_for_function(
                "() => { const s = document.querySelector('.labdist-spread').labdist;"
                " const ev = s.events[s.events.length - 1].x;"
                " return s.x.filter(x => x > ev).length >= 40; }", timeout=30_000)
            (spread,) = page.evaluate(AFTER, "spread")
            zeros = sum(1 for v in spread if v == 0)
            assert 0.15 * len(spread) <= zeros <= 0.35 * len(spread), spread  # 1 step in 4
            assert max(spread) > 0.01
            pseudo, outer = page.evaluate(AFTER, "outer")
            shown = [v for v in pseudo if v is not None and math.isfinite(v)]  # gaps: NaN
            assert shown and min(shown) > 0  # the last round's, held until the next
            assert min(v for v in outer if v is not None and math.isfinite(v)) > 0
            (bytes0, _) = page.evaluate(AFTER, "bytes")
            assert all(math.isfinite(b) for b in bytes0)  # every step says what it sent
            assert sum(1 for b in bytes0 if b) in range(len(bytes0) // 4 - 2,
                                                        len(bytes0) // 4 + 3)
            page.locator(".labdist-outer .labdist-caption",
                         has_text="snaps to 0").wait_for(timeout=10_000)
            assert page.locator(".labdist-topk-ratio input").input_value() == "0.01"
            page.locator(".labdist-panel").screenshot(
                path=str(OUTPUT / "lab-communication.png"))
        finally:
            nb.run(2)
