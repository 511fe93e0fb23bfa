"""LiteRT's int8 / 16x8 (and legacy uint8) kernels of the weighted, windowed and reducing ops
and CONCATENATION, as pure functions.

Each function takes integer tensors with their `QuantParams` and returns what LiteRT 2.3's
reference kernels (``BUILTIN_REF``) compute, bit for bit: integer accumulation with the
zero points subtracted, a requantization, the output zero point, and the fused
activation's clamp.

Measured on LiteRT 2.3 (thousands of outputs each): FULLY_CONNECTED requantizes with one
rounding (`fixedpoint.multiply_by_quantized_multiplier`; two roundings differ on ~0.05 % of
outputs) while CONV_2D and DEPTHWISE_CONV_2D round twice
(`fixedpoint.multiply_by_quantized_multiplier_double_rounding`; one rounding differs on ~0.1 %).
The int16 (16x8) variants take int16 activations with zero point 0 and int64 biases:
FULLY_CONNECTED still rounds once, the convolutions use the int64-accumulator rescaling.

Windowed ops take their geometry (``out_hw``, ``pads``, ``strides``, ``dilation``) from the
caller (`kiln.ops.windowed.window_geometry`), as `kiln.kernels.hybrid` does.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from kiln.ir import QuantParams
from kiln.schema import Activation

from .fixedpoint import (
    IntegerKernelError,
    activation_range,
    dtype_range,
    multiply_by_quantized_multiplier,
    multiply_by_quantized_multiplier_double_rounding,
    multiply_by_quantized_multiplier_int64,
    quantize_multiplier,
    quantize_multipliers,
    xp_clamp,
    xp_rescale,
)
from .hybrid import int_matmul, tap_windows, transpose_conv_sums

F32 = np.float32


def _zp(qp: QuantParams) -> int:
    return int(qp.zero_point[0])


def _requantize(acc, multiplier, shift, out_qp: QuantParams, activation, dtype, *,
                double_rounding: bool = False) -> np.ndarray:
    lo, hi = activation_range(activation, out_qp, dtype)
    rescale = multiply_by_quantized_multiplier_double_rounding if double_rounding else \
        multiply_by_quantized_multiplier
    out = rescale(acc, multiplier, shift).astype(np.int64)
    return np.clip(out + int(out_qp.zero_point[0]), lo, hi).astype(dtype)


def _requantize_conv(acc, multiplier, shift, out_qp: QuantParams, activation, x_dtype, dtype) -> np.ndarray:
    """The convolutions' output stage: two roundings for int8 inputs, the int64-accumulator
    rescaling (a 15-bit multiplier) for int16 inputs (16x8; measured: 0 of 1 000 differ)."""
    if np.dtype(x_dtype) != np.int16:
        return _requantize(acc, multiplier, shift, out_qp, activation, dtype, double_rounding=True)
    lo, hi = activation_range(activation, out_qp, dtype)
    out = multiply_by_quantized_multiplier_int64(acc, multiplier, shift).astype(np.int64)
    return np.clip(out + int(out_qp.zero_point[0]), lo, hi).astype(dtype)


def _channel_multipliers(x_qp: QuantParams, w_qp: QuantParams, out_qp: QuantParams, channels: int):
    """PopulateConvolutionQuantizationParams: ``double(s_x) · double(s_w,c) / double(s_y)``
    per output channel (a per-tensor filter scale repeated)."""
    return _multipliers_for(float(x_qp.scale[0]), np.asarray(w_qp.scale, np.float32).tobytes(),
                            float(out_qp.scale[0]), channels)


@lru_cache(maxsize=4096)
def _multipliers_for(x_scale: float, w_scales: bytes, out_scale: float, channels: int):
    """The multipliers of one node's scales, kept: a node's parameters never change."""
    w_scale = np.broadcast_to(np.frombuffer(w_scales, np.float32).astype(np.float64), (channels,))
    return quantize_multipliers(x_scale * w_scale / out_scale)


def _bias(bias_q, channels: int) -> np.ndarray:
    return np.zeros(channels, np.int64) if bias_q is None else np.asarray(bias_q, np.int64).reshape(channels)


def fully_connected_multipliers(x_qp: QuantParams, w_qp: QuantParams, out_qp: QuantParams, units: int):
    """FULLY_CONNECTED's (multiplier, shift): per unit for per-channel weights, else one pair
    (see `fully_connected`); shared with the compiled delegate's lowering."""
    if w_qp.per_channel:
        return _channel_multipliers(x_qp, w_qp, out_qp, units)
    return quantize_multiplier(float(x_qp.scale[0]) * float(w_qp.scale[0]) / float(out_qp.scale[0]))


