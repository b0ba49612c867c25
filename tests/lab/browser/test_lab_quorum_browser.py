"""The lab's "kill replica" and "add replica" buttons in a real JupyterLab and browser: a click
kills replica 1's worker process mid-run, the log says so, the nanny's replacement and then an
added worker join, and the spread chart stays at 0 throughout (ON_WRITE, MEAN). The legends and
the delay sliders show the replicas there are: 2 at first (not the 4 slots), 3 once one is
added."""

from __future__ import annotations

import pytest
from harness import OUTPUT, open_lab

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("quiet_machine"),
              pytest.mark.timeout(300)]

CELLS = [
    "import labdist as ld\nlab = ld.Lab(fault_tolerance='quorum', skew=2.0, pace=20)\n"
    "lab.show()",
    "lab.run()",
    "lab.pause(); print(lab.num_replicas, '|', ' / '.join(e.text for e in lab.events))",
    "lab.close()",
]

# the replicas each chart's legend names (the charts with a line per replica)
LEGENDS = """() => [...document.querySelectorAll('.labdist-chart')]
  .map(el => [...el.querySelectorAll('span')].map(s => s.textContent)
        .filter(t => /^replica \\d+$/.test(t)))
  .filter(names => names.length)"""
SLIDERS = """() => [0, 1, 2, 3].filter(r => {
  const el = document.querySelector('.labdist-delay-' + r);
  return el && el.getBoundingClientRect().height > 0; })"""

SPREAD = """() => {
  const s = document.querySelector('.labdist-spread').labdist;
  return {points: s.x.length, max: Math.max(0, ...(s.y[0] || []).filter(v => v !== null))};
}"""


def test_kill_and_add_replica_buttons(tmp_path):
    with open_lab(tmp_path, CELLS, name="lab-quorum") as nb:
        page = nb.page
        legends = page.evaluate(LEGENDS)
        assert legends and all(names == ["replica 0", "replica 1"] for names in legends), legends
        assert page.evaluate(SLIDERS) == [0, 1]
        page.locator(".labdist-replica-kill").click()
        log = page.locator(".labdist-log")
        log.filter(has_text="replica 1 lost at step").wait_for(timeout=30_000)
        log.filter(has_text="replica 1 joined at step").wait_for(timeout=60_000)
        page.locator(".labdist-replica-add").click()
        log.filter(has_text="replica 2 joined at step").wait_for(timeout=60_000)
        page.wait_for_function(f"() => ({SLIDERS})().length === 3", timeout=10_000)
        assert page.evaluate(SLIDERS) == [0, 1, 2]  # the added replica's delay slider
        page.wait_for_function(  # every chart with a line per replica, the added one too
            f"() => ({LEGENDS})().every(n => n.join() === 'replica 0,replica 1,replica 2')",
            timeout=10_000)
        page.wait_for_timeout(1500)
        spread = page.evaluate(SPREAD)
        assert spread["points"] > 20 and spread["max"] == 0.0
        page.locator(".labdist-panel").screenshot(path=str(OUTPUT / "lab-quorum.png"))
        nb.run(2)
        printed = nb.cell(2).locator(".jp-OutputArea-output").inner_text()
        assert printed.startswith("3 |") and "replica 1 lost at step" in printed
        nb.run(3)
        assert nb.errors() == []
