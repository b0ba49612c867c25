"""The step functions a replica holds, under the key the driver names them by, so a training
loop's function travels once: the driver sends (key, pickle) until this replica has run it,
then (key, None); it also lists the keys it will not name again, which are dropped here."""

from __future__ import annotations

from typing import Any

import cloudpickle


class LoadedFunctions:
    def __init__(self):
        self._fns: dict[str, Any] = {}
        self._last: tuple[bytes, Any] | None = None  # `extended.update`'s function, by bytes

    def load(self, ref: tuple[str, bytes | None, tuple], where: str,
             feeds: dict[str, Any] | None = None) -> Any:
        key, data, forget = ref
        for old in forget:
            self._fns.pop(old, None)
            if feeds is not None:
                feeds.pop(old, None)
        fn = self._fns.get(key)
        if fn is None:
            if data is None:  # never expected: the driver resends it after any failure here
                raise RuntimeError(
                    f"{where} does not hold the step function the driver named ({key}); the "
                    "driver sends it again with the next call")
            fn = self._fns[key] = cloudpickle.loads(data)
        return fn

    def load_bytes(self, data: bytes) -> Any:
        if self._last is None or self._last[0] != data:
            self._last = (data, cloudpickle.loads(data))
        return self._last[1]
