"""`EventLog`: the panel's log of what happened (switches, refusals, a divergence, a reset).
It keeps every line since the last reset, so it never misses an entry `lab.events` holds,
and shows them newest at the bottom, scrolled there (a reversed flex column keeps the scroll
anchored at the end without any script). Lines come from several threads: a lock orders them."""

from __future__ import annotations

import html
import threading

import ipywidgets as w

STYLE = ("max-height:140px;overflow:auto;display:flex;flex-direction:column-reverse;"
         "border:1px solid #ddd;font:12px/1.35 monospace;padding:2px 6px;white-space:pre-wrap")


class EventLog:
    def __init__(self):
        self._lock = threading.Lock()
        self._lines: list[str] = []
        self.widget = w.HTML(self._render())
        self.widget.add_class("labdist-log")

    @property
    def lines(self) -> list[str]:
        with self._lock:
            return list(self._lines)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def append(self, line: str) -> None:
        with self._lock:
            self._lines.append(line)
            self.widget.value = self._render()

    def clear(self) -> None:
        with self._lock:
            self._lines.clear()
            self.widget.value = self._render()

    def _render(self) -> str:
        body = "\n".join(html.escape(line) for line in self._lines) or "(no events yet)"
        return f"<div style='{STYLE}'><div>{body}</div></div>"
