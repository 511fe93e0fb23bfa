"""Lowerings of quantized ops to integer arithmetic, bit-exact with LiteRT's reference kernels.

QUANTIZE and DEQUANTIZE mirror kiln/ops/quantize.py; int8 FULLY_CONNECTED and CONV_2D mirror
kiln.kernels.nn, their legacy uint8 forms kiln.kernels.nn (both measured against
LiteRT's BUILTIN_REF kernels there): accumulation in int32 with the zero points subtracted,
then LiteRT's fixed-point requantization in int64 — one rounding for FULLY_CONNECTED, two for
CONV_2D and QUANTIZE — the output zero point and the fused activation's clamp. Nothing goes
through float, so XLA's result is the reference kernel's bit for bit. Other quantized nodes
are refused with the reason (the delegate leaves them to the reference kernels).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..errors import OpError
from ..kernels.fixedpoint import (
    INT32_MAX,
    INT32_MIN,
    quantize_multiplier,
    quantize_multipliers,
)
from ..kernels.nn import uint8_multiplier
from ..ops.windowed import window_geometry
from ..schema import Activation, DType
from .lowering import CODES, Rows, computed_once

_I64 = jnp.int64

#: This module's entries of the XLA table (kiln/xla/table.py's `fill` registers them).
ROWS = Rows()


# -- LiteRT's fixed-point arithmetic on JAX integers (kiln.kernels.fixedpoint's, traced) ---------------

def rescale_once(x, multiplier, shift):
    """round(x · M · 2^(shift − 31)), one rounding (arith.multiply_by_quantized_multiplier)."""
    total = 31 - jnp.asarray(shift, _I64)
    rounding = jnp.left_shift(jnp.asarray(1, _I64), total - 1)
    return jnp.right_shift(x.astype(_I64) * jnp.asarray(multiplier, _I64) + rounding, total)


def _high_mul(a, b):
    """gemmlowp's SaturatingRoundingDoublingHighMul (int64 in, int64 out).

    gemmlowp nudges the product by ±2^30 by its sign and divides by 2^31 truncating; for
    integers that is floor((a·b + 2^30) / 2^31): one add and one shift instead of three
    selects. Only INT32_MIN² saturates, and a constant multiplier never is INT32_MIN.
    """
    high = jnp.right_shift(a * b + (1 << 30), 31)
    if isinstance(b, np.ndarray) and not np.any(b == INT32_MIN):
        return high
    return jnp.where((a == INT32_MIN) & (b == INT32_MIN), INT32_MAX, high)


def _divide_by_pot(x, exponent):
    """gemmlowp's RoundingDivideByPOT: x / 2^exponent, halves away from zero — as
    floor((x + 2^(e-1) - [x < 0 and e > 0]) / 2^e)."""
    if isinstance(exponent, np.ndarray) or np.isscalar(exponent):
        e = np.asarray(exponent, np.int64)
        half, signed = jnp.asarray((np.int64(1) << e) >> 1), jnp.asarray(e > 0)
    else:
        e = exponent
        half, signed = jnp.right_shift(jnp.left_shift(jnp.asarray(1, _I64), e), 1), e > 0
    return jnp.right_shift(x + half - ((x < 0) & signed), jnp.asarray(e, _I64))


def rescale_twice(x, multiplier, shift):
    """LiteRT's two-rounding requantization (arith.multiply_by_quantized_multiplier_double_rounding)."""
    if isinstance(shift, (np.ndarray, int, np.integer)):
        shift = np.asarray(shift, np.int64)
        left, right = np.maximum(shift, 0), np.maximum(-shift, 0)
        scaled = x.astype(_I64) if not left.any() else jnp.left_shift(x.astype(_I64), jnp.asarray(left))
    else:
        shift = jnp.asarray(shift, _I64)
        left, right = jnp.maximum(shift, 0), jnp.maximum(-shift, 0)
        scaled = jnp.left_shift(x.astype(_I64), left)
    scaled = jnp.clip(scaled, INT32_MIN, INT32_MAX)
    m = np.asarray(multiplier, np.int64) if isinstance(multiplier, (np.ndarray, int, np.integer)) else \
        jnp.asarray(multiplier, _I64)
    return _divide_by_pot(_high_mul(scaled, m), right)


