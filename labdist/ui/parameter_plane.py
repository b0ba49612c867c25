"""`ParameterPlane`: for a model with two parameters, each replica's path through the
(a, b) plane over the loss surface, so convergence and drift show as paths. Points arrive as
deltas; the surface is sent again only when the data (skew) or the view's box changes.
Front end: widgets/parameter_plane.js."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import traitlets

from labdist import checks
from labdist.ui.line_chart import PALETTE
from labdist.ui.stream import StreamChart, esm

MAX_POINTS = 3000  # per replica, thinned by half beyond (as the front end does)


class ParameterPlane(StreamChart):
    _esm = esm("parameter_plane")
    series = traitlets.List(traitlets.Unicode()).tag(sync=True)
    colors = traitlets.List(traitlets.Unicode(), PALETTE).tag(sync=True)
    height = traitlets.Int(300).tag(sync=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._paths: list[list[list[float]]] = [[] for _ in self.series]
        self._events: list[dict] = []
        self._contours: dict | None = None

    @property
    def bounds(self) -> tuple[float, float, float, float] | None:
        return tuple(self._contours["bounds"]) if self._contours else None

    def recent(self, count: int) -> list[list[list[float]]]:
        """Each replica's last `count` points ([a, b] pairs), oldest first."""
        checks.integer("count", count, 0)
        with self._delta_lock:
            return [path[-count:] if count else [] for path in self._paths]

    def append(self, points: Sequence[np.ndarray]) -> None:
        """`points`: for each new step, a (replicas, 2) array of where each replica is."""
        if not len(points):
            return
        steps = [np.asarray(p, float).round(6).tolist() for p in points]
        with self._delta_lock:
            for step in steps:
                for r, p in enumerate(step):
                    self._paths[r].append(p)
            if self._paths and len(self._paths[0]) > MAX_POINTS:
                self._paths = [[p for i, p in enumerate(path) if i % 2 == 0 or i == len(path) - 1]
                               for path in self._paths]
                self._events = [{**e, "index": e["index"] // 2} for e in self._events]
            self._emit({"type": "append", "points": steps})

    def event(self, label: str) -> None:
        """A marker where every replica is now (the last point of each path)."""
        with self._delta_lock:
            index = max(len(self._paths[0]) - 1, 0) if self._paths else 0
            self._events.append({"index": index, "label": label})
            self._emit({"type": "event", "index": index, "label": label})

    def set_surface(self, bounds: Sequence[float], z: np.ndarray) -> None:
        """The loss on a grid over `bounds` = (a0, a1, b0, b1): z[j, i] at b_j, a_i."""
        z = np.asarray(z, float)
        contours = {"bounds": [float(v) for v in bounds], "ny": int(z.shape[0]),
                    "nx": int(z.shape[1]), "z": np.round(z.reshape(-1), 8).tolist()}
        with self._delta_lock:
            self._contours = contours
            self._emit({"type": "contours", "contours": contours})

    def reset(self) -> None:
        with self._delta_lock:
            self._paths = [[] for _ in self.series]
            self._events = []
            self._emit({"type": "reset"})

    def _snapshot(self) -> dict:
        return {"paths": [list(p) for p in self._paths], "events": list(self._events),
                "contours": self._contours}
