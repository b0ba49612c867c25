"""`Histogram`: counts per integer bin, sent as increments — the parameter servers' staleness
histogram, with torn reads, lost updates and dropped gradients in its note. Front end:
widgets/histogram.js."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import traitlets

from labdist.ui.stream import StreamChart, esm


class Histogram(StreamChart):
    _esm = esm("histogram")
    y_label = traitlets.Unicode("count").tag(sync=True)
    note = traitlets.Unicode("").tag(sync=True)
    color = traitlets.Unicode("#4c72b0").tag(sync=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._counts: Counter[int] = Counter()
        self._events: list[str] = []

    @property
    def counts(self) -> dict[int, int]:
        return dict(self._counts)

    def add(self, counts: Mapping[int, int]) -> None:
        """Increments per bin."""
        counts = {int(k): int(v) for k, v in counts.items() if v}
        if not counts:
            return
        with self._delta_lock:
            self._counts.update(counts)
            self._emit({"type": "add", "counts": {str(k): v for k, v in counts.items()}})

    def event(self, label: str) -> None:
        with self._delta_lock:
            self._events.append(label)
            self._emit({"type": "event", "label": label})

    def reset(self) -> None:
        with self._delta_lock:
            self._counts.clear()
            self._events.clear()
            self._emit({"type": "reset"})

    def _snapshot(self) -> dict:
        return {"counts": {str(k): v for k, v in self._counts.items()},
                "events": list(self._events)}