def _limits(dtype) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def _qp(t, what: str):
    q = None if t is None else t.quantization
    if q is None or q.scale.size == 0:
        raise OpError(f"{what} has no quantization parameters")
    return q


# -- QUANTIZE / DEQUANTIZE -----------------------------------------------------------------------

def _channel_shape(ndim: int, axis: int) -> list[int]:
    shape = [1] * ndim
    shape[axis] = -1
    return shape


def _dequantize(call, x):
    if x.dtype == np.float16:
        return x.astype(jnp.float32)
    q = _qp(call.op.inputs[0], "DEQUANTIZE input")
    if q.scale.size > 1:  # per channel, in float32
        shape = _channel_shape(x.ndim, q.quantized_dimension)
        centered = x.astype(jnp.int32) - q.zero_point.astype(np.int32).reshape(shape)
        return centered.astype(jnp.float32) * q.scale.astype(np.float32).reshape(shape)
    centered = x.astype(_I64) - int(q.zero_point[0])
    return (np.float64(q.scale[0]) * centered.astype(jnp.float64)).astype(jnp.float32)


def _quantize(call, x):
    out_dtype = call.out_dtypes[0]
    q_out = _qp(call.op.outputs[0], "QUANTIZE output")
    lo, hi = _limits(out_dtype)
    if np.dtype(x.dtype).kind == "f":
        if q_out.scale.size > 1:
            shape = _channel_shape(x.ndim, q_out.quantized_dimension)
            scale = q_out.scale.astype(np.float32).reshape(shape)
            zp = q_out.zero_point.astype(np.int64).reshape(shape)
        else:
            scale, zp = np.float32(q_out.scale[0]), int(q_out.zero_point[0])
        # The reference divides in float32. XLA turns a division by a constant into a product
        # with its reciprocal, one float32 ulp off for about a sixth of all values (a rounding
        # flip at .5); the float64 quotient rounded to float32 is the float32 one (checked on
        # 140M values, half of them next to a .5 boundary).
        v = x.astype(jnp.float32).astype(jnp.float64) / np.asarray(scale, np.float64)
        v = v.astype(jnp.float32).astype(jnp.float64)
        rounded = jnp.sign(v) * jnp.floor(jnp.abs(v) + 0.5)          # half away from zero
        # Saturate in float first: the reference casts values far outside int64 to its minimum.
        q = jnp.clip(jnp.nan_to_num(rounded, nan=-2.0 ** 62), -2.0 ** 62, 2.0 ** 62).astype(_I64) + zp
        return jnp.clip(q, lo, hi).astype(out_dtype)
    q_in = _qp(call.op.inputs[0], "QUANTIZE input")
    m, s = quantize_multiplier(float(np.float64(q_in.scale[0]) / np.float64(q_out.scale[0])))
    out = rescale_twice(x.astype(_I64) - int(q_in.zero_point[0]), m, s) + int(q_out.zero_point[0])
    return jnp.clip(out, lo, hi).astype(out_dtype)


def _edges_check(op, opts):
    for t in (*op.inputs, *op.outputs):
        if t is not None and t.dtype == DType.INT4:
            return f"{op.name} of INT4 tensor {t.name!r} is not lowered"
    return None


ROWS.add("QUANTIZE", _quantize, types=CODES, check=_edges_check)
ROWS.add("DEQUANTIZE", _dequantize)   # float16 weights
ROWS.add("DEQUANTIZE", _dequantize, types=CODES, check=_edges_check)


# -- int8 FULLY_CONNECTED / CONV_2D ----------------------------------------------------------------