def fully_connected(x_q, x_qp: QuantParams, w_q, w_qp: QuantParams, bias_q, out_qp: QuantParams, *,
                    activation=Activation.NONE, keep_num_dims: bool = False, out_dtype=np.int8) -> np.ndarray:
    """int8 FULLY_CONNECTED: x [..., depth], weights [units, depth] (per tensor or per unit),
    int32 bias [units].

    The multiplier is ``double(s_x) · double(s_w) / double(s_y)``, per tensor as per channel
    (PopulateConvolutionQuantizationParams). Measured against BUILTIN_REF on scales whose
    products round differently: the float32 product of GetQuantizedConvolutionMultipler —
    LiteRT's legacy uint8 path — is off by one on 0.1 % of int8 and 16x8 outputs, the
    double product on none."""
    x_q, w_q = np.asarray(x_q), np.asarray(w_q)
    units, depth = w_q.shape
    if x_q.size % depth:
        raise IntegerKernelError(f"FULLY_CONNECTED: input {list(x_q.shape)} does not split into rows of {depth}")
    rows = x_q.reshape(-1, depth).astype(np.int64) - int(x_qp.zero_point[0])
    w = w_q.astype(np.int64) - (0 if w_qp.per_channel else int(w_qp.zero_point[0]))
    acc = int_matmul(rows, w.T) + _bias(bias_q, units)
    m, s = fully_connected_multipliers(x_qp, w_qp, out_qp, units)
    out = _requantize(acc, m, s, out_qp, activation, out_dtype)
    shape = x_q.shape[:-1] + (units,) if keep_num_dims else (rows.shape[0], units)
    return out.reshape(shape)


def batch_matmul(a_q, a_qp: QuantParams, b_q, b_qp: QuantParams, out_qp: QuantParams, *,
                 adj_x: bool = False, adj_y: bool = False, out_dtype=np.int8) -> np.ndarray:
    """int8 / 16x8 BATCH_MATMUL with broadcast batch dimensions: ``Σ (a − zp_a)(b − zp_b)``
    rescaled by ``float32(s_a · s_b) / s_y``. Measured: int8 rounds twice (one rounding
    differs on ~0.1 % of outputs); int16 takes the int64 accumulator's rescaling."""
    a = np.asarray(a_q, np.int64) - int(a_qp.zero_point[0])
    b = np.asarray(b_q, np.int64) - int(b_qp.zero_point[0])
    if adj_x:
        a = np.swapaxes(a, -1, -2)
    if adj_y:
        b = np.swapaxes(b, -1, -2)
    if a.shape[-1] != b.shape[-2]:
        raise IntegerKernelError(f"BATCH_MATMUL: contraction sizes {a.shape[-1]} and {b.shape[-2]} differ")
    acc = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.int64)   # exact below 2^53
    product = np.float32(np.float32(a_qp.scale[0]) * np.float32(b_qp.scale[0]))
    m, s = quantize_multiplier(float(product) / float(out_qp.scale[0]))
    if np.asarray(a_q).dtype == np.int16:   # 16x8 (rhs int16 or int8): int64 accumulator, 15-bit multiplier
        out = multiply_by_quantized_multiplier_int64(acc, m, s).astype(np.int64) + int(out_qp.zero_point[0])
        return np.clip(out, *dtype_range(out_dtype)).astype(out_dtype)
    return _requantize(acc, m, s, out_qp, Activation.NONE, out_dtype, double_rounding=True)


