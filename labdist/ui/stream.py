"""What the lab's charts share: an anywidget whose ES module lives in `widgets/`, a lock, and the
delta protocol. The kernel sends only deltas; a front end that (re)connects says "hello" and
gets one snapshot of what the chart holds, so a reload or a second view starts complete.
"""

from __future__ import annotations

import math
import re
import threading
from pathlib import Path
from typing import Any

import anywidget
import traitlets

_PACKAGE = Path(__file__).resolve().parent.parent
FOLDERS = (_PACKAGE / "widgets", _PACKAGE.parent / "widgets")  # the wheel's, a checkout's
SHARED = "_shared.js"  # the helpers every chart's module imports
_IMPORT = re.compile(r"^import \{[^}]*\} from \"\./_shared\.js\";\n", re.MULTILINE)
_EXPORT = re.compile(r"^export (?=function |const |let |class )", re.MULTILINE)


def esm(name: str) -> str:
    """The ES module of chart `name`, as anywidget takes it (one module per widget): found
    inside the installed wheel (labdist/widgets/) or, in a source checkout, the repository's
    widgets/ folder, and assembled there (see `assemble`)."""
    if not isinstance(name, str) or not name or name.startswith("_") or "/" in name:
        raise ValueError(f"name={name!r} must name a chart's module in widgets/, e.g. "
                         "'line_chart'")
    for folder in FOLDERS:
        if (folder / f"{name}.js").is_file():
            return assemble(folder, name)
    raise FileNotFoundError(f"the widget module {name}.js is missing from {FOLDERS[0]}"
                            " (a broken install?)")


def assemble(folder: Path, name: str) -> str:
    """`folder`/`name`.js with the helpers of `folder`/_shared.js in front, as one ES module:
    the chart's `import {...} from "./_shared.js"` line and the helpers' `export` words go, so
    both files stay real modules for an editor while anywidget gets a single one."""
    shared = (folder / SHARED).read_text(encoding="utf-8")
    own = (folder / f"{name}.js").read_text(encoding="utf-8")
    return (f"{_EXPORT.sub('', shared)}\n// ---- {name}.js ----\n{_IMPORT.sub('', own)}")


def clean(value: float) -> float | None:
    """JSON has no NaN or infinity: the front end draws a gap for None."""
    value = float(value)
    return value if math.isfinite(value) else None


class StreamChart(anywidget.AnyWidget):
    """A chart fed by deltas from any thread (sends are serialised by a lock), with what every
    chart shows: a title, axis titles and a height (px)."""

    title = traitlets.Unicode("").tag(sync=True)
    x_label = traitlets.Unicode("").tag(sync=True)
    y_label = traitlets.Unicode("").tag(sync=True)
    height = traitlets.Int(190).tag(sync=True)
    caption = traitlets.Unicode("").tag(sync=True)  # one line: what it shows, in this mode
    series = traitlets.List(traitlets.Unicode()).tag(sync=True)  # what the legend lists
    # series the legend leaves out: a quorum lab's replica slots with no replica in them
    hidden = traitlets.List(traitlets.Unicode()).tag(sync=True)

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
