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
from functools import lru_cache

import numpy as np

from kiln.errors import KilnError
from kiln.ir import QuantParams
from kiln.schema import Activation

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def round_half_away(x, xp=np) -> np.ndarray:
    """C's std::round (TfLiteRound): halves away from zero, unlike NumPy's half-to-even (over
    array namespace ``xp``)."""
    x = xp.asarray(x, np.float64)  # float32's x + 0.5 would round large values early
    return xp.sign(x) * xp.floor(xp.abs(x) + 0.5)


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


# -- the arithmetic over any array namespace ``xp`` (numpy or jax.numpy) -------------------------
# Values are int32 held in int64. Multipliers and shifts known when the caller prepares (NumPy
# values) take shorter paths: a compiled backend sees fewer operations, NumPy does less work.

def _static(value) -> bool:
    return isinstance(value, (np.ndarray, np.integer, int))


def xp_high_mul(xp, a, b):
    """gemmlowp's SaturatingRoundingDoublingHighMul: its nudge of ±2^30 by the product's sign
    and truncating division by 2^31 come, for integers, to ``floor((a·b + 2^30) / 2^31)``.
    Only INT32_MIN² saturates; a static ``b`` without INT32_MIN needs no check."""
    high = (a * b + (1 << 30)) >> 31
    if _static(b) and not np.any(np.asarray(b) == INT32_MIN):
        return high
    return xp.where((a == INT32_MIN) & (b == INT32_MIN), INT32_MAX, high)


def xp_divide_by_pot(xp, x, exponent):
    """gemmlowp's RoundingDivideByPOT: ``x / 2^exponent``, halves away from zero, as
    ``floor((x + 2^(e-1) - [x < 0 and e > 0]) / 2^e)``."""
    if _static(exponent):
        e = np.asarray(exponent, np.int64)
        half, signed = (np.int64(1) << e) >> 1, e > 0
        if not np.any(signed):
            return x
    else:
        e = exponent
        half, signed = (xp.ones_like(e) << e) >> 1, e > 0
    return (x + half - ((x < 0) & signed)) >> e


def xp_rescale(xp, x, multiplier, shift):
    """LiteRT's MultiplyByQuantizedMultiplier with two roundings (its reference CONV_2D,
    DEPTHWISE_CONV_2D, ADD, MUL, MEAN, QUANTIZE ...): saturating left shift, doubling high
    multiply, rounding right shift."""
    if _static(shift):
        shift = np.asarray(shift, np.int64)
        left, right = np.maximum(shift, 0), np.maximum(-shift, 0)
        scaled = x << left if np.any(left) else x
    else:
        left, right = xp.maximum(shift, 0), xp.maximum(-shift, 0)
        scaled = x << left
    return xp_divide_by_pot(xp, xp_high_mul(xp, xp_clamp(xp, scaled, INT32_MIN, INT32_MAX), multiplier), right)


def xp_rescale_once(xp, x, multiplier, shift):
    """``round(x · M · 2^(shift − 31))`` with one rounding (half up; LiteRT's reference
    FULLY_CONNECTED and XNNPACK), the result taken as int32 (wrapping, as the C cast)."""
    total = 31 - shift
    return _wrap32(xp, (x * multiplier + (1 << (total - 1))) >> total)


def xp_rescale_int64(xp, x, multiplier, shift):
    """The int64-accumulator variant (16x8 convolutions): the mantissa first reduced to 15
    bits so that ``x · M`` fits in 64 bits for |x| < 2^47; one rounding, taken as int32."""
    m = np.asarray(multiplier, np.int64)
    reduced = np.where(m < 0x7FFF0000, (m + (1 << 15)) >> 16, 0x7FFF)
    total = 15 - np.asarray(shift, np.int64)
    return _wrap32(xp, (x * reduced + (np.int64(1) << (total - 1))) >> total)


def _wrap32(xp, x):
    return x.astype(xp.int32).astype(xp.int64)


def xp_clamp(xp, x, lo, hi):
    return xp.minimum(xp.maximum(x, lo), hi)   # (np.clip's per-call dtype checks cost more)


#: The rescalings by name, as `Requantizer` and the kernels' measurements call them.
RESCALINGS = {"single": xp_rescale_once, "double": xp_rescale, "int64": xp_rescale_int64}


