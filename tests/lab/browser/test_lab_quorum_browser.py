"""The lab's "kill replica" and "add replica" buttons in a real JupyterLab and browser: a click
kills replica 1's worker process mid-run, the log says so, the nanny's replacement and then an
added worker join, and the spread chart stays at 0 throughout (ON_WRITE, MEAN)."""

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

SPREAD = """() => {
  const s = document.querySelector('.labdist-spread').labdist;
  return {points: s.x.length, max: Math.max(0, ...(s.y[0] || []).filter(v => v !== null))};
}"""


def test_kill_and_add_replica_buttons(tmp_path):
    with open_lab(tmp_path, CELLS, name="lab-quorum") as nb:
        page = nb.page
        page.locator(".labdist-replica-kill").click()
        log = page.locator(".labdist-log")
        log.filter(has_text="replica 1 lost at step").wait_for(timeout=30_000)
        log.filter(has_text="replica 1 joined at step").wait_for(timeout=60_000)
        page.locator(".labdist-replica-add").click()
        log.filter(has_text="replica 2 joined at step").wait_for(timeout=60_000)
        page.wait_for_timeout(1500)
        spread = page.evaluate(SPREAD)
        assert spread["points"] > 20 and spread["max"] == 0.0
        page.locator(".labdist-panel").screenshot(path=str(OUTPUT / "lab-quorum.png"))
        nb.run(2)
        printed = nb.cell(2).locator(".jp-OutputArea-output").inner_text()
        assert printed.startswith("3 |") and "replica 1 lost at step" in printed
        nb.run(3)
        assert nb.errors() == []
