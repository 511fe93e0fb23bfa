"""LiteRT's fixed-point arithmetic, vectorised over NumPy arrays.

Integer kernels rescale an int32 accumulator by a real multiplier ``m`` held as a 31-bit
fixed-point mantissa and a power-of-two shift (`quantize_multiplier`). Which rounding a
LiteRT 2.3 kernel uses is measured per op (see kiln.kernels.nn*): its reference
FULLY_CONNECTED and XNNPACK round once (`multiply_by_quantized_multiplier`), its reference
CONV_2D, DEPTHWISE_CONV_2D, ADD, MUL, MEAN, ... and QUANTIZE round twice
(`..._double_rounding`); the two differ by one LSB on a few outputs.
"""

from __future__ import annotations

import math

import numpy as np

from kiln.errors import KilnError
from kiln.ir import QuantParams
from kiln.schema import Activation

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def round_half_away(x) -> np.ndarray:
    """C's std::round (TfLiteRound): halves away from zero, unlike NumPy's half-to-even."""
    x = np.asarray(x, np.float64)  # float32's x + 0.5 would round large values early
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def quantize_multiplier(real_multiplier: float) -> tuple[int, int]:
    """``real_multiplier ≈ M · 2^(shift − 31)`` with M in [2^30, 2^31): LiteRT's
    QuantizeMultiplier (single-rounding build: the shift is capped at 30)."""
    m = float(real_multiplier)
    if m == 0.0:
        return 0, 0
    if m < 0 or not math.isfinite(m):
        raise ValueError(f"a requantization multiplier must be finite and >= 0, got {m}")
    q, shift = math.frexp(m)
    q_fixed = int(round_half_away(q * (1 << 31)))
    if q_fixed == 1 << 31:
        q_fixed //= 2
        shift += 1
    if shift < -31:
        return 0, 0
    if shift > 30:
        return INT32_MAX, 30
    return q_fixed, shift


