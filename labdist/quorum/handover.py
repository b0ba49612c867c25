"""Variable copies handed from one replica actor to its successor on the same worker, when a
quorum-trained replica group moves to its next membership epoch: the survivor's state stays in
the process (no copy, no disk) while the old actor closes and the new one starts."""

from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()
_parked: dict[str, dict[int, Any]] = {}  # token -> var_id -> array (at most one per process)


def park(token: str, values: dict[int, Any]) -> None:
    """Keep `values` for the actor that will `take(token)`; drops anything parked before (a
    successor that never came, e.g. its epoch failed to form)."""
    with _lock:
        _parked.clear()
        _parked[token] = values


def take(token: str) -> dict[int, Any] | None:
    """The values parked under `token` (once), or None when there are none here."""
    with _lock:
        return _parked.pop(token, None)
