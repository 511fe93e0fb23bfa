"""Kernel families of the 2-D pools, MAX_POOL_2D and AVERAGE_POOL_2D: float and integer (int8,
uint8, 16x8), per number format (kiln.kernels.family).

Both fold the window taps in order over the whole tensor (kiln.kernels.windows). MAX_POOL_2D
pads with its type's lowest value, which never wins (a window always holds an input pixel);
AVERAGE_POOL_2D sums the taps inside the input and divides by their count — in float for float
tensors, in integers rounding half away from zero for quantized ones (LiteRT's reference
kernels: ``(sum ± count/2) / count`` in C's truncating division). The quantized kernels take
input and output with one quantization (LiteRT requires it) and clamp to the fused
activation's range in the output's codes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import OpError
from ..schema import Activation
from .dense import INT8, INT16, UINT8
from .family import (
    Format,
    as_float,
    float_dtype,
    float_range,
    fused_activation,
    nhwc,
    out_params,
    params,
    reject_quantized,
)
from .fixedpoint import activation_range, dtype_range
from .windows import Window, padded, windows


@dataclass
class Pool:
    window: Window
    out_shape: tuple
    dtype: np.dtype                 # what the taps are folded in
    lo: float
    hi: float
    out_dtype: np.dtype
    counts: np.ndarray | None = None    # AVERAGE_POOL_2D: [1, OH, OW, 1] pixels inside each window
    clip: bool = True                   # whether [lo, hi] is narrower than the type's range
    workspace: dict = field(default_factory=dict, repr=False)


def pool_shape(opts, x) -> tuple[int, ...]:
    """A pool's output shape (its records' shape rule)."""
    if len(x) != 4:
        raise OpError(f"pooling input must be 4-D NHWC, got {list(x)}")
    window = Window.of_2d(opts, x[1:3], (opts.filter_height, opts.filter_width))
    return (x[0], *window.out, x[3])


def _window(call, x) -> Window:
    opts = call.opts
    nhwc(call, x.shape)
    if opts.filter_height <= 0 or opts.filter_width <= 0:
        raise OpError(f"{call.op.name}: filter size {opts.filter_height}x{opts.filter_width} must be positive")
    return Window.of_2d(opts, x.shape[1:3], (opts.filter_height, opts.filter_width))


def _counts(x_shape, window: Window, dtype) -> np.ndarray:
    """[1, OH, OW, 1]: how many in-bounds pixels each window covers, summed tap by tap."""
    inside = np.pad(np.ones((1, *x_shape[1:3], 1), dtype), ((0, 0), *window.pads, (0, 0)))
    count = np.zeros((1, *window.out, 1), dtype)
    for tap in windows(np, inside, window, taps=True):
        count += tap
    return count


def prepare_float_pool(call, inputs) -> Pool:
    """Float pools; MAX_POOL_2D also takes integer codes whose input and output share one
    quantization (max commutes with it)."""
    x = inputs[0]
    maximum = call.op.op_type == "MAX_POOL_2D"
    dtype = np.dtype(x.dtype)
    if maximum and dtype in (np.int8, np.uint8, np.int16):
        reject_quantized(call, shared_ok=True)
        if call.opts.fused_activation_function != Activation.NONE:
            raise OpError("MAX_POOL_2D: fused activation on integer input is not implemented")
        lo, hi = dtype_range(dtype)
    else:
        if maximum and dtype.kind != "f" and dtype.name != "bfloat16":
            raise OpError(f"MAX_POOL_2D: input type {x.dtype} is not supported")
        reject_quantized(call)
        dtype = float_dtype(call, x, "input") if not maximum else dtype   # MAX_POOL_2D keeps its type
        lo, hi = float_range(call.opts.fused_activation_function, dtype)
    window = _window(call, x)
    counts = None if maximum else _counts(x.shape, window, dtype)
    return Pool(window, (x.shape[0], *window.out, x.shape[3]), dtype, lo, hi, call.out_dtypes[0], counts,
                clip=dtype.kind == "f" or dtype.name == "bfloat16")


def run_float_pool(xp, p: Pool, x):
    if p.counts is None:
        return _fold_max(xp, p, x)
    n, oh, ow, c = p.out_shape
    taps = padded(xp, as_float(x, p.dtype), p.window, 0, p.dtype, p.workspace).taps()
    total = xp.zeros((n, oh, ow, c), p.dtype)
    if xp is np:
        for tap in taps:
            np.add(total, tap, out=total)
        y = np.divide(total, p.counts)
        y.clip(p.lo, p.hi, out=y)
        return y.astype(p.out_dtype, copy=False)
    for tap in taps:
        total = total + tap
    y = total / p.counts.astype(p.dtype)
    return xp.clip(y, xp.asarray(p.lo, y.dtype), xp.asarray(p.hi, y.dtype)).astype(p.out_dtype)


def _fold_max(xp, p: Pool, x):
    """The taps' maximum in order over a copy padded with the type's lowest value, clamped."""
    dtype = np.dtype(x.dtype)
    low = np.iinfo(dtype).min if dtype.kind in "iu" else -np.inf
    taps = padded(xp, x, p.window, 0, dtype, p.workspace, fill=low).taps()
    if xp is np:
        y = taps[0].copy()
        for tap in taps[1:]:
            np.maximum(y, tap, out=y)
        if p.clip:
            y.clip(p.lo, p.hi, out=y)
        return y.astype(p.out_dtype, copy=False)
    y = taps[0]
    for tap in taps[1:]:
        y = xp.maximum(y, tap)
    return xp.clip(y, xp.asarray(p.lo, y.dtype), xp.asarray(p.hi, y.dtype)).astype(p.out_dtype)


def prepare_integer_pool(call, inputs) -> Pool:
    """int8 / uint8 / 16x8 pools (LiteRT requires input and output quantized alike)."""
    x = inputs[0]
    window = _window(call, x)
    in_q, out_q = params(call, 0, "input"), out_params(call)
    if np.float32(in_q.scale[0]) != np.float32(out_q.scale[0]) or in_q.zero_point[0] != out_q.zero_point[0]:
        raise OpError(f"{call.op.name}: input and output quantization differ ({in_q.scale[0]}, "
                      f"{in_q.zero_point[0]} vs {out_q.scale[0]}, {out_q.zero_point[0]}); LiteRT requires them equal")
    out_dtype = call.out_dtypes[0]
    activation = fused_activation(call)
    lo, hi = dtype_range(out_dtype) if activation == Activation.NONE else activation_range(activation, out_q, out_dtype)
    counts = None if call.op.op_type == "MAX_POOL_2D" else _counts(x.shape, window, np.int64)
    info = np.iinfo(x.dtype)
    return Pool(window, (x.shape[0], *window.out, x.shape[3]), np.dtype(np.int64), lo, hi, out_dtype, counts,
                clip=lo > info.min or hi < info.max)


def run_integer_pool(xp, p: Pool, x):
    if p.counts is None:
        return _fold_max(xp, p, x)
    n, oh, ow, c = p.out_shape
    taps = padded(xp, x, p.window, 0, np.int64, p.workspace).taps()
    total = taps[0] if xp is not np else taps[0].copy()
    for tap in taps[1:]:
        total = total + tap
    half = p.counts // 2
    num = xp.where(total > 0, total + half, total - half)
    out = xp.sign(num) * (xp.abs(num) // p.counts)
    return xp.clip(out, p.lo, p.hi).astype(p.out_dtype)


_FLOAT = Format(prepare_float_pool, run_float_pool)
_INTEGER = Format(prepare_integer_pool, run_integer_pool)
MAX_POOL_2D = {None: _FLOAT, **dict.fromkeys((INT8, UINT8, INT16), _INTEGER)}
AVERAGE_POOL_2D = MAX_POOL_2D
