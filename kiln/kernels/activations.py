"""LiteRT's integer kernels of the unary ops — activations (LOGISTIC, TANH, RELU, PRELU,
ELU, ...; SOFTMAX has kiln.kernels.softmax), unary math (EXP, LOG, RSQRT, SQRT, ABS) and L2_NORMALIZATION — int8 and
16x8, as pure functions bit-exact with its reference kernels (``BUILTIN_REF``; ELU, which
BUILTIN_REF lacks, with the builtin one).

Measured on LiteRT 2.3: the requantizing ones (RELU family, LEAKY_RELU) rescale with two
roundings (`fixedpoint.multiply_by_quantized_multiplier_double_rounding`)."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from kiln.ir import QuantParams
from kiln.schema import Activation

from ..errors import OpError
from .family import INT8, INT16, UINT8, checked, int16_zero_points, out_params, params
from .fixedpoint import (
    INT32_MAX,
    INT32_MIN,
    IntegerKernelError,
    activation_range,
    dtype_range,
    quantize_multiplier,
    round_half_away,
    rounding_divide_by_pot,
    xp_clamp,
    xp_divide_by_pot,
    xp_high_mul,
    xp_rescale,
)
from .fixedpoint import multiply_by_quantized_multiplier_double_rounding as rescale
from .fixedpoint import saturating_rounding_doubling_high_mul as srdhm
from .float_math import expf

F32 = np.float32


def lookup_table(x_q, x_qp: QuantParams, out_qp: QuantParams, transform, out_dtype=np.int8) -> np.ndarray:
    """LiteRT's LUTPopulate: every input level dequantized in float32, transformed in
    float32, scaled by the float32 ``1 / s_y``, rounded half away, offset and clamped."""
    qmin, qmax = dtype_range(np.asarray(x_q).dtype)
    levels = np.arange(qmin, qmax + 1)
    real = (F32(x_qp.scale[0]) * (levels - int(x_qp.zero_point[0])).astype(F32)).astype(F32)
    scaled = (transform(real).astype(F32) * (F32(1) / F32(out_qp.scale[0]))).astype(F32)
    table = np.clip(round_half_away(scaled) + int(out_qp.zero_point[0]), *dtype_range(out_dtype))
    return table.astype(out_dtype)[np.asarray(x_q, np.int64) - qmin]


def logistic(x_q, x_qp: QuantParams, out_qp: QuantParams, *, out_dtype=np.int8) -> np.ndarray:
    """int8 LOGISTIC. Measured: LiteRT 2.3's BUILTIN_REF runs the float lookup table (not
    gemmlowp's fixed-point logistic) — 0 of 76 800 levels differ over 150 input params."""
    def sigmoid(v):
        with np.errstate(over="ignore"):
            return (F32(1) / (F32(1) + expf(-v))).astype(F32)
    return lookup_table(x_q, x_qp, out_qp, sigmoid, out_dtype)


def tanh(x_q, x_qp: QuantParams, out_qp: QuantParams, *, out_dtype=np.int8) -> np.ndarray:
    """int8 TANH: the float lookup table, as LOGISTIC (measured the same way)."""
    return lookup_table(x_q, x_qp, out_qp, np.tanh, out_dtype)


def _gelu_transform(approximate: bool):
    """LiteRT's GeluTransform in float32: ``0.5·x · erfc(−x/√2)`` (erfc, not 1 + erf) or the
    tanh form; erfc and tanh correctly rounded to float32 (as C's erfcf / tanhf)."""
    def exact(v):
        arg = (v * F32(-math.sqrt(0.5))).astype(F32)
        erfc = np.vectorize(math.erfc, otypes=[np.float64])(arg.astype(np.float64)).astype(F32)
        return ((F32(0.5) * v).astype(F32) * erfc).astype(F32)

    def tanh_form(v):
        inner = (F32(math.sqrt(2.0 / math.pi)) * (v + F32(0.044715) * v * v * v)).astype(F32)
        return (F32(0.5) * v * (F32(1) + np.tanh(inner.astype(np.float64)).astype(F32))).astype(F32)
    return tanh_form if approximate else exact


def gelu(x_q, x_qp: QuantParams, out_qp: QuantParams, *, approximate: bool = False, out_dtype=np.int8) -> np.ndarray:
    """int8 GELU: a float lookup table of `_gelu_transform` (measured: 0 of 20 480 levels differ)."""
    return lookup_table(x_q, x_qp, out_qp, _gelu_transform(approximate), out_dtype)