def _centered_padded(x_q: np.ndarray, zero_point: int, pads) -> np.ndarray:
    """x_q − zero point, padded with zeros: the reference kernels skip taps outside the
    input, which is the same as a padded value equal to the zero point."""
    (t, b), (l, r) = pads
    centered = np.asarray(x_q, np.int64) - zero_point
    return centered if t == b == l == r == 0 else np.pad(centered, ((0, 0), (t, b), (l, r), (0, 0)))


def conv2d(x_q, x_qp: QuantParams, w_q, w_qp: QuantParams, bias_q, out_qp: QuantParams, *,
           out_hw, pads, strides, dilation, activation=Activation.NONE, out_dtype=np.int8) -> np.ndarray:
    """int8 CONV_2D (reference ConvPerChannel), one group: x [n, h, w, c], weights
    [out_c, kh, kw, c] with one scale per output channel (or one for all)."""
    x_q, w_q = np.asarray(x_q), np.asarray(w_q)
    out_c, kh, kw, in_c = w_q.shape
    if x_q.shape[3] != in_c:
        raise IntegerKernelError(f"CONV_2D: input has {x_q.shape[3]} channels, the filter {in_c} "
                                 "(grouped convolution has no integer kernel here)")
    cols = tap_windows(_centered_padded(x_q, int(x_qp.zero_point[0]), pads), kh, kw, out_hw, strides, dilation)
    acc = int_matmul(cols.reshape(-1, kh * kw * in_c), w_q.reshape(out_c, -1).T) + _bias(bias_q, out_c)
    m, s = _channel_multipliers(x_qp, w_qp, out_qp, out_c)
    out = _requantize_conv(acc, m, s, out_qp, activation, x_q.dtype, out_dtype)
    return out.reshape(x_q.shape[0], out_hw[0], out_hw[1], out_c)


def depthwise_conv2d(x_q, x_qp: QuantParams, w_q, w_qp: QuantParams, bias_q, out_qp: QuantParams, *,
                     multiplier: int, out_hw, pads, strides, dilation, activation=Activation.NONE,
                     out_dtype=np.int8) -> np.ndarray:
    """int8 DEPTHWISE_CONV_2D (reference DepthwiseConvPerChannel): weights [1, kh, kw,
    c·multiplier], output channel ``ic·multiplier + k`` reads input channel ``ic``."""
    x_q, w_q = np.asarray(x_q), np.asarray(w_q)
    _, kh, kw, out_c = w_q.shape
    if out_c != x_q.shape[3] * multiplier:
        raise IntegerKernelError(f"DEPTHWISE_CONV_2D: {x_q.shape[3]} input channels × multiplier "
                                 f"{multiplier} != {out_c} filter channels")
    cols = tap_windows(_centered_padded(x_q, int(x_qp.zero_point[0]), pads), kh, kw, out_hw, strides, dilation)
    if multiplier > 1:
        cols = np.repeat(cols, multiplier, axis=-1)
    acc = np.einsum("nyxhwc,hwc->nyxc", cols, w_q[0].astype(np.int64)) + _bias(bias_q, out_c)
    m, s = _channel_multipliers(x_qp, w_qp, out_qp, out_c)
    return _requantize_conv(acc, m, s, out_qp, activation, x_q.dtype, out_dtype)


def transpose_conv(x_q, x_qp: QuantParams, w_q, w_qp: QuantParams, bias_q, out_qp: QuantParams, *,
                   out_hw, pads, strides, activation=Activation.NONE, out_dtype=np.int8) -> np.ndarray:
    """int8 TRANSPOSE_CONV (reference TransposeConv per channel): every input pixel,
    zero point removed, scatters ``x · w`` into an int32 accumulator of the (uncropped)
    output; ``pads`` = (top, left) crops it; bias and the convolutions' output stage follow."""
    x_q, w_q = np.asarray(x_q), np.asarray(w_q)
    in_c = x_q.shape[3]
    out_c, w_in = w_q.shape[0], w_q.shape[3]
    if w_in != in_c:
        raise IntegerKernelError(f"TRANSPOSE_CONV: input has {in_c} channels, the filter {w_in}")
    x = np.asarray(x_q, np.int64) - int(x_qp.zero_point[0])
    acc = transpose_conv_sums(x, w_q, out_hw=out_hw, pads=pads, strides=strides) + _bias(bias_q, out_c)
    m, s = _channel_multipliers(x_qp, w_qp, out_qp, out_c)
    return _requantize_conv(acc, m, s, out_qp, activation, x_q.dtype, out_dtype)


