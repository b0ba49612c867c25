"""The lab's panel without a browser: what the charts are sent (deltas only, at most 20 frames a
second, strict JSON, a snapshot when a front end says hello), controls that only queue, and
the widgets' ES modules shipped in the wheel. The browser side is tests/lab/browser/."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import zipfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

import labdist as ld
from labdist.ui import LabPanel, LineChart
from labdist.ui.publisher import RATE_HZ
from labdist.ui.stream import assemble, esm

ROOT = Path(__file__).resolve().parents[2]
WIDGETS = ("line_chart", "histogram", "parameter_plane")
TOP_LEVEL = re.compile(r"^(?:function|const|let|class) (\w+)", re.MULTILINE)


@pytest.fixture(scope="module")
def strategy():
    s = ld.MirroredStrategy(num_replicas=2)
    yield s
    s.close()


def capture(panel) -> dict[str, list[dict]]:
    """Every message each chart sends, as the front end would receive it."""
    sent: dict[str, list[dict]] = defaultdict(list)
    for name, chart in panel.charts.items():
        chart.send = (lambda n: lambda msg, buffers=None: sent[n].append(
            json.loads(json.dumps(msg, allow_nan=False))))(name)
    return sent


def settle(panel, lab) -> None:
    """Until the publisher has drawn everything the run produced."""
    lab.wait()
    deadline = time.monotonic() + 5
    while not panel.publisher.items.empty() and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(2.5 / RATE_HZ)


def test_charts_get_only_deltas_at_most_20_times_a_second(strategy):
    with ld.Lab(strategy, skew=1.0) as lab:
        panel = LabPanel(lab)
        sent = capture(panel)
        t0 = time.monotonic()
        lab.step(300)  # fast: several steps per frame
        settle(panel, lab)
        elapsed = time.monotonic() - t0
        appends = [m for m in sent["spread"] if m["type"] == "append"]
        assert len(appends) <= RATE_HZ * elapsed + 2
        xs = [x for m in appends for x in m["x"]]
        assert xs == list(range(1, 301))  # each step sent once, in order: deltas, no re-sends
        plane = [p for m in sent["plane"] if m["type"] == "append" for p in m["points"]]
        assert len(plane) == 300 and np.shape(plane[0]) == (2, 2)
        losses = [m for m in sent["loss"] if m["type"] == "append"]
        assert len(losses[0]["y"]) == 3  # replica 0, replica 1, global
        panel.close()


def test_a_front_end_that_says_hello_gets_a_snapshot(strategy):
    with ld.Lab(strategy, skew=1.0, learning_rate=0.05) as lab:
        panel = LabPanel(lab)
        sent = capture(panel)
        lab.step(20)
        lab.set(aggregation="NONE")
        lab.step(10)
        settle(panel, lab)
        chart = panel.charts["track:w"]
        chart._from_frontend(chart, {"type": "hello"}, [])
        snap = sent["track:w"][-1]
        assert snap["type"] == "snapshot"
        assert snap["x"] == [float(s) for s in lab.history.step]
        got = np.array(snap["y"]).T
        np.testing.assert_allclose(got, lab.history.tracked("w"), rtol=1e-12)
        assert [e["label"] for e in snap["events"]] == ["aggregation → NONE"]
        assert snap["events"][0]["x"] == 20.0
        panel.charts["plane"]._from_frontend(None, {"type": "hello"}, [])
        plane = sent["plane"][-1]
        assert plane["type"] == "snapshot" and len(plane["paths"][0]) == len(lab.history)
        assert plane["contours"]["nx"] == plane["contours"]["ny"] == 56
        panel.close()


def test_loss_gaps_travel_as_null_not_nan(strategy):
    """A switch row has no loss (nan in the history); strict JSON has no NaN."""
    with ld.Lab(strategy) as lab:
        panel = LabPanel(lab)
        sent = capture(panel)
        lab.step(3)
        lab.set(synchronization="ON_READ")
        lab.step(2)
        settle(panel, lab)
        ys = [v for m in sent["loss"] if m["type"] == "append" for v in m["y"][0]]
        assert None in ys and len(ys) == 6  # 5 steps and the switch
        panel.close()


def test_controls_only_queue_and_show_what_applies(strategy):
    with ld.Lab(strategy, model=ld.lab.Linear(1), delays=[0.0, 0.2]) as lab:
        panel = LabPanel(lab)
        capture(panel)
        c = panel.controls
        lab.run()  # every step waits 0.2 s for replica 1
        time.sleep(0.3)
        t0 = time.perf_counter()
        c.aggregation.value = "SUM"  # what a click does, on the kernel's comm thread
        c.learning_rate.value = 0.2
        queued = time.perf_counter() - t0
        assert queued < 0.02  # never waits for the step in progress
        assert lab.config.aggregation is ld.VariableAggregation.MEAN  # not applied yet
        lab.pause()
        assert lab.config.aggregation is ld.VariableAggregation.SUM
        assert lab.config.learning_rate == 0.2
        lab.set(skew=1.5, synchronization="ON_READ")  # a plain call: the controls follow
        lab.wait()
        settle(panel, lab)
        assert (c.skew.value, c.synchronization.value) == (1.5, "ON_READ")
        assert c.use_locking.disabled and not c.synchronization.disabled
        c.buttons["step"].click()
        lab.wait()
        assert lab.step_count > 0 and c.error is None
        log = panel.log.text
        assert "aggregation → SUM" in log and "skew → 1.5" in log
        panel.close()


def test_a_refused_control_value_is_logged_not_raised(strategy):
    with ld.Lab(strategy) as lab:
        panel = LabPanel(lab)
        panel.controls._changed("learning_rate")({"new": -1.0})
        assert "learning_rate=-1.0 is not allowed" in panel.controls.error
        assert "refused: ValueError" in panel.log.text
        assert lab.events == []
        panel.close()


def test_parameter_server_staleness_reaches_the_histogram(strategy):
    with ld.Lab(strategy, kind="ps_async", delays=[0.0, 0.02]) as lab:
        panel = LabPanel(lab)
        sent = capture(panel)
        lab.step(20)
        settle(panel, lab)
        added = defaultdict(int)
        for m in sent["staleness"]:
            if m["type"] == "add":
                for k, v in m["counts"].items():
                    added[int(k)] += v
        assert sum(added.values()) == 20  # async: a step is one worker's push
        assert dict(added) == panel.charts["staleness"].counts
        assert "torn reads: " in panel.charts["staleness"].note
        assert "lost updates: " in panel.charts["staleness"].note  # beside the torn reads
        assert re.search(r"per worker: w0 \d+ \(\d+/s\), w1 \d+", panel.charts["staleness"].note)
        panel.close()
        lab.step(2)  # a closed panel no longer collects the run's items
        assert panel.publisher.items.empty()


def test_the_surface_follows_the_skew(strategy):
    with ld.Lab(strategy, skew=0.0) as lab:
        panel = LabPanel(lab)
        capture(panel)
        time.sleep(3 / RATE_HZ)
        plane = panel.charts["plane"]
        first = plane._contours
        x, y = lab.data
        best = lab.model.solve(x, y)
        a0, a1, b0, b1 = first["bounds"]
        assert a0 < float(best["w"]) < a1 and b0 < float(best["b"]) < b1
        z = np.array(first["z"]).reshape(56, 56)
        j, i = np.unravel_index(z.argmin(), z.shape)
        a, b = np.linspace(a0, a1, 56)[i], np.linspace(b0, b1, 56)[j]
        assert abs(a - float(best["w"])) < (a1 - a0) / 20  # the minimum is the optimum
        assert abs(b - float(best["b"])) < (b1 - b0) / 20
        lab.set(skew=3.0)
        lab.wait()
        settle(panel, lab)
        assert plane._contours is not first and plane._contours["z"] != first["z"]
        panel.close()


def test_the_planes_axes_come_back_after_a_blow_up(strategy):
    """A path that flew far out widens the box; once the last 200 points are back near the
    optimum, the box shrinks to them again (issue 38: it stayed at 30 for good)."""
    with ld.Lab(strategy, skew=0.0) as lab:
        panel = LabPanel(lab)
        capture(panel)
        time.sleep(3 / RATE_HZ)
        plane, publisher = panel.charts["plane"], panel.publisher
        calm = plane.bounds[1] - plane.bounds[0]
        far = np.array([[30.0, 30.0], [-30.0, -30.0]])
        plane.append([far])
        time.sleep(0.6)
        publisher._surface(points=[far])
        assert plane.bounds[1] - plane.bounds[0] > 50  # the box holds the excursion
        x, y = lab.data
        best = lab.model.solve(x, y)
        near = np.array([[float(best["w"]), float(best["b"])]] * 2)
        plane.append([near] * 200)  # the paths came back and stayed
        time.sleep(0.6)
        publisher._surface(points=[near])
        assert plane.bounds[1] - plane.bounds[0] < 2 * calm
        panel.close()


def test_widget_modules_are_found_and_ship_in_the_wheel(tmp_path):
    for name in WIDGETS:
        assert esm(name).lstrip().startswith("//")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                    str(tmp_path), str(ROOT)], check=True, timeout=240)
    (wheel,) = tmp_path.glob("labdist-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"labdist/widgets/line_chart.js", "labdist/widgets/histogram.js",
            "labdist/widgets/parameter_plane.js", "labdist/widgets/_shared.js",
            "labdist/ui/line_chart.py"} <= names
    installed = tmp_path / "installed"  # what esm() assembles inside an installed wheel
    zipfile.ZipFile(wheel).extractall(installed, [n for n in names if "/widgets/" in n])
    for name in WIDGETS:
        assert assemble(installed / "labdist" / "widgets", name) == esm(name)




def test_each_widget_module_is_the_shared_helpers_and_its_own_code_once():
    shared = (ROOT / "widgets" / "_shared.js").read_text()
    exported = set(re.findall(r"^export function (\w+)", shared, re.MULTILINE))
    assert {"niceStep", "ticks", "fmt", "fitCanvas", "axisTitles", "legend",
            "mountChart"} <= exported
    for name in WIDGETS:
        own = (ROOT / "widgets" / f"{name}.js").read_text()
        (imported,) = re.findall(r'^import \{([^}]*)\} from "\./_shared\.js";$', own,
                                 re.MULTILINE)
        assert {n.strip() for n in imported.split(",")} <= exported  # no dangling import
        text = esm(name)
        assert text.count("export default") == 1 and "export function" not in text
        assert not re.search(r"^import ", text, re.MULTILINE)
        names = TOP_LEVEL.findall(text)
        assert len(names) == len(set(names)), names  # no helper defined twice
        assert set(names) >= exported
        body = own.split('from "./_shared.js";\n', 1)[1]
        assert text.endswith(body)  # the widget's own module, whole, after the helpers


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_each_assembled_widget_module_parses_as_an_es_module(tmp_path):
    for name in WIDGETS:
        path = tmp_path / f"{name}.mjs"
        path.write_text(esm(name))
        done = subprocess.run(["node", "--check", str(path)], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr


def test_esm_refuses_names_that_are_not_charts():
    with pytest.raises(ValueError, match=r"name='_shared' must name a chart's module"):
        esm("_shared")
    with pytest.raises(FileNotFoundError, match=r"nope\.js is missing"):
        esm("nope")


def test_captions_say_what_to_expect_in_each_mode():
    from labdist.lab.config import RunConfig
    from labdist.ui.captions import captions

    def text(**settings) -> dict[str, str]:
        return captions(RunConfig().replace(settings, 2))

    assert "spread stays 0" in text()["spread"]
    none = text(aggregation="NONE")["spread"]
    assert none.startswith("ON_WRITE, NONE: replicas update on their own — spread grows")
    assert "every 5 steps" in text(synchronization="ON_READ", sync_period=5)["spread"]
    ps = text(kind="ps_async")
    assert "not diverging copies" in ps["spread"]
    assert "a straggler slows only its own updates" in ps["throughput"]
    assert "torn read: a worker read the parameters while an update was half applied" \
        in ps["staleness"]
    assert "lost update: two updates of one parameter overlapped" in ps["staleness"]
    assert "torn reads and lost updates stay 0" in text(kind="ps_async",
                                                         use_locking=True)["staleness"]
    assert "staleness 0" in text(kind="ps_sync")["staleness"]
    assert "waits at the barrier" in text(kind="ps_sync")["throughput"]
    assert "no parameter servers now" in text()["staleness"]


def test_panel_captions_follow_the_mode_and_the_window_slider_sets_every_line_chart(strategy):
    with ld.Lab(strategy, skew=1.0) as lab:
        panel = LabPanel(lab)
        assert "spread stays 0" in panel.charts["spread"].caption
        lab.set(aggregation="NONE")
        lab.step(2)
        settle(panel, lab)
        assert "spread grows" in panel.charts["spread"].caption
        assert "the lines part" in panel.charts["track:w"].caption
        panel.window.value = 500
        lines = [c for c in panel.charts.values() if isinstance(c, LineChart)]
        assert len(lines) >= 4 and all(c.window == 500 for c in lines)
        with pytest.raises(Exception, match="window=-1 must be 0"):
            lines[0].window = -1
        panel.close()


def test_the_staleness_bars_add_up_to_the_updates_shown_across_switches(strategy):
    with ld.Lab(strategy, kind="ps_async") as lab:
        panel = LabPanel(lab)
        for kind in ("ps_async", "mirrored", "ps_async"):
            lab.set(kind=kind)
            lab.step(6)
            settle(panel, lab)
            chart = panel.charts["staleness"]
            shown = int(re.match(r"(\d+) updates", chart.note).group(1))
            assert sum(chart.counts.values()) == shown, (kind, chart.counts, chart.note)
            assert shown == (0 if kind == "mirrored" else 6), chart.note
        panel.close()


def test_a_diverged_run_says_so_on_the_panel(strategy):
    with ld.Lab(strategy, aggregation="SUM", learning_rate=0.9) as lab:
        panel = LabPanel(lab)
        sent = capture(panel)
        lab.run()
        deadline = time.monotonic() + 30
        while lab.state != "diverged" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lab.state == "diverged"
        step = lab.divergence.step
        deadline = time.monotonic() + 5  # a frame and a status refresh
        while (f"diverged at step {step}" not in panel.status.value
               or not panel.alert.value) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert f"Diverged at step {step}" in panel.alert.value, panel.log.text
        assert "lower the learning rate and reset" in panel.alert.value
        assert "replica " in panel.alert.value and panel.alert.layout.display == ""
        assert f"diverged at step {step}" in panel.status.value
        assert "steps/s" not in panel.status.value  # a stopped run shows no (stale) rate
        log = panel.log.text
        assert f"step {step}: the run diverged at step {step}: replica" in log
        assert "panel error" not in log
        marks = [m for m in sent["loss"] if m["type"] == "event"]
        assert any(m.get("label") == "diverged" for m in marks), marks
        lab.reset()
        settle(panel, lab)
        assert panel.alert.value == "" and panel.alert.layout.display == "none"
        panel.close()


def test_the_event_log_keeps_every_event_and_a_reset_clears_it(strategy):
    with ld.Lab(strategy) as lab:
        panel = LabPanel(lab)
        capture(panel)
        for i in range(70):  # more than a log trimmed to its last lines would keep
            lab.set(learning_rate=0.01 + i * 1e-4)
            lab.step(1)
        settle(panel, lab)
        switches = [line for line in panel.log.lines if "learning_rate →" in line]
        assert len(switches) == len(lab.events) == 70
        assert [s.split(": ", 1)[1].split("  (")[0] for s in switches] == \
            [f"learning_rate → {e.changes['learning_rate'][1]:g}" for e in lab.events]
        assert "flex-direction:column-reverse" in panel.log.widget.value  # newest in view
        lab.reset()
        settle(panel, lab)
        assert panel.log.lines == ["reset: back to the initial parameters at step 0"]
        panel.close()


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_step_axis_tick_labels_stay_distinct_after_many_steps(tmp_path):
    script = tmp_path / "ticks.mjs"
    script.write_text(
        f'import {{ tickFmt, ticks }} from "{ROOT / "widgets" / "_shared.js"}";\n'
        "const out = [];\n"
        "for (const [lo, hi] of [[13000, 13200], [99800, 100000], [0, 1], [-0.5, 0.5],\n"
        "                        [1e7, 1e7 + 40], [0.001, 0.0012]]) {\n"
        "  const t = ticks(lo, hi, 4);\n"
        "  out.push(t.map((v) => tickFmt(v, t[1] - t[0])));\n"
        "}\n"
        "// a diverging run's span at its values' precision: ends at once, no endless loop\n"
        "const flat = ticks(1e20, 1e20 * (1 + 4e-16), 4).length;\n"
        "console.log(JSON.stringify({out, flat}));\n")
    done = subprocess.run(["node", str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    labels = got["out"]
    assert 1 <= got["flat"] <= 2
    for row in labels:
        assert len(set(row)) == len(row) >= 3, row  # neighbours never read the same
    assert labels[0][:2] == ["13,000", "13,050"]


def test_the_chart_that_matters_for_the_mode_comes_first(strategy):
    with ld.Lab(strategy) as lab:
        panel = LabPanel(lab)
        capture(panel)
        assert panel.lead.children == (panel.charts["plane"],)
        for kind, first in (("ps_async", "staleness"), ("ps_sync", "throughput"),
                            ("mirrored", "plane")):
            lab.set(kind=kind)
            lab.step(2)
            settle(panel, lab)
            assert panel.lead.children == (panel.charts[first],), kind
            assert panel.beside.children == (panel.charts["timeline"],)  # in every mode
            shown = {*panel.lead.children, *panel.beside.children, *panel.grid.children}
            assert shown == set(panel.charts.values())  # every chart, once
            assert len(panel.grid.children) == len(panel.charts) - 2
        panel.close()


def test_showing_an_applied_change_leaves_a_click_on_its_way_alone(strategy):
    """The publisher shows what a change set, only that: a click whose value reached its
    widget but not yet `lab.set` (the comm's thread) is not written back over."""
    with ld.Lab(strategy, kind="ps_async") as lab:
        panel = LabPanel(lab)
        controls = panel.controls
        controls._quiet.on = True  # the click's value, its observer not run yet
        controls.use_locking.value = True
        controls._quiet.on = False
        controls.sync(lab.pending_config(), fields={"learning_rate"})
        assert controls.use_locking.value is True
        controls.sync(lab.pending_config())  # everything (a panel shown anew)
        assert controls.use_locking.value is False
        panel.close()


def test_an_applied_change_is_sent_at_once_not_at_the_next_frame(strategy):
    """A click's marker leaves the kernel as soon as the runner has applied it: events skip
    the 20-a-second pacing that steps get (it used to add up to a frame, 50 ms, to every
    click), while steps stay paced."""
    with ld.Lab(strategy, skew=1.0, pace=100) as lab:
        panel = LabPanel(lab)
        sent_at: list[float] = []
        chart = panel.charts["spread"]
        original = chart.event
        chart.event = lambda *a, **k: (sent_at.append(time.time()), original(*a, **k))[1]
        sent = capture(panel)
        t0 = time.monotonic()
        lab.run()
        delays = []
        for i in range(12):
            seen = len(sent_at)
            lab.set(aggregation="SUM" if i % 2 == 0 else "MEAN")
            deadline = time.monotonic() + 10
            while len(sent_at) == seen and time.monotonic() < deadline:
                time.sleep(0.001)
            assert len(sent_at) > seen, "no event marker within 10 s"
            delays.append(sent_at[-1] - lab.events[-1].applied)
            time.sleep(0.1 + i * 0.0041)  # clicks at every phase of the frame
        time.sleep(1.0)
        lab.pause()
        settle(panel, lab)
        elapsed = time.monotonic() - t0
        delays.sort()
        # the median: a small part of a frame (paced, it was half a frame: 25 ms)
        assert delays[len(delays) // 2] < 0.15 / RATE_HZ, delays
        appends = [m for m in sent["spread"] if m["type"] == "append"]
        # steps still paced: a frame per period, plus at most one early frame per change
        assert len(appends) <= RATE_HZ * elapsed + len(delays) + 2, (len(appends), elapsed)