def relu(x_q, x_qp: QuantParams, out_qp: QuantParams, *, activation: Activation = Activation.RELU,
         out_dtype=np.int8) -> np.ndarray:
    """int8 RELU / RELU6 / RELU_N1_TO_1 (``activation``: the range it clamps to): rescaled by
    ``s_x / s_y``, then clamped to the activation's range in the output's integer domain."""
    if activation not in (Activation.RELU, Activation.RELU6, Activation.RELU_N1_TO_1):
        raise IntegerKernelError(f"relu: activation must be RELU, RELU6 or RELU_N1_TO_1, got {activation!r}")
    m, shift = quantize_multiplier(float(x_qp.scale[0]) / float(out_qp.scale[0]))
    out = rescale(np.asarray(x_q, np.int64) - int(x_qp.zero_point[0]), m, shift).astype(np.int64)
    lo, hi = activation_range(activation, out_qp, out_dtype)
    return np.clip(out + int(out_qp.zero_point[0]), lo, hi).astype(out_dtype)


def leaky_relu(x_q, x_qp: QuantParams, out_qp: QuantParams, *, alpha: float, out_dtype=np.int8) -> np.ndarray:
    """int8 LEAKY_RELU: non-negative inputs rescaled by ``s_x / s_y``, negative ones by
    ``s_x · alpha / s_y`` (formed in float32, as LiteRT's Prepare does)."""
    centered = np.asarray(x_q, np.int64) - int(x_qp.zero_point[0])
    m_id, s_id = quantize_multiplier(float(x_qp.scale[0]) / float(out_qp.scale[0]))
    real_alpha = np.float32(np.float32(x_qp.scale[0]) * np.float32(alpha)) / np.float32(out_qp.scale[0])
    m_a, s_a = quantize_multiplier(float(np.float32(real_alpha)))
    out = np.where(centered >= 0, rescale(centered, m_id, s_id), rescale(centered, m_a, s_a)).astype(np.int64)
    return np.clip(out + int(out_qp.zero_point[0]), *dtype_range(out_dtype)).astype(out_dtype)


def _inv_sqrt_multiplier(value: int) -> tuple[int, int]:
    """LiteRT's GetInvSqrtQuantizedMultiplierExp: ``1 / sqrt(value)`` as (Q0.31 multiplier,
    left shift), from five Newton-Raphson steps in gemmlowp's Q3.28 fixed point."""
    if value <= 1:
        return INT32_MAX, 0
    shift = 11
    while value >= 1 << 29:
        value //= 4
        shift += 1
    pairs = (32 - value.bit_length() - 1) // 2 - 1
    shift -= pairs
    value <<= 2 * pairs
    half_input = int(rounding_divide_by_pot(value >> 1, 1))
    x = 1 << 28                                                     # 1.0 in Q3.28
    for _ in range(5):   # Q9 products back to Q3: a saturating left shift (gemmlowp's Rescale)
        x3 = _saturating_left_shift32(srdhm(srdhm(x, x), x), 6)
        x = _saturating_left_shift32(_wrap32(srdhm((1 << 28) + (1 << 27), x) - srdhm(half_input, x3)), 3)
    x = int(srdhm(x, 1518500250))                                   # · sqrt(2)/2
    if shift < 0:
        x, shift = _wrap32(x << -shift), 0
    return int(x), -shift


def _saturating_left_shift32(x, exponent: int) -> int:
    threshold = (1 << (31 - exponent)) - 1
    x = int(x)
    return INT32_MAX if x > threshold else -INT32_MAX - 1 if x < -threshold else x << exponent


def _wrap32(x):
    return ((int(x) + (1 << 31)) % (1 << 32)) - (1 << 31)


@lru_cache(maxsize=256)
def _rsqrt_table(x_scale: float, zp: int, out_scale: float, out_zp: int, qmin: int, qmax: int) -> np.ndarray:
    """RSQRT's result for every input code (computed once per parameter set)."""
    real = 1.0 / float(F32(np.sqrt(F32(x_scale)) * F32(out_scale)))
    m, shift = quantize_multiplier(real)
    table = np.empty(qmax - qmin + 1, np.int64)
    for code in range(qmin, qmax + 1):
        value = code - zp
        if value <= 0:
            table[code - qmin] = qmin if value < 0 else qmax
            continue
        inv_m, inv_shift = _inv_sqrt_multiplier(value)
        data = rescale(1, inv_m, inv_shift + 20)
        table[code - qmin] = int(rescale(data, m, shift - 20)) + out_zp
    table.flags.writeable = False
    return table


def rsqrt(x_q, x_qp: QuantParams, out_qp: QuantParams, *, out_dtype=np.int8) -> np.ndarray:
    """int8 RSQRT (LiteRT's elementwise RsqrtEvalQuantizedInt8): ``1 / sqrt(x − zp_x)`` as a
    fixed-point multiplier (`_inv_sqrt_multiplier`) applied to 2^20, then rescaled by
    ``1 / (sqrt(s_x) · s_y)`` (float32 product); zero maps to the largest code, and LiteRT
    refuses a code below the zero point."""
    x = np.asarray(x_q, np.int64)
    zp = int(x_qp.zero_point[0])
    if x.size and int(x.min()) < zp:
        raise IntegerKernelError(f"RSQRT: input code {int(x.min())} is below the zero point {zp}: "
                                 "rsqrt is only defined for non-negative values")
    qmin, qmax = dtype_range(out_dtype)
    table = _rsqrt_table(float(x_qp.scale[0]), zp, float(out_qp.scale[0]), int(out_qp.zero_point[0]), qmin, qmax)
    return np.clip(table[x - qmin], qmin, qmax).astype(out_dtype)


