"""LiteRT's int8 kernels for PRELU, L2_NORMALIZATION, SQRT, ELU and RESIZE_BILINEAR, and its
legacy uint8 FULLY_CONNECTED / CONV_2D / DEPTHWISE_CONV_2D, as pure functions bit-exact with
its reference kernels (``BUILTIN_REF``; ELU, which BUILTIN_REF lacks, with the builtin one).

uint8 models come from TF1's quantization-aware converters: asymmetric per-tensor weights
with a zero point, one multiplier from the float32 product of the scales. Measured on
LiteRT 2.3: PRELU and the uint8 convolutions rescale with two roundings, uint8
FULLY_CONNECTED with one (as its int8 kernel)."""

from __future__ import annotations

import numpy as np

from kiln.ir import QuantParams
from kiln.schema import Activation

from .arith import (INT32_MAX, INT32_MIN, multiply_by_quantized_multiplier,
                    multiply_by_quantized_multiplier_double_rounding as rescale2, quantize_multiplier)
from .hybrid import int_matmul, tap_windows
from .integer import IntegerKernelError, activation_range, dtype_range
from .integer_lstm import _divide_by_pot, _high_mul, rescale as lstm_rescale   # over xp
from .integer_activations import lookup_table

F32 = np.float32


def _zp(qp: QuantParams) -> int:
    return int(qp.zero_point[0])


# -- PRELU -------------------------------------------------------------------------------------

def prelu(x_q, x_qp: QuantParams, alpha_q, alpha_qp: QuantParams, out_qp: QuantParams, *,
          out_dtype=np.int8) -> np.ndarray:
    """PRELU (reference Prelu / BroadcastPrelu4DSlow): two multipliers, ``s_x / s_y`` where
    ``x − zp_x ≥ 0`` and ``s_x · s_α / s_y`` applied to ``(x − zp_x)(α − zp_α)`` elsewhere,
    both formed in float32; alpha broadcasts into the input's shape. 16x8 PRELU is the same
    with int16 input and output and an int8 alpha."""
    x = np.asarray(x_q, np.int64) - _zp(x_qp)
    alpha = np.broadcast_to(np.asarray(alpha_q, np.int64) - _zp(alpha_qp), x.shape)
    s_x, s_a, s_y = F32(x_qp.scale[0]), F32(alpha_qp.scale[0]), F32(out_qp.scale[0])
    m1, e1 = quantize_multiplier(float(F32(s_x / s_y)))          # float32 arithmetic, as Prepare
    m2, e2 = quantize_multiplier(float(F32(F32(s_x * s_a) / s_y)))
    positive = rescale2(x, m1, e1).astype(np.int64)
    negative = rescale2(x * alpha, m2, e2).astype(np.int64)
    out = np.where(x >= 0, positive, negative) + _zp(out_qp)
    return np.clip(out, *dtype_range(out_dtype)).astype(out_dtype)


# -- L2_NORMALIZATION --------------------------------------------------------------------------
# Written once over an array namespace ``xp`` (NumPy here, jax.numpy in kiln.xla's lowering),
# as kiln.quant.integer_lstm's step: the Newton–Raphson steps are the kernel's arithmetic.

def _saturating_shift_left(xp, x, exponent: int):
    """gemmlowp's SaturatingRoundingMultiplyByPOT for a positive exponent."""
    threshold = (1 << (31 - exponent)) - 1
    return xp.where(x > threshold, INT32_MAX, xp.where(x < -threshold, INT32_MIN, x << exponent))


#: ``acc`` (an int64 sum of squares) is divided by 4 at most this often to fall below 2^29.
_MAX_QUARTERINGS = 17