def quantize_multipliers(real_multipliers) -> tuple[np.ndarray, np.ndarray]:
    """`quantize_multiplier` per channel, vectorised: (int32 mantissas, int32 shifts)."""
    m = np.ravel(np.asarray(real_multipliers, np.float64))
    if np.any(m < 0) or not np.all(np.isfinite(m)):
        raise ValueError(f"requantization multipliers must be finite and >= 0, got {m[(m < 0) | ~np.isfinite(m)][:4]}")
    q, shift = np.frexp(m)
    q_fixed = round_half_away(q * (1 << 31)).astype(np.int64)
    carry = q_fixed == 1 << 31
    q_fixed = np.where(carry, q_fixed // 2, q_fixed)
    shift = np.where(carry, shift + 1, shift).astype(np.int64)
    zero = (m == 0) | (shift < -31)
    big = shift > 30
    return (np.where(zero, 0, np.where(big, INT32_MAX, q_fixed)).astype(np.int64),
            np.where(zero, 0, np.where(big, 30, shift)).astype(np.int64))


def multiply_by_quantized_multiplier(x, multiplier, shift) -> np.ndarray:
    """``round(x · M · 2^(shift − 31))`` with one rounding (half up), as int32 results.

    ``x`` is an int32 accumulator (any shape); ``multiplier``/``shift`` broadcast against it
    (per-channel along the last axis, or scalars)."""
    x = np.asarray(x, np.int64)
    multiplier = np.asarray(multiplier, np.int64)
    total_shift = 31 - np.asarray(shift, np.int64)
    rounding = np.left_shift(np.int64(1), total_shift - 1)
    return ((x * multiplier + rounding) >> total_shift).astype(np.int32)


def multiply_by_quantized_multiplier_int64(x, multiplier, shift) -> np.ndarray:
    """The int64-accumulator variant (16x8 kernels): the mantissa is first reduced to 15
    bits so that ``x · M`` fits in 64 bits for |x| < 2^47."""
    x = np.asarray(x, np.int64)
    multiplier = np.asarray(multiplier, np.int64)
    reduced = np.where(multiplier < 0x7FFF0000, (multiplier + (1 << 15)) >> 16, 0x7FFF)
    total_shift = 15 - np.asarray(shift, np.int64)
    rounding = np.left_shift(np.int64(1), total_shift - 1)
    return ((x * reduced + rounding) >> total_shift).astype(np.int32)


def saturating_rounding_doubling_high_mul(a, b) -> np.ndarray:
    """gemmlowp's SaturatingRoundingDoublingHighMul on int32 values."""
    a = np.asarray(a, np.int64)
    b = np.asarray(b, np.int64)
    product = a * b
    nudge = np.where(product >= 0, 1 << 30, 1 - (1 << 30))
    total = product + nudge
    high = np.where(total >= 0, total >> 31, -((-total) >> 31))  # C division truncates
    overflow = (a == INT32_MIN) & (b == INT32_MIN)
    return np.where(overflow, INT32_MAX, high).astype(np.int64)


def rounding_divide_by_pot(x, exponent) -> np.ndarray:
    """gemmlowp's RoundingDivideByPOT: ``x / 2^exponent`` rounded half away from zero."""
    x = np.asarray(x, np.int64)
    exponent = np.asarray(exponent, np.int64)
    mask = (np.int64(1) << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + (remainder > threshold)


def multiply_by_quantized_multiplier_double_rounding(x, multiplier, shift) -> np.ndarray:
    """LiteRT's optimised-kernel requantization (two roundings), for comparison."""
    shift = np.asarray(shift, np.int64)
    left = np.maximum(shift, 0)
    right = np.maximum(-shift, 0)
    scaled = np.asarray(x, np.int64) << left
    scaled = np.clip(scaled, INT32_MIN, INT32_MAX)
    return rounding_divide_by_pot(saturating_rounding_doubling_high_mul(scaled, multiplier),
                                  right).astype(np.int32)


def requantize(acc, real_multiplier, zero_point: int, qmin: int, qmax: int) -> np.ndarray:
    """An integer kernel's output stage: rescale the accumulator, add the output zero
    point, clamp to the activation range."""
    m, s = quantize_multipliers(real_multiplier)
    if m.size == 1:
        m, s = m[0], s[0]
    out = multiply_by_quantized_multiplier(acc, m, s).astype(np.int64) + int(zero_point)
    return np.clip(out, qmin, qmax)


# -- the same arithmetic over any array namespace ``xp`` (numpy or jax.numpy) -------------------
# Kernels written once for NumPy and for kiln.xla's lowerings (the integer LSTM step, L2
# normalization's inverse square root) call these; values are int32 held in int64.

def xp_high_mul(xp, a, b):
    """gemmlowp's SaturatingRoundingDoublingHighMul on int32 values held in int64."""
    product = a * b
    total = product + xp.where(product >= 0, 1 << 30, 1 - (1 << 30))
    high = xp.where(total >= 0, total >> 31, -((-total) >> 31))
    return xp.where((a == INT32_MIN) & (b == INT32_MIN), INT32_MAX, high)


def xp_divide_by_pot(xp, x, exponent):
    mask = (1 << exponent) - 1
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + ((x & mask) > threshold)


def xp_rescale(xp, x, multiplier, shift):
    """LiteRT's MultiplyByQuantizedMultiplier (two roundings, as its build computes it)."""
    left, right = xp.maximum(shift, 0), xp.maximum(-shift, 0)
    scaled = xp_clamp(xp, x << left, INT32_MIN, INT32_MAX)
    return xp_divide_by_pot(xp, xp_high_mul(xp, scaled, multiplier), right)


def xp_clamp(xp, x, lo, hi):
    return xp.minimum(xp.maximum(x, lo), hi)   # (np.clip's per-call dtype checks cost more)


# -- output ranges -----------------------------------------------------------------------------

class IntegerKernelError(KilnError):
    """An integer kernel was given operands LiteRT's kernel would refuse."""


def dtype_range(dtype) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def activation_range(activation, out_qp: QuantParams, dtype=np.int8) -> tuple[int, int]:
    """LiteRT's CalculateActivationRangeQuantized: the fused activation's bounds in the
    output's integer domain; ``f / scale`` is a float32 division rounded half away."""
    qmin, qmax = dtype_range(dtype)
    scale, zp = np.float32(out_qp.scale[0]), int(out_qp.zero_point[0])

    def quantize(f: float) -> int:
        v = np.float32(np.float32(f) / scale)
        return zp + int(np.sign(v) * np.floor(np.abs(v) + np.float32(0.5)))

    activation = Activation(activation)
    if activation == Activation.RELU:
        return max(qmin, quantize(0.0)), qmax
    if activation == Activation.RELU6:
        return max(qmin, quantize(0.0)), min(qmax, quantize(6.0))
    if activation == Activation.RELU_N1_TO_1:
        return max(qmin, quantize(-1.0)), min(qmax, quantize(1.0))
    if activation == Activation.NONE:
        return qmin, qmax
    raise IntegerKernelError(f"fused activation {activation.name} has no integer kernel")