def _srdhm16(a, b) -> np.ndarray:
    """gemmlowp's SaturatingRoundingDoublingHighMul on int16 values."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    product = a * b
    total = product + np.where(product >= 0, 1 << 14, 1 - (1 << 14))
    high = np.where(total >= 0, total >> 15, -((-total) >> 15))   # C division truncates
    return np.where((a == -32768) & (b == -32768), 32767, high)


def _sdhm16(a, b) -> np.ndarray:
    """LiteRT's SaturatingDoublingHighMul (int16): the doubled high half, truncated."""
    product = np.asarray(a, np.int64) * np.asarray(b, np.int64)
    high = np.where(product >= 0, product >> 15, -((-product) >> 15))
    return np.where(product == 1 << 30, 32767, high)


def _rounding_divide16(x, exponent: int) -> np.ndarray:
    mask = (1 << exponent) - 1
    x = np.asarray(x, np.int64)
    return (x >> exponent) + ((x & mask) > ((mask >> 1) + (x < 0)))


def _saturating_left_shift16(x, amount: int) -> np.ndarray:
    return np.clip(np.asarray(x, np.int64) << amount, -32768, 32767)


def _int16_multiplier(real: float) -> tuple[int, int]:
    """QuantizeMultiplier, then DownScaleInt32ToInt16Multiplier (round to the top 16 bits)."""
    m, exponent = quantize_multiplier(real)
    return (32767 if m >= (1 << 31) - 1 - (1 << 15) else (m + (1 << 15)) >> 16), exponent


def hard_swish(x_q, x_qp: QuantParams, out_qp: QuantParams, *, out_dtype=np.int8) -> np.ndarray:
    """int8 HARD_SWISH, LiteRT's fixed-point reference: ``x · relu6(x + 3) / 6`` with the
    input lifted by 2^7, a "reluish" factor in [0, 1] from a 16-bit multiplier of
    ``s_x / 128 / (3 / 32768)`` and the output rescaled by ``s_x / 128 / s_y`` (scales
    formed in float32, as its Prepare does)."""
    hires_scale = F32(F32(1.0 / 128.0) * F32(x_qp.scale[0]))
    out_m, out_exp = _int16_multiplier(float(F32(hires_scale / F32(out_qp.scale[0]))))
    relu_m, relu_exp = _int16_multiplier(float(F32(hires_scale / F32(3.0 / 32768.0))))
    if out_exp > 0:
        raise IntegerKernelError(f"HARD_SWISH: output scale {out_qp.scale[0]} is too small for the input scale "
                                 f"{x_qp.scale[0]} (LiteRT needs s_x / 128 <= s_y)")
    hires = (np.asarray(x_q, np.int64) - int(x_qp.zero_point[0])) * 128
    preshift = _srdhm16(hires, out_m)
    reluish = hires
    if relu_exp > 0:
        reluish = _saturating_left_shift16(reluish, relu_exp - 1)
    reluish = _srdhm16(reluish, relu_m)
    if relu_exp > 0:
        reluish = _saturating_left_shift16(reluish, 1)
    if relu_exp < 0:
        reluish = _rounding_divide16(reluish, -relu_exp)
    reluish = (reluish + (1 << 15)) >> 1
    out = _rounding_divide16(_sdhm16(reluish, preshift), -out_exp) + int(out_qp.zero_point[0])
    return np.clip(out, *dtype_range(out_dtype)).astype(out_dtype)


def exp(x_q, x_qp: QuantParams, out_qp: QuantParams, *, out_dtype=np.int8) -> np.ndarray:
    """int8 EXP: the float lookup table of ``exp`` (measured: 0 of 768 levels differ)."""
    return lookup_table(x_q, x_qp, out_qp, expf, out_dtype)


def log(x_q, x_qp: QuantParams, out_qp: QuantParams, *, out_dtype=np.int8) -> np.ndarray:
    """int8 LOG: the float lookup table of ``log``; zero and negative inputs give the
    smallest code, as LiteRT's table does (measured)."""
    def transform(v):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(v > 0, np.log(np.maximum(v, F32(1e-45))), -np.inf).astype(F32)
    return lookup_table(x_q, x_qp, out_qp, transform, out_dtype)


def abs_(x_q, x_qp: QuantParams, out_qp: QuantParams, *, out_dtype=np.int8) -> np.ndarray:
    """int8 ABS: ``|x − zp_x|`` rescaled by ``s_x / s_y`` with two roundings (measured: one
    rounding differs on up to a quarter of the levels)."""
    m, shift = quantize_multiplier(float(x_qp.scale[0]) / float(out_qp.scale[0]))
    out = rescale(np.abs(np.asarray(x_q, np.int64) - int(x_qp.zero_point[0])), m, shift).astype(np.int64)
    return np.clip(out + int(out_qp.zero_point[0]), *dtype_range(out_dtype)).astype(out_dtype)


