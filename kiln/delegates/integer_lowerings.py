"""The quantized delegate's lowerings of the weighted, windowed and reducing integer ops.

Each computes what its pure kernel (kiln/quant/nn_kernels.py) computes, bit for bit, with the
per-node work done once: weights centred and laid out as float BLAS operands, multipliers
and clamp bounds worked out, padded input buffers allocated. Integer accumulations run as
float matmuls, which are exact while every partial sum is an integer below 2^24 (float32)
or 2^53 (float64): the bound ``depth · max|x − zp| · max|w|`` picks the type at prepare time
(none fits: the node keeps its reference kernel). The output stage is `Requantizer`, the
rescalings of kiln.kernels.fixedpoint rewritten as a few in-place int64 operations.

A lowering returns None where it does not handle a node; the delegate then runs the node's
reference kernel inside the chain (kiln/delegates/quantized.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from ..kernels import nn as nn_kernels
from ..kernels.fixedpoint import INT32_MAX, INT32_MIN
from ..ops.windowed import window_geometry, window_views
from ..schema import Activation

if TYPE_CHECKING:  # pragma: no cover
    from .quantized import QNode

I64 = np.dtype(np.int64)
F32_EXACT, F64_EXACT = 1 << 24, 1 << 53
#: Activation types the weighted lowerings take (uint8: the legacy kernels of kiln.kernels.nn).
CODES = (np.dtype(np.int8), np.dtype(np.int16), np.dtype(np.uint8))
#: Element budget of one im2col matrix (bigger convolutions run in chunks of output rows).
IM2COL_BUDGET = 1 << 22


def _largest(bound: int, m: np.ndarray, total_shift: np.ndarray) -> int:
    """The largest |round(x · m / 2^total_shift)| for |x| <= bound, over the channels."""
    pairs = np.broadcast_arrays(m, total_shift)
    return max(((bound * int(mi)) >> int(ti)) + 1 for mi, ti in zip(pairs[0].ravel(), pairs[1].ravel()))


class Requantizer:
    """An integer kernel's output stage for one node: int64 accumulator -> output codes.

    ``kind`` is the pure kernel's rescaling: "single" (`multiply_by_quantized_multiplier`),
    "double" (`..._double_rounding`) or "int64" (`..._int64`, 16x8 convolutions); then the
    output zero point and the clamp to [lo, hi]. ``bound`` is the largest |accumulator| the
    node can produce: where the rescaled value cannot leave int32, the int32 steps the
    reference takes (saturation before, wrap-around after) are left out.

    The double rounding in two shifts: gemmlowp's SaturatingRoundingDoublingHighMul of a
    non-negative multiplier is ``(x·m + 2^30) >> 31`` for either sign of ``x·m`` (its nudge
    ``1 − 2^30`` and truncating division of negatives come to the same floor), and
    RoundingDivideByPOT by ``e ≥ 1`` is ``(x + 2^(e−1) − [x < 0]) >> e``; the output zero point
    joins it as ``zp << e``, and where the bound keeps every value after the high multiply
    within int32 (``narrow``) that second stage runs in int32.
    """

    def __init__(self, kind: str, multiplier, shift, zero_point: int, lo: int, hi: int, dtype, bound: int):
        m = np.asarray(multiplier, I64)
        shift = np.asarray(shift, I64)
        if np.any(m < 0) or np.any(m > INT32_MAX):
            raise ValueError(f"multiplier {m} out of range")
        self.kind, self.zp, self.lo, self.hi, self.dtype = kind, int(zero_point), int(lo), int(hi), np.dtype(dtype)
        self.lo64, self.hi64 = np.int64(lo), np.int64(hi)
        bound = int(bound)
        if kind == "single":
            total = 31 - shift
            self.m, self.add, self.shr = m, np.left_shift(np.int64(1), total - 1), total
            self.wrap = _largest(bound, m, total) > INT32_MAX
        elif kind == "int64":
            reduced = np.where(m < 0x7FFF0000, (m + (1 << 15)) >> 16, 0x7FFF).astype(I64)
            total = 15 - shift
            if np.any(total < 1):
                raise ValueError("a 16x8 rescaling shift beyond 14 bits")
            self.m, self.add, self.shr = reduced, np.left_shift(np.int64(1), total - 1), total
            self.wrap = _largest(bound, reduced, total) > INT32_MAX
        elif kind == "double":
            left, right = np.maximum(shift, 0), np.maximum(-shift, 0)
            self.left = left if np.any(left > 0) else None
            self.saturate = self.left is not None or bound > INT32_MAX
            self.m = m
            self.right = right if np.any(right > 0) else None
            self.half = (np.left_shift(np.int64(1), right) >> 1)
            # (x + half − [x < 0]) >> e, plus zp, is (x + half + (zp << e) − [x < 0]) >> e
            self.half_zp = self.half + np.left_shift(np.int64(self.zp), right)
            self.neg_step = None if np.all(right > 0) else (right > 0).astype(I64)
            # After the high multiply the value fits int32; the rest runs in int32 (half the
            # memory traffic) where nothing after it can leave int32 either.
            stage_in = min(bound << int(left.max(initial=0)), 1 << 31)
            after = _largest(stage_in, m, np.int64(31)) + int(np.max(np.abs(self.half_zp), initial=0)) + 1
            self.narrow = after < (1 << 31) and max(abs(self.lo), abs(self.hi)) < (1 << 31)
            if self.narrow:
                i32 = np.dtype(np.int32)
                self.half_zp, self.right = self.half_zp.astype(i32), None if self.right is None else right.astype(i32)
                self.neg_step = None if self.neg_step is None else self.neg_step.astype(i32)
                self.lo64, self.hi64 = np.int32(lo), np.int32(hi)
        else:
            raise ValueError(f"unknown rescaling {kind!r}")

    def __call__(self, acc: np.ndarray) -> np.ndarray:
        """Output codes of an int64 accumulator (``acc`` is overwritten)."""
        p = acc
        if self.kind == "double":
            if self.left is not None:
                np.left_shift(p, self.left, out=p)
            if self.saturate:
                np.clip(p, np.int64(INT32_MIN), np.int64(INT32_MAX), out=p)
            np.multiply(p, self.m, out=p)
            np.add(p, 1 << 30, out=p)
            np.right_shift(p, 31, out=p)
            if self.narrow:
                p = p.astype(np.int32)
            if self.right is not None:
                negative = p < 0
                np.add(p, self.half_zp, out=p)        # the zero point added before the shift, scaled
                if self.neg_step is None:
                    np.subtract(p, negative, out=p)
                else:
                    np.subtract(p, negative * self.neg_step, out=p)
                np.right_shift(p, self.right, out=p)
            elif self.zp:
                np.add(p, self.zp, out=p)
        else:
            np.multiply(p, self.m, out=p)
            np.add(p, self.add, out=p)
            np.right_shift(p, self.shr, out=p)
            if self.wrap:
                p = p.astype(np.int32).astype(I64)
            if self.zp:
                np.add(p, self.zp, out=p)
        np.clip(p, self.lo64, self.hi64, out=p)     # NumPy scalar bounds: less wrapper work than ints
        return p.astype(self.dtype)


def _out_qp(node: "QNode"):
    return node.op.outputs[0].quantization


def _in_qp(node: "QNode", k: int):
    return node.op.inputs[k].quantization


def _centred_max(dtype, zero_point: int) -> int:
    info = np.iinfo(dtype)
    return max(abs(int(info.min) - zero_point), abs(int(info.max) - zero_point))


def _exact_float(bound: int):
    """The float type whose matmul gives integer sums up to ``bound`` exactly (None: neither)."""
    if bound < F32_EXACT:
        return np.dtype(np.float32)
    if bound < F64_EXACT:
        return np.dtype(np.float64)
    return None


def _bias(node: "QNode", channels: int) -> np.ndarray | None:
    b = node.consts[2] if len(node.consts) > 2 else None
    return None if b is None else np.asarray(b, I64).reshape(channels)


def _activation(node: "QNode") -> Activation:
    return Activation(node.opts.fused_activation_function)


# -- FULLY_CONNECTED ----------------------------------------------------------------------------

def lower_fully_connected(node: "QNode") -> Callable | None:
    """int8 / 16x8 FULLY_CONNECTED with constant 2-D weights: one exact float GEMM."""
    x, w = node.ins[0], node.consts[1]
    if w is None or w.ndim != 2 or x.dtype not in CODES or x.size % max(w.shape[1], 1):
        return None
    x_qp, w_qp, out_qp = _in_qp(node, 0), _in_qp(node, 1), _out_qp(node)
    units, depth = w.shape
    zx = int(x_qp.zero_point[0])
    wc = w.astype(I64) - (0 if w_qp.per_channel else int(w_qp.zero_point[0]))
    bias = _bias(node, units)
    acc_bound = depth * _centred_max(x.dtype, zx) * int(np.abs(wc).max(initial=0))
    ft = _exact_float(acc_bound)
    if ft is None:
        return None
    if x.dtype == np.uint8:   # legacy uint8 (kiln.kernels.nn): per-tensor weights only
        if w_qp.per_channel:
            return None
        m, s = nn_kernels.uint8_multiplier(x_qp, w_qp, out_qp)
    else:
        m, s = nn_kernels.fully_connected_multipliers(x_qp, w_qp, out_qp, units)
    out_dtype = node.call.out_dtypes[0]
    lo, hi = nn_kernels.activation_range(_activation(node), out_qp, out_dtype)
    bound = acc_bound + (0 if bias is None else int(np.abs(bias).max(initial=0)))
    requant = Requantizer("single", m, s, out_qp.zero_point[0], lo, hi, out_dtype, bound)
    w_t = np.ascontiguousarray(wc.T.astype(ft))
    rows = x.size // depth
    out_shape = x.shape[:-1] + (units,) if node.opts.keep_num_dims else (rows, units)
    xf = np.empty((rows, depth), ft)
    xi, oi = node.in_slots[0], node.out_slots[0]

    def run(slots):
        np.subtract(slots[xi].reshape(rows, depth), zx, out=xf, dtype=xf.dtype)
        acc = np.dot(xf, w_t).astype(I64)
        if bias is not None:
            acc += bias
        slots[oi] = requant(acc).reshape(out_shape)

    return run


# -- BATCH_MATMUL -------------------------------------------------------------------------------

def lower_batch_matmul(node: "QNode") -> Callable | None:
    """int8 / 16x8 BATCH_MATMUL: centred operands as exact float matmuls; int8 rounds twice,
    int16 takes the int64-accumulator rescaling (`nn_kernels.batch_matmul`)."""
    a, b = node.ins[0], node.ins[1]
    if a.dtype not in (np.int8, np.int16) or b.dtype not in (np.int8, np.int16) or a.ndim < 2 or b.ndim < 2:
        return None
    a_qp, b_qp, out_qp = _in_qp(node, 0), _in_qp(node, 1), _out_qp(node)
    za, zb = int(a_qp.zero_point[0]), int(b_qp.zero_point[0])
    adj_x, adj_y = bool(node.opts.adj_x), bool(node.opts.adj_y)
    depth = a.shape[-2] if adj_x else a.shape[-1]
    bound = depth * _centred_max(a.dtype, za) * _centred_max(b.dtype, zb)
    ft = _exact_float(bound)
    if ft is None:
        return None
    product = np.float32(np.float32(a_qp.scale[0]) * np.float32(b_qp.scale[0]))
    m, s = nn_kernels.quantize_multiplier(float(product) / float(out_qp.scale[0]))
    out_dtype = node.call.out_dtypes[0]
    lo, hi = nn_kernels.activation_range(Activation.NONE, out_qp, out_dtype)
    kind = "int64" if a.dtype == np.int16 else "double"
    requant = Requantizer(kind, m, s, out_qp.zero_point[0], lo, hi, out_dtype, bound)
    (sa, ca), (sb, cb) = zip(node.in_slots[:2], node.consts[:2])
    fixed_a = None if ca is None else _centred(ca, za, ft)
    fixed_b = None if cb is None else _centred(cb, zb, ft)
    oi = node.out_slots[0]

    def run(slots):
        fa = fixed_a if fixed_a is not None else _centred(slots[sa], za, ft)
        fb = fixed_b if fixed_b is not None else _centred(slots[sb], zb, ft)
        if adj_x:
            fa = np.swapaxes(fa, -1, -2)
        if adj_y:
            fb = np.swapaxes(fb, -1, -2)
        slots[oi] = requant(np.matmul(fa, fb).astype(I64))

    return run


def _centred(x, zero_point: int, ft) -> np.ndarray:
    y = x.astype(ft)
    if zero_point:
        y -= zero_point
    return y


# -- convolutions -------------------------------------------------------------------------------

def _conv_geometry(node: "QNode", khw):
    opts = node.opts
    dil = (opts.dilation_h_factor, opts.dilation_w_factor)
    out_hw, pads = window_geometry(opts, node.ins[0].shape[1:3], khw, dil)
    return out_hw, pads, (opts.stride_h, opts.stride_w), dil


def _conv_requantizer(node: "QNode", channels: int, bound: int) -> Requantizer:
    """The convolutions' output stage (`nn_kernels._requantize_conv`)."""
    x_qp, w_qp, out_qp = _in_qp(node, 0), _in_qp(node, 1), _out_qp(node)
    if node.ins[0].dtype == np.uint8:
        m, s = nn_kernels.uint8_multiplier(x_qp, w_qp, out_qp)
    else:
        m, s = nn_kernels._channel_multipliers(x_qp, w_qp, out_qp, channels)
    out_dtype = node.call.out_dtypes[0]
    lo, hi = nn_kernels.activation_range(_activation(node), out_qp, out_dtype)
    kind = "int64" if node.ins[0].dtype == np.int16 else "double"
    return Requantizer(kind, m, s, out_qp.zero_point[0], lo, hi, out_dtype, bound)


