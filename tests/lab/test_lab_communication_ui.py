"""The panel's communication part without a browser: its controls only queue `lab.set`, and
the bytes / residual / DiLoCo charts are sent what each step's communication did."""

from __future__ import annotations

import json
import time
from collections import defaultdict

import pytest

import labdist as ld
from labdist.ui import LabPanel
from labdist.ui.publisher import RATE_HZ


@pytest.fixture(scope="module")
def strategy():
    s = ld.MirroredStrategy(num_replicas=2)
    yield s
    s.close()


def capture(panel) -> dict[str, list[dict]]:
    sent: dict[str, list[dict]] = defaultdict(list)
    for name, chart in panel.charts.items():
        chart.send = (lambda n: lambda msg, buffers=None: sent[n].append(
            json.loads(json.dumps(msg, allow_nan=False))))(name)
    return sent


def settle(panel, lab) -> None:
    lab.wait()
    deadline = time.monotonic() + 5
    while not panel.publisher.items.empty() and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(2.5 / RATE_HZ)


def points(sent, name) -> tuple[list, list]:
    appends = [m for m in sent[name] if m["type"] == "append"]
    return ([x for m in appends for x in m["x"]],
            [[v for m in appends for v in m["y"][i]] for i in range(len(appends[0]["y"]))])


def test_the_controls_switch_the_modes_and_the_charts_show_them(strategy):
    with ld.Lab(strategy, skew=2.0, learning_rate=0.05) as lab:
        panel = LabPanel(lab)
        sent = capture(panel)
        controls = panel.controls.communication
        assert controls.outer_lr.disabled and controls.topk_ratio.disabled
        lab.step(2)  # plain: the uncompressed bytes (the baseline), gaps in the other charts
        settle(panel, lab)
        assert "baseline" in panel.charts["bytes"].caption
        controls.local_steps.value = 3
        controls.compression.value = "fp16"
        lab.step(6)
        settle(panel, lab)
        assert lab.config.local_steps == 3 and lab.config.compression == "fp16"
        assert not controls.outer_lr.disabled
        assert "snaps it to 0" in panel.charts["spread"].caption
        x, (b0, b1) = points(sent, "bytes")
        assert x == list(range(1, 9))
        assert b1 == b0 and b0[0] == b0[1] > 0  # both replicas send as much, every step
        assert [b > 0 for b in b0[2:]] == [False, False, True] * 2  # a burst every 3 steps
        assert b0[0] > b0[4]  # fp16's burst is smaller than a plain step
        _, (pseudo, outer) = points(sent, "outer")
        assert pseudo[:4] == [None] * 4 and pseudo[4] > 0 and pseudo[4:7] == [pseudo[4]] * 3
        assert outer[4] > 0
        _, (r0, r1) = points(sent, "residual")
        assert all(r is not None and r < 1e-2 for r in (r0[4], r1[4]))  # fp16: rounding only
        controls.compression.value = "topk"
        controls.topk_ratio.value = 0.5
        lab.step(1)
        settle(panel, lab)
        assert lab.config.compression == "topk" and lab.config.topk_ratio == 0.5
        lab.set(kind="ps_async", local_steps=0, compression="none")
        lab.step(1)
        settle(panel, lab)
        assert controls.compression.disabled and controls.local_steps.disabled
        assert "off:" in panel.charts["outer"].caption
        assert "mirrored only" in panel.charts["bytes"].caption
        panel.close()
