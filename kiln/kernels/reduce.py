"""Kernel families of MEAN and SUM: float and integer, per number format (kiln.kernels.family).

Axes come from operand 1 (constant, or a value the backend knows while it prepares: scalar or
1-D, negative and repeated axes allowed). Float: the sum in float64, then (MEAN) divided by
the count — integer MEAN truncates toward zero, float MEAN of nothing is NaN. int8 / 16x8
MEAN is LiteRT's reference QuantizedMeanOrSum (measured: LiteRT 2.3 takes this one path also
for equal in/out params and for the 4-D H,W keep-dims case): ``1 / count`` folded into the
multiplier ``s_x / s_y`` as an integer division of ``M · 2^k`` (``k = floor(log2 count)``, at
most 32 and at most ``31 + shift``), then ``Σ x − zp_x · count`` rescaled with two roundings.
int8 SUM is LiteRT's optimized kernel (its default resolver; optimized_ops::
QuantizedMeanOrSum): the exact sum (wrapped to int32, as LiteRT accumulates), then in float32
``round(Σx · (s_x / s_y) + (−zp_x · (s_x / s_y)) · count) + zp_y``, rounded half away,
clamped. (LiteRT's reference SUM reads int8 codes as uint8 — wrong for every negative code —
so BUILTIN_REF is no reference for it.) Each float32 step is computed in float64 and rounded
to float32: the correctly rounded float32 result (float64 has more than twice float32's
precision), whatever a compiler would fuse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import OpError
from .dense import INT8, INT16
from .family import Format, known, out_params, params, reject_quantized
from .fixedpoint import Requantizer, centred_max, dtype_range, quantize_multiplier, xp_clamp

F32 = np.float32


def reduction_axes(call, x, axis) -> tuple[int, ...]:
    """Sorted, de-duplicated, non-negative axes from a reducer's axis operand, checked."""
    a = np.asarray(axis)
    if a.dtype.kind not in "iu":
        raise OpError(f"{call.op.name}: axis operand must be int32 or int64, got {a.dtype}")
    out = set()
    for v in a.reshape(-1).tolist():
        if not -x.ndim <= v < x.ndim:
            raise OpError(f"{call.op.name}: axis {v} is out of range for an input of rank {x.ndim}")
        out.add(v % x.ndim)
    return tuple(sorted(out))


@dataclass
class Reduction:
    axes: tuple[int, ...]
    count: int
    keep_dims: bool
    kept_shape: tuple
    dtype: np.dtype
    out_dtype: np.dtype
    zx: int = 0
    zy: int = 0
    requant: Requantizer | None = None
    scale: float = 0.0              # SUM: float32(s_x / s_y)
    bias: float = 0.0               # SUM: float32(−zp_x · scale · count)


def _reduction(call, inputs, integer: bool = False) -> Reduction:
    x, axis = inputs[0], inputs[1]
    if not known(axis):
        raise OpError(f"{call.op.name}: the axes must be known when the kernel prepares")
    if integer:   # the quantized kernels reduce a scalar over axis 0 to itself
        values = np.asarray(axis).reshape(-1)
        if np.any((values < -x.ndim) | (values >= max(x.ndim, 1))):
            raise OpError(f"{call.op.name}: axes {values.tolist()} out of range for rank {x.ndim}")
        axes = tuple(sorted({int(a) % x.ndim for a in values})) if x.ndim else ()
    else:
        axes = reduction_axes(call, x, axis)
    count = math.prod(x.shape[a] for a in axes)
    kept = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    return Reduction(axes, count, bool(call.opts.keep_dims), kept, np.dtype(x.dtype), call.out_dtypes[0])


def _kept(xp, p: Reduction, out):
    out = xp.asarray(out)
    return out.reshape(p.kept_shape) if p.keep_dims else out


def prepare_float_reduction(call, inputs) -> Reduction:
    reject_quantized(call)
    return _reduction(call, inputs)


