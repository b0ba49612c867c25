"""`LineChart`: values over training steps, one line per series (replicas, or the global
value), with the lab's events drawn as markers. Its front end is widgets/line_chart.js."""

from __future__ import annotations

from collections.abc import Sequence

import traitlets

from labdist.ui.stream import StreamChart, clean, esm

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#17becf"]
MAX_POINTS = 4000  # per series; older points are thinned (as the front end does)
DEFAULT_WINDOW = 200  # steps shown: 5 s at 40 steps/s, long enough to see a drift


class LineChart(StreamChart):
    _esm = esm("line_chart")
    x_label = traitlets.Unicode("step").tag(sync=True)
    series = traitlets.List(traitlets.Unicode()).tag(sync=True)
    colors = traitlets.List(traitlets.Unicode(), PALETTE).tag(sync=True)
    log_y = traitlets.Bool(False).tag(sync=True)
    emphasis = traitlets.Int(-1).tag(sync=True)  # a series drawn thicker (e.g. "global")
    zero_y = traitlets.Bool(False).tag(sync=True)  # the y axis always shows 0 (throughput)
    # the steps shown: the last `window` (0: all); the y axis fits what is shown
    window = traitlets.Int(DEFAULT_WINDOW).tag(sync=True)

    @traitlets.validate("window")
    def _check_window(self, proposal):
        value = proposal["value"]
        if value < 0:
            raise traitlets.TraitError(f"window={value!r} must be 0 (every step) or a number "
                                       "of steps > 0")
        return value

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._x: list[float] = []
        self._y: list[list[float | None]] = [[] for _ in self.series]
        self._events: list[dict] = []

    def append(self, x: Sequence[float], ys: Sequence[Sequence[float]]) -> None:
        """New points: `x` steps, and for each series its values at those steps."""
        if not len(x):
            return
        x = [float(v) for v in x]
        ys = [[clean(v) for v in col] for col in ys]
        with self._delta_lock:
            self._x += x
            for i, col in enumerate(ys):
                self._y[i] += col
            if len(self._x) > MAX_POINTS:
                keep = [i for i in range(len(self._x)) if i % 2 == 0 or i == len(self._x) - 1]
                self._x = [self._x[i] for i in keep]
                self._y = [[col[i] for i in keep] for col in self._y]
            self._emit({"type": "append", "x": x, "y": ys})

    def event(self, x: float, label: str) -> None:
        with self._delta_lock:
            self._events.append({"x": float(x), "label": label})
            self._emit({"type": "event", "x": float(x), "label": label})

    def reset(self) -> None:
        with self._delta_lock:
            self._x, self._y, self._events = [], [[] for _ in self.series], []
            self._emit({"type": "reset"})

    def _snapshot(self) -> dict:
        return {"x": list(self._x), "y": [list(c) for c in self._y],
                "events": list(self._events)}
