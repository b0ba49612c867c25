"""What the lab's charts share: an anywidget whose ES module lives in `widgets/`, a lock, and the
delta protocol. The kernel sends only deltas; a front end that (re)connects says "hello" and
gets one snapshot of what the chart holds, so a reload or a second view starts complete.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

import anywidget

_PACKAGE = Path(__file__).resolve().parent.parent


def esm(name: str) -> Path:
    """The ES module `name`.js: inside the installed wheel (labdist/widgets/) or, in a source
    checkout, the repository's widgets/ folder."""
    for folder in (_PACKAGE / "widgets", _PACKAGE.parent / "widgets"):
        path = folder / f"{name}.js"
        if path.is_file():
            return path
    raise FileNotFoundError(f"the widget module {name}.js is missing from {_PACKAGE / 'widgets'}"
                            " (a broken install?)")


def clean(value: float) -> float | None:
    """JSON has no NaN or infinity: the front end draws a gap for None."""
    value = float(value)
    return value if math.isfinite(value) else None


class StreamChart(anywidget.AnyWidget):
    """A chart fed by deltas from any thread (sends are serialised by a lock)."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._delta_lock = threading.RLock()
        self.messages_sent = 0
        self.on_msg(self._from_frontend)

    def _from_frontend(self, _widget, content: dict, _buffers) -> None:
        if isinstance(content, dict) and content.get("type") == "hello":
            with self._delta_lock:
                self._emit({"type": "snapshot", **self._snapshot()})

    def _emit(self, message: dict) -> None:
        self.messages_sent += 1
        self.send(message)

    def _snapshot(self) -> dict:
        raise NotImplementedError