def lut16(transform, input_scale: float, input_zero_point: int, output_scale: float,
          output_zero_point: int) -> np.ndarray:
    """LiteRT's 513-entry int16 lookup table (LUTPopulateInt16, double precision): 512
    samples of ``transform`` over the input range, each biased by half the error of linear
    interpolation at its midpoint, and the end point."""
    input_min = input_scale * (-32768 - input_zero_point)
    input_max = input_scale * (32767 - input_zero_point)
    output_min = output_scale * (-32768 - output_zero_point)
    output_max = output_scale * (32767 - output_zero_point)
    step = (input_max - input_min) / 512
    scaling = 65536.0 / (output_max - output_min)
    starts = input_min + np.arange(512) * step
    value, midpoint, following = transform(starts), transform(starts + step / 2), transform(input_min + np.arange(1, 513) * step)
    sample = round_half_away(value * scaling)
    interpolated = round_half_away((following * scaling + sample) / 2)
    bias = round_half_away((interpolated - round_half_away(midpoint * scaling)) / 2)
    table = np.clip(np.append(sample - bias, round_half_away(transform(np.float64(input_max)) * scaling)),
                    -32768, 32767)
    return table.astype(np.int64)


def lut16_lookup(values, table: np.ndarray) -> np.ndarray:
    """LUTLookup for int16: the high 9 bits index, the low 7 interpolate (int16 result)."""
    values = np.asarray(values, np.int64)
    index = 256 + (values >> 7)
    base = table[index]
    delta = ((table[index + 1] - base) * (values & 0x7F) + 64) >> 7
    return ((base + delta + 32768) % 65536) - 32768


# -- 16x8 LOGISTIC / TANH --------------------------------------------------------------------

#: LiteRT's fixed ``sigmoid_table_uint16``: sigmoid(i / 24) for i in 0..255 in unsigned 0.16,
#: shared by its int16 LOGISTIC and TANH (tanh(x) = 2·sigmoid(2x) − 1). The entries are tuned
#: values, not a rounding of the formula (44 of 256 differ by one from round(65536·sigmoid(i/24))),
#: so the table is data; tests/quant/test_16x8_kernels.py checks every entry through LiteRT.
SIGMOID_TABLE_U16 = np.array([
    32768, 33451, 34133, 34813, 35493, 36169, 36843, 37513, 38180, 38841, 39498, 40149, 40794, 41432, 42064, 42688,
    43304, 43912, 44511, 45102, 45683, 46255, 46817, 47369, 47911, 48443, 48964, 49475, 49975, 50464, 50942, 51409,
    51865, 52311, 52745, 53169, 53581, 53983, 54374, 54755, 55125, 55485, 55834, 56174, 56503, 56823, 57133, 57433,
    57724, 58007, 58280, 58544, 58800, 59048, 59288, 59519, 59743, 59959, 60168, 60370, 60565, 60753, 60935, 61110,
    61279, 61441, 61599, 61750, 61896, 62036, 62172, 62302, 62428, 62549, 62666, 62778, 62886, 62990, 63090, 63186,
    63279, 63368, 63454, 63536, 63615, 63691, 63765, 63835, 63903, 63968, 64030, 64090, 64148, 64204, 64257, 64308,
    64357, 64405, 64450, 64494, 64536, 64576, 64614, 64652, 64687, 64721, 64754, 64786, 64816, 64845, 64873, 64900,
    64926, 64950, 64974, 64997, 65019, 65039, 65060, 65079, 65097, 65115, 65132, 65149, 65164, 65179, 65194, 65208,
    65221, 65234, 65246, 65258, 65269, 65280, 65291, 65301, 65310, 65319, 65328, 65337, 65345, 65352, 65360, 65367,
    65374, 65381, 65387, 65393, 65399, 65404, 65410, 65415, 65420, 65425, 65429, 65433, 65438, 65442, 65445, 65449,
    65453, 65456, 65459, 65462, 65465, 65468, 65471, 65474, 65476, 65479, 65481, 65483, 65485, 65488, 65489, 65491,
    65493, 65495, 65497, 65498, 65500, 65501, 65503, 65504, 65505, 65507, 65508, 65509, 65510, 65511, 65512, 65513,
    65514, 65515, 65516, 65517, 65517, 65518, 65519, 65520, 65520, 65521, 65522, 65522, 65523, 65523, 65524, 65524,
    65525, 65525, 65526, 65526, 65526, 65527, 65527, 65528, 65528, 65528, 65529, 65529, 65529, 65529, 65530, 65530,
    65530, 65530, 65531, 65531, 65531, 65531, 65531, 65532, 65532, 65532, 65532, 65532, 65532, 65533, 65533, 65533,
    65533, 65533, 65533, 65533, 65533, 65534, 65534, 65534, 65534, 65534, 65534, 65534, 65534, 65534, 65534, 65535,
], np.int64)
SIGMOID_TABLE_U16.flags.writeable = False


