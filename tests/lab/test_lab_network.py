"""The lab's network control on a real LocalCluster: a slow link set mid-run stretches the
mirrored all-reduce (the recorded `comm` per step grows by the modelled latency of each of the
step's collectives) while asynchronous parameter-server workers keep computing (their updates
per second stay well above mirrored's steps per second on the same link); bad values are
refused with NetworkModel's wording and change nothing; the lab takes its model off again."""

from __future__ import annotations

import statistics
import time

import pytest

import labdist as ld
from labdist import network
from labdist.lab.config import RunConfig
from labdist.timing import timeline

LATENCY_S = 0.025  # long beside a step's CPU work: the rates follow the link, even under load


@pytest.fixture(scope="module")
def strategy():
    s = ld.MirroredStrategy(num_replicas=2)
    yield s
    s.close()


def links(strategy) -> list:
    """What every worker process of the cluster holds as its modelled link."""
    return sorted(strategy.client.run(lambda: network.CURRENT).values(), key=repr)


def applied(lab, check, timeout: float = 60.0) -> None:
    """Until the lab's configuration in effect passes `check` (a switch applied)."""
    deadline = time.monotonic() + timeout
    while not check(lab.config):
        assert time.monotonic() < deadline, lab.config
        time.sleep(0.02)


def window(lab, strategy, seconds: float = 1.5) -> dict:
    """Steps per second and the recorded phases of the next `seconds` of a running lab."""
    time.sleep(0.3)  # past the boundary that applied the last change
    n0, t0 = lab.step_count, time.time()
    time.sleep(seconds)
    n1, t1 = lab.step_count, time.time()
    processes = timeline.collect(strategy.client, t0, rounds=2)
    per_step = [statistics.median(timeline.phase_totals(p, "comm")) for p in processes
                if any(s[0] == "step" for s in p["spans"]) and timeline.phase_totals(p, "comm")]
    return {"rate": (n1 - n0) / (t1 - t0), "comm_ms": [1e3 * c for c in per_step],
            "summary": timeline.summary(processes)}


@pytest.mark.parametrize("changes, match", [
    ({"latency": "-5ms"}, r"latency='-5ms' is not allowed; use a number of seconds >= 0"),
    ({"latency": "5 parsecs"}, r"latency='5 parsecs' is not allowed; use a number of seconds"),
    ({"latency": 2.0}, r"latency=2.0 is not allowed in the lab; use at most 1 s"),
    ({"bandwidth": "0MB/s"}, r"bandwidth='0MB/s' is not allowed; use a number of bytes per "
                             r"second > 0, None \(unlimited\), or a string like '100MB/s'"),
    ({"bandwidth": "fast"}, r"bandwidth='fast' is not allowed"),
    ({"bandwidth": 10}, r"bandwidth=10 is not allowed in the lab; use at least 1000 bytes"),
    ({"network": 3}, r"network=3 is not allowed; use ld.NetworkModel"),
    ({"latency": "5ms", "bandwidth": -1}, r"bandwidth=-1 is not allowed"),
])
def test_bad_network_settings_are_refused(changes, match):
    with pytest.raises((ValueError, TypeError), match=match):
        RunConfig().replace(changes, 2)


def test_network_settings_parse_and_describe():
    c = RunConfig().replace({"latency": "5ms", "bandwidth": "100MB/s"}, 2)
    assert (c.latency, c.bandwidth) == (0.005, 1e8)
    assert c.network == ld.NetworkModel("5ms", "100MB/s")
    assert c.describe() == "mirrored ON_WRITE, MEAN, link 5 ms + 100 MB/s"
    off = c.replace({"network": "off"}, 2)
    assert off.network is None and off == RunConfig().replace({}, 2)
    both = RunConfig().replace({"network": ld.NetworkModel(latency=0.002)}, 2)
    assert (both.latency, both.bandwidth) == (0.002, None)
    assert both.replace({"kind": "ps_async"}, 2).describe() == "PS async, link 2 ms"