def run_float_mean(xp, p: Reduction, x):
    if p.dtype.kind in "iu":
        total = xp.sum(x, axis=p.axes, dtype=xp.int64)
        if p.count == 0:
            return _kept(xp, p, xp.zeros_like(total).astype(p.dtype))
        q = xp.abs(total) // p.count   # truncate toward zero, like C++ integer division
        return _kept(xp, p, xp.where(total < 0, -q, q).astype(p.dtype))
    total = xp.sum(x, axis=p.axes, dtype=xp.float64)
    if xp is np:
        with np.errstate(all="ignore"):
            return _kept(xp, p, (total / p.count).astype(p.dtype, copy=False))   # 0 / 0 -> NaN when empty
    return _kept(xp, p, (total / p.count if p.count else total * np.nan).astype(p.dtype))


def run_float_sum(xp, p: Reduction, x):
    acc = xp.float64 if p.dtype.kind == "f" else p.dtype
    return _kept(xp, p, xp.sum(x, axis=p.axes, dtype=acc).astype(p.dtype))


def mean_multiplier(x_qp, out_qp, count: int) -> tuple[int, int]:
    """MEAN's (multiplier, shift) with ``1 / count`` folded in; count > 0."""
    m, shift = quantize_multiplier(float(x_qp.scale[0]) / float(out_qp.scale[0]))
    k = min(count.bit_length() - 1, 32, 31 + shift)
    return (m << k) // count, shift - k


def prepare_integer_mean(call, inputs) -> Reduction:
    p = _reduction(call, inputs, integer=True)
    x_qp, out_qp = params(call, 0, "input"), out_params(call)
    p.zx, p.zy = int(x_qp.zero_point[0]), int(out_qp.zero_point[0])
    if p.axes and p.count:
        m, s = mean_multiplier(x_qp, out_qp, p.count)
        lo, hi = dtype_range(p.out_dtype)
        p.requant = Requantizer("double", m, s, p.zy, lo, hi, p.out_dtype, p.count * centred_max(p.dtype, p.zx))
    return p


def run_integer_mean(xp, p: Reduction, x):
    if not p.axes:
        return x.astype(p.out_dtype)
    total = xp.sum(x, axis=p.axes, dtype=xp.int64, keepdims=p.keep_dims)
    if p.count == 0:
        return xp.zeros(total.shape, p.out_dtype)
    if p.zx:
        total = total - p.zx * p.count
    return p.requant.requantize(xp, np.array(total, np.int64) if xp is np else total)


def prepare_integer_sum(call, inputs) -> Reduction:
    p = _reduction(call, inputs, integer=True)
    x_qp, out_qp = params(call, 0, "input"), out_params(call)
    p.zx, p.zy = int(x_qp.zero_point[0]), int(out_qp.zero_point[0])
    scale = F32(F32(x_qp.scale[0]) / F32(out_qp.scale[0]))
    p.scale, p.bias = float(scale), float(F32(F32(F32(-p.zx) * scale) * F32(p.count if p.axes else 1)))
    return p


def run_integer_sum(xp, p: Reduction, x):
    total = xp.sum(x, axis=p.axes, dtype=xp.int64, keepdims=p.keep_dims) if p.axes else x.astype(xp.int64)
    if x.size == 0 or (p.axes and p.count == 0):
        return xp.full(total.shape, p.zy, p.out_dtype)
    wrapped = ((total + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)
    product = (wrapped.astype(xp.float32).astype(xp.float64) * p.scale).astype(xp.float32)
    value = (product.astype(xp.float64) + p.bias).astype(xp.float32).astype(xp.float64)
    rounded = xp.sign(value) * xp.floor(xp.abs(value) + 0.5)            # half away from zero
    return xp_clamp(xp, rounded.astype(xp.int64) + p.zy, *dtype_range(p.out_dtype)).astype(p.out_dtype)


MEAN = {None: Format(prepare_float_reduction, run_float_mean),
        **dict.fromkeys((INT8, INT16), Format(prepare_integer_mean, run_integer_mean))}
SUM = {None: Format(prepare_float_reduction, run_float_sum), INT8: Format(prepare_integer_sum, run_integer_sum)}