def _checked_log2(scale: float) -> tuple[int, bool]:
    """LiteRT's CheckedLog2 in float32: (rounded log2, whether it is within 1e-3 of it)."""
    log2 = F32(np.log(F32(scale))) * (F32(1) / F32(np.log(F32(2))))
    rounded = F32(round_half_away(log2))
    return int(rounded), bool(abs(F32(log2 - rounded)) < F32(1e-3))


def _int16_lut_params(x_qp: QuantParams, out_qp: QuantParams, op: str, pot_shifts: tuple[int, ...],
                      exact_output: bool) -> tuple[int, int]:
    """(input multiplier, right shift) taking int16 input codes onto the table's Q3.12 × 3/4
    scale (LiteRT's Sigmoid/TanhPrepare). A power-of-two input scale whose shift
    ``12 + log2(s_x)`` is in ``pot_shifts`` multiplies by ``3 << shift``; any other scale by
    ``s_x · 4096 · 3`` doubled until above 16383.5 (at most 31 times) and truncated. The
    output must be Q0.15: exactly 1/32768 for LOGISTIC, log2 within 1e-3 of −15 for TANH."""
    if int(x_qp.zero_point[0]) != 0 or int(out_qp.zero_point[0]) != 0:
        raise IntegerKernelError(f"{op}: int16 input and output zero points must be 0, got "
                                 f"{int(x_qp.zero_point[0])} and {int(out_qp.zero_point[0])}")
    out_log2, out_pot = _checked_log2(float(out_qp.scale[0]))
    if not out_pot or out_log2 != -15 or (exact_output and F32(out_qp.scale[0]) != F32(1 / 32768)):
        raise IntegerKernelError(f"{op}: int16 output scale must be 1/32768, got {float(out_qp.scale[0])}")
    log2, pot = _checked_log2(float(x_qp.scale[0]))
    shift = 12 + log2
    if pot and shift in pot_shifts:
        return 3 << shift, 0
    multiplier, shift = float(F32(x_qp.scale[0])) * 4096.0 * 3.0, 0
    while multiplier <= 32767.0 / 2.0 and shift <= 30:
        shift += 1
        multiplier *= 2.0
    return int(multiplier), shift


