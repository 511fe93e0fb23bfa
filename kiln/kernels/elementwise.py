"""LiteRT's int8 elementwise integer kernels (ADD, SUB, MUL, ...) as pure functions,
bit-exact with its reference kernels (``BUILTIN_REF``); operands broadcast NumPy-style.

Measured on LiteRT 2.3: these kernels rescale with two roundings
(`fixedpoint.multiply_by_quantized_multiplier_double_rounding`; one rounding differs on up to
a quarter of ADD's outputs when both input scales are equal)."""

from __future__ import annotations

import numpy as np

from kiln.errors import OpError
from kiln.ir import QuantParams
from kiln.schema import Activation

from .family import INT8, INT16, broadcast, fused_activation, out_params, params

from .fixedpoint import (
    IntegerKernelError,
    activation_range,
    dtype_range,
    quantize_multiplier,
    saturating_rounding_doubling_high_mul,
    xp_clamp,
    xp_rescale,
)
from .fixedpoint import multiply_by_quantized_multiplier_double_rounding as rescale

# ADD / SUB lift 8-bit inputs by 2^20 before rescaling them to a common scale, so the
# input rescaling loses no precision that the output rescaling would keep.
LEFT_SHIFT_8BIT = 20
#: int16 inputs (16x8, scales not powers of two) are lifted by 2^15 only.
LEFT_SHIFT_16BIT = 15


def _zp(q: QuantParams) -> int:
    return int(q.zero_point[0])


def add_sub_multipliers(a_qp: QuantParams, b_qp: QuantParams, out_qp: QuantParams, dtype):
    """ADD / SUB's ((m_a, shift_a), (m_b, shift_b), (m_y, shift_y), lift) for inputs of ``dtype``
    (shared with the quantized delegate's int16 lowering)."""
    s_a, s_b, s_y = float(a_qp.scale[0]), float(b_qp.scale[0]), float(out_qp.scale[0])
    twice_max = 2.0 * max(s_a, s_b)
    lift = LEFT_SHIFT_16BIT if np.dtype(dtype) == np.int16 else LEFT_SHIFT_8BIT
    return (quantize_multiplier(s_a / twice_max), quantize_multiplier(s_b / twice_max),
            quantize_multiplier(twice_max / ((1 << lift) * s_y)), lift)


def _add_sub(a_q, a_qp, b_q, b_qp, out_qp, activation, out_dtype, sign: int) -> np.ndarray:
    """Both inputs, lifted by 2^20, rescaled to the scale ``2 · max(s_a, s_b)`` (multipliers
    below one), summed, rescaled to the output scale (multipliers from double scales)."""
    (m_a, sh_a), (m_b, sh_b), (m_y, sh_y), lift = add_sub_multipliers(a_qp, b_qp, out_qp, np.asarray(a_q).dtype)
    a = (np.asarray(a_q, np.int64) - _zp(a_qp)) << lift
    b = (np.asarray(b_q, np.int64) - _zp(b_qp)) << lift
    total = rescale(a, m_a, sh_a).astype(np.int64) \
        + sign * rescale(b, m_b, sh_b).astype(np.int64)
    out = rescale(total, m_y, sh_y).astype(np.int64) + _zp(out_qp)
    lo, hi = activation_range(activation, out_qp, out_dtype)
    return np.clip(out, lo, hi).astype(out_dtype)


def add(a_q, a_qp: QuantParams, b_q, b_qp: QuantParams, out_qp: QuantParams, *,
        activation=Activation.NONE, out_dtype=np.int8) -> np.ndarray:
    """int8 ADD (reference integer_ops AddElementwise / BroadcastAdd)."""
    return _add_sub(a_q, a_qp, b_q, b_qp, out_qp, activation, out_dtype, +1)


def sub(a_q, a_qp: QuantParams, b_q, b_qp: QuantParams, out_qp: QuantParams, *,
        activation=Activation.NONE, out_dtype=np.int8) -> np.ndarray:
    """int8 SUB: ADD's arithmetic with the rescaled second input subtracted."""
    return _add_sub(a_q, a_qp, b_q, b_qp, out_qp, activation, out_dtype, -1)