# -- the same on NumPy values, as the integer kernels and their tests call them ---------------------

def _i64(x) -> np.ndarray:
    return np.asarray(x, np.int64)


def multiply_by_quantized_multiplier(x, multiplier, shift) -> np.ndarray:
    """``round(x · M · 2^(shift − 31))`` with one rounding (half up), as int32 results.

    ``x`` is an int32 accumulator (any shape); ``multiplier``/``shift`` broadcast against it
    (per-channel along the last axis, or scalars)."""
    return xp_rescale_once(np, _i64(x), _i64(multiplier), _i64(shift)).astype(np.int32)


def multiply_by_quantized_multiplier_int64(x, multiplier, shift) -> np.ndarray:
    """`xp_rescale_int64` on NumPy (16x8 kernels), as int32 results."""
    return xp_rescale_int64(np, _i64(x), multiplier, shift).astype(np.int32)


def saturating_rounding_doubling_high_mul(a, b) -> np.ndarray:
    """gemmlowp's SaturatingRoundingDoublingHighMul on int32 values (`xp_high_mul`)."""
    return xp_high_mul(np, _i64(a), _i64(b))


def rounding_divide_by_pot(x, exponent) -> np.ndarray:
    """gemmlowp's RoundingDivideByPOT (`xp_divide_by_pot`)."""
    return xp_divide_by_pot(np, _i64(x), _i64(exponent))


def multiply_by_quantized_multiplier_double_rounding(x, multiplier, shift) -> np.ndarray:
    """LiteRT's two-rounding requantization (`xp_rescale`), as int32 results."""
    return xp_rescale(np, _i64(x), _i64(multiplier), _i64(shift)).astype(np.int32)


def requantize(acc, real_multiplier, zero_point: int, qmin: int, qmax: int) -> np.ndarray:
    """An integer kernel's output stage: rescale the accumulator, add the output zero
    point, clamp to the activation range."""
    m, s = quantize_multipliers(real_multiplier)
    if m.size == 1:
        m, s = m[0], s[0]
    out = multiply_by_quantized_multiplier(acc, m, s).astype(np.int64) + int(zero_point)
    return np.clip(out, qmin, qmax)


def _largest(bound: int, m: np.ndarray, total_shift: np.ndarray) -> int:
    """The largest |round(x · m / 2^total_shift)| for |x| <= bound, over the channels."""
    pairs = np.broadcast_arrays(m, total_shift)
    return max(((bound * int(mi)) >> int(ti)) + 1 for mi, ti in zip(pairs[0].ravel(), pairs[1].ravel()))