def _activation_range(act: int, q, dtype) -> tuple[int, int]:
    """LiteRT's CalculateActivationRangeQuantized (float32 division, rounded half away), as
    kiln.kernels.nn.activation_range computes it."""
    qmin, qmax = _limits(dtype)
    scale, zp = np.float32(q.scale[0]), int(q.zero_point[0])

    def quantize(f: float) -> int:
        v = np.float32(np.float32(f) / scale)
        return zp + int(np.sign(v) * np.floor(np.abs(v) + np.float32(0.5)))

    if act == Activation.RELU:
        return max(qmin, quantize(0.0)), qmax
    if act == Activation.RELU6:
        return max(qmin, quantize(0.0)), min(qmax, quantize(6.0))
    if act == Activation.RELU_N1_TO_1:
        return max(qmin, quantize(-1.0)), min(qmax, quantize(1.0))
    return qmin, qmax


def _channel_multipliers(x_q, w_q, out_q, channels: int):
    real = float(x_q.scale[0]) * np.broadcast_to(w_q.scale.astype(np.float64), (channels,)) / float(out_q.scale[0])
    return quantize_multipliers(real)


def _weighted_multipliers(op, channels: int):
    """The per-channel (multiplier, shift) of a FULLY_CONNECTED / convolution node: int8 / 16x8
    take PopulateConvolutionQuantizationParams' double products; the legacy uint8 kernels
    (kiln.kernels.nn) one multiplier from the float32 product of the scales, as
    GetQuantizedConvolutionMultipler forms it."""
    q_x, q_w, q_out = (op.inputs[0].quantization, op.inputs[1].quantization, op.outputs[0].quantization)
    if op.inputs[0].dtype != DType.UINT8:
        return _channel_multipliers(q_x, q_w, q_out, channels)
    m, s = uint8_multiplier(q_x, q_w, q_out)
    return np.full(channels, m, np.int64), np.full(channels, s, np.int64)


def _conv_weights_and_multipliers(op, w, channels: int):
    """The filter less its zero point (uint8 filters have one; int8 ones zero) and
    `_weighted_multipliers`."""
    zero_point = int(op.inputs[1].quantization.zero_point[0]) if op.inputs[0].dtype == DType.UINT8 else 0
    return np.asarray(w, np.int32) - zero_point, _weighted_multipliers(op, channels)


def _int_dot(a, b, acc=jnp.int32, a_bound: int | None = None):
    """Exact a · bᵀ, accumulated in int32 (int8 kernels) or int64 (16x8 kernels).

    With constant weights ``b`` and |a| <= ``a_bound``, no partial sum of a row's product
    exceeds a_bound * max_j sum_k |b_jk|: below 2^24 the product is exact in float32, whose
    dot XLA's CPU runs faster than an integer one (int8 transformer block 1.4x, MobileNetV2
    1.1x faster; bench/xla_quant_bench.py). A float64 dot for the 16x8 kernels' int64 sums
    measured no faster, so they stay integer.
    """
    if a_bound is not None and isinstance(b, np.ndarray) and acc == jnp.int32:
        worst = a_bound * float(np.abs(b.astype(np.int64)).sum(axis=1).max(initial=0))
        if worst < 2.0 ** 24:
            y = lax.dot_general(a.astype(jnp.float32), jnp.asarray(b, jnp.float32), (((a.ndim - 1,), (1,)), ((), ())),
                                precision=lax.Precision.HIGHEST)
            return y.astype(acc)
    return lax.dot_general(a.astype(acc), b.astype(acc), (((a.ndim - 1,), (1,)), ((), ())),
                           preferred_element_type=acc)


def _centered_bound(x, zero_point: int) -> int:
    """The largest |x - zero_point| an integer tensor of x's type can hold."""
    info = np.iinfo(np.dtype(x.dtype))
    return max(abs(int(info.min) - zero_point), abs(int(info.max) - zero_point))


