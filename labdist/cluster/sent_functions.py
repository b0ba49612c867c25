"""Which step functions each replica holds, so that a loop's function travels once.

The driver pickles a function only when something it holds may have changed
(`shipping.PickledFunctions`); each pickle is named by a digest of its bytes. A replica is
sent (key, bytes) until it has answered a call that ran that function, then (key, None); any
error from it makes the driver send the bytes again (a replica keeps the function it has).
The driver keeps the last LIMIT keys and tells replicas which ones to drop (replica/loaded.py).
"""

from __future__ import annotations

from typing import Any

from labdist import shipping

LIMIT = 16  # step functions a replica holds at most


class SentFunctions:
    def __init__(self):
        self._pickles = shipping.PickledFunctions()
        self._keys: dict[str, None] = {}  # keys in use, oldest first
        self._held: list[set[str]] = []  # per rank: the keys it holds
        self._drop: list[list[str]] = []  # per rank: keys to tell it to drop
        self._current: str | None = None  # the key of the run in progress

    def refs(self, fn: Any, n: int, forget: tuple = ()) -> list[tuple]:
        """Each rank's (key, bytes or None, keys to drop) for a run of `fn`."""
        key, data = self._pickles.dumps_cached(fn)
        while len(self._held) < n:
            self._held.append(set())
            self._drop.append([])
        self._keys.pop(key, None)
        self._keys[key] = None
        while len(self._keys) > LIMIT:
            old = next(iter(self._keys))
            del self._keys[old]
            for r in range(len(self._held)):
                if old in self._held[r]:
                    self._held[r].discard(old)
                    self._drop[r].append(old)
        self._current = key
        refs, alike = [], {}  # equal references are one object: their requests pickle once
        for r in range(n):
            drop, self._drop[r] = (*self._drop[r], *forget), []
            held = key in self._held[r]
            refs.append(alike.setdefault((held, drop), (key, None if held else data, drop)))
        return refs

    def answered(self, events: list, ranks: list[int] | None = None) -> list:
        """Note which ranks ran the current function (a "done" or "merge" answer) and which
        failed (sent the bytes again next time); returns `events`."""
        for r, event in zip(range(len(events)) if ranks is None else ranks, events,
                            strict=True):
            if event.kind == "error":
                self._held[r].clear()
            elif self._current is not None:
                self._held[r].add(self._current)
        return events