class Requantizer:
    """An integer kernel's output stage for one node: int64 accumulator -> output codes.

    ``kind`` is the kernel's rescaling (`RESCALINGS`): "single" (`xp_rescale_once`),
    "double" (`xp_rescale`) or "int64" (`xp_rescale_int64`, 16x8 convolutions); then the
    output zero point and the clamp to [lo, hi]. ``bound`` is the largest |accumulator| the
    node can produce: where the rescaled value cannot leave int32, the int32 steps the
    reference takes (saturation before, wrap-around after) are left out. `requantize` runs it
    over any array namespace; on NumPy it is the in-place form below.

    The double rounding in two shifts: gemmlowp's SaturatingRoundingDoublingHighMul of a
    non-negative multiplier is ``(x·m + 2^30) >> 31`` for either sign of ``x·m`` (its nudge
    ``1 − 2^30`` and truncating division of negatives come to the same floor), and
    RoundingDivideByPOT by ``e ≥ 1`` is ``(x + 2^(e−1) − [x < 0]) >> e``; the output zero point
    joins it as ``zp << e``, and where the bound keeps every value after the high multiply
    within int32 (``narrow``) that second stage runs in int32.
    """

    def __init__(self, kind: str, multiplier, shift, zero_point: int, lo: int, hi: int, dtype, bound: int):
        m = np.asarray(multiplier, np.int64)
        shift = np.asarray(shift, np.int64)
        if np.any(m < 0) or np.any(m > INT32_MAX):
            raise ValueError(f"multiplier {m} out of range")
        self.kind, self.zp, self.lo, self.hi, self.dtype = kind, int(zero_point), int(lo), int(hi), np.dtype(dtype)
        self.multiplier, self.shift = m, shift
        self.lo64, self.hi64 = np.int64(lo), np.int64(hi)
        bound = int(bound)
        if kind == "single":
            total = 31 - shift
            self.m, self.add, self.shr = m, np.left_shift(np.int64(1), total - 1), total
            self.wrap = _largest(bound, m, total) > INT32_MAX
        elif kind == "int64":
            reduced = np.where(m < 0x7FFF0000, (m + (1 << 15)) >> 16, 0x7FFF).astype(np.int64)
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
            self.neg_step = None if np.all(right > 0) else (right > 0).astype(np.int64)
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

    def requantize(self, xp, acc):
        """Output codes of an int64 accumulator over array namespace ``xp`` (NumPy: in place)."""
        if xp is np:
            return self(acc)
        out = RESCALINGS[self.kind](xp, acc, self.multiplier, self.shift) + self.zp
        return xp_clamp(xp, out, self.lo, self.hi).astype(self.dtype)

    def __call__(self, acc: np.ndarray) -> np.ndarray:
        """Output codes of an int64 accumulator (``acc`` is overwritten)."""
        p = acc
        if self.kind == "double":
            if self.left is not None:
                np.left_shift(p, self.left, out=p)
            if self.saturate:
                p.clip(np.int64(INT32_MIN), np.int64(INT32_MAX), out=p)
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
                p = p.astype(np.int32).astype(np.int64)
            if self.zp:
                np.add(p, self.zp, out=p)
        p.clip(self.lo64, self.hi64, out=p)     # NumPy scalar bounds, the method: np.clip's wrappers cost 1 us
        return p.astype(self.dtype)


# -- a weighted op's multipliers ----------------------------------------------------------------

def channel_multipliers(x_qp: QuantParams, w_qp: QuantParams, out_qp: QuantParams, channels: int):
    """PopulateConvolutionQuantizationParams: ``double(s_x) · double(s_w,c) / double(s_y)``
    per output channel (a per-tensor weight scale repeated). Measured against BUILTIN_REF on
    scales whose products round differently: the float32 product of the legacy uint8 path
    (`uint8_multiplier`) is off by one on 0.1 % of int8 and 16x8 outputs, this one on none."""
    return _multipliers_for(float(x_qp.scale[0]), np.asarray(w_qp.scale, np.float32).tobytes(),
                            float(out_qp.scale[0]), channels)


@lru_cache(maxsize=4096)
def _multipliers_for(x_scale: float, w_scales: bytes, out_scale: float, channels: int):
    """The multipliers of one node's scales, kept: a node's parameters never change."""
    w_scale = np.broadcast_to(np.frombuffer(w_scales, np.float32).astype(np.float64), (channels,))
    return quantize_multipliers(x_scale * w_scale / out_scale)


def uint8_multiplier(x_qp: QuantParams, w_qp: QuantParams, out_qp: QuantParams) -> tuple[int, int]:
    """The legacy uint8 kernels' GetQuantizedConvolutionMultipler: ``double(float32(s_x · s_w))
    / double(s_y)``, per-tensor weights only."""
    if np.asarray(w_qp.scale).size != 1:
        raise IntegerKernelError(f"uint8 kernels take per-tensor weights, got {np.asarray(w_qp.scale).size} scales")
    product = np.float32(np.float32(x_qp.scale[0]) * np.float32(w_qp.scale[0]))
    return quantize_multiplier(float(product) / float(np.float32(out_qp.scale[0])))


# -- exact integer products ---------------------------------------------------------------------

#: Integer sums below these bounds are exact in a float32 / float64 product (BLAS), whatever
#: order it sums in: every partial sum is an integer no larger than the sum of |terms|.
F32_EXACT, F64_EXACT = 1 << 24, 1 << 53
#: Bytes of weights a NumPy product keeps widened to its float type; above it the integer
#: weights stay as they are (memory-mapped from the model) and each product widens one block
#: of output columns at a time: a widened copy of a large model costs 4-8x its size.
WIDEN_BUDGET = 64 << 20
#: Bytes of one widened block of weight columns.
BLOCK_BYTES = 4 << 20