def rescale_int64(x, multiplier, shift):
    """The 16x8 convolutions' rescaling (arith.multiply_by_quantized_multiplier_int64): the
    multiplier cut to 15 bits, one rounding, the result taken as int32."""
    m = np.asarray(multiplier, np.int64)
    reduced = np.where(m < 0x7FFF0000, (m + (1 << 15)) >> 16, 0x7FFF)
    total = 15 - jnp.asarray(shift, _I64)
    rounding = jnp.left_shift(jnp.asarray(1, _I64), total - 1)
    return jnp.right_shift(x.astype(_I64) * jnp.asarray(reduced) + rounding, total).astype(jnp.int32).astype(_I64)


def _acc_type(x):
    return _I64 if x.dtype == jnp.int16 else jnp.int32


def _output_stage(acc, bias, m, s, call, *, twice: bool):
    out_t = call.op.outputs[0]
    q_out = out_t.quantization
    acc = acc.astype(_I64)
    if bias is not None:
        acc = acc + jnp.asarray(bias).astype(_I64).reshape(-1)
    if twice and call.op.inputs[0].dtype == DType.INT16:
        rescale = rescale_int64
    else:
        rescale = rescale_twice if twice else rescale_once
    out = rescale(acc, m, s) + int(q_out.zero_point[0])
    lo, hi = _activation_range(call.opts.fused_activation_function, q_out, call.out_dtypes[0])
    return jnp.clip(out, lo, hi).astype(call.out_dtypes[0])


def int8_fully_connected(call, x, w, bias=None):
    op, opts = call.op, call.opts
    q_x, q_w = op.inputs[0].quantization, op.inputs[1].quantization
    units, depth = w.shape
    if x.size % depth:
        raise OpError(f"FULLY_CONNECTED: input {list(x.shape)} does not split into rows of {depth}")
    rows = x.reshape(-1, depth).astype(_acc_type(x)) - int(q_x.zero_point[0])
    per_channel = q_w.scale.size > 1
    # Weights may be a run-time input (LiteRT's kernel takes them so): then a traced array.
    weights = np.asarray(w, np.int32) if isinstance(w, np.ndarray) else w.astype(jnp.int32)
    centered_w = weights - (0 if per_channel else int(q_w.zero_point[0]))
    m, s = _weighted_multipliers(op, units)
    bound = _centered_bound(x, int(q_x.zero_point[0]))
    y = _output_stage(_int_dot(rows, centered_w, _acc_type(x), bound), bias, m, s, call, twice=False)
    return y.reshape(*x.shape[:-1], units) if opts.keep_num_dims else y


def int8_conv(call, x, w, bias=None):
    op, opts = call.op, call.opts
    q_x = op.inputs[0].quantization
    out_c, kh, kw, in_c = w.shape
    if x.ndim != 4 or x.shape[3] != in_c:
        raise OpError(f"CONV_2D: input {list(x.shape)} does not match the filter {list(w.shape)} "
                      "(grouped convolution has no integer kernel)")
    dil = (opts.dilation_h_factor, opts.dilation_w_factor)
    (oh, ow), pads = window_geometry(opts, x.shape[1:3], (kh, kw), dil)
    # Padding with zeros after subtracting the zero point = the reference skipping those taps.
    xp = jnp.pad(x.astype(_acc_type(x)) - int(q_x.zero_point[0]), ((0, 0), *pads, (0, 0)))
    if kh * kw > 1:
        xp = computed_once(xp)
    sh, sw = opts.stride_h, opts.stride_w
    taps = [lax.slice(xp, (0, i * dil[0], j * dil[1], 0),
                      (xp.shape[0], i * dil[0] + (oh - 1) * sh + 1, j * dil[1] + (ow - 1) * sw + 1, in_c),
                      (1, sh, sw, 1)) for i in range(kh) for j in range(kw)]
    cols = jnp.concatenate(taps, axis=3) if len(taps) > 1 else taps[0]
    w, (m, s) = _conv_weights_and_multipliers(op, w, out_c)
    acc = _int_dot(cols.reshape(-1, kh * kw * in_c), w.reshape(out_c, -1), _acc_type(x),
                   _centered_bound(x, int(q_x.zero_point[0])))
    return _output_stage(acc, bias, m, s, call, twice=True).reshape(x.shape[0], oh, ow, out_c)


