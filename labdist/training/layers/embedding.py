"""`Embedding`: a table of vectors looked up by integer id, Keras' first layer for text."""

from __future__ import annotations

from typing import Any

import numpy as np

from labdist import checks
from labdist.training.layers.base import Layer, Shape, check_input_shape


class Embedding(Layer):
    """(batch, ...) of ids in [0, input_dim) -> (batch, ..., output_dim): row `id` of the
    table (Keras' uniform(-0.05, 0.05) initial values). An id outside the table is refused
    before training starts (`check_input_values`), as TensorFlow refuses it on a CPU."""

    sliced = frozenset({"embeddings"})  # one gradient slice per lookup, as TensorFlow's

    def __init__(self, input_dim: int, output_dim: int,
                 input_shape: tuple[int, ...] | None = None):
        self.input_dim = checks.integer("input_dim", input_dim, 1)
        self.output_dim = checks.integer("output_dim", output_dim, 1)
        self.input_shape = check_input_shape(input_shape, example="(10,)")

    def output_shape(self, input_shape: Shape) -> Shape:
        return (*input_shape, self.output_dim)

    def param_shapes(self, input_shape: Shape) -> dict[str, Shape]:
        return {"embeddings": (self.input_dim, self.output_dim)}

    def build(self, input_shape: Shape, rng: np.random.Generator) -> dict[str, np.ndarray]:
        shape = (self.input_dim, self.output_dim)
        checks.array_bytes(f"{self!r} table", shape, 4)
        return {"embeddings": rng.uniform(-0.05, 0.05, shape).astype(np.float32)}

    def check_input_values(self, x: np.ndarray, what: str) -> None:
        whole = np.isfinite(x) & (x == np.round(x))
        bad = x[~whole] if not whole.all() else x[(x < 0) | (x >= self.input_dim)]
        if bad.size:
            raise ValueError(f"{what}: x holds {bad.reshape(-1)[0].item()!r}, not an id of "
                             f"{self!r}; allowed: whole numbers 0..{self.input_dim - 1}")

    def forward(self, xp, params, x, training: bool = False, rng: Any = None,
                state: dict | None = None):
        ids = x.astype(xp.int64)
        return params["embeddings"][ids], ids

    def backward(self, xp, params, cache, dy, input_grad: bool = True, out: dict | None = None):
        """The table's gradient: each looked-up row gets the sum of its lookups' gradients
        (rows never looked up get zeros); the ids themselves have no gradient."""
        grad = out["embeddings"] if out is not None else xp.empty_like(params["embeddings"])
        self._per_row(xp, cache, dy, grad)
        return (xp.zeros(cache.shape, dtype=dy.dtype) if input_grad else None), \
            {"embeddings": grad}

    def squared_slices(self, xp, cache, dy, out: dict) -> None:
        """Each row's sum of its lookups' squared gradients: what Keras 3's second moments
        take from TensorFlow's IndexedSlices (squared slice by slice, then summed)."""
        self._per_row(xp, cache, dy * dy, out["embeddings"])

    def _per_row(self, xp, ids, dy, into) -> None:
        """`dy` (one row per lookup) summed per looked-up id into `into` (zeros elsewhere)."""
        # one bincount over (id, column) pairs: every array module has it (cupy's has no
        # ufunc.at everywhere); it sums in float64, then the table's dtype
        cells = (ids.reshape(-1, 1) * self.output_dim + xp.arange(self.output_dim)).reshape(-1)
        sums = xp.bincount(cells, weights=dy.reshape(-1),
                           minlength=self.input_dim * self.output_dim)
        into[...] = sums.reshape(self.input_dim, self.output_dim)

    def get_config(self) -> dict[str, Any]:
        return {"input_dim": self.input_dim, "output_dim": self.output_dim,
                "input_shape": list(self.input_shape) if self.input_shape else None}

    def __repr__(self) -> str:
        return f"Embedding({self.input_dim}, {self.output_dim})"
