"""LiteRT's integer RESIZE_BILINEAR (reference ResizeBilinearInteger) as a pure function,
bit-exact with its reference kernel: the codes are interpolated directly, since input and
output share their quantization."""

from __future__ import annotations

import numpy as np

from ..errors import OpError
from .family import INT8, INT16, checked
from .fixedpoint import IntegerKernelError

# -- RESIZE_BILINEAR ---------------------------------------------------------------------------

def _c_div(a, b):
    """C's truncating integer division."""
    a = np.asarray(a, np.int64)
    q = np.abs(a) // b
    return np.where(a < 0, -q, q)


def _integer_axis(in_size: int, out_size: int, align_corners: bool, half_pixel: bool):
    """ComputeInterpolationValuesInteger: source positions in 1/1024 units and neighbours."""
    if align_corners and out_size > 1:
        scale = ((1 << 10) * (in_size - 1) + (out_size - 1) // 2) // (out_size - 1)
    else:
        scale = ((1 << 10) * in_size + out_size // 2) // out_size
    pos = np.arange(out_size, dtype=np.int64) * scale
    if half_pixel:
        pos = pos + scale // 2 - (1 << 9)
    lower = np.maximum(_c_div(pos, 1 << 10), 0)
    upper = np.minimum(_c_div(pos + (1 << 10) - 1, 1 << 10), in_size - 1)
    return lower, upper, pos - (lower << 10)


def resize_bilinear(x_q, out_hw, *, align_corners: bool = False, half_pixel_centers: bool = False) -> np.ndarray:
    """int8 RESIZE_BILINEAR (reference ResizeBilinearInteger): 10-bit fixed-point positions,
    the four weighted neighbours summed in 20 bits and rounded half away from zero. Input
    and output share their quantization, so the codes are interpolated directly."""
    x = np.asarray(x_q)
    if x.ndim != 4:
        raise IntegerKernelError(f"RESIZE_BILINEAR: input must be 4-D NHWC, got {list(x.shape)}")
    if align_corners and half_pixel_centers:
        raise IntegerKernelError("RESIZE_BILINEAR: if half_pixel_centers is True, align_corners must be False")
    return xp_resize_bilinear(np, x.astype(np.int64), out_hw, align_corners, half_pixel_centers).astype(x.dtype)


def xp_resize_bilinear(xp, x, out_hw, align_corners: bool, half_pixel_centers: bool):
    """`resize_bilinear`'s arithmetic over array namespace ``xp`` (NumPy, or jax.numpy in
    kiln.xla) on int64 codes: the four weighted neighbours of each output pixel (positions from
    `_integer_axis`, constants) summed in 20 bits, rounded half away from zero; int64 out."""
    y0, y1, dy = _integer_axis(x.shape[1], out_hw[0], align_corners, half_pixel_centers)
    x0, x1, dx = _integer_axis(x.shape[2], out_hw[1], align_corners, half_pixel_centers)
    dy, dx = dy[None, :, None, None], dx[None, None, :, None]
    one = 1 << 10
    top, bottom = x[:, y0], x[:, y1]
    total = (top[:, :, x0] * (one - dy) * (one - dx) + bottom[:, :, x0] * dy * (one - dx)
             + top[:, :, x1] * (one - dy) * dx + bottom[:, :, x1] * dy * dx)
    rounded = total + xp.where(total > 0, 1 << 19, -(1 << 19))
    return xp.sign(rounded) * (xp.abs(rounded) // (1 << 20))      # C's truncating division


def _resize_bilinear(call, x, size):
    size = np.asarray(size).reshape(-1)
    if size.size != 2 or size.dtype.kind not in "iu" or np.any(size <= 0):
        raise OpError(f"{call.op.name}: size must be a positive integer [new_height, new_width], got {size}")
    return checked(call, resize_bilinear, x, (int(size[0]), int(size[1])),
                align_corners=bool(call.opts.align_corners), half_pixel_centers=bool(call.opts.half_pixel_centers))


RESIZE_BILINEAR = {INT8: _resize_bilinear, INT16: _resize_bilinear}   # on the codes: any width
