"""Messages of arrays for the shared-memory transport, laid out once per shape: a
(sig, arrays) message whose arrays are C-contiguous and hold no objects pickles to the same
bytes whatever the values (the arrays travel out of band), so its meta and offsets are made
once and the publisher only copies the arrays in. Each layout gets a number, written beside
the stamp: a reader that sees the same number (and area and offset) again reuses its parse.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from labdist.shm import area

MAX_LAYOUTS = 64  # message layouts remembered (a training loop uses a handful)


class Layouts:
    """One publisher's layouts: (sig, shapes and dtypes) -> (meta, offsets, end, number)."""

    def __init__(self) -> None:
        self._known: dict[tuple, tuple[bytes, list[int], int, int]] = {}
        self._numbered = 0

    def of(self, message: Any) -> tuple[tuple[bytes, list[int], int, int] | None, list]:
        """(meta, offsets, end, layout number) of a (sig, arrays) message, `arrays` a list of
        arrays or, per peer, of such lists and None, whose pickles depend on their shapes and
        dtypes alone (C-contiguous, no objects): the same bytes every step, so they are made
        once and peers parse them once; and the arrays in pickling order. (None, []) else."""
        payload = message[1] if type(message) is tuple and len(message) == 2 else None
        if type(payload) is not list:
            return None, []
        arrays: list[np.ndarray] = []
        shape: list = []
        for item in payload:
            if type(item) is list:
                arrays.extend(item)
                shape.append(tuple((a.shape, a.dtype) if type(a) is np.ndarray else None
                                   for a in item))
            elif item is None:
                shape.append(None)
            else:
                arrays.append(item)
                shape.append((getattr(item, "shape", None), getattr(item, "dtype", None)))
        for a in arrays:
            if (type(a) is not np.ndarray or not a.flags.c_contiguous or a.dtype.hasobject
                    or a.size == 0):
                return None, []
        try:
            key = (message[0], tuple(shape))
            known = self._known.get(key)
        except TypeError:  # a signature that cannot be a key
            return None, []
        if known is None:
            buffers: list[pickle.PickleBuffer] = []
            inner = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
            sizes = [b.raw().nbytes for b in buffers]
            if len(sizes) != len(arrays):  # pickled in band after all: contents in the meta
                return None, []
            meta = pickle.dumps((inner, sizes), protocol=5)
            offsets, end = area.layout([*sizes, len(meta)])
            if len(self._known) >= MAX_LAYOUTS:
                self._known.clear()
            self._numbered += 1
            known = self._known[key] = (meta, offsets, end, self._numbered)
        return known, arrays
