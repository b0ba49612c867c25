"""Progress of `fit`/`evaluate`: a bar in a terminal, an ipywidgets bar in a notebook.

Keras prints text in both places; in JupyterLab a widget updates in place without flooding the
output area, so labdist uses one there when ipywidgets is installed, and text otherwise.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


def check_verbose(value: Any) -> int:
    """Keras' values: "auto" (= 1), 0 silent, 1 a bar, 2 one line per epoch."""
    if value == "auto" or value is True:
        return 1
    if value is False:
        return 0
    if isinstance(value, int) and value in (0, 1, 2):
        return int(value)
    raise ValueError(f"verbose: got {value!r}; expected 'auto', 0, 1 or 2")


def in_notebook() -> bool:
    """True inside a Jupyter kernel (where a widget can be drawn), False in a terminal."""
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    try:
        ip = shell.get_ipython()
    except AttributeError:
        return False
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


def _widgets():
    try:
        import ipywidgets
        from IPython.display import display
    except ImportError:
        return None
    return ipywidgets, display


class ProgressBar:
    """One bar per epoch: `update(done, logs)` while it runs, `finish(logs)` at its end.

    `verbose=1` draws the bar, `verbose=2` only the epoch's closing line, `0` nothing.
    """

    def __init__(self, title: str, total: int, verbose: int = 1,
                 stream: TextIO | None = None, widget: bool | None = None):
        self.title, self.total, self.verbose = title, max(int(total), 0), verbose
        self.stream = stream or sys.stdout
        self.start = time.perf_counter()
        self._last_draw = 0.0
        self._last_done = -1  # the count last drawn: the end is drawn once, whoever reports it
        use_widget = in_notebook() if widget is None else widget
        kit = _widgets() if (use_widget and verbose == 1) else None
        self.widget = None
        if kit is not None:
            ipywidgets, display = kit
            self._bar = ipywidgets.IntProgress(value=0, min=0, max=max(self.total, 1),
                                               description=title, bar_style="info")
            self._label = ipywidgets.Label(value="")
            self.widget = ipywidgets.HBox([self._bar, self._label])
            display(self.widget)

    def update(self, done: int, logs: dict[str, float]) -> None:
        if self.verbose != 1:
            return
        now = time.perf_counter()
        if done < self.total and now - self._last_draw < 0.05:  # ≤ 20 redraws a second
            return
        if done >= self.total and self._last_done == done:  # the watch drew the end already
            return
        self._last_draw, self._last_done = now, done
        if self.widget is not None:
            self._bar.value = done
            self._label.value = f"{done}/{self.total} {_items(logs)}"
            return
        width = 24
        filled = width * done // max(self.total, 1)
        bar = "=" * filled + (">" if filled < width else "") + "." * (width - filled - 1)
        self.stream.write(f"\r{self.title} {done}/{self.total} [{bar[:width]}] {_items(logs)}")
        self.stream.flush()

    def finish(self, logs: dict[str, float]) -> None:
        if self.verbose == 0:
            return
        seconds = time.perf_counter() - self.start
        line = f"{self.title} - {seconds:.1f}s" + (f" - {_items(logs)}" if logs else "")
        if self.widget is not None:
            self._bar.value = self._bar.max
            self._bar.bar_style = "success"
            self._label.value = line[len(self.title) + 3:]  # the bar shows the title
            return
        self.stream.write(f"\r{line}\n")
        self.stream.flush()


def _items(logs: dict[str, float]) -> str:
    return " - ".join(f"{k}: {v:.4f}" for k, v in logs.items())