def max_pool2d(x_q, *, filter_hw, out_hw, pads, strides, activation=Activation.NONE,
               out_qp: QuantParams | None = None, out_dtype=np.int8) -> np.ndarray:
    """int8 MAX_POOL_2D: the maximum over the window's taps inside the input, clamped to
    the activation range (input and output share their quantization); `xp_max_pool2d`."""
    lo, hi = _pool_range(activation, out_qp, out_dtype)
    out = xp_max_pool2d(np, np.asarray(x_q), filter_hw, out_hw, pads, strides, lo, hi)
    return out.astype(out_dtype)


def _pool_range(activation, out_qp, out_dtype):
    if Activation(activation) == Activation.NONE:
        return dtype_range(out_dtype)
    if out_qp is None:
        raise IntegerKernelError("a pooling op with a fused activation needs the output's QuantParams")
    return activation_range(activation, out_qp, out_dtype)


def average_pool2d(x_q, *, filter_hw, out_hw, pads, strides, activation=Activation.NONE,
                   out_qp: QuantParams | None = None, out_dtype=np.int8) -> np.ndarray:
    """int8 AVERAGE_POOL_2D: the sum of the taps inside the input divided by their count,
    rounded half away from zero; `xp_average_pool2d`."""
    lo, hi = _pool_range(activation, out_qp, out_dtype)
    out = xp_average_pool2d(np, np.asarray(x_q), filter_hw, out_hw, pads, strides, lo, hi)
    return out.astype(out_dtype)


# -- pooling over an array namespace ``xp`` (NumPy here, jax.numpy in kiln.xla) -----------------

def _pool_taps(padded, filter_hw, out_hw, strides) -> list:
    """Each filter tap's [n, oh, ow, c] strided slice of a padded NHWC array: plain slicing,
    which NumPy takes as views and XLA fuses."""
    (kh, kw), (oh, ow), (sh, sw) = filter_hw, out_hw, strides
    return [padded[:, i:i + (oh - 1) * sh + 1:sh, j:j + (ow - 1) * sw + 1:sw, :] for i in range(kh) for j in range(kw)]


def xp_max_pool2d(xp, x_q, filter_hw, out_hw, pads, strides, lo: int, hi: int):
    """MAX_POOL_2D over the codes (int64 out): padding with int64's minimum, which never wins
    (a window always holds an input pixel), then the taps' maximum, clamped to [lo, hi]."""
    n, _, _, c = x_q.shape
    if 0 in out_hw:
        return xp.zeros((n, *out_hw, c), xp.int64)
    (t, b), (l, r) = pads
    padded = xp.pad(x_q.astype(xp.int64), ((0, 0), (t, b), (l, r), (0, 0)), constant_values=np.iinfo(np.int64).min)
    taps = _pool_taps(padded, filter_hw, out_hw, strides)
    out = taps[0]
    for tap in taps[1:]:
        out = xp.maximum(out, tap)
    return xp_clamp(xp, out, lo, hi)