def _wrap32_array(x: np.ndarray) -> np.ndarray:
    return ((x + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)


def _int16_table_input(x_q, multiplier: int, shift: int) -> np.ndarray:
    """The input on the table's scale, in LiteRT's int32 arithmetic (wrapping as its int32 does)."""
    x = np.asarray(x_q, np.int64)
    rounding = (1 << (shift - 1)) if shift > 0 else 0
    return _wrap32_array(_wrap32_array(x * multiplier) + rounding) >> shift


def _sigmoid_table_at(magnitude: np.ndarray, frac_bits: int, saturated: int) -> np.ndarray:
    """The 256-entry sigmoid table read at ``magnitude`` as the 16x8 LOGISTIC and TANH read it:
    the high bits index it, the low ``frac_bits`` interpolate to the next entry (kept scaled by
    ``2^frac_bits``); from entry 255 on, ``saturated``."""
    high = magnitude >> frac_bits
    index = np.minimum(high, 254)
    lo, hi = SIGMOID_TABLE_U16[index], SIGMOID_TABLE_U16[index + 1]
    frac = magnitude & ((1 << frac_bits) - 1)
    return np.where(high >= 255, saturated, (lo << frac_bits) + frac * (hi - lo))


def logistic_int16(x_q, x_qp: QuantParams, out_qp: QuantParams) -> np.ndarray:
    """16x8 LOGISTIC (reference_integer_ops::Logistic for int16): |x| on the table's scale
    indexes the 256-entry sigmoid table with its high bits and interpolates with its low 9,
    mirrored for negative inputs, output Q0.15. LiteRT's reference path is this table
    whatever the input scale (not the float LUTPopulate its int8 kernel uses)."""
    multiplier, shift = _int16_lut_params(x_qp, out_qp, "LOGISTIC", (0,), True)
    data = _int16_table_input(x_q, multiplier, shift)
    result = _sigmoid_table_at(np.abs(data), 9, 0x7FFF << 10)
    result = np.where(data >= 0, result + (1 << 9), (1 << 25) - result + (1 << 9) - 1)
    return (result >> 10).astype(np.int16)


def tanh_int16(x_q, x_qp: QuantParams, out_qp: QuantParams) -> np.ndarray:
    """16x8 TANH (reference_integer_ops::Tanh for int16): the sigmoid table read at twice the
    input (8 low bits interpolate), ``2·sigmoid − 1``, output Q0.15; input scales 2^-12 and
    2^-11 take the power-of-two path."""
    multiplier, shift = _int16_lut_params(x_qp, out_qp, "TANH", (0, 1), False)
    data = _int16_table_input(x_q, multiplier, shift)
    result = _sigmoid_table_at(np.abs(data), 8, 0xFFFF << 8)
    result = np.where(data >= 0, result - (1 << 23) + (1 << 7), -result + (1 << 23) + (1 << 7) - 1)
    return (result >> 8).astype(np.int16)


# -- 16x8 lookup-table kernels (EXP, LOG, RSQRT, GELU) --------------------------------------------

def lut16_float(transform, x_qp: QuantParams, out_qp: QuantParams) -> np.ndarray:
    """LiteRT's LUTPopulate<int16_t> for a float function: LUTPopulateInt16 in float32
    (`lut16` is its double-precision form), 513 entries."""
    in_scale, out_scale = F32(x_qp.scale[0]), F32(out_qp.scale[0])
    in_zp, out_zp = int(x_qp.zero_point[0]), int(out_qp.zero_point[0])
    input_min, input_max = F32(in_scale * F32(-32768 - in_zp)), F32(in_scale * F32(32767 - in_zp))
    output_min, output_max = F32(out_scale * F32(-32768 - out_zp)), F32(out_scale * F32(32767 - out_zp))
    step = F32(F32(input_max - input_min) / F32(512))
    half_step = F32(step / F32(2))
    scaling = F32(F32(65536) / F32(output_max - output_min))
    steps = np.arange(512, dtype=F32)
    starts = (input_min + (steps * step).astype(F32)).astype(F32)
    value = transform(starts).astype(F32)
    midpoint = transform((starts + half_step).astype(F32)).astype(F32)
    following = transform((input_min + ((steps + F32(1)) * step).astype(F32)).astype(F32)).astype(F32)

    def round32(v):
        return round_half_away(np.asarray(v, F32)).astype(F32)
    with np.errstate(over="ignore", invalid="ignore"):
        sample = round32(value * scaling)
        interpolated = round32(((following * scaling).astype(F32) + sample) / F32(2))
        bias = round32((interpolated - round32(midpoint * scaling)).astype(F32) / F32(2))
        last = round32(transform(np.asarray([input_max], F32)).astype(F32) * scaling)
    table = np.clip(np.append(sample - bias, last), -32768, 32767)
    return table.astype(np.int64)


def lut16_lookup_int16(values, table: np.ndarray) -> np.ndarray:
    """`lut16_lookup` with LiteRT's int16 slope (``lut[i + 1] − lut[i]`` wraps in int16)."""
    values = np.asarray(values, np.int64)
    index = 256 + (values >> 7)
    base = table[index]
    slope = ((table[index + 1] - base + 32768) % 65536) - 32768
    delta = (slope * (values & 0x7F) + 64) >> 7
    return (((base + delta + 32768) % 65536) - 32768).astype(np.int16)


def _lut16_unary(op: str, x_q, x_qp: QuantParams, out_qp: QuantParams, transform) -> np.ndarray:
    if int(x_qp.zero_point[0]) != 0 or int(out_qp.zero_point[0]) != 0:
        raise IntegerKernelError(f"{op}: int16 input and output zero points must be 0, got "
                                 f"{int(x_qp.zero_point[0])} and {int(out_qp.zero_point[0])}")
    return lut16_lookup_int16(x_q, lut16_float(transform, x_qp, out_qp))


def exp_int16(x_q, x_qp: QuantParams, out_qp: QuantParams) -> np.ndarray:
    """16x8 EXP: LiteRT's float32 int16 lookup table of ``exp``, interpolated; exp correctly
    rounded to float32 as C's expf (NumPy's float32 exp misses by an ulp: measured, one
    table entry off)."""
    return _lut16_unary("EXP", x_q, x_qp, out_qp, expf)


def log_int16(x_q, x_qp: QuantParams, out_qp: QuantParams) -> np.ndarray:
    """16x8 LOG: the float32 int16 table of ``log``; inputs ≤ 0 sample the output range's
    minimum, as LiteRT's table function does."""
    output_min = F32(F32(-32768 - int(out_qp.zero_point[0])) * F32(out_qp.scale[0]))

    def transform(v):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(v > 0, np.log(np.maximum(v, F32(1e-45)).astype(np.float64)), output_min).astype(F32)
    return _lut16_unary("LOG", x_q, x_qp, out_qp, transform)


def rsqrt_int16(x_q, x_qp: QuantParams, out_qp: QuantParams) -> np.ndarray:
    """16x8 RSQRT: the float32 int16 table of ``1 / sqrt``; inputs ≤ 0 sample the largest
    output; a negative input code is refused, as LiteRT refuses it."""
    if np.any(np.asarray(x_q) < int(x_qp.zero_point[0])):
        raise IntegerKernelError("RSQRT: Rsqrt is only defined for positive values (an int16 input code is "
                                 "below the zero point)")
    top = F32(F32(32767) * F32(out_qp.scale[0]))

    def transform(v):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(v > 0, F32(1) / np.sqrt(np.maximum(v, F32(1e-45))), top).astype(F32)
    return _lut16_unary("RSQRT", x_q, x_qp, out_qp, transform)


def gelu_int16(x_q, x_qp: QuantParams, out_qp: QuantParams, *, approximate: bool = False) -> np.ndarray:
    """16x8 GELU: the int8 kernel's GELU transforms through the float32 int16 table."""
    return lut16_lookup_int16(x_q, lut16_float(_gelu_transform(approximate), x_qp, out_qp))


def _zp(qp: QuantParams) -> int:
    return int(qp.zero_point[0])


# -- PRELU -------------------------------------------------------------------------------------

def prelu(x_q, x_qp: QuantParams, alpha_q, alpha_qp: QuantParams, out_qp: QuantParams, *,
          out_dtype=np.int8) -> np.ndarray:
    """PRELU (reference Prelu / BroadcastPrelu4DSlow): `xp_prelu` on NumPy."""
    x, alpha = np.asarray(x_q, np.int64), np.asarray(alpha_q, np.int64)
    return xp_prelu(np, x, x_qp, alpha, alpha_qp, out_qp, out_dtype).astype(out_dtype)


def xp_prelu(xp, x_q, x_qp: QuantParams, alpha_q, alpha_qp: QuantParams, out_qp: QuantParams, out_dtype):
    """PRELU over array namespace ``xp`` (NumPy, or jax.numpy in kiln.xla) on int64 codes: two
    multipliers, ``s_x / s_y`` where ``x − zp_x ≥ 0`` and ``s_x · s_α / s_y`` applied to
    ``(x − zp_x)(α − zp_α)`` elsewhere, both formed in float32; alpha broadcasts into the
    input's shape. 16x8 PRELU is the same with int16 input and output and an int8 alpha."""
    x = x_q - _zp(x_qp)
    alpha = xp.broadcast_to(alpha_q - _zp(alpha_qp), x.shape)
    s_x, s_a, s_y = F32(x_qp.scale[0]), F32(alpha_qp.scale[0]), F32(out_qp.scale[0])
    m1, e1 = quantize_multiplier(float(F32(s_x / s_y)))          # float32 arithmetic, as Prepare
    m2, e2 = quantize_multiplier(float(F32(F32(s_x * s_a) / s_y)))
    out = xp.where(x >= 0, xp_rescale(xp, x, m1, e1), xp_rescale(xp, x * alpha, m2, e2)) + _zp(out_qp)
    return xp_clamp(xp, out, *dtype_range(out_dtype))


# -- L2_NORMALIZATION --------------------------------------------------------------------------
# Written once over an array namespace ``xp`` (NumPy here, jax.numpy in kiln.xla's lowering),
# as kiln.kernels.lstm's step: the Newton–Raphson steps are the kernel's arithmetic.

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
    half_in = xp_divide_by_pot(xp, x_in, 1)
    half_three = (1 << 28) + (1 << 27)
    x = xp.full(acc.shape, 1 << 28, xp.int64)        # F3 one
    for _ in range(5):
        x3 = _saturating_shift_left(xp, xp_high_mul(xp, xp_high_mul(xp, x, x), x), 6)
        diff = xp_high_mul(xp, half_three, x) - xp_high_mul(xp, half_in, x3)
        diff = ((diff + (1 << 31)) % (1 << 32)) - (1 << 31)   # int32 wrap-around, as gemmlowp
        x = _saturating_shift_left(xp, diff, 3)
    x = xp_high_mul(xp, x, 1518500250)
    negative = shift < 0
    x = xp.where(negative, x << xp.where(negative, -shift, 0), x)
    shift = xp.where(negative, 0, shift)
    return xp.where(small, INT32_MAX, x), xp.where(small, 0, -shift)


def l2_normalize_centered(xp, x):
    """The kernel on int64 ``x − zp`` (last axis): each value rescaled by the row's
    inverse-square-root multiplier with an extra ``2^7``, before the clamp."""
    m, shift = inv_sqrt_multiplier((x * x).sum(axis=-1, keepdims=True), xp)
    return xp_rescale(xp, x, m, shift + 7)


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


# -- the records' ``quantized`` kernels: a node's operands and options to the arithmetic above -----

def _int16_table(fn):
    """A 16x8 table kernel: int16 in and out (zero points 0, checked by ``fn``)."""
    def kernel(call, x):
        if call.out_dtypes[0] != np.int16:
            raise OpError(f"{call.op.name}: int16 input needs an int16 output, got {np.dtype(call.out_dtypes[0])}")
        return fn(x, params(call, 0, "input"), out_params(call))
    return kernel


def _abs(call, x):
    if x.dtype == np.int16:
        int16_zero_points(call, 0, -1)
    return abs_(x, params(call, 0, "input"), out_params(call), out_dtype=call.out_dtypes[0])


def _unary(fn, **fixed):
    def kernel(call, x):
        return fn(x, params(call, 0, "input"), out_params(call), out_dtype=call.out_dtypes[0], **fixed)
    return kernel


def _int16_unary(fn):
    """A 16x8 activation with Q0.15 output (LOGISTIC, TANH): int16 in, int16 out, zero points 0."""
    def kernel(call, x):
        if call.out_dtypes[0] != np.int16:
            raise OpError(f"{call.op.name}: int16 input needs an int16 output, got {np.dtype(call.out_dtypes[0])}")
        int16_zero_points(call, 0, -1)
        return fn(x, params(call, 0, "input"), out_params(call))
    return kernel


def _leaky_relu(call, x):
    if x.dtype == np.int16:
        int16_zero_points(call, 0, -1)
    return leaky_relu(x, params(call, 0, "input"), out_params(call), alpha=float(call.opts.alpha),
                          out_dtype=call.out_dtypes[0])


def _gelu(call, x):
    if x.dtype == np.int16:
        int16_zero_points(call, 0, -1)
        return gelu_int16(x, params(call, 0, "input"), out_params(call), approximate=bool(call.opts.approximate))
    return gelu(x, params(call, 0, "input"), out_params(call), approximate=bool(call.opts.approximate),
                    out_dtype=call.out_dtypes[0])


def _hard_swish(call, x):
    return hard_swish(x, params(call, 0, "input"), out_params(call), out_dtype=call.out_dtypes[0])


def _relu(activation: Activation):
    unary = _unary(relu, activation=activation)

    def kernel(call, x):
        if x.dtype == np.int16:   # the same rescale and clamp, LiteRT checks zero points 0
            int16_zero_points(call, 0, -1)
        return unary(call, x)
    return kernel


def _prelu(call, x, alpha):
    try:
        np.broadcast_to(alpha, x.shape)
    except ValueError as exc:
        raise OpError(f"{call.op.name}: alpha shape {list(alpha.shape)} does not broadcast into the input shape "
                      f"{list(x.shape)}") from exc
    return prelu(x, params(call, 0, "input"), alpha, params(call, 1, "alpha"), out_params(call),
                      out_dtype=call.out_dtypes[0])


def _l2_normalization(call, x):
    if Activation(call.opts.fused_activation_function) != Activation.NONE:
        raise OpError(f"{call.op.name}: fused activation {Activation(call.opts.fused_activation_function).name} is "
                      "not supported (LiteRT's L2_NORMALIZATION takes NONE only)")
    out_q = out_params(call)
    if np.float32(out_q.scale[0]) != np.float32(1 / 128) or int(out_q.zero_point[0]) != 0:
        raise OpError(f"{call.op.name}: int8 output must have scale 1/128 and zero point 0 (LiteRT's Prepare), got "
                      f"{out_q.scale[0]} / {out_q.zero_point[0]}")
    return checked(call, l2_normalization, x, params(call, 0, "input"), out_dtype=call.out_dtypes[0])


def _sqrt(call, x):
    if x.dtype == np.int16:   # 16x8: LiteRT's elementwise Prepare checks zero points 0
        int16_zero_points(call, 0, -1)
    return checked(call, sqrt, x, params(call, 0, "input"), out_params(call), out_dtype=call.out_dtypes[0])


def _elu(call, x):
    return elu(x, params(call, 0, "input"), out_params(call), out_dtype=call.out_dtypes[0])


LOGISTIC = {INT8: _unary(logistic), INT16: _int16_unary(logistic_int16)}
TANH = {INT8: _unary(tanh), INT16: _int16_unary(tanh_int16)}
RELU = dict.fromkeys((INT8, UINT8, INT16), _relu(Activation.RELU))
RELU6 = dict.fromkeys((INT8, UINT8, INT16), _relu(Activation.RELU6))
RELU_N1_TO_1 = {INT8: _relu(Activation.RELU_N1_TO_1), UINT8: _relu(Activation.RELU_N1_TO_1)}
LEAKY_RELU = {INT8: _leaky_relu, INT16: _leaky_relu}
GELU = {INT8: _gelu, INT16: _gelu}
HARD_SWISH = {INT8: _hard_swish}
RSQRT = {INT8: _unary(rsqrt), INT16: _int16_table(rsqrt_int16)}
EXP = {INT8: _unary(exp), INT16: _int16_table(exp_int16)}
LOG = {INT8: _unary(log), INT16: _int16_table(log_int16)}
ABS = {INT8: _abs, INT16: _abs}
PRELU = {INT8: _prelu, UINT8: _prelu, INT16: _prelu}   # 16x8: int16 input and output, int8 alpha
L2_NORMALIZATION = {INT8: _l2_normalization}
SQRT = {INT8: _sqrt, INT16: _sqrt}
ELU = {INT8: _elu}