def test_a_bad_value_mid_run_changes_nothing(strategy):
    with ld.Lab(strategy) as lab:
        lab.set(latency="3ms")
        lab.step(2)
        for bad in ({"latency": "-1ms"}, {"latency": "1ms", "bandwidth": "slow"}):
            with pytest.raises(ValueError):
                lab.set(**bad)
            assert lab.pending_config().latency == 0.003  # nothing queued
        lab.step(2)
        assert lab.config.latency == 0.003 and links(strategy) == [ld.NetworkModel(0.003)] * 2
        assert [e.text for e in lab.events] == ["latency 0 ms → 3 ms"]  # the controls' unit
    assert links(strategy) == [None, None]  # the lab took its model off when it closed


@pytest.mark.timeout(240)
def test_a_slow_link_stretches_sync_all_reduce_while_async_keeps_computing(strategy):
    with ld.Lab(strategy) as lab:
        lab.run()
        free = window(lab, strategy)
        lab.set(latency=f"{LATENCY_S * 1e3:g}ms")  # mid-run, at the next step boundary
        applied(lab, lambda c: c.latency == LATENCY_S)
        slow = window(lab, strategy)
        assert links(strategy) == [ld.NetworkModel(LATENCY_S)] * 2
        lab.set(kind="ps_async")  # the same link: pulls and pushes pay it too
        applied(lab, lambda c: c.kind == "ps_async")
        ps = window(lab, strategy)
        lab.set(network=None)
        lab.pause()
        assert links(strategy) == [None, None]
        texts = [e.text for e in lab.events]
    print(f"mirrored free {free}\nmirrored {LATENCY_S * 1e3:g} ms {slow}\nPS async {ps}")
    ms = f"{LATENCY_S * 1e3:g} ms"
    assert texts[0] == f"latency 0 ms → {ms}" and texts[-1] == f"latency {ms} → 0 ms"
    # the lab's step all-reduces w and b: two collectives, each paying the latency
    assert len(slow["comm_ms"]) == 2 and min(slow["comm_ms"]) >= 0.8 * 2e3 * LATENCY_S, slow
    assert max(free["comm_ms"]) < 0.25 * min(slow["comm_ms"]), (free, slow)
    assert slow["rate"] <= 1 / (2 * LATENCY_S) and free["rate"] > 3 * slow["rate"], (free, slow)
    # asynchronous workers pay it on their own pulls and pushes, never waiting for a peer
    assert ps["summary"].startswith("async: nobody waits"), ps
    assert ps["rate"] >= 1.5 * slow["rate"], (slow, ps)


def test_the_network_controls_set_the_link_and_the_timeline_marks_the_switch(strategy):
    from labdist.ui import LabPanel
    from labdist.ui.publisher import RATE_HZ

    def settle():
        lab.wait()
        deadline = time.monotonic() + 5
        while not panel.publisher.items.empty() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(2.5 / RATE_HZ)

    with ld.Lab(strategy) as lab:
        panel = LabPanel(lab)
        for chart in panel.charts.values():
            chart.send = lambda msg, buffers=None: None  # no front end here
        net = panel.controls.network
        net.latency.value = 4.0  # ms, what a person drags or types
        lab.step(3)
        settle()
        assert lab.config.latency == 0.004 and links(strategy) == [ld.NetworkModel(0.004)] * 2
        net.bandwidth.value = 1e6
        lab.step(1)
        lab.set(bandwidth="3MB/s")  # a plain call: the dropdown shows a value of its own
        lab.step(1)
        settle()
        assert net.bandwidth.value == 3e6 and ("3 MB/s", 3e6) in net.bandwidth.options
        assert lab.config.describe().endswith("link 4 ms + 3 MB/s")
        net._send(latency="-1ms")  # a refusal is logged, nothing changes
        assert "latency='-1ms' is not allowed" in panel.log.text and lab.pending_config() \
            == lab.config
        net.off.click()
        lab.step(2)
        settle()
        assert lab.config.network is None and links(strategy) == [None, None]
        assert (net.latency.value, net.bandwidth.value) == (0.0, 0.0)
        assert net.bandwidth.label == "unlimited"  # shown, never a blank box
        chart = panel.charts["timeline"]
        chart.refresh(strategy.client, seconds=30)
        marks = [label for _, label in chart.window["marks"]]
        assert any("latency → 4 ms" in m for m in marks), marks
        assert any("latency → 0 ms, bandwidth → unlimited" in m for m in marks), marks
        panel.close()
