"""Pooling: `MaxPooling2D` and `AveragePooling2D` over channels-last images, and
`GlobalAveragePooling1D` over sequences, with TensorFlow's output sizes and padding."""

from __future__ import annotations

from typing import Any

from labdist.training.layers import windows
from labdist.training.layers.base import Layer, Shape, check_input_shape, pair


class _Pooling2D(Layer):
    """What both 2-D poolings share: windows of `pool_size`, moved by `strides` (default: the
    pool size, as Keras), 'valid' or 'same' padding."""

    def __init__(self, pool_size: int | tuple[int, int] = (2, 2),
                 strides: int | tuple[int, int] | None = None, padding: str = "valid",
                 input_shape: tuple[int, int, int] | None = None):
        self.pool_size = pair("pool_size", pool_size)
        self.strides = self.pool_size if strides is None else pair("strides", strides)
        self.padding = windows.check_padding(padding)
        self.input_shape = check_input_shape(input_shape, 3, "(28, 28, 1)")

    def _geometry(self, input_shape: Shape) -> windows.Geometry:
        return windows.for_images(self, input_shape, self.pool_size, self.strides, self.padding)

    def output_shape(self, input_shape: Shape) -> Shape:
        return (*self._geometry(input_shape).out, input_shape[2])

    def get_config(self) -> dict[str, Any]:
        return {"pool_size": list(self.pool_size), "strides": list(self.strides),
                "padding": self.padding,
                "input_shape": list(self.input_shape) if self.input_shape else None}

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.pool_size}, strides={self.strides}, "
                f"padding={self.padding!r})")


class MaxPooling2D(_Pooling2D):
    """The largest value of each window; its gradient goes to that one entry (the first, in
    row-major order, when several tie)."""

    def forward(self, xp, params, x, training: bool = False, rng: Any = None,
                state: dict | None = None):
        """A running maximum over the window's positions, each a strided view of the padded
        input: no gathered copy of the windows, no argmax (`backward` finds the winners)."""
        g = self._geometry(x.shape[1:])
        padded = windows.padded(xp, x, g, -xp.inf)
        (rows, cols), *rest = windows.offsets(g)
        best = padded[:, rows, cols].copy()
        for rows, cols in rest:
            xp.maximum(best, padded[:, rows, cols], out=best)
        return best, (padded, best, x.shape, g)

    def backward(self, xp, params, cache, dy, input_grad: bool = True, out: dict | None = None):
        """Each window's gradient to the first position (row-major) holding its maximum, as
        TensorFlow breaks ties; windows that do not overlap are written, not added."""
        if not input_grad:
            return None, {}
        padded, best, shape, g = cache
        full = windows.zeros_padded(xp, g, shape, dy.dtype)
        taken = xp.zeros(best.shape, dtype=bool)
        overlap = g.strides[0] < g.size[0] or g.strides[1] < g.size[1]
        for rows, cols in windows.offsets(g):
            hit = padded[:, rows, cols] == best
            hit &= ~taken
            taken |= hit
            if overlap:
                full[:, rows, cols] += dy * hit
            else:
                xp.multiply(dy, hit, out=full[:, rows, cols])
        return windows.unpadded(full, g, shape), {}


class AveragePooling2D(_Pooling2D):
    """The mean of each window; with 'same' padding, TensorFlow's mean over the entries inside
    the image only (the padding is not counted)."""

    def _counts(self, xp, shape, g: windows.Geometry, dtype):
        """How many entries of each window lie inside the image: (1, out_rows, out_cols, 1)."""
        inside = windows.gather(xp, xp.ones((1, shape[1], shape[2], 1), dtype=dtype), g)
        return inside.sum(axis=(3, 4))

    def forward(self, xp, params, x, training: bool = False, rng: Any = None,
                state: dict | None = None):
        g = self._geometry(x.shape[1:])
        cols = windows.gather(xp, x, g)
        counts = self._counts(xp, x.shape, g, x.dtype)
        return cols.sum(axis=(3, 4)) / counts, (counts, x.shape, g)

    def backward(self, xp, params, cache, dy, input_grad: bool = True, out: dict | None = None):
        if not input_grad:
            return None, {}
        counts, shape, g = cache
        share = dy / counts
        n, oh, ow, c = dy.shape
        dcols = xp.broadcast_to(share[:, :, :, None, None, :], (n, oh, ow, *g.size, c))
        return windows.scatter(xp, dcols, g, shape), {}


class GlobalAveragePooling1D(Layer):
    """(batch, steps, features) -> (batch, features): the mean over the steps."""

    def __init__(self, input_shape: tuple[int, int] | None = None):
        self.input_shape = check_input_shape(input_shape, 2, "(10, 16)")

    def output_shape(self, input_shape: Shape) -> Shape:
        if len(input_shape) != 2:
            raise self.incompatible(input_shape, "sequences (steps, features)")
        return (input_shape[1],)

    def forward(self, xp, params, x, training: bool = False, rng: Any = None,
                state: dict | None = None):
        return x.mean(axis=1), x.shape

    def backward(self, xp, params, cache, dy, input_grad: bool = True, out: dict | None = None):
        if not input_grad:
            return None, {}
        steps = cache[1]
        return xp.broadcast_to((dy / steps)[:, None, :], cache).copy(), {}

    def get_config(self) -> dict[str, Any]:
        return {"input_shape": list(self.input_shape) if self.input_shape else None}

    def __repr__(self) -> str:
        return "GlobalAveragePooling1D()"