def xp_average_pool2d(xp, x_q, filter_hw, out_hw, pads, strides, lo: int, hi: int):
    """AVERAGE_POOL_2D over the codes (int64 out): the taps inside the input summed and
    divided by their count, ``(sum ± count/2) / count`` in C's truncating division, clamped."""
    n, h, w, c = x_q.shape
    if 0 in out_hw:
        return xp.zeros((n, *out_hw, c), xp.int64)
    (t, b), (l, r) = pads
    widths = ((0, 0), (t, b), (l, r), (0, 0))
    taps = _pool_taps(xp.pad(x_q.astype(xp.int64), widths), filter_hw, out_hw, strides)
    sums = taps[0]
    for tap in taps[1:]:
        sums = sums + tap
    counts = sum(_pool_taps(np.pad(np.ones((1, h, w, 1), np.int64), widths), filter_hw, out_hw, strides))
    half = counts // 2
    num = xp.where(sums > 0, sums + half, sums - half)
    return xp_clamp(xp, xp.sign(num) * (xp.abs(num) // counts), lo, hi)


def mean_multiplier(x_qp: QuantParams, out_qp: QuantParams, count: int) -> tuple[int, int]:
    """MEAN's (multiplier, shift) with ``1 / count`` folded in (see `mean`); count > 0."""
    m, shift = quantize_multiplier(float(x_qp.scale[0]) / float(out_qp.scale[0]))
    k = min(count.bit_length() - 1, 32, 31 + shift)
    return (m << k) // count, shift - k


def reduced_axes(x_q, axes) -> tuple[int, ...]:
    """A reducer's axis operand as sorted, distinct, non-negative axes of ``x_q``."""
    return tuple(sorted({int(a) % x_q.ndim for a in np.ravel(axes)})) if x_q.ndim else ()


def mean(x_q, x_qp: QuantParams, axes, out_qp: QuantParams, *, keep_dims: bool, out_dtype=np.int8) -> np.ndarray:
    """int8 MEAN (reference QuantizedMeanOrSum), for every axis set — measured: LiteRT 2.3
    takes this one path also for equal in/out params and for the 4-D H,W keep-dims case.
    The arithmetic is `xp_mean`'s, on NumPy."""
    x_q = np.asarray(x_q)
    return np.asarray(xp_mean(np, x_q, x_qp, reduced_axes(x_q, axes), out_qp, keep_dims, out_dtype)).astype(out_dtype)


def xp_mean(xp, x_q, x_qp: QuantParams, axes: tuple[int, ...], out_qp: QuantParams, keep_dims: bool, out_dtype):
    """`mean` over array namespace ``xp`` (NumPy, or jax.numpy in kiln.xla) on ``reduced_axes``:
    ``1 / count`` is folded into the multiplier ``s_x / s_y`` as an integer division of
    ``M · 2^k`` (``k = floor(log2 count)``, at most 32 and at most ``31 + shift``), then
    ``Σ x − zp_x · count`` is rescaled with two roundings. Returns int64 codes."""
    if not axes:
        return x_q.astype(xp.int64)
    count = int(np.prod([x_q.shape[a] for a in axes]))
    total = x_q.astype(xp.int64).sum(axis=axes, keepdims=keep_dims) - int(x_qp.zero_point[0]) * count
    if count == 0:
        return xp.zeros(total.shape, xp.int64)
    m, shift = mean_multiplier(x_qp, out_qp, count)
    return xp_clamp(xp, xp_rescale(xp, total, m, shift) + int(out_qp.zero_point[0]), *dtype_range(out_dtype))


def quantized_sum(x_q, x_qp: QuantParams, axes, out_qp: QuantParams, *, keep_dims: bool,
                  out_dtype=np.int8) -> np.ndarray:
    """int8 SUM as LiteRT's optimized kernel (its default resolver; optimized_ops::
    QuantizedMeanOrSum); `xp_quantized_sum`'s arithmetic on NumPy. (LiteRT's reference kernel
    reads int8 codes as uint8 — wrong for every negative code — so BUILTIN_REF is no
    reference for it.)"""
    x_q = np.asarray(x_q)
    out = xp_quantized_sum(np, x_q, x_qp, reduced_axes(x_q, axes), out_qp, keep_dims, out_dtype)
    return np.asarray(out).astype(out_dtype)


def xp_quantized_sum(xp, x_q, x_qp: QuantParams, axes: tuple[int, ...], out_qp: QuantParams, keep_dims: bool,
                     out_dtype):
    """`quantized_sum` over array namespace ``xp`` on ``reduced_axes``: the exact integer sum
    (wrapped to int32, as LiteRT accumulates), then in float32 ``round(Σx · (s_x / s_y) +
    (−zp_x · (s_x / s_y)) · count) + zp_y``, rounded half away, clamped; int64 codes. Each
    float32 step is computed in float64 and rounded to float32 — the correctly rounded
    float32 result (float64 has more than twice float32's precision), whatever a compiler
    would fuse."""
    total = x_q.astype(xp.int64).sum(axis=axes, keepdims=keep_dims) if axes else x_q.astype(xp.int64)
    count = int(np.prod([x_q.shape[a] for a in axes])) if axes else 1
    if x_q.size == 0 or count == 0:
        return xp.full(total.shape, int(out_qp.zero_point[0]), xp.int64)
    scale = F32(F32(x_qp.scale[0]) / F32(out_qp.scale[0]))
    bias = F32(F32(F32(-int(x_qp.zero_point[0])) * scale) * F32(count))
    wrapped = ((total + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)
    product = (wrapped.astype(xp.float32).astype(xp.float64) * float(scale)).astype(xp.float32)
    value = (product.astype(xp.float64) + float(bias)).astype(xp.float32).astype(xp.float64)
    rounded = xp.sign(value) * xp.floor(xp.abs(value) + 0.5)            # half away from zero
    return xp_clamp(xp, rounded.astype(xp.int64) + int(out_qp.zero_point[0]), *dtype_range(out_dtype))


def concatenation(inputs, input_qps, out_qp: QuantParams, *, axis: int, activation=Activation.NONE,
                  out_dtype=np.int8) -> np.ndarray:
    """int8 CONCATENATION. Measured: LiteRT 2.3 requantizes nothing — it refuses inputs
    whose scale or zero point differs from the output's, and any fused activation."""
    if Activation(activation) != Activation.NONE:
        raise IntegerKernelError(f"CONCATENATION: int8 takes no fused activation, got {Activation(activation).name}")
    for k, q in enumerate(input_qps):
        if np.float32(q.scale[0]) != np.float32(out_qp.scale[0]) or int(q.zero_point[0]) != int(out_qp.zero_point[0]):
            raise IntegerKernelError(
                f"CONCATENATION: input {k} has scale {q.scale[0]} zero point {q.zero_point[0]}, the output "
                f"{out_qp.scale[0]} / {out_qp.zero_point[0]}; int8 inputs must share the output's params")
    return np.concatenate([np.asarray(x) for x in inputs], axis=axis).astype(out_dtype)


# -- uint8 FULLY_CONNECTED / CONV_2D / DEPTHWISE_CONV_2D -------------------------------------------

def uint8_multiplier(x_qp: QuantParams, w_qp: QuantParams, out_qp: QuantParams) -> tuple[int, int]:
    """GetQuantizedConvolutionMultipler: ``double(float32(s_x · s_w)) / double(s_y)``."""
    if np.asarray(w_qp.scale).size != 1:
        raise IntegerKernelError(f"uint8 kernels take per-tensor weights, got {np.asarray(w_qp.scale).size} scales")
    product = F32(F32(x_qp.scale[0]) * F32(w_qp.scale[0]))
    return quantize_multiplier(float(product) / float(F32(out_qp.scale[0])))


def _finish(acc, m: int, shift: int, out_qp: QuantParams, activation, *, double_rounding: bool) -> np.ndarray:
    lo, hi = activation_range(activation, out_qp, np.uint8)
    rescale = multiply_by_quantized_multiplier_double_rounding if double_rounding else multiply_by_quantized_multiplier
    out = rescale(acc, m, shift).astype(np.int64) + _zp(out_qp)
    return np.clip(out, lo, hi).astype(np.uint8)



def fully_connected_uint8(x_q, x_qp: QuantParams, w_q, w_qp: QuantParams, bias_q, out_qp: QuantParams, *,
                          activation=Activation.NONE, keep_num_dims: bool = False) -> np.ndarray:
    """uint8 FULLY_CONNECTED (reference FullyConnected, uint8): ``Σ (x − zp_x)(w − zp_w) + b``."""
    x_q, w_q = np.asarray(x_q), np.asarray(w_q)
    units, depth = w_q.shape
    if depth == 0 or x_q.size % depth:
        raise IntegerKernelError(f"FULLY_CONNECTED: input {list(x_q.shape)} does not split into rows of {depth}")
    rows = x_q.reshape(-1, depth).astype(np.int64) - _zp(x_qp)
    acc = int_matmul(rows, (w_q.astype(np.int64) - _zp(w_qp)).T) + _bias(bias_q, units)
    out = _finish(acc, *uint8_multiplier(x_qp, w_qp, out_qp), out_qp, activation, double_rounding=False)
    return out.reshape(x_q.shape[:-1] + (units,) if keep_num_dims else (rows.shape[0], units))


def _windows(x_q, x_qp: QuantParams, kh: int, kw: int, *, out_hw, pads, strides, dilation) -> np.ndarray:
    """Each output pixel's taps, zero point removed (padding contributes nothing)."""
    (t, b), (l, r) = pads
    centered = np.asarray(x_q, np.int64) - _zp(x_qp)
    if t or b or l or r:
        centered = np.pad(centered, ((0, 0), (t, b), (l, r), (0, 0)))
    return tap_windows(centered, kh, kw, out_hw, strides, dilation)


def conv2d_uint8(x_q, x_qp: QuantParams, w_q, w_qp: QuantParams, bias_q, out_qp: QuantParams, *,
                 out_hw, pads, strides, dilation, activation=Activation.NONE) -> np.ndarray:
    """uint8 CONV_2D (reference Conv, uint8): weights [out_c, kh, kw, in_c] with a zero point."""
    x_q, w_q = np.asarray(x_q), np.asarray(w_q)
    out_c, kh, kw, in_c = w_q.shape
    if x_q.shape[3] != in_c:
        raise IntegerKernelError(f"CONV_2D: input has {x_q.shape[3]} channels, the filter {in_c}")
    cols = _windows(x_q, x_qp, kh, kw, out_hw=out_hw, pads=pads, strides=strides, dilation=dilation)
    w = (w_q.astype(np.int64) - _zp(w_qp)).reshape(out_c, -1)
    acc = int_matmul(cols.reshape(-1, kh * kw * in_c), w.T) + _bias(bias_q, out_c)
    out = _finish(acc, *uint8_multiplier(x_qp, w_qp, out_qp), out_qp, activation, double_rounding=True)
    return out.reshape(x_q.shape[0], out_hw[0], out_hw[1], out_c)


def depthwise_conv2d_uint8(x_q, x_qp: QuantParams, w_q, w_qp: QuantParams, bias_q, out_qp: QuantParams, *,
                           multiplier: int, out_hw, pads, strides, dilation,
                           activation=Activation.NONE) -> np.ndarray:
    """uint8 DEPTHWISE_CONV_2D (reference DepthwiseConv, uint8): weights [1, kh, kw, c·multiplier]."""
    x_q, w_q = np.asarray(x_q), np.asarray(w_q)
    _, kh, kw, out_c = w_q.shape
    if out_c != x_q.shape[3] * multiplier:
        raise IntegerKernelError(f"DEPTHWISE_CONV_2D: {x_q.shape[3]} input channels × multiplier {multiplier} "
                                 f"!= {out_c} filter channels")
    cols = _windows(x_q, x_qp, kh, kw, out_hw=out_hw, pads=pads, strides=strides, dilation=dilation)
    if multiplier > 1:
        cols = np.repeat(cols, multiplier, axis=-1)
    w = w_q[0].astype(np.int64) - _zp(w_qp)
    acc = np.einsum("nyxhwc,hwc->nyxc", cols, w) + _bias(bias_q, out_c)
    return _finish(acc, *uint8_multiplier(x_qp, w_qp, out_qp), out_qp, activation, double_rounding=True)