def inv_sqrt_multiplier(acc, xp=np):
    """GetInvSqrtQuantizedMultiplierExp (reverse shift −1), vectorised: ``1 / sqrt(acc)`` as a
    31-bit multiplier and a left shift, by five Newton–Raphson steps in gemmlowp's Q3.28."""
    acc = xp.asarray(acc).astype(xp.int64)
    small = acc <= 1
    acc = xp.where(small, 4, acc)   # any valid value; replaced below
    shift = xp.full(acc.shape, 11, xp.int64)
    for _ in range(_MAX_QUARTERINGS):   # the kernel's `while (acc >= 2^29)`: once past, a no-op
        big = acc >= (1 << 29)
        acc = xp.where(big, acc // 4, acc)
        shift = shift + big
    leading_zeros = 32 - xp.frexp(acc.astype(xp.float64))[1].astype(xp.int64)   # exact below 2^53
    pairs = (leading_zeros - 1) // 2 - 1
    shift = shift - pairs
    acc = acc << (2 * pairs)
    x_in = acc >> 1                                  # F3 raw
    half_in = _divide_by_pot(xp, x_in, 1)
    half_three = (1 << 28) + (1 << 27)
    x = xp.full(acc.shape, 1 << 28, xp.int64)        # F3 one
    for _ in range(5):
        x3 = _saturating_shift_left(xp, _high_mul(xp, _high_mul(xp, x, x), x), 6)
        diff = _high_mul(xp, half_three, x) - _high_mul(xp, half_in, x3)
        diff = ((diff + (1 << 31)) % (1 << 32)) - (1 << 31)   # int32 wrap-around, as gemmlowp
        x = _saturating_shift_left(xp, diff, 3)
    x = _high_mul(xp, x, 1518500250)
    negative = shift < 0
    x = xp.where(negative, x << xp.where(negative, -shift, 0), x)
    shift = xp.where(negative, 0, shift)
    return xp.where(small, INT32_MAX, x), xp.where(small, 0, -shift)


def l2_normalize_centered(xp, x):
    """The kernel on int64 ``x − zp`` (last axis): each value rescaled by the row's
    inverse-square-root multiplier with an extra ``2^7``, before the clamp."""
    m, shift = inv_sqrt_multiplier((x * x).sum(axis=-1, keepdims=True), xp)
    return lstm_rescale(xp, x, m, shift + 7)


def l2_normalization(x_q, x_qp: QuantParams, *, out_dtype=np.int8) -> np.ndarray:
    """int8 L2_NORMALIZATION over the last axis: ``Σ (x − zp)²`` gives an inverse-square-root
    multiplier, applied to each ``x − zp`` with an extra ``2^7`` (output scale 1/128, zero
    point 0, which LiteRT's Prepare requires)."""
    x = np.asarray(x_q, np.int64) - _zp(x_qp)
    if x.ndim == 0:
        raise IntegerKernelError("L2_NORMALIZATION: input must have at least one dimension")
    out = l2_normalize_centered(np, x).astype(np.int64)
    return np.clip(out, *dtype_range(out_dtype)).astype(out_dtype)


# -- SQRT, ELU ------------------------------------------------------------------------------------

def sqrt(x_q, x_qp: QuantParams, out_qp: QuantParams, *, out_dtype=np.int8) -> np.ndarray:
    """int8 SQRT (elementwise SqrtEvalQuantized): dequantize in float32, float32 sqrt, divide
    by the output scale and truncate toward zero, add the zero point, clamp. A negative
    input is refused, as LiteRT's kernel refuses it."""
    real = (F32(x_qp.scale[0]) * (np.asarray(x_q, np.int64) - _zp(x_qp)).astype(F32)).astype(F32)
    if np.any(real < 0):
        raise IntegerKernelError(f"SQRT: input dequantizes to a negative value ({float(real.min())}); "
                                 "SQRT is defined for non-negative values only")
    scaled = (np.sqrt(real) / F32(out_qp.scale[0])).astype(F32)
    out = np.trunc(scaled).astype(np.int64) + _zp(out_qp)
    return np.clip(out, *dtype_range(out_dtype)).astype(out_dtype)


def elu(x_q, x_qp: QuantParams, out_qp: QuantParams, *, out_dtype=np.int8) -> np.ndarray:
    """int8 ELU: LiteRT's float lookup table of ``expm1(x)`` for x < 0, ``x`` elsewhere."""
    def transform(v):
        return np.where(v < 0, np.expm1(v), v).astype(F32)
    return lookup_table(x_q, x_qp, out_qp, transform, out_dtype)


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
    y0, y1, dy = _integer_axis(x.shape[1], out_hw[0], align_corners, half_pixel_centers)
    x0, x1, dx = _integer_axis(x.shape[2], out_hw[1], align_corners, half_pixel_centers)
    v = x.astype(np.int64)
    dy, dx = dy[None, :, None, None], dx[None, None, :, None]
    one = 1 << 10
    total = (v[:, y0][:, :, x0] * (one - dy) * (one - dx) + v[:, y1][:, :, x0] * dy * (one - dx)
             + v[:, y0][:, :, x1] * (one - dy) * dx + v[:, y1][:, :, x1] * dy * dx)
    half = np.where(total > 0, 1 << 19, -(1 << 19))
    return _c_div(total + half, 1 << 20).astype(x.dtype)


# -- uint8 FULLY_CONNECTED / CONV_2D / DEPTHWISE_CONV_2D -------------------------------------------

def _uint8_multiplier(x_qp: QuantParams, w_qp: QuantParams, out_qp: QuantParams) -> tuple[int, int]:
    """GetQuantizedConvolutionMultipler: ``double(float32(s_x · s_w)) / double(s_y)``."""
    if np.asarray(w_qp.scale).size != 1:
        raise IntegerKernelError(f"uint8 kernels take per-tensor weights, got {np.asarray(w_qp.scale).size} scales")
    product = F32(F32(x_qp.scale[0]) * F32(w_qp.scale[0]))
    return quantize_multiplier(float(product) / float(F32(out_qp.scale[0])))


def _finish(acc, m: int, shift: int, out_qp: QuantParams, activation, *, double_rounding: bool) -> np.ndarray:
    lo, hi = activation_range(activation, out_qp, np.uint8)
    rescale = rescale2 if double_rounding else multiply_by_quantized_multiplier
    out = rescale(acc, m, shift).astype(np.int64) + _zp(out_qp)
    return np.clip(out, lo, hi).astype(np.uint8)


def _bias(bias_q, channels: int) -> np.ndarray:
    return np.zeros(channels, np.int64) if bias_q is None else np.asarray(bias_q, np.int64).reshape(channels)


def fully_connected_uint8(x_q, x_qp: QuantParams, w_q, w_qp: QuantParams, bias_q, out_qp: QuantParams, *,
                          activation=Activation.NONE, keep_num_dims: bool = False) -> np.ndarray:
    """uint8 FULLY_CONNECTED (reference FullyConnected, uint8): ``Σ (x − zp_x)(w − zp_w) + b``."""
    x_q, w_q = np.asarray(x_q), np.asarray(w_q)
    units, depth = w_q.shape
    if depth == 0 or x_q.size % depth:
        raise IntegerKernelError(f"FULLY_CONNECTED: input {list(x_q.shape)} does not split into rows of {depth}")
    rows = x_q.reshape(-1, depth).astype(np.int64) - _zp(x_qp)
    acc = int_matmul(rows, (w_q.astype(np.int64) - _zp(w_qp)).T) + _bias(bias_q, units)
    out = _finish(acc, *_uint8_multiplier(x_qp, w_qp, out_qp), out_qp, activation, double_rounding=False)
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
    out = _finish(acc, *_uint8_multiplier(x_qp, w_qp, out_qp), out_qp, activation, double_rounding=True)
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
    return _finish(acc, *_uint8_multiplier(x_qp, w_qp, out_qp), out_qp, activation, double_rounding=True)
