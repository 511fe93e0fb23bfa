"""gemmlowp's 16-bit fixed-point logistic and tanh (fixedpoint/fixedpoint.h), as tables.

LiteRT's integer LSTM (lstm_eval.cc, via tensor_utils ApplySigmoid / ApplyTanh) runs its
gates through ``gemmlowp::logistic`` and ``gemmlowp::tanh`` on ``FixedPoint<int16_t, N>``
values: Q3.12 gate pre-activations, and the cell state at ``N = 15 + log2(cell scale)``
integer bits. An int16 input has 65 536 values, so kiln evaluates gemmlowp's algorithm once
on all of them (NumPy, int16 semantics emulated on int64: wrapping adds, saturating
shifts, the int16 SaturatingRoundingDoublingHighMul) and kernels look results up — the
same table serves the NumPy kernel and the XLA lowering.
"""

from __future__ import annotations

import functools

import numpy as np

from .fixedpoint import xp_divide_by_pot, xp_high_mul

_MIN, _MAX = -(1 << 15), (1 << 15) - 1


def _wrap(x):
    """An int16 cast (C's conversion of an out-of-range int: two's-complement wrap)."""
    return ((x + (1 << 15)) & 0xFFFF) - (1 << 15)


def _high_mul(a, b):
    """SaturatingRoundingDoublingHighMul<int16_t>: the fixed-point product."""
    ab = a * b
    total = ab + np.where(ab >= 0, 1 << 14, 1 - (1 << 14))
    q = np.where(total >= 0, total >> 15, -((-total) >> 15))    # C division truncates
    return np.where((a == _MIN) & (b == _MIN), _MAX, _wrap(q))


def _divide_by_pot(x, exponent: int):
    """RoundingDivideByPOT: halves away from zero."""
    mask = (1 << exponent) - 1
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + ((x & mask) > threshold)


def _mul_by_pot(x, exponent: int):
    """SaturatingRoundingMultiplyByPOT<exponent> on int16 values."""
    if exponent < 0:
        return _divide_by_pot(x, -exponent)
    if exponent == 0:
        return x
    threshold = (1 << (15 - exponent)) - 1
    return np.where(x > threshold, _MAX, np.where(x < -threshold, _MIN, x << exponent))


def _constant(raw32: int) -> int:
    """GEMMLOWP_CHECKED_FIXEDPOINT_CONSTANT for int16: the int32 raw value rounded down 16 bits."""
    return int(_divide_by_pot(np.int64(raw32), 16))


def _one(integer_bits: int) -> int:
    return _MAX if integer_bits == 0 else 1 << (15 - integer_bits)


def _saturating_add(a, b):
    return np.clip(a + b, _MIN, _MAX)


def _exp_quarter(a):
    """exp(a) for a in [-1/4, 0), Q0.15 in and out (a Taylor series around -1/8)."""
    constant_term, third = _constant(1895147668), _constant(715827883)
    x = _wrap(a + (1 << 12))
    x2 = _high_mul(x, x)
    x3 = _high_mul(x2, x)
    x4 = _high_mul(x2, x2)
    x4_over_4 = _mul_by_pot(x4, -2)
    rest = _mul_by_pot(_wrap(_high_mul(_wrap(x4_over_4 + x3), third) + x2), -1)
    return _saturating_add(constant_term, _high_mul(constant_term, _wrap(x + rest)))


_BARREL = ((-2, 1672461947), (-1, 1302514674), (0, 790015084), (1, 290630308), (2, 39332535),
           (3, 720401), (4, 242))


def _exp_on_negative_values(a, integer_bits: int):
    fractional = 15 - integer_bits
    quarter = 1 << (fractional - 2)
    a_mod = _wrap((a & _wrap(quarter - 1)) - quarter)
    result = _exp_quarter(_mul_by_pot(a_mod, integer_bits))
    remainder = _wrap(a_mod - a)
    for exponent, multiplier in _BARREL:
        if integer_bits > exponent:
            bit = _wrap(1 << (fractional + exponent))
            result = np.where((remainder & bit) != 0, _high_mul(result, _constant(multiplier)), result)
    if integer_bits > 5:
        result = np.where(a < _constant(-(1 << (36 - integer_bits))), 0, result)
    return np.where(a == 0, _one(0), result)


def _newton_reciprocal(a):
    """x ≈ 1 / ((1 + a) / 2) in Q2.13 for a in (0, 1): three Newton-Raphson steps."""
    half_denominator = _rounding_half_sum(a, _MAX)
    x = _wrap(_constant(1515870810) + _high_mul(half_denominator, _constant(-1010580540)))
    for _ in range(3):
        one_minus = _wrap(_one(2) - _high_mul(half_denominator, x))
        x = _wrap(x + _mul_by_pot(_high_mul(x, one_minus), 2))
    return x


