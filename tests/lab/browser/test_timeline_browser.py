"""The timeline chart in a real JupyterLab and a real browser (Debian chromium + Playwright) at
1280x800: a mirrored run with a straggling replica 1 shows the driver's lane and the two
replicas', the other replica waiting, a legend, the line in words, and a bar's phase and
duration on hover."""

from __future__ import annotations

import re

import pytest
from harness import OUTPUT, JupyterLab, Notebook, browser, open_lab, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("quiet_machine"),
              pytest.mark.timeout(300)]

CELLS = [
    "import time\nimport numpy as np\nimport labdist as ld\n"
    "from labdist.timing import timeline\nfrom labdist.ui.timeline_chart import TimelineChart\n"
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


LAB_CELLS = ["import labdist as ld\nlab = ld.Lab(pace=20)\nlab.show()", "lab.run()",
             "lab.close()"]
# the lab's timeline with the panel's top scrolled to the top of the notebook: each canvas's
# box against the notebook's visible area and the window, and what the chart drew
IN_VIEW = """(lead) => {
  const scroller = document.querySelector('.jp-NotebookPanel .jp-WindowedPanel-outer')
    || document.querySelector('.jp-NotebookPanel .jp-Notebook');
  document.querySelector('.labdist-panel').scrollIntoView({block: 'start'});
  const view = scroller.getBoundingClientRect();
  const box = (sel) => {
    const r = document.querySelector(sel).getBoundingClientRect();
    return {top: r.top, bottom: r.bottom, left: r.left, right: r.right,
            inside: r.width > 0 && r.top >= view.top - 0.5 && r.bottom <= view.bottom + 0.5
              && r.left >= 0 && r.right <= window.innerWidth + 0.5
              && r.bottom <= window.innerHeight};
  };
  const el = document.querySelector('.labdist-timeline');
  const s = el.labdist;
  return {timeline: box('.labdist-timeline canvas'), lead: box(lead + ' canvas'),
          view: {top: view.top, bottom: view.bottom}, lanes: s.lanes, labelled: s.labelled,
          note: el.querySelector('.labdist-timeline-note').textContent};
}"""
# per lane: the durations (ms) of its bars of one phase
BARS = """(phase) => {
  const s = document.querySelector('.labdist-timeline').labdist;
  const out = {};
  s.lanes.forEach((name, i) => { out[name] = s.bars.filter(b => b[0] === i && b[3] === phase)
    .map(b => b[2] - b[1]); });
  return out;
}"""
STRAGGLING = """() => {
  const s = document.querySelector('.labdist-timeline').labdist;
  const lane = s.lanes.indexOf('replica 0');
  return lane >= 0 && s.bars.filter(b => b[0] === lane && b[3] === 'wait'
                                         && b[2] - b[1] > 30).length >= 10;
}"""


def _set_readout(page, control: str, value: str) -> None:
    readout = page.locator(f".labdist-{control} .widget-readout")
    readout.click()
    page.keyboard.press("Control+A")
    page.keyboard.type(value)
    page.keyboard.press("Enter")


def test_the_lab_timeline_is_in_view_and_shows_a_straggler_and_a_slow_link(tmp_path):
    """The lab at 1280 x 800 with the file browser open: the timeline's lanes are in view
    beside the lead value chart without scrolling, each labelled; a 50 ms straggler set on
    replica 1 with the panel's control shows as `wait` bars on replica 0's lane (sync); a 20
    ms latency set in the network section stretches both lanes' `comm` bars, and the switch is
    marked on the timeline; in PS async the workers' lanes show pulls and pushes and no
    `wait`, the timeline still in view beside that mode's lead chart."""
    with open_lab(tmp_path, LAB_CELLS, name="lab-timeline") as nb:
        page = nb.page
        assert page.locator(".jp-FileBrowser").is_visible()
        _set_readout(page, "delay-1", "0.05")
        page.locator(".labdist-log", has_text="delays → [0, 0.05]").wait_for(timeout=30_000)
        page.wait_for_function(STRAGGLING, timeout=30_000)
        got = page.evaluate(IN_VIEW, ".labdist-plane")  # mirrored's lead chart
        assert got["timeline"]["inside"] and got["lead"]["inside"], got
        assert {"replica 0", "replica 1"} <= set(got["lanes"]) and got["labelled"], got
        assert got["note"].startswith("sync: replica 1 was last to the collectives"), got
        waits = page.evaluate(BARS, "wait")
        assert min(sorted(waits["replica 0"])[-10:]) > 30, waits  # about the 50 ms delay
        assert sorted(waits["replica 1"])[len(waits["replica 1"]) // 2] < 10, waits
        page.screenshot(path=str(OUTPUT / "lab-timeline-straggler-1280x800.png"))

        page.locator(".labdist-network").get_by_text("network (a slow link)").click()
        _set_readout(page, "network-latency", "20")
        page.locator(".labdist-log", has_text="latency → 20 ms").wait_for(timeout=30_000)
        page.locator(".labdist-status", has_text="link 20 ms").wait_for(timeout=10_000)
        page.wait_for_function(
            "() => { const s = document.querySelector('.labdist-timeline').labdist;"
            " return s.shownMarks.some(m => m.includes('latency → 20 ms')); }", timeout=30_000)
        page.wait_for_function(
            "() => { const s = document.querySelector('.labdist-timeline').labdist;"
            " return s.bars.filter(b => b[3] === 'comm' && b[2] - b[1] > 15).length >= 10; }",
            timeout=30_000)
        comm = page.evaluate(BARS, "comm")
        assert all(max(comm[f"replica {r}"]) > 15 for r in (0, 1)), comm
        page.screenshot(path=str(OUTPUT / "lab-timeline-slow-link-1280x800.png"))
        page.locator(".labdist-network-off").click()
        page.locator(".labdist-log", has_text="latency → 0 ms").last.wait_for(timeout=30_000)

        # PS async with the same straggler: the workers pull and push, nobody waits
        page.locator(".labdist-kind button").filter(has_text=re.compile("^PS async$")).click()
        page.wait_for_function(
            "() => { const s = document.querySelector('.labdist-timeline').labdist;"
            " const w = s.lanes.indexOf('PS worker 0');"
            " return w >= 0 && s.bars.filter(b => b[0] === w && b[3] === 'push').length >= 5;"
            " }", timeout=60_000)
        page.wait_for_timeout(500)
        got = page.evaluate(IN_VIEW, ".labdist-staleness")  # PS async's lead chart
        assert got["timeline"]["inside"] and got["lead"]["inside"], got
        assert {"PS worker 0", "PS worker 1"} <= set(got["lanes"]) and got["labelled"], got
        waits = page.evaluate(BARS, "wait")
        assert not any(waits.get(f"PS worker {w}") for w in (0, 1)), waits
        page.screenshot(path=str(OUTPUT / "lab-timeline-ps-async-1280x800.png"))
        nb.run(2)
        assert nb.errors() == []