def int8_weighted_check(op, opts):
    """None when the node is the int8 (or hybrid) kernel lowered here, else why not."""
    from .lower_hybrid import hybrid_check, is_hybrid

    if is_hybrid(op):
        return hybrid_check(op, opts)
    def dtype(k):
        return op.inputs[k].dtype if k < len(op.inputs) and op.inputs[k] is not None else None

    x_t, w_t, b_t, out_t = dtype(0), dtype(1), dtype(2), op.outputs[0].dtype
    types = [x_t, w_t, b_t, out_t]
    int8 = (x_t, w_t, out_t) == (DType.INT8,) * 3 and b_t in (None, DType.INT32)
    int16 = (x_t, w_t, out_t) == (DType.INT16, DType.INT8, DType.INT16) and b_t in (None, DType.INT32, DType.INT64)
    uint8 = (x_t, w_t, out_t) == (DType.UINT8,) * 3 and b_t in (None, DType.INT32)
    if not (int8 or int16 or uint8):
        return (f"{op.name} with {[t.name if t else None for t in types]} tensors: only the int8 kernel "
                "(int8 input, weights and output, int32 bias), the 16x8 one (int16 activations, int8 "
                "weights, int32/int64 bias), the legacy uint8 one (uint8 input, weights and output, int32 "
                "bias) and the hybrid one (float32 around int8 weights) are lowered")
    if uint8 and op.inputs[1].quantization.scale.size != 1:
        return f"{op.name}: uint8 weights with {op.inputs[1].quantization.scale.size} scales (the kernel takes one)"
    if int16 and any(op.inputs[0 if k == 0 else k].quantization.zero_point.any() for k in (0,)) \
            or int16 and op.outputs[0].quantization.zero_point.any():
        return f"{op.name}: 16x8 activations with non-zero zero points (the reference kernel refuses them)"
    if op.op_type != "FULLY_CONNECTED" and (not op.inputs[1].is_constant or
                                            (b_t is not None and not op.inputs[2].is_constant)):
        return f"{op.name}: quantized filter and bias must be constants"
    q_w = op.inputs[1].quantization
    if q_w.scale.size > 1 and np.any(q_w.zero_point != 0):
        return f"{op.name}: per-channel weights with non-zero zero points"
    if opts.fused_activation_function not in (Activation.NONE, Activation.RELU, Activation.RELU6,
                                              Activation.RELU_N1_TO_1):
        return f"{op.name}: fused activation {Activation(opts.fused_activation_function).name} has no integer kernel"
    if op.op_type == "FULLY_CONNECTED" and opts.weights_format != 0:
        return "FULLY_CONNECTED: shuffled weights are not lowered"
    return None