def mul_multiplier(a_qp: QuantParams, b_qp: QuantParams, out_qp: QuantParams) -> tuple[int, int]:
    """MUL's (multiplier, shift) of ``s_a·s_b / s_y``, formed in float32."""
    real = np.float32(np.float32(a_qp.scale[0]) * np.float32(b_qp.scale[0])) / np.float32(out_qp.scale[0])
    return quantize_multiplier(float(np.float32(real)))


def mul(a_q, a_qp: QuantParams, b_q, b_qp: QuantParams, out_qp: QuantParams, *,
        activation=Activation.NONE, out_dtype=np.int8) -> np.ndarray:
    """int8 MUL: ``(a − zp_a)(b − zp_b)`` rescaled by ``s_a·s_b / s_y``, that multiplier
    formed in float32 (measured: the double-precision one differs on saturating cases)."""
    m, shift = mul_multiplier(a_qp, b_qp, out_qp)
    product = (np.asarray(a_q, np.int64) - _zp(a_qp)) * (np.asarray(b_q, np.int64) - _zp(b_qp))
    out = rescale(product, m, shift).astype(np.int64) + _zp(out_qp)
    lo, hi = activation_range(activation, out_qp, out_dtype)
    return np.clip(out, lo, hi).astype(out_dtype)


#: SQUARED_DIFFERENCE lifts inputs by 2^7 only: the squared difference must stay in 32 bits.
LEFT_SHIFT_SQUARED_DIFFERENCE = 7


def squared_difference(a_q, a_qp: QuantParams, b_q, b_qp: QuantParams, out_qp: QuantParams, *,
                       out_dtype=np.int8) -> np.ndarray:
    """int8 SQUARED_DIFFERENCE (`xp_squared_difference` on NumPy)."""
    a, b = np.asarray(a_q, np.int64), np.asarray(b_q, np.int64)
    return xp_squared_difference(np, a, a_qp, b, b_qp, out_qp, out_dtype).astype(out_dtype)


def xp_squared_difference(xp, a_q, a_qp: QuantParams, b_q, b_qp: QuantParams, out_qp: QuantParams, out_dtype):
    """int8 SQUARED_DIFFERENCE over array namespace ``xp`` (NumPy, or jax.numpy in kiln.xla)
    on int64 codes: both inputs lifted by 2^7 and rescaled to the scale ``2 · max(s_a, s_b)``,
    the difference squared, rescaled by ``(2·max)² / (2^14 · s_y)``; int64 codes out."""
    s_a, s_b, s_y = float(a_qp.scale[0]), float(b_qp.scale[0]), float(out_qp.scale[0])
    twice_max = 2.0 * max(s_a, s_b)
    m_a, sh_a = quantize_multiplier(s_a / twice_max)
    m_b, sh_b = quantize_multiplier(s_b / twice_max)
    m_y, sh_y = quantize_multiplier(twice_max * twice_max / ((1 << 2 * LEFT_SHIFT_SQUARED_DIFFERENCE) * s_y))
    a = (a_q - _zp(a_qp)) << LEFT_SHIFT_SQUARED_DIFFERENCE
    b = (b_q - _zp(b_qp)) << LEFT_SHIFT_SQUARED_DIFFERENCE
    diff = xp_rescale(xp, a, m_a, sh_a) - xp_rescale(xp, b, m_b, sh_b)
    return xp_clamp(xp, xp_rescale(xp, diff * diff, m_y, sh_y) + _zp(out_qp), *dtype_range(out_dtype))


def _wrap32(x) -> np.ndarray:
    """int32 wrap-around of an int64 array (gemmlowp's fixed-point additions do not saturate)."""
    return ((np.asarray(x, np.int64) + (1 << 31)) % (1 << 32)) - (1 << 31)


def _srdhm(a, b) -> np.ndarray:
    return saturating_rounding_doubling_high_mul(a, b)


def _saturating_shift_left(x, exponent: int) -> np.ndarray:
    threshold = (1 << (31 - exponent)) - 1
    x = np.asarray(x, np.int64)
    return np.where(x > threshold, (1 << 31) - 1, np.where(x < -threshold, -(1 << 31), x << exponent))


