"""Central differences: what hand-written and recorded gradients are checked against."""

from __future__ import annotations

import numpy as np


def numeric_grad(f, p: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """d f / d p by central differences, entry by entry (use float64 arrays)."""
    g = np.zeros_like(p)
    for i in np.ndindex(p.shape):
        up, down = p.copy(), p.copy()
        up[i] += h
        down[i] -= h
        g[i] = (f(up) - f(down)) / (2 * h)
    return g