def int8_depthwise(call, x, w, bias=None):
    op, opts = call.op, call.opts
    q_x = op.inputs[0].quantization
    _, kh, kw, out_c = w.shape
    if x.ndim != 4 or x.shape[3] == 0 or out_c % x.shape[3]:
        raise OpError(f"DEPTHWISE_CONV_2D: filter channels {out_c} are not a multiple of the input's {list(x.shape)}")
    dil = (opts.dilation_h_factor, opts.dilation_w_factor)
    (oh, ow), pads = window_geometry(opts, x.shape[1:3], (kh, kw), dil)
    xp = jnp.pad(x.astype(_acc_type(x)) - int(q_x.zero_point[0]), ((0, 0), *pads, (0, 0)))
    if out_c > x.shape[3]:  # output channel c * M + m reads input channel c
        xp = jnp.repeat(xp, out_c // x.shape[3], axis=3)
    if kh * kw > 1:
        xp = computed_once(xp)
    sh, sw = opts.stride_h, opts.stride_w
    weights, (m, s) = _conv_weights_and_multipliers(op, w, out_c)
    weights = weights[0]
    acc = None
    for i in range(kh):
        for j in range(kw):
            tap = lax.slice(xp, (0, i * dil[0], j * dil[1], 0),
                            (xp.shape[0], i * dil[0] + (oh - 1) * sh + 1, j * dil[1] + (ow - 1) * sw + 1, out_c),
                            (1, sh, sw, 1)) * weights[i, j]
            acc = tap if acc is None else acc + tap
    return _output_stage(acc, bias, m, s, call, twice=True)


# -- int8 ADD / SUB / MUL (kiln.kernels.elementwise) ----------------------------------------

#: ADD / SUB lift 8-bit inputs by 2^20 before rescaling them to a common scale.
_LEFT_SHIFT = 20
#: int16 inputs (16x8) are lifted by 2^15 only.
_LEFT_SHIFT_16 = 15


def _finish_elementwise(out, call):
    q_out = call.op.outputs[0].quantization
    lo, hi = _activation_range(call.opts.fused_activation_function, q_out, call.out_dtypes[0])
    return jnp.clip(out + int(q_out.zero_point[0]), lo, hi).astype(call.out_dtypes[0])


def int8_add_sub(sign: int):
    def lower(call, a, b):
        q_a, q_b, q_y = (call.op.inputs[0].quantization, call.op.inputs[1].quantization,
                         call.op.outputs[0].quantization)
        s_a, s_b, s_y = float(q_a.scale[0]), float(q_b.scale[0]), float(q_y.scale[0])
        twice_max = 2.0 * max(s_a, s_b)
        m_a, sh_a = quantize_multiplier(s_a / twice_max)
        m_b, sh_b = quantize_multiplier(s_b / twice_max)
        lift = _LEFT_SHIFT_16 if a.dtype == jnp.int16 else _LEFT_SHIFT
        m_y, sh_y = quantize_multiplier(twice_max / ((1 << lift) * s_y))
        lifted_a = jnp.left_shift(jnp.asarray(a).astype(_I64) - int(q_a.zero_point[0]), lift)
        lifted_b = jnp.left_shift(jnp.asarray(b).astype(_I64) - int(q_b.zero_point[0]), lift)
        total = rescale_twice(lifted_a, m_a, sh_a) + sign * rescale_twice(lifted_b, m_b, sh_b)
        return _finish_elementwise(rescale_twice(total, m_y, sh_y), call)
    return lower


def int8_mul(call, a, b):
    q_a, q_b, q_y = (call.op.inputs[0].quantization, call.op.inputs[1].quantization,
                     call.op.outputs[0].quantization)
    real = np.float32(np.float32(q_a.scale[0]) * np.float32(q_b.scale[0])) / np.float32(q_y.scale[0])
    m, s = quantize_multiplier(float(np.float32(real)))
    product = (jnp.asarray(a).astype(_I64) - int(q_a.zero_point[0])) * (jnp.asarray(b).astype(_I64)
                                                                          - int(q_b.zero_point[0]))
    return _finish_elementwise(rescale_twice(product, m, s), call)


def int8_elementwise_check(op, opts):
    """None for the int8 ADD / SUB / MUL lowered here (per-tensor scales), else why not."""
    tensors = [*op.inputs[:2], op.outputs[0]]
    kind = tensors[0].dtype if tensors[0] is not None else None
    if kind not in (DType.INT8, DType.INT16) or any(
            t is None or t.dtype != kind or t.quantization is None or t.quantization.scale.size != 1 for t in tensors):
        return f"{op.name}: only int8 or int16 operands with one scale each have an integer lowering"
    if kind == DType.INT16 and any(t.quantization.zero_point.any() for t in tensors):
        return f"{op.name}: int16 operands with non-zero zero points (the 16x8 kernel refuses them)"
    if opts.fused_activation_function not in (Activation.NONE, Activation.RELU, Activation.RELU6,
                                              Activation.RELU_N1_TO_1):
        return f"{op.name}: fused activation {Activation(opts.fused_activation_function).name} has no integer kernel"
    return None