def _centred_weights(node: "QNode", w) -> np.ndarray | None:
    """int64 filter less its zero point: uint8 filters have one (per tensor; None if per
    channel), int8 ones are symmetric (their kernels ignore the zero point)."""
    w = w.astype(I64)
    if node.ins[0].dtype != np.uint8:
        return w
    w_qp = _in_qp(node, 1)
    return None if w_qp.per_channel else w - int(w_qp.zero_point[0])


class _Padded:
    """A persistent zero-bordered float buffer holding ``x − zero point`` and its windows."""

    def __init__(self, x_shape, khw, out_hw, pads, strides, dilation, ft, zero_point: int):
        n, h, w, c = x_shape
        (pt, pb), (pl, pr) = pads
        self.buf = np.zeros((n, h + pt + pb, w + pl + pr, c), ft)
        self.interior = self.buf[:, pt:pt + h, pl:pl + w, :]
        self.windows, self.taps = window_views(self.buf, khw, out_hw, strides, dilation)
        self.zp = zero_point

    def load(self, x):
        np.subtract(x, self.zp, out=self.interior, dtype=self.buf.dtype)


class _DepthwiseSum:
    """A depthwise convolution's taps summed exactly in float: every tap's products in one
    persistent buffer (channel multipliers by broadcasting), then one reduction. The caller
    loads ``padded`` (``x`` minus its zero point) before each call."""

    def __init__(self, node: "QNode", x_shape, w: np.ndarray, ft, zero_point: int):
        _, kh, kw, cout = w.shape
        n, _, _, cin = x_shape
        k = kh * kw
        (oh, ow), pads, strides, dil = _conv_geometry(node, (kh, kw))
        self.padded = _Padded(x_shape, (kh, kw), (oh, ow), pads, strides, dil, ft, zero_point)
        self.products = np.empty((k, n, oh, ow, cout), ft)
        self.gathered = self.products.reshape(kh, kw, n, oh, ow, cin, cout // cin)
        self.taps = self.padded.taps[..., None]
        self.weights = np.ascontiguousarray(
            np.broadcast_to(w.reshape(k, 1, 1, 1, cout).astype(ft), self.products.shape))
        self.total = np.empty((n, oh, ow, cout), ft)

    def __call__(self) -> np.ndarray:
        np.copyto(self.gathered, self.taps)
        np.multiply(self.products, self.weights, out=self.products)
        return np.add.reduce(self.products, axis=0, out=self.total)


def _exact_integer_setup(node: "QNode", x: np.ndarray, w: np.ndarray, taps: int, cout: int):
    """(input zero point, bias, float type, requantizer) for an integer convolution summing
    ``taps`` products of centred weights ``w`` per output; None when no float type holds the
    sums exactly."""
    zx = int(_in_qp(node, 0).zero_point[0])
    bias = _bias(node, cout)
    acc_bound = taps * _centred_max(x.dtype, zx) * int(np.abs(w).max(initial=0))
    ft = _exact_float(acc_bound)
    if ft is None:
        return None
    requant = _conv_requantizer(node, cout, acc_bound + (0 if bias is None else int(np.abs(bias).max(initial=0))))
    return zx, bias, ft, requant


def lower_conv(node: "QNode") -> Callable | None:
    """int8 / 16x8 CONV_2D (one group) with constant weights: im2col and one exact GEMM."""
    x, w = node.ins[0], node.consts[1]
    if w is None or x.ndim != 4 or w.ndim != 4 or x.dtype not in CODES or x.shape[3] != w.shape[3]:
        return None
    w = _centred_weights(node, w)
    if w is None:
        return None
    cout, kh, kw, cin = w.shape
    depth = kh * kw * cin
    setup = _exact_integer_setup(node, x, w, depth, cout)
    if setup is None:
        return None
    zx, bias, ft, requant = setup
    (oh, ow), pads, strides, dil = _conv_geometry(node, (kh, kw))
    n = x.shape[0]
    w_mat = np.ascontiguousarray(w.reshape(cout, depth).T.astype(ft))
    out_shape = (n, oh, ow, cout)
    xi, oi = node.in_slots[0], node.out_slots[0]
    pointwise = kh == kw == 1 and pads == ((0, 0), (0, 0)) and strides == (1, 1)
    if pointwise:
        xf = np.empty((n * oh * ow, cin), ft)

        def run(slots):
            np.subtract(slots[xi].reshape(xf.shape), zx, out=xf, dtype=xf.dtype)
            acc = np.dot(xf, w_mat).astype(I64)
            if bias is not None:
                acc += bias
            slots[oi] = requant(acc).reshape(out_shape)
        return run

    padded = _Padded(x.shape, (kh, kw), (oh, ow), pads, strides, dil, ft, zx)
    chunk = max(1, min(oh, IM2COL_BUDGET // max(1, n * ow * depth)))
    cols = np.empty((n, chunk, ow, kh, kw, cin), ft)

    def run(slots):
        padded.load(slots[xi])
        acc = np.empty((n, oh, ow, cout), I64)
        for r0 in range(0, oh, chunk):
            rows = min(chunk, oh - r0)
            c = cols[:, :rows]
            np.copyto(c, padded.windows[:, r0:r0 + rows])
            acc[:, r0:r0 + rows] = np.dot(c.reshape(-1, depth), w_mat).reshape(n, rows, ow, cout)
        if bias is not None:
            acc += bias
        slots[oi] = requant(acc)

    return run


def lower_depthwise(node: "QNode") -> Callable | None:
    """int8 / 16x8 DEPTHWISE_CONV_2D with constant weights: every tap's products in one
    buffer, summed exactly in float (channel multipliers by broadcasting)."""
    x, w = node.ins[0], node.consts[1]
    if w is None or x.ndim != 4 or w.ndim != 4 or w.shape[0] != 1 or x.dtype not in CODES:
        return None
    w = _centred_weights(node, w)
    if w is None:
        return None
    _, kh, kw, cout = w.shape
    cin = x.shape[3]
    if cin == 0 or cout % cin:
        return None
    setup = _exact_integer_setup(node, x, w, kh * kw, cout)
    if setup is None:
        return None
    zx, bias, ft, requant = setup
    taps_sum = _DepthwiseSum(node, x.shape, w, ft, zx)
    xi, oi = node.in_slots[0], node.out_slots[0]

    def run(slots):
        taps_sum.padded.load(slots[xi])
        acc = taps_sum().astype(I64)
        if bias is not None:
            acc += bias
        slots[oi] = requant(acc)

    return run


# -- pooling and MEAN ---------------------------------------------------------------------------

def _pool_geometry(node: "QNode"):
    opts = node.opts
    khw = (opts.filter_height, opts.filter_width)
    x = node.ins[0]
    if x.ndim != 4 or min(khw) < 1:
        return None
    out_hw, pads = window_geometry(opts, x.shape[1:3], khw)
    return khw, out_hw, pads, (opts.stride_h, opts.stride_w)


def _padded_taps(x_shape, geometry, fill, dtype):
    """A persistent copy of the input padded with ``fill``: (buffer, its interior to load
    the input into, the views of every tap in row-major window order)."""
    khw, out_hw, ((pt, pb), (pl, pr)), strides = geometry
    n, h, w, c = x_shape
    buf = np.full((n, h + pt + pb, w + pl + pr, c), fill, dtype)
    interior = buf[:, pt:pt + h, pl:pl + w]
    _, taps = window_views(buf, khw, out_hw, strides, (1, 1))
    return buf, interior, [taps[i, j] for i in range(khw[0]) for j in range(khw[1])]


def _pool_range(node: "QNode"):
    return nn_kernels._pool_range(_activation(node), _out_qp(node), node.call.out_dtypes[0])


def lower_max_pool(node: "QNode") -> Callable | None:
    """Integer MAX_POOL_2D: taps maxed over a copy padded with the type's minimum (a window
    always holds an input pixel, so the padding never wins)."""
    x = node.ins[0]
    geometry = _pool_geometry(node)
    if geometry is None or x.dtype.kind not in "iu":
        return None
    _, interior, taps = _padded_taps(x.shape, geometry, np.iinfo(x.dtype).min, x.dtype)
    first, rest = taps[0], taps[1:]
    lo, hi = _pool_range(node)
    info = np.iinfo(x.dtype)
    clip = lo > info.min or hi < info.max
    out_dtype = node.call.out_dtypes[0]
    xi, oi = node.in_slots[0], node.out_slots[0]

    def run(slots):
        np.copyto(interior, slots[xi])
        y = first.copy()
        for tap in rest:
            np.maximum(y, tap, out=y)
        if clip:
            np.clip(y, lo, hi, out=y)
        slots[oi] = y.astype(out_dtype, copy=False)

    return run


def lower_avg_pool(node: "QNode") -> Callable | None:
    """Integer AVERAGE_POOL_2D: int64 tap sums over a zero-padded copy, divided by each
    window's pixel count rounding half away from zero (`nn_kernels.average_pool2d`)."""
    x = node.ins[0]
    geometry = _pool_geometry(node)
    if geometry is None or x.dtype.kind not in "iu":
        return None
    khw, out_hw, pads, strides = geometry
    buf, interior, all_taps = _padded_taps(x.shape, geometry, 0, I64)
    (pt, _), (pl, _) = pads
    inside = np.zeros((1,) + buf.shape[1:3] + (1,), I64)
    inside[:, pt:pt + x.shape[1], pl:pl + x.shape[2]] = 1
    counts = window_views(inside, khw, out_hw, strides, (1, 1))[0].sum(axis=(3, 4))
    if np.any(counts == 0):
        return None
    half = counts // 2
    lo, hi = _pool_range(node)
    out_dtype = node.call.out_dtypes[0]
    total = np.empty(all_taps[0].shape, I64)
    xi, oi = node.in_slots[0], node.out_slots[0]

    def run(slots):
        np.copyto(interior, slots[xi])
        np.copyto(total, all_taps[0])
        for tap in all_taps[1:]:
            np.add(total, tap, out=total)
        up = (total + half) // counts
        down = -((half - total) // counts)
        y = np.where(total > 0, up, down)
        np.clip(y, lo, hi, out=y)
        slots[oi] = y.astype(out_dtype)

    return run


def lower_mean(node: "QNode") -> Callable | None:
    """int8 / int16 MEAN over constant axes: an int64 sum, MEAN's folded multiplier, two roundings."""
    x, axes = node.ins[0], node.ins[1]      # constant, or a run-time axes tensor keying the plan
    if axes is None or x.ndim == 0 or x.dtype not in (np.int8, np.int16):
        return None
    axes = tuple(sorted({int(a) % x.ndim for a in np.ravel(axes)}))
    count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64)) if axes else 0
    if not axes or count == 0:
        return None
    x_qp, out_qp = _in_qp(node, 0), _out_qp(node)
    m, s = nn_kernels.mean_multiplier(x_qp, out_qp, count)
    out_dtype = node.call.out_dtypes[0]
    lo, hi = nn_kernels.dtype_range(out_dtype)
    bound = count * _centred_max(x.dtype, int(x_qp.zero_point[0]))
    requant = Requantizer("double", m, s, out_qp.zero_point[0], lo, hi, out_dtype, bound)
    offset = int(x_qp.zero_point[0]) * count
    keep = bool(node.opts.keep_dims)
    xi, oi = node.in_slots[0], node.out_slots[0]

    def run(slots):
        total = np.sum(slots[xi], axis=axes, dtype=I64, keepdims=keep)
        total = np.asarray(total, I64)
        if offset:
            total = total - offset
        slots[oi] = requant(np.array(total, I64))

    return run
