"""SOFTMAX's integer kernels, as LiteRT's reference kernels compute them (BUILTIN_REF).

int8 / uint8 (reference_ops::Softmax) works in gemmlowp's 32-bit fixed point; 16x8
(SoftmaxInt16) looks exps and a reciprocal up in interpolated int16 tables. Each arithmetic is
written once over an array namespace (`softmax_fixed_point`, `softmax_int16_fixed_point`):
the reference kernels run it on NumPy, the NumPy delegate on per-node prepared tables, and
kiln.xla on jax.numpy — one function, so the three cannot drift apart. LiteRT's optimized
int8 kernel (a float table, its default resolver) is `softmax_float_table`, kept to measure
the two apart and for the rows on which the reference kernel aborts.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from kiln.ir import QuantParams

from ..errors import OpError
from . import gemmlowp
from .activations import lut16, lut16_lookup
from .family import INT8, INT16, int16_zero_points, out_params, params
from .fixedpoint import (
    IntegerKernelError,
    dtype_range,
    quantize_multiplier,
    round_half_away,
    xp_clamp,
    xp_divide_by_pot,
    xp_high_mul,
)
from .fixedpoint import multiply_by_quantized_multiplier_double_rounding as rescale
from .fixedpoint import saturating_rounding_doubling_high_mul as srdhm
from . import float_math
from .float_math import expf
from .gemmlowp import xp_wrap32

F32 = np.float32


# -- int8 / uint8 -------------------------------------------------------------------------------

def softmax_exp_table(x_qp: QuantParams, beta: float) -> np.ndarray:
    """int8 SOFTMAX's float32 ``expf(−β·s_x·d)`` for the 256 distances ``d`` to the row maximum
    (PopulateSoftmaxLookupTable). glibc's expf, not NumPy's float32 exp: an ulp in one entry
    turns a near tie (178.49995 · …) the other way (issue #22)."""
    distances = np.arange(256).astype(F32)
    return expf((F32(-F32(x_qp.scale[0]) * F32(beta)) * distances).astype(F32))


def softmax(x_q, x_qp: QuantParams, out_qp: QuantParams, *, beta: float = 1.0, out_dtype=np.int8) -> np.ndarray:
    """int8 / uint8 SOFTMAX over the last axis, as LiteRT's reference kernel (BUILTIN_REF:
    reference_ops::Softmax, gemmlowp fixed point).

    The distance to the row maximum, times ``β·s_x`` as a Q5.26 multiplier, goes through
    gemmlowp's exp into Q0.31; the exps (of distances within the multiplier's input radius)
    sum in Q12.19; the sum's reciprocal comes from Newton-Raphson after normalising by its
    leading zeros, and each output is ``exp · reciprocal`` shifted down to the output's 8
    bits plus the type's minimum (the output is fixed at scale 1/256). Measured: 0 of 33 120
    outputs differ from BUILTIN_REF; LiteRT's optimized (default) kernel computes the float
    table `softmax_float_table` instead, which differs from it on near ties (1 output in
    30 000: a sum 2^-19 coarser in fixed point turns 27.49997 into 28). A row whose exps sum
    to 256 or more (1000 near-equal classes) leaves the reference kernel no output shift and
    BUILTIN_REF aborts the process; such rows get the optimized kernel's values."""
    return softmax_codes(np.int8, x_qp, out_qp, beta, out_dtype)(np, np.asarray(x_q))


def softmax_codes(x_dtype, x_qp: QuantParams, out_qp: QuantParams, beta: float, out_dtype):
    """SOFTMAX of 8-bit codes (`softmax`) or 16x8 (`softmax_int16`, ``x_dtype`` int16) with its
    tables made once: ``run(xp, x)`` over array namespace ``xp`` (the reference kernels and the
    NumPy delegate on NumPy, kiln.xla on jax.numpy) gives the output codes in ``out_dtype``."""
    scale = float(F32(x_qp.scale[0]))
    if np.dtype(x_dtype) == np.int16:
        exps16, reciprocals = softmax_int16_tables(scale, float(beta))

        def run16(xp, x):
            return softmax_int16_fixed_point(xp, x.astype(xp.int64), xp.asarray(exps16),
                                             xp.asarray(reciprocals)).astype(xp.int16)

        return run16
    multiplier, left_shift, diff_min = softmax_input_scaling(scale, float(beta))
    exps = softmax_fixed_exps(multiplier, left_shift)

    def run(xp, x):
        out, aborts = softmax_fixed_point(xp, x.astype(xp.int64), xp.asarray(exps), diff_min, out_dtype)
        # NumPy looks at the rows; a traced backend, which cannot, at whether a row can abort
        if aborts.any() if xp is np else softmax_may_abort(x.shape[-1], out_dtype):
            out = xp.where(aborts, softmax_float_table(x, x_qp, out_qp, beta=beta, out_dtype=out_dtype, xp=xp), out)
        return out.astype(out_dtype)

    return run


def softmax_fixed_point(xp, x, exps_of_distance, diff_min: int, out_dtype):
    """`softmax`'s arithmetic, written once over array namespace ``xp`` (NumPy here,
    jax.numpy in kiln.xla): 8-bit codes ``x`` (int64) and the node's `softmax_fixed_exps`
    table give the output codes (int64) and the rows on which BUILTIN_REF aborts (whose
    values here are meaningless). A distance beyond the input radius counts as exp 0, which
    adds nothing to the sum and gives the type's minimum, as the reference skips it."""
    lo, hi = dtype_range(out_dtype)
    distance = x.max(axis=-1, keepdims=True) - x
    exps = xp.where(-distance >= diff_min, xp.take(exps_of_distance, xp.minimum(distance, 255)), 0)
    total = xp_wrap32(xp, xp_divide_by_pot(xp, exps, 12).sum(axis=-1, keepdims=True))   # Q12.19, int32
    # CountLeadingZeros via the float64 exponent: exact for every uint32
    headroom_plus_one = 32 - xp.frexp((total & 0xFFFFFFFF).astype(xp.float64))[1].astype(xp.int64)
    shifted_minus_one = ((total << headroom_plus_one) & 0xFFFFFFFF) - (1 << 31)
    reciprocal = gemmlowp.xp_one_over_one_plus_x32(xp, xp_wrap32(xp, shifted_minus_one))
    exponent = (12 - headroom_plus_one) + 31 - 8 * np.dtype(out_dtype).itemsize
    aborts = (exponent < 0) | (exponent > 31)    # LiteRT's TFLITE_CHECK: BUILTIN_REF aborts the process
    out = xp_divide_by_pot(xp, xp_high_mul(xp, reciprocal, exps), xp_clamp(xp, exponent, 0, 31)) + lo
    return xp_clamp(xp, out, lo, hi), aborts


def softmax_may_abort(row_length: int, out_dtype) -> bool:
    """Whether some row of ``row_length`` 8-bit codes can make `softmax_fixed_point` report
    an abort (a lowering that cannot branch on values then adds the optimized kernel's path)."""
    smallest, largest = 1 << 19, row_length << 19      # the row maximum's exp alone; every exp at its most
    if largest >= 1 << 31:
        return True                                     # the int32 sum may wrap

    def exponent(total: int) -> int:
        return (12 - (32 - total.bit_length())) + 31 - 8 * np.dtype(out_dtype).itemsize

    return exponent(largest) > 31 or exponent(smallest) < 0


def softmax_input_scaling(input_scale: float, beta: float) -> tuple[int, int, int]:
    """LiteRT's PreprocessSoftmaxScaling (Q5.26) and CalculateInputRadius: the distance's
    multiplier and left shift, and the smallest distance (negated) that still counts."""
    real = min(float(beta) * input_scale * (1 << 26), float((1 << 31) - 1))
    fraction, shift = math.frexp(real)          # QuantizeMultiplierGreaterThanOne: no cap at 30
    multiplier = int(round_half_away(fraction * (1 << 31)))
    if multiplier == 1 << 31:
        multiplier, shift = multiplier // 2, shift + 1
    radius = math.floor(31.0 * (1 << 26) / (1 << shift))
    return multiplier, shift, -radius


@lru_cache(maxsize=256)
def softmax_fixed_exps(multiplier: int, left_shift: int) -> np.ndarray:
    """gemmlowp's Q0.31 exp of the 256 int8 distances to the row maximum (one table per node)."""
    distance = -np.arange(256, dtype=np.int64)
    rescaled = srdhm(np.clip(distance << left_shift, -(1 << 31), (1 << 31) - 1), multiplier)
    table = gemmlowp.exp_on_negative_values32(rescaled, 5)
    table.setflags(write=False)
    return table


def softmax_float_table(x_q, x_qp: QuantParams, out_qp: QuantParams, *, beta: float = 1.0,
                        out_dtype=np.int8, xp=np) -> np.ndarray:
    """int8 SOFTMAX as LiteRT's optimized kernel computes it (its default resolver): each
    distance's ``expf(−β·s_x·d)`` from a float32 table, summed left to right, times
    ``1 / (sum · s_y)``, rounded half away; over array namespace ``xp``. Not the reference
    (`softmax`); kept to measure the two apart."""
    f = float_math.arithmetic(xp)
    x = xp.asarray(x_q).astype(xp.int64)
    exps = xp.take(xp.asarray(softmax_exp_table(x_qp, beta)), x.max(axis=-1, keepdims=True) - x)
    inverse = f.div(F32(1), f.mul(f.sum_last(exps), F32(out_qp.scale[0])))
    out = round_half_away(f.mul(exps, inverse), xp) + int(out_qp.zero_point[0])
    return xp.clip(out, *dtype_range(out_dtype)).astype(out_dtype)


# -- 16x8 ---------------------------------------------------------------------------------------

_EXP_LUT = lut16(np.exp, 10.0 / 65535, 32767, 2.0 / 65535, 0)
ONE_OVER_ONE_PLUS_X_LUT = lut16(lambda v: 1.0 / (1.0 + v), 1.0 / 65535, -32768, 2.0 / 65535, 0)


def softmax_int16_exps(differences, x_qp: QuantParams, beta: float) -> np.ndarray:
    """16x8 SOFTMAX's exp (Q0.15, from the int16 table) of input differences ``x − max`` (<= 0)."""
    real = float(F32(F32(x_qp.scale[0]) * F32(beta))) / (10.0 / 65535.0)
    m, shift = quantize_multiplier(real)
    scaled = rescale(np.asarray(differences, np.int64), m, shift).astype(np.int64)
    return lut16_lookup(np.clip(scaled + 32767, -32768, 32767), _EXP_LUT)


def softmax_int16(x_q, x_qp: QuantParams, out_qp: QuantParams, *, beta: float = 1.0) -> np.ndarray:
    """16x8 SOFTMAX (reference SoftmaxInt16) over the last axis: `softmax_int16_fixed_point`
    on NumPy with the node's `softmax_int16_tables`."""
    return softmax_codes(np.int16, x_qp, out_qp, beta, np.int16)(np, np.asarray(x_q))


@lru_cache(maxsize=64)
def softmax_int16_tables(input_scale: float, beta: float) -> tuple[np.ndarray, np.ndarray]:
    """16x8 SOFTMAX's two interpolated int16 lookups as plain tables over every value they can
    see: the exp of each difference ``x − max`` in −65535..0 (index ``difference + 65535``),
    and the 1/(1+x) of each int16 (index ``value + 32768``)."""
    x_qp = QuantParams(np.array([input_scale], np.float32), np.array([0]))
    exps = np.asarray(softmax_int16_exps(np.arange(-65535, 1), x_qp, beta), np.int64)
    reciprocals = np.asarray(lut16_lookup(np.arange(-32768, 32768), ONE_OVER_ONE_PLUS_X_LUT), np.int64)
    exps.setflags(write=False)
    reciprocals.setflags(write=False)
    return exps, reciprocals


def softmax_int16_fixed_point(xp, x, exps_of_difference, reciprocals):
    """`softmax_int16`'s arithmetic, written once over array namespace ``xp`` (NumPy here,
    jax.numpy in kiln.xla), on int64 codes and `softmax_int16_tables`: the distance to the row
    maximum rescaled onto [-10, 0], its exp, the sum's reciprocal from the 1/(1+x) table after
    normalising by its leading zeros (counted from the float64 exponent, exact for every
    uint32), output in Q0.15 (int64)."""
    exps = xp.take(exps_of_difference, x - x.max(axis=-1, keepdims=True) + 65535)
    total = exps.sum(axis=-1, keepdims=True)
    headroom_plus_one = 32 - xp.frexp((total & 0xFFFFFFFF).astype(xp.float64))[1].astype(xp.int64)
    shifted = ((total << (headroom_plus_one - 1)) + (1 << 13)) >> 14
    reciprocal = xp.take(reciprocals, xp_clamp(xp, shifted - (1 << 15) - (1 << 16), -32768, 32767) + 32768)
    right_shift = 31 - headroom_plus_one
    out = (exps * reciprocal + (1 << (right_shift - 1))) >> right_shift
    return xp_clamp(xp, out, 0, 32767)


def log_softmax(x_q, x_qp: QuantParams, out_qp: QuantParams, *, out_dtype=np.int8) -> np.ndarray:
    """int8 LOG_SOFTMAX over the last axis. Measured: LiteRT 2.3's BUILTIN_REF matches the
    float32 ``(x − max) − log(Σ exp(x − max))`` of the dequantized row, divided by ``s_y``
    and rounded half away (0 of 9 216 outputs differ over 6 input parameter sets)."""
    x = np.asarray(x_q)
    if x.ndim == 0:
        raise IntegerKernelError("LOG_SOFTMAX: input must have at least one dimension")
    real = (F32(x_qp.scale[0]) * (x.astype(np.int64) - int(x_qp.zero_point[0])).astype(F32)).astype(F32)
    shifted = (real - real.max(axis=-1, keepdims=True)).astype(F32)
    with np.errstate(under="ignore"):   # NumPy's exp, which kiln.xla's lowering mirrors table for table
        total = np.exp(shifted).astype(F32).sum(axis=-1, keepdims=True, dtype=F32)
    result = (shifted - np.log(total).astype(F32)).astype(F32)
    out = round_half_away((result / F32(out_qp.scale[0])).astype(F32)) + int(out_qp.zero_point[0])
    return np.clip(out, *dtype_range(out_dtype)).astype(out_dtype)


# -- the records' ``quantized`` kernels ---------------------------------------------------------------

def _softmax(call, x):
    if x.ndim == 0:
        raise OpError(f"{call.op.name}: input must have at least one dimension")
    if x.dtype == np.int16:
        int16_zero_points(call, 0, -1)
        return softmax_int16(x, params(call, 0, "input"), out_params(call), beta=float(call.opts.beta))
    return softmax(x, params(call, 0, "input"), out_params(call), beta=float(call.opts.beta),
                       out_dtype=call.out_dtypes[0])


def _log_softmax(call, x):
    return log_softmax(x, params(call, 0, "input"), out_params(call), out_dtype=call.out_dtypes[0])


SOFTMAX = {INT8: _softmax, INT16: _softmax}
LOG_SOFTMAX = {INT8: _log_softmax}
