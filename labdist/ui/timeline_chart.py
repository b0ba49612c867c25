"""`TimelineChart`: where each replica's, PS worker's and parameter server's time went over the
last steps, one lane each, bars coloured by phase, a legend, the mode switches marked, and a
line in words (timing/timeline.py's `summary`). Fed with `timeline.collect(...)`'s processes;
each `show` replaces the window the chart draws. Front end: widgets/timeline.js."""

from __future__ import annotations

import time
from typing import Any

import traitlets

from labdist import checks
from labdist.timing import phases, timeline
from labdist.ui.stream import StreamChart, esm

PHASE_COLORS = {"compute": "#4c72b0", "wait": "#dd8452", "comm": "#55a868", "apply": "#8172b3",
                "pull": "#64b5cd", "push": "#937860", "lock": "#c44e52", "input": "#ccb974",
                "driver": "#8c8c8c"}
LAST_STEPS = 20  # steps per lane the chart shows by default


def lane_name(process: dict[str, Any]) -> str:
    """What a process is, from what it recorded: replica r, PS worker w, or parameter server."""
    for name, _, _, _, args in process["spans"]:
        if name == phases.STEP and args and "rank" in args:
            return f"replica {args['rank']}"
        if name == phases.STEP and args and "worker" in args:
            return f"PS worker {args['worker']}"
    if any(s[0] == "apply" for s in process["spans"]):
        return "parameter server"
    return process["name"]


class TimelineChart(StreamChart):
    _esm = esm("timeline")
    x_label = traitlets.Unicode("ms before the latest span").tag(sync=True)
    height = traitlets.Int(170).tag(sync=True)
    series = traitlets.List(list(PHASE_COLORS)).tag(sync=True)  # the legend
    colors = traitlets.List(list(PHASE_COLORS.values())).tag(sync=True)
    note = traitlets.Unicode("").tag(sync=True)  # the line in words

    def __init__(self, steps: int = LAST_STEPS, **kwargs: Any):
        checks.integer("steps", steps, 1, meaning="steps a lane shows")
        super().__init__(**kwargs)
        self.steps = steps
        self._window: dict[str, Any] = {"lanes": [], "bars": [], "marks": [], "end": 0.0}
        self._marks: list[tuple[float, str]] = []

    @property
    def window(self) -> dict[str, Any]:
        """What the chart draws: lanes, bars [lane, start ms, end ms, phase], marks."""
        return self._window

    def mark(self, label: str, at: float | None = None) -> None:
        """A mode switch (or any event) at wall time `at` (default now), drawn as a line."""
        self._marks.append((time.time() if at is None else at, label))
        del self._marks[:-20]

    def event(self, step: int, label: str) -> None:
        """A mode switch at step `step` (the lab's publisher tells every chart)."""
        self.mark(f"step {step}: {label}")

    def reset(self) -> None:
        """Start again (the lab's reset): no bars, no marks."""
        self._marks.clear()
        with self._delta_lock:
            self._window = {"lanes": [], "bars": [], "marks": [], "end": 0.0}
            self.note = ""
            self._emit({"type": "snapshot", **self._snapshot()})

    def refresh(self, client: Any, seconds: float = 3.0, workers: list[str] | None = None
                ) -> None:
        """Show what every process of `client`'s cluster (or its `workers`) recorded in the
        last `seconds`."""
        self.show(timeline.collect(client, time.time() - seconds, rounds=2, workers=workers))

    def show(self, processes: list[dict[str, Any]]) -> None:
        """Draw the last `steps` steps of each lane of `processes` (timeline.collect's)."""
        lanes, bars = [], []
        end = max((s[2] for p in processes for s in p["spans"]), default=0.0)
        since = self._since(processes)
        for proc in sorted(processes, key=lane_name):
            spans = [s for s in proc["spans"] if s[0] != phases.STEP and s[2] > since]
            if not spans:
                continue
            lane = len(lanes)
            lanes.append(lane_name(proc))
            bars += [[lane, round((max(s[1], since) - end) * 1e3, 3),
                      round((s[2] - end) * 1e3, 3), s[0]] for s in spans]
        marks = [[round((at - end) * 1e3, 3), label] for at, label in self._marks]
        with self._delta_lock:
            self._window = {"lanes": lanes, "bars": bars, "marks": marks, "end": end}
            self.note = timeline.summary(processes)
            self._emit({"type": "snapshot", **self._snapshot()})

    def _since(self, processes: list[dict[str, Any]]) -> float:
        """One window for every lane: from the earliest of the lanes' `steps`-th last step
        start, so each lane shows at least its last `steps` steps and lanes without steps
        (the driver, a parameter server) show the same stretch of time, not all they hold."""
        starts = []
        for proc in processes:
            steps = sorted(s[1] for s in proc["spans"] if s[0] == phases.STEP)
            if steps:
                starts.append(steps[-self.steps] if len(steps) >= self.steps else steps[0])
        if starts:
            return min(starts)
        return min((s[1] for p in processes for s in p["spans"]), default=0.0)

    def _snapshot(self) -> dict:
        return dict(self._window)
