"""The timeline panel's chart (issue 27, item 2): lanes per replica, the last steps as bars
coloured by phase, the mode switches marked, and the line in words, from phases recorded on
real worker processes; its ES module parses. (Not yet in the lab's panel, nor in a browser.)"""

from __future__ import annotations

import shutil
import subprocess
import time

import numpy as np
import pytest

import labdist as ld
from labdist.timing import timeline
from labdist.ui.stream import esm
from labdist.ui.timeline_chart import PHASE_COLORS, TimelineChart


def straggling_step():
    ctx = ld.get_replica_context()
    if ctx.replica_id_in_sync_group == 1:
        time.sleep(0.03)
    return ctx.all_reduce("SUM", np.ones(8))


@pytest.mark.timeout(120)
def test_a_straggler_shows_as_the_other_lane_waiting(mirrored2):
    mirrored2.run(straggling_step)
    since = time.time()
    time.sleep(0.1)  # a margin for the clock offsets
    chart = TimelineChart(steps=5)
    for _ in range(3):
        mirrored2.run(straggling_step)
    chart.mark("sync → async")
    for _ in range(9):
        mirrored2.run(straggling_step)
    processes = timeline.collect(mirrored2.client, since)
    chart.show(processes)
    window = chart.window
    # the driver records its own part of each step (`driver` spans): a lane of its own
    assert window["lanes"] == ["driver", "replica 0", "replica 1"]
    assert {p for ln, *_, p in window["bars"] if ln == 0} == {"driver"}
    waits = {lane: sum(b - a for ln, a, b, p in window["bars"] if ln == lane + 1 and p == "wait")
             for lane in (0, 1)}
    assert waits[0] > 5 * 25 and waits[1] < 5 * 10, waits  # ms over the last 5 steps
    steps0 = sum(1 for ln, _, _, p in window["bars"] if ln == 1 and p == "wait")
    assert steps0 == 5  # the last `steps` steps only, one wait each
    # one window for every lane: the driver's lane (no steps of its own) shows the same
    # stretch of time as the replicas', not everything recorded since `since` (issue 38)
    first = {lane: min(a for ln, a, _, _ in window["bars"] if ln == lane) for lane in (0, 1, 2)}
    assert first[0] >= min(first[1], first[2]), first
    assert all(p in PHASE_COLORS for *_, p in window["bars"])
    assert all(b <= 0 for _, _, b, _ in window["bars"])  # ms before the latest span
    ((at, label),) = window["marks"]
    assert label == "sync → async" and at < 0
    assert chart.note == timeline.summary(processes)
    assert chart.note.startswith("sync: replica 1 was last to the collectives")


def test_bad_steps_is_refused():
    with pytest.raises(ValueError,
                       match=r"steps=0 is not allowed; use an integer >= 1 \(steps a lane shows\)"):
        TimelineChart(steps=0)


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_module_parses_as_an_es_module(tmp_path):
    path = tmp_path / "timeline.mjs"
    path.write_text(esm("timeline"))
    done = subprocess.run(["node", "--check", str(path)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.timeout(180)
def test_the_lab_panel_shows_who_waits(mirrored2):
    from labdist.ui.panel import LabPanel

    with ld.Lab(mirrored2, delays=[0.0, 0.05]) as lab:
        panel = LabPanel(lab)
        chart = panel.charts["timeline"]
        try:
            lab.run()
            deadline = time.monotonic() + 60
            while not chart.note.startswith("sync: replica 1 was last") \
                    and time.monotonic() < deadline:
                time.sleep(0.2)
            # Read before the switch: without the delay, the next 100 steps rightly name
            # whichever replica happened to be last, and 100 fast steps take under a second.
            with_delay = chart.note
            lab.set(delays=[0.0, 0.0])  # a switch: marked on the timeline
            deadline = time.monotonic() + 30
            while not chart.window["marks"] and time.monotonic() < deadline:
                time.sleep(0.2)
            lab.pause()
        finally:
            panel.close()
    assert with_delay.startswith("sync: replica 1 was last"), with_delay
    assert "delays" in chart.window["marks"][-1][1]
    assert chart.window["lanes"] == ["driver", "replica 0", "replica 1"]


def lonely_step():
    ctx = ld.get_replica_context()
    return float(np.ones(8).sum()) + ctx.replica_id_in_sync_group


@pytest.mark.timeout(120)
def test_steps_without_collectives_are_not_said_to_wait(mirrored2):
    """ON_READ with no averaging: the replicas never meet, so the line in words names nobody
    as last to the collectives (issue 38: it said "replica 0 ... in 100 %")."""
    since = time.time()
    for _ in range(5):
        mirrored2.run(lonely_step)
    note = timeline.summary(timeline.collect(mirrored2.client, since))
    assert note.startswith("sync replicas, no collective in the last"), note
    assert "last to the collectives" not in note
