"""Lowerings of QUANTIZE / DEQUANTIZE (mirroring kiln/ops/quantize.py) and the int8 / 16x8 ADD,
SUB, MUL (kiln.kernels.elementwise's arithmetic), bit-exact with LiteRT's reference kernels:
LiteRT's fixed-point requantization (kiln.kernels.fixedpoint, over jax.numpy), the output zero
point and the fused activation's clamp. The weighted ops' quantized kernels run their kernel
families (lower_families.py).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..errors import OpError
from ..kernels.fixedpoint import activation_range, dtype_range, quantize_multiplier, round_half_away, xp_rescale
from ..ops.quantize import dequantize
from ..schema import Activation, DType
from .lowering import CODES, Rows

_I64 = jnp.int64

#: This module's entries of the XLA table (kiln/xla/table.py's `fill` registers them).
ROWS = Rows()


def _rescale(x, multiplier, shift):
    return xp_rescale(jnp, x, multiplier, shift)


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


def _quantize(call, x):
    out_dtype = call.out_dtypes[0]
    q_out = _qp(call.op.outputs[0], "QUANTIZE output")
    lo, hi = dtype_range(out_dtype)
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
        rounded = round_half_away(v, jnp)
        # Saturate in float first: the reference casts values far outside int64 to its minimum.
        q = jnp.clip(jnp.nan_to_num(rounded, nan=-2.0 ** 62), -2.0 ** 62, 2.0 ** 62).astype(_I64) + zp
        return jnp.clip(q, lo, hi).astype(out_dtype)
    q_in = _qp(call.op.inputs[0], "QUANTIZE input")
    m, s = quantize_multiplier(float(np.float64(q_in.scale[0]) / np.float64(q_out.scale[0])))
    out = _rescale(x.astype(_I64) - int(q_in.zero_point[0]), m, s) + int(q_out.zero_point[0])
    return jnp.clip(out, lo, hi).astype(out_dtype)


def _edges_check(op, opts):
    for t in (*op.inputs, *op.outputs):
        if t is not None and t.dtype == DType.INT4:
            return f"{op.name} of INT4 tensor {t.name!r} is not lowered"
    return None


ROWS.add("QUANTIZE", _quantize, types=CODES, check=_edges_check)
ROWS.add("DEQUANTIZE", dequantize)   # float16 weights
ROWS.add("DEQUANTIZE", dequantize, types=CODES, check=_edges_check)


# -- int8 ADD / SUB / MUL (kiln.kernels.elementwise) ----------------------------------------

#: ADD / SUB lift 8-bit inputs by 2^20 before rescaling them to a common scale.
_LEFT_SHIFT = 20
#: int16 inputs (16x8) are lifted by 2^15 only.
_LEFT_SHIFT_16 = 15


def _finish_elementwise(out, call):
    q_out = call.op.outputs[0].quantization
    lo, hi = activation_range(call.opts.fused_activation_function, q_out, call.out_dtypes[0])
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
        total = _rescale(lifted_a, m_a, sh_a) + sign * _rescale(lifted_b, m_b, sh_b)
        return _finish_elementwise(_rescale(total, m_y, sh_y), call)
    return lower


def int8_mul(call, a, b):
    q_a, q_b, q_y = (call.op.inputs[0].quantization, call.op.inputs[1].quantization,
                     call.op.outputs[0].quantization)
    real = np.float32(np.float32(q_a.scale[0]) * np.float32(q_b.scale[0])) / np.float32(q_y.scale[0])
    m, s = quantize_multiplier(float(np.float32(real)))
    product = (jnp.asarray(a).astype(_I64) - int(q_a.zero_point[0])) * (jnp.asarray(b).astype(_I64)
                                                                          - int(q_b.zero_point[0]))
    return _finish_elementwise(_rescale(product, m, s), call)


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
