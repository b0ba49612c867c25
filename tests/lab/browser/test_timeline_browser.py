"""The timeline chart in a real JupyterLab and a real browser (Debian chromium + Playwright) at
1280x800: a mirrored run with a straggling replica 1 shows the driver's lane and the two
replicas', the other replica waiting, a legend, the line in words, and a bar's phase and
duration on hover."""

from __future__ import annotations

import pytest
from harness import OUTPUT, JupyterLab, Notebook, browser, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

CELLS = [
    "import time\nimport numpy as np\nimport labdist as ld\n"
    "from labdist.cluster import timeline\nfrom labdist.ui.timeline import TimelineChart\n"
    "s = ld.MirroredStrategy(num_replicas=2, device='cpu')\n"
    "def step():\n"
    "    ctx = ld.get_replica_context()\n"
    "    if ctx.replica_id_in_sync_group == 1:\n"
    "        time.sleep(0.05)\n"
    "    return ctx.all_reduce('SUM', np.ones(8))\n"
    "s.run(step)\nsince = time.time()\ntime.sleep(0.1)\n"
    "chart = TimelineChart(steps=10)\nchart",
    "for _ in range(12):\n    s.run(step)\nchart.show(timeline.collect(s.client, since))\n"
    "print(chart.note)",
    "s.close()",
]

STATE = """() => {
  const el = document.querySelector('.labdist-timeline');
  const s = el.labdist;
  return {lanes: s.lanes, bars: s.bars.length, draws: s.draws,
          note: el.querySelector('.labdist-timeline-note').textContent,
          legend: el.querySelectorAll('span > span').length,
          waits: s.bars.filter(b => b[0] === 1 && b[3] === 'wait').length};
}"""


def test_the_timeline_shows_who_waits(tmp_path):
    write_notebook(tmp_path / "timeline.ipynb", CELLS)
    OUTPUT.mkdir(parents=True, exist_ok=True)
    with JupyterLab(tmp_path) as server, browser(width=1280, height=800) as page:
        nb = Notebook(page, server, "timeline.ipynb")
        try:
            nb.run(0)
            page.locator(".labdist-timeline canvas").wait_for()
            nb.run(1)
            page.wait_for_function(
                "() => document.querySelector('.labdist-timeline').labdist.bars.length > 0")
            got = page.evaluate(STATE)
            assert got["lanes"] == ["driver", "replica 0", "replica 1"]  # its `driver` spans
            assert got["waits"] == 10  # the last 10 steps, replica 0 waiting in each
            assert got["note"].startswith("sync: replica 1 was last to the collectives")
            assert got["legend"] >= 9  # one swatch per phase
            canvas = page.locator(".labdist-timeline canvas")
            box = canvas.bounding_box()
            bar = page.evaluate("() => document.querySelector('.labdist-timeline').labdist"
                                ".hits.find(h => h.title.includes('wait'))")
            page.mouse.move(box["x"] + (bar["x0"] + bar["x1"]) / 2,
                            box["y"] + (bar["y0"] + bar["y1"]) / 2)
            page.wait_for_function("() => document.querySelector('.labdist-timeline canvas')"
                                   ".title.includes('replica 0: wait')")
            canvas.screenshot(path=str(OUTPUT / "timeline.png"))
            nb.run(2)
        finally:
            page.screenshot(path=str(OUTPUT / "timeline-page.png"))