def centred_max(dtype, zero_point: int = 0) -> int:
    """The largest |x − zero_point| an integer of ``dtype`` can hold."""
    info = np.iinfo(dtype)
    return max(abs(int(info.min) - zero_point), abs(int(info.max) - zero_point))


def exact_type(xp, bound: int):
    """The type an exact integer product with partial sums up to ``bound`` runs in: float32
    below 2^24 (BLAS on NumPy; XLA's CPU dot is fastest there too), then on NumPy float64
    below 2^53 or int64, on a compiled namespace int32 below 2^31 or int64."""
    if bound < F32_EXACT:
        return np.dtype(np.float32)
    if xp is np:
        return np.dtype(np.float64 if bound < F64_EXACT else np.int64)
    return np.dtype(np.int32 if bound <= INT32_MAX else np.int64)


def centred(xp, x, zero_point: int, dtype):
    """``x − zero_point`` in ``dtype`` (an `exact_type`): exact, as integers below 2^24 are in float32."""
    if xp is np:
        return np.subtract(x, zero_point, dtype=dtype) if zero_point else x.astype(dtype)
    x = x.astype(dtype)
    return x - zero_point if zero_point else x


def exact_matmul(xp, a, b, dtype):
    """``a @ b`` of `centred` operands in their `exact_type` ``dtype``, as int64."""
    if xp is np:
        return np.matmul(a, b).astype(np.int64)
    if np.dtype(dtype).kind == "f":
        return xp.matmul(a, b, precision="highest").astype(xp.int64)
    return xp.matmul(a, b, preferred_element_type=dtype).astype(xp.int64)


def _largest_column(w: np.ndarray) -> int:
    """max_j Σ_k |w_kj| of integer weights: from max |w| when that bound already fits float32,
    else summed a block of rows at a time (a large model's weights are never widened whole)."""
    if not w.size:
        return 0
    largest = max(int(w.max()), -int(w.min()))
    if w.shape[0] * largest * 256 < F32_EXACT:
        return w.shape[0] * largest
    total = np.zeros(w.shape[1], np.int64)
    step = max(1, (1 << 20) // max(1, w.shape[1]))
    for start in range(0, w.shape[0], step):
        total += np.abs(w[start:start + step].astype(np.int64)).sum(axis=0)
    return int(total.max())


class ExactProduct:
    """``a @ w`` as exact integers (int64) for integer weights ``w`` [k, m] known when a kernel
    prepares and integer activations ``a`` [..., k] with |a| <= ``a_bound``.

    The bound on every partial sum, ``a_bound · max_j Σ_k |w_kj|``, picks the type (`exact_type`).
    On NumPy the weights are widened to it once when that fits `WIDEN_BUDGET`, else a block of
    output columns at a time."""

    def __init__(self, w, a_bound: int):
        w = np.asarray(w)
        self.w = w
        self.bound = int(a_bound) * _largest_column(w)
        self._np_type = exact_type(np, self.bound)
        self._wide = None

    def type(self, xp):
        return self._np_type if xp is np else exact_type(xp, self.bound)

    def __call__(self, xp, a, out=None):
        """The product of ``a`` (`centred` in ``self.type(xp)``, or any integers); NumPy writes it
        into the int64 buffer ``out`` when given."""
        if xp is not np:
            dtype = self.type(xp)
            return exact_matmul(xp, a.astype(dtype), self.w.astype(dtype), dtype)
        dtype = self._np_type
        if a.dtype != dtype:
            a = a.astype(dtype)
        if self._wide is None and self.w.size * dtype.itemsize <= WIDEN_BUDGET:
            self._wide = np.ascontiguousarray(self.w.astype(dtype))
        out = np.empty(a.shape[:-1] + (self.w.shape[1],), np.int64) if out is None else out
        if self._wide is not None:
            np.copyto(out, np.dot(a, self._wide), casting="unsafe")
            return out
        block = max(1, BLOCK_BYTES // (dtype.itemsize * self.w.shape[0]))
        for start in range(0, self.w.shape[1], block):
            out[..., start:start + block] = a @ self.w[:, start:start + block].astype(dtype)
        return out


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
