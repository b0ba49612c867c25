"""The lab in a real JupyterLab and a real browser (Debian chromium + Playwright): a person's click
on a mode control switches aggregation while training runs, the kernel applies it at the next
step, and the spread chart changes. Run with JupyterLab's commsOverSubshells on and off: on, a
click is applied even while another cell keeps the kernel's main shell busy; off, it waits for
that cell. Either way the training itself never waits (its loop is on a thread of its own)."""

from __future__ import annotations

import time

import pytest
from harness import OUTPUT, open_lab

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("quiet_machine"),
              pytest.mark.timeout(300)]

CELLS = [
    "import labdist as ld\nlab = ld.Lab(skew=2.0, pace=40)\nlab.show()",
    "lab.run()",
    "import time\nt0 = time.time()\n"
    "while lab.config.aggregation.name != 'SUM' and time.time() - t0 < 12:\n"
    "    time.sleep(0.05)\n"
    "print('during the cell:', lab.config.aggregation.name)",
    "print(lab.config.aggregation.name, '|', ' / '.join(e.text for e in lab.events))",
    "lab.close()",
]

SPREAD = """() => {
  const s = document.querySelector('.labdist-spread').labdist;
  const ys = s.y[0] || [];
  const ev = s.events.length ? s.events[s.events.length - 1].x : null;
  const after = ev === null ? [] : ys.filter((_, i) => s.x[i] > ev);
  return {points: s.x.length, events: s.events.length, updates: s.updates,
          max_before: Math.max(0, ...ys.filter((_, i) => ev === null || s.x[i] <= ev)),
          max_after: Math.max(0, ...after), after: after.length,
          image: document.querySelector('.labdist-spread canvas').toDataURL()};
}"""


@pytest.mark.parametrize("subshells", ["on", "off"])
def test_a_click_switches_aggregation_mid_run(tmp_path, subshells):
    with open_lab(tmp_path, CELLS, subshells=subshells, size=(1500, 1500), points=40,
                  name=f"lab-subshells-{subshells}") as nb:
        page = nb.page
        before = page.evaluate(SPREAD)
        assert before["events"] == 0 and before["max_before"] == 0.0  # ON_WRITE MEAN

        # the charts hear from the kernel at most 20 times a second (40 steps/s here)
        t0 = time.monotonic()
        time.sleep(2.0)
        rate = (page.evaluate(SPREAD)["updates"] - before["updates"]) / (
            time.monotonic() - t0)
        assert 0 < rate <= 21, rate

        page.locator(".labdist-aggregation button", has_text="NONE").click()
        page.wait_for_function(
            "() => { const s = document.querySelector('.labdist-spread').labdist;"
            " if (!s.events.length) return false; const ev = s.events[0].x;"
            " return s.x.filter(x => x > ev).length >= 40; }", timeout=30_000)
        after = page.evaluate(SPREAD)
        assert after["events"] == 1 and after["max_before"] == 0.0
        assert after["max_after"] > 0.01  # the copies drift apart on skewed data
        assert after["image"] != before["image"]  # and the chart shows it
        page.locator(".labdist-status", has_text="mirrored ON_WRITE, NONE").wait_for()
        page.locator(".labdist-panel").screenshot(
            path=str(OUTPUT / f"lab-subshells-{subshells}.png"))

        nb.run(2, wait=False)  # keeps the main shell busy until SUM applies (or 12 s)
        page.locator(".labdist-aggregation button", has_text="SUM").click()
        nb.wait_done(2)
        during = nb.cell(2).locator(".jp-OutputArea-output").inner_text().strip()
        # on: the click reaches the kernel on a subshell while the cell runs; off: it
        # waits behind the cell on the main shell, and applies once the cell is done
        assert during == f"during the cell: {'SUM' if subshells == 'on' else 'NONE'}"
        page.locator(".labdist-log", has_text="aggregation → SUM").wait_for(timeout=30_000)
        nb.run(3)
        printed = nb.cell(3).locator(".jp-OutputArea-output").inner_text()
        assert printed.startswith("SUM |")
        assert "aggregation MEAN → NONE / aggregation NONE → SUM" in printed
        nb.run(4)
        assert nb.errors() == []
