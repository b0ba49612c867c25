"""Sliding windows over images (batch, height, width, channels), shared by convolution and
pooling: TensorFlow's output sizes and padding, windows gathered by slicing (one slice per
offset in the window, so any array module that slices does it, cupy included), and their
gradients added back the same way."""

from __future__ import annotations

from typing import Any, NamedTuple

from labdist import checks

PADDINGS = ("valid", "same")


def check_padding(value: Any) -> str:
    if not isinstance(value, str) or value.lower() not in PADDINGS:
        checks.refuse("padding", value, "'valid' or 'same'")
    return value.lower()


class Geometry(NamedTuple):
    """Where the windows of one image size sit: the output size and the zeros padded before
    and after each axis. TensorFlow's rule for 'same': out = ceil(in / stride), and the odd
    padding row or column goes after (bottom, right)."""

    size: tuple[int, int]  # kernel or pool (rows, columns)
    strides: tuple[int, int]
    out: tuple[int, int]
    pad_before: tuple[int, int]
    pad_after: tuple[int, int]


def geometry(height: int, width: int, size: tuple[int, int], strides: tuple[int, int],
             padding: str) -> Geometry | None:
    """The windows' layout, or None when 'valid' windows do not fit in the image."""
    out, before, after = [], [], []
    for n, k, s in zip((height, width), size, strides, strict=True):
        if padding == "valid":
            o = (n - k) // s + 1 if n >= k else 0
            total = 0
        else:
            o = -(-n // s)
            total = max((o - 1) * s + k - n, 0)
        out.append(o)
        before.append(total // 2)
        after.append(total - total // 2)
    if min(out) < 1:
        return None
    return Geometry(size, strides, (out[0], out[1]), (before[0], before[1]),
                    (after[0], after[1]))


def for_images(layer, input_shape: tuple[int, ...], size: tuple[int, int],
               strides: tuple[int, int], padding: str) -> Geometry:
    """The geometry of `layer`'s windows (a convolution's or a pooling's) on images of
    `input_shape` (height, width, channels); Keras' `ValueError` where they cannot go."""
    if len(input_shape) != 3:
        raise layer.incompatible(input_shape, "images (height, width, channels)")
    g = geometry(input_shape[0], input_shape[1], size, strides, padding)
    if g is None:
        raise layer.incompatible(input_shape, f"images of at least {size[0]}x{size[1]} for "
                                 "padding='valid'")
    return g


def padded(xp, x, g: Geometry, fill: float = 0.0):
    """`x` with the geometry's padding around its height and width (no copy without any)."""
    if not any(g.pad_before) and not any(g.pad_after):
        return x
    n, h, w, c = x.shape
    out = xp.full((n, h + g.pad_before[0] + g.pad_after[0],
                   w + g.pad_before[1] + g.pad_after[1], c), fill, dtype=x.dtype)
    out[:, g.pad_before[0]:g.pad_before[0] + h, g.pad_before[1]:g.pad_before[1] + w] = x
    return out


def offsets(g: Geometry):
    """For each position (i, j) of the window, row-major: the (rows, cols) slices of the
    padded input that position sees, one entry per window."""
    (kh, kw), (sh, sw), (oh, ow) = g.size, g.strides, g.out
    return [(slice(i, i + sh * (oh - 1) + 1, sh), slice(j, j + sw * (ow - 1) + 1, sw))
            for i in range(kh) for j in range(kw)]


def gather(xp, x, g: Geometry, fill: float = 0.0):
    """(batch, out_rows, out_cols, kernel_rows, kernel_cols, channels): every window of `x`,
    padded with `fill` (zeros for convolution, -inf for max pooling)."""
    xp_ = padded(xp, x, g, fill)
    (kh, kw), (oh, ow) = g.size, g.out
    out = xp.empty((len(x), oh, ow, kh, kw, x.shape[3]), dtype=x.dtype)
    for k, (rows, cols) in enumerate(offsets(g)):
        out[:, :, :, k // kw, k % kw, :] = xp_[:, rows, cols]
    return out


def scatter(xp, windows, g: Geometry, shape: tuple[int, ...]):
    """The adjoint of `gather`: each window entry's gradient added back to the input position
    it came from (overlapping windows add up), padding dropped; `shape` is the input's."""
    kw = g.size[1]
    full = zeros_padded(xp, g, shape, windows.dtype)
    for k, (rows, cols) in enumerate(offsets(g)):
        full[:, rows, cols] += windows[:, :, :, k // kw, k % kw, :]
    return unpadded(full, g, shape)


def zeros_padded(xp, g: Geometry, shape: tuple[int, ...], dtype):
    """Zeros shaped as the padded input (what `scatter` adds gradients into)."""
    n, h, w, c = shape
    return xp.zeros((n, h + g.pad_before[0] + g.pad_after[0],
                     w + g.pad_before[1] + g.pad_after[1], c), dtype=dtype)


def unpadded(full, g: Geometry, shape: tuple[int, ...]):
    """The input's part of a padded array."""
    h, w = shape[1], shape[2]
    return full[:, g.pad_before[0]:g.pad_before[0] + h, g.pad_before[1]:g.pad_before[1] + w]