def _count_leading_zeros32(x) -> np.ndarray:
    x = np.asarray(x, np.int64) & 0xFFFFFFFF
    bits = np.zeros(x.shape, np.int64)
    nonzero = x > 0
    bits[nonzero] = np.floor(np.log2(x[nonzero].astype(np.float64))).astype(np.int64) + 1
    # log2 of values just below a power of two can round up: correct by testing the bound
    over = nonzero & ((np.int64(1) << np.maximum(bits - 1, 0)) > x)
    bits[over] -= 1
    return 32 - bits


def _one_over_one_plus_x(a) -> np.ndarray:
    """gemmlowp's one_over_one_plus_x_for_x_in_0_1 (Newton-Raphson, three steps) on raw
    Q0.31 values, result in Q0.31."""
    half_denominator = _rounding_half_sum(a, (1 << 31) - 1)
    x = _wrap32(1515870810 + _srdhm(half_denominator, -1010580540))     # Q2.29: 48/17 - 32/17 · d
    for _ in range(3):
        one_minus = _wrap32((1 << 29) - _srdhm(half_denominator, x))
        x = _wrap32(x + _saturating_shift_left(_srdhm(x, one_minus), 2))
    return _saturating_shift_left(x, 1)


def _rounding_half_sum(a, b) -> np.ndarray:
    total = np.asarray(a, np.int64) + np.asarray(b, np.int64)
    nudged = total + np.where(total >= 0, 1, -1)
    return np.where(nudged >= 0, nudged // 2, -((-nudged) // 2))


def div(a_q, a_qp: QuantParams, b_q, b_qp: QuantParams, out_qp: QuantParams, *,
        activation=Activation.NONE, out_dtype=np.int8) -> np.ndarray:
    """int8 DIV (reference quantized Div): the divisor's fixed-point reciprocal (gemmlowp's
    Newton-Raphson), the dividend scaled up by its headroom, then ``s_a / (s_b · s_y)``
    (formed in float32; measured: 0 of 2 400 outputs differ over 3 parameter sets)."""
    a = np.asarray(a_q, np.int64) - _zp(a_qp)
    b = np.asarray(b_q, np.int64) - _zp(b_qp)
    a, b = np.broadcast_arrays(a, b)
    if np.any(b == 0):
        raise IntegerKernelError("DIV: a divisor equals its zero point (division by zero)")
    a = np.where(b < 0, -a, a)
    b = np.abs(b)
    headroom_plus_one = _count_leading_zeros32(b)
    recip_shift = 31 - headroom_plus_one
    shifted = _wrap32((b << headroom_plus_one) - (1 << 31))
    reciprocal = _one_over_one_plus_x(shifted)
    headroom = np.where(a >= 0, _count_leading_zeros32(a) - 1, _count_leading_zeros32(2 * (-a) - 1))
    quotient = _srdhm(a << headroom, reciprocal)
    f32 = np.float32
    real = f32(a_qp.scale[0]) / f32(f32(b_qp.scale[0]) * f32(out_qp.scale[0]))   # formed in float32
    m, shift = quantize_multiplier(float(f32(real)))
    total_shift = shift - recip_shift - headroom
    out = rescale_by(quotient, m, total_shift) + _zp(out_qp)
    lo, hi = activation_range(activation, out_qp, out_dtype)
    return np.clip(out, lo, hi).astype(out_dtype)


def rescale_by(x, multiplier, shift) -> np.ndarray:
    """MultiplyByQuantizedMultiplierSmallerThanOneExp with a per-element shift (<= 0). A
    right shift of 32 bits or more is what x86 makes of C's undefined shift: the mask is
    formed in 64 bits and cut to 32, the shift count taken modulo 32 (measured: LiteRT's
    DIV gives those results for dividends near zero)."""
    exponent = -np.asarray(shift, np.int64)
    x = np.asarray(_srdhm(x, multiplier), np.int64)
    mask = _wrap32((np.int64(1) << np.minimum(exponent, 62)) - 1)
    threshold = (mask >> 1) + (x < 0)
    return (x >> (exponent & 31)) + (_wrap32(x & mask) > threshold)


#: Comparisons lift 8-bit inputs by 2^8 before rescaling each by its own scale.
LEFT_SHIFT_COMPARISON = 8


def comparison_values(a_q, a_qp: QuantParams, b_q, b_qp: QuantParams) -> tuple[np.ndarray, np.ndarray]:
    """The values LiteRT's int8 comparisons (LESS, EQUAL, ...) compare: each input less its
    zero point, lifted by 2^8 and rescaled by its own scale (a multiplier below one, two
    roundings). Codes that differ can compare equal where the scale is small."""
    out = []
    for x, q in ((a_q, a_qp), (b_q, b_qp)):
        m, shift = quantize_multiplier(float(q.scale[0]))
        lifted = (np.asarray(x, np.int64) - _zp(q)) << LEFT_SHIFT_COMPARISON
        out.append(rescale(lifted, m, shift).astype(np.int64))
    return out[0], out[1]


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


# -- the records' ``quantized`` kernels: a node's operands and options to the arithmetic above -----

def _binary(fn):
    def kernel(call, a, b):
        broadcast(call, a, b)
        return fn(a, params(call, 0, "input 0"), b, params(call, 1, "input 1"), out_params(call),
                  activation=fused_activation(call), out_dtype=call.out_dtypes[0])
    return kernel


def _squared_difference(call, a, b):
    broadcast(call, a, b)
    return squared_difference(a, params(call, 0, "input 0"), b, params(call, 1, "input 1"), out_params(call),
                              out_dtype=call.out_dtypes[0])


def comparison(fn):
    """An int8 comparison's kernel: ``fn`` on LiteRT's rescaled values (`comparison_values`)."""
    def kernel(call, a, b):
        broadcast(call, a, b)
        return fn(*comparison_values(a, params(call, 0, "input 0"), b, params(call, 1, "input 1")))
    return kernel


def _concatenation(call, *xs):
    inputs = [params(call, k, f"input {k}") for k in range(len(xs))]
    axis = int(call.opts.axis)
    rank = xs[0].ndim if xs else 0
    if not -rank <= axis < rank:
        raise OpError(f"{call.op.name}: axis {axis} out of range for rank {rank}")
    try:
        return concatenation(xs, inputs, out_params(call), axis=axis, activation=fused_activation(call),
                             out_dtype=call.out_dtypes[0])
    except ValueError as exc:
        raise OpError(f"{call.op.name}: inputs {[list(x.shape) for x in xs]} do not concatenate on axis "
                      f"{axis}") from exc


def _pack(call, *xs):
    """int8 PACK: LiteRT stacks the codes and requires every input's params to be the output's."""
    out_q = out_params(call)
    for k in range(len(xs)):
        q = params(call, k, f"input {k}")
        if np.float32(q.scale[0]) != np.float32(out_q.scale[0]) or q.zero_point[0] != out_q.zero_point[0]:
            raise OpError(f"{call.op.name}: input {k} has scale {q.scale[0]} zero point {q.zero_point[0]}, the "
                          f"output {out_q.scale[0]} / {out_q.zero_point[0]}; LiteRT requires them equal")
    rank = xs[0].ndim + 1 if xs else 1
    axis = int(call.opts.axis)
    if not -rank <= axis < rank or any(x.shape != xs[0].shape for x in xs):
        raise OpError(f"{call.op.name}: inputs {[list(x.shape) for x in xs]} do not stack on axis {axis}")
    return np.stack(xs, axis=axis).astype(call.out_dtypes[0], copy=False)


ADD = dict.fromkeys((INT8, INT16), _binary(add))
SUB = dict.fromkeys((INT8, INT16), _binary(sub))
MUL = dict.fromkeys((INT8, INT16), _binary(mul))
DIV = {INT8: _binary(div)}
SQUARED_DIFFERENCE = {INT8: _squared_difference}
CONCATENATION = {INT8: _concatenation, INT16: _concatenation}
PACK = {INT8: _pack, INT16: _pack}