def _rounding_half_sum(a, b):
    s = a + b
    t = s + np.where(s >= 0, 1, -1)
    return _wrap(np.where(t >= 0, t // 2, -((-t) // 2)))


@functools.lru_cache(maxsize=None)
def tanh_table(integer_bits: int) -> np.ndarray:
    """gemmlowp::tanh on FixedPoint<int16_t, integer_bits>: int16 table indexed by raw + 32768."""
    if not 0 <= integer_bits <= 6:
        raise ValueError(f"LiteRT's integer tanh takes 0..6 integer bits, got {integer_bits}")
    a = np.arange(_MIN, _MAX + 1, dtype=np.int64)
    negative = a < 0
    n = np.where(negative, a, _wrap(-a))
    e = _exp_on_negative_values(n, integer_bits + 1)                 # exp(2n), n <= 0
    t = _mul_by_pot(_wrap(_newton_reciprocal(e) - _one(2)), 2)       # (1 - e) / (1 + e)
    return _frozen(np.where(a == 0, 0, np.where(negative, _wrap(-t), t)))


@functools.lru_cache(maxsize=None)
def logistic_table(integer_bits: int = 3) -> np.ndarray:
    """gemmlowp::logistic on FixedPoint<int16_t, integer_bits>, as `tanh_table`."""
    a = np.arange(_MIN, _MAX + 1, dtype=np.int64)
    positive = a > 0
    magnitude = np.where(positive, a, _wrap(-a))
    e = _exp_on_negative_values(_wrap(-magnitude), integer_bits)
    if_positive = _mul_by_pot(_newton_reciprocal(e), 1)               # 1 / (1 + e)
    return _frozen(np.where(a == 0, _constant(1 << 30),
                            np.where(positive, if_positive, _wrap(_one(0) - if_positive))))


def _frozen(values) -> np.ndarray:
    table = values.astype(np.int16)
    table.setflags(write=False)
    return table


# -- int32 fixed point: LiteRT's reference int8 / uint8 SOFTMAX ------------------------------------
# gemmlowp's FixedPoint<int32_t, N> on int64 arrays: products by
# SaturatingRoundingDoublingHighMul, wrapping adds (AddSaturatingIf16Bit adds plainly in 32 bits).

_MIN32, _MAX32 = -(1 << 31), (1 << 31) - 1


def _wrap32(x):
    return ((np.asarray(x, np.int64) + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)


def _high_mul32(a, b):
    from .fixedpoint import saturating_rounding_doubling_high_mul

    return _wrap32(saturating_rounding_doubling_high_mul(a, b))


def _mul_by_pot32(x, exponent: int):
    """SaturatingRoundingMultiplyByPOT<exponent> on int32 values."""
    from .fixedpoint import rounding_divide_by_pot

    x = np.asarray(x, np.int64)
    if exponent < 0:
        return rounding_divide_by_pot(x, -exponent)
    if exponent == 0:
        return x
    threshold = (1 << (31 - exponent)) - 1
    return np.where(x > threshold, _MAX32, np.where(x < -threshold, _MIN32, x << exponent))


def exp_on_negative_values32(a, integer_bits: int) -> np.ndarray:
    """gemmlowp::exp_on_negative_values(FixedPoint<int32_t, integer_bits>) -> Q0.31 raw values."""
    a = np.asarray(a, np.int64)
    fractional = 31 - integer_bits
    quarter = 1 << (fractional - 2)
    a_mod = _wrap32((a & (quarter - 1)) - quarter)
    # exp on [-1/4, 0): a Taylor expansion around -1/8
    x = _wrap32(_mul_by_pot32(a_mod, integer_bits) + (1 << 28))
    x2 = _high_mul32(x, x)
    x3 = _high_mul32(x2, x)
    x4 = _high_mul32(x2, x2)
    rest = _mul_by_pot32(_wrap32(_high_mul32(_wrap32(_mul_by_pot32(x4, -2) + x3), 715827883) + x2), -1)
    result = _wrap32(1895147668 + _high_mul32(1895147668, _wrap32(x + rest)))
    remainder = _wrap32(a_mod - a)
    for exponent, multiplier in _BARREL:
        if integer_bits > exponent:
            bit = 1 << (fractional + exponent)
            result = np.where((remainder & bit) != 0, _high_mul32(result, multiplier), result)
    if integer_bits > 5:
        result = np.where(a < -(1 << (fractional + 5)), 0, result)
    return np.where(a == 0, _MAX32, result)


def xp_wrap32(xp, x):
    """An int32 cast of int64 values (two's-complement wrap), over array namespace ``xp``."""
    return ((x + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)


def _xp_mul_by_pot32(xp, x, exponent: int):
    """SaturatingRoundingMultiplyByPOT<exponent> on int32 values held in int64."""
    if exponent < 0:
        return xp_divide_by_pot(xp, x, -exponent)
    threshold = (1 << (31 - exponent)) - 1
    return xp.where(x > threshold, _MAX32, xp.where(x < -threshold, _MIN32, x << exponent))


def xp_one_over_one_plus_x32(xp, a):
    """gemmlowp::one_over_one_plus_x_for_x_in_0_1 on Q0.31 raw values held in int64:
    1 / (1 + a) in Q0.31, over array namespace ``xp`` (NumPy, or jax.numpy in kiln.xla)."""
    def high_mul(u, v):
        return xp_wrap32(xp, xp_high_mul(xp, u, v))

    s = a + _MAX32
    half = xp_wrap32(xp, xp.where(s >= 0, (s + 1) // 2, -((-s + 1) // 2)))        # RoundingHalfSum
    x = xp_wrap32(xp, 1515870810 + high_mul(half, -1010580540))                     # 48/17 − 32/17·d, Q2.29
    for _ in range(3):
        x = xp_wrap32(xp, x + _xp_mul_by_pot32(xp, high_mul(x, xp_wrap32(xp, (1 << 29) - high_mul(half, x))), 2))
    return _xp_mul_by_pot32(xp, x, 1)                                               # Q2.29 / 2 as Q0.31
