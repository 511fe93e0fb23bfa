"""Quantized lowerings beyond the weighted ops, bit-exact with kiln.quant's integer kernels.

Three kinds:

* Data movement on the codes: an op whose record runs its float kernel unchanged on
  quantized tensors (`kiln.ops.record.on_codes`: RESHAPE, TRANSPOSE, PAD, GATHER, MAXIMUM,
  ...) runs its float lowering unchanged on the integer codes too; SHAPE / RANK only read
  the shape.
* 8-bit unary ops (TANH, LOGISTIC, GELU, RELU*, LEAKY_RELU, HARD_SWISH, EXP, LOG, RSQRT,
  ABS): a function of one int8 / uint8 code has 256 values, so the lowering is a lookup in
  the table of the node's own reference kernel evaluated on every code at trace time (what
  LiteRT's Prepare does for its LUT kernels). Exact by construction, one gather in XLA.
* Integer arithmetic mirroring kiln.kernels.nn: MAX / AVERAGE_POOL_2D, MEAN, SOFTMAX
  (int8's float-table kernel), BATCH_MATMUL, SQUARED_DIFFERENCE, TRANSPOSE_CONV (and its hybrid
  form, kiln/xla/lower_hybrid.py's float steps), and RESIZE_BILINEAR (int8, int16:
  `kiln.kernels.image.xp_resize_bilinear`, its source rows / columns and fractions computed
  while tracing from the static sizes).

The other quantized activations (PRELU, L2_NORMALIZATION, LOG_SOFTMAX) are in
lower_quant_activations.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import ops
from ..errors import KilnError, OpError
from ..kernels.softmax import (
    softmax_exp_table,
    softmax_fixed_exps,
    softmax_fixed_point,
    softmax_input_scaling,
    softmax_int16_fixed_point,
    softmax_int16_tables,
    softmax_may_abort,
)
from ..kernels.elementwise import xp_squared_difference
from ..kernels.fixedpoint import quantize_multiplier
from ..kernels.image import xp_resize_bilinear
from ..kernels.nn import reduced_axes, xp_average_pool2d, xp_max_pool2d, xp_mean, xp_quantized_sum
from ..ops.record import HYBRID, KernelCall, operand_types
from ..ops.windowed import transpose_conv_geometry, window_geometry
from ..schema import Activation, DType
from .lower_hybrid import hybrid_transpose_conv
from .lower_nn import transpose_conv_2d
from .lower_quant import (
    _activation_range,
    _channel_multipliers,
    _limits,
    rescale_int64,
    rescale_twice,
)
from .lower_shape import ROWS as SHAPE_ROWS
from .lowering import CODES, Rows, fused_range

_I64 = jnp.int64
_SIMPLE_ACTS = (Activation.NONE, Activation.RELU, Activation.RELU6, Activation.RELU_N1_TO_1)


def _q(t):
    return t.quantization


def _zp(t) -> int:
    return int(t.quantization.zero_point[0])


def _per_tensor(op, kinds=(DType.INT8,)) -> str | None:
    """None when every tensor of ``op`` is quantized per tensor with one of ``kinds``."""
    for t in (*op.inputs, *op.outputs):
        if t is None or not t.dtype.name.startswith(("INT", "UINT")):
            continue
        q = t.quantization
        if q is None or q.scale.size == 0:
            continue
        if t.dtype not in kinds or q.scale.size != 1:
            return (f"{op.name}: quantized tensor {t.name!r} is {t.dtype.name} with {q.scale.size} scales; "
                    f"lowered: {'/'.join(k.name for k in kinds)} with one scale")
    return None


# -- data movement on the codes: kiln/xla/table.py's `fill` gives every op whose quantized kernel
# is its float kernel run on the codes (or that reads only shapes) its float lowering.

# -- 8-bit unary ops as lookups in their reference kernel's table ---------------------------------

_UNARY = ("TANH", "LOGISTIC", "GELU", "RELU", "RELU6", "RELU_N1_TO_1", "LEAKY_RELU", "HARD_SWISH", "EXP",
          "LOG", "RSQRT", "ABS", "SQRT", "ELU")


def _code_table(call):
    """The reference kernel's output for every code of the input type (ordered by code).

    A kernel may refuse the codes below the input's zero point (RSQRT of a negative
    value; LiteRT fails the invoke). A compiled program cannot fail, so, as GATHER clamps its
    indices, those codes take the output of the zero point (the kernel's value for 0)."""
    x_t = call.op.inputs[0]
    lo, hi = _limits(x_t.dtype.numpy)
    kcall = KernelCall(call.opts, call.op, call.out_dtypes)
    kernel = ops.require(call.op.op_type).kernel_for(call.op)
    codes = np.arange(lo, hi + 1).astype(x_t.dtype.numpy)
    try:
        return np.asarray(kernel(kcall, codes)), lo
    except KilnError:
        zero = _zp(x_t)
        valid = np.asarray(kernel(kcall, np.arange(zero, hi + 1).astype(x_t.dtype.numpy)))
        return np.concatenate([np.full(zero - lo, valid[0], valid.dtype), valid]), lo


def _unary_lookup(call, x):
    values, lo = _code_table(call)
    return jnp.take(jnp.asarray(values), x.astype(jnp.int32) - lo, axis=0)


def _unary_check(op, opts):
    x_t = op.inputs[0]
    codes = (DType.INT8, DType.UINT8, DType.INT16)
    if x_t.dtype not in codes or op.outputs[0].dtype not in codes:
        return f"{op.name}: only 8- and 16-bit codes are lowered (as a table); {x_t.dtype.name} is not"
    key = operand_types(op)
    if key not in ops.require(op.op_type).quantized:
        return f"{op.name}: kiln has no {key} kernel to tabulate"
    return _per_tensor(op, codes)


# -- 8-bit binary ops as lookups in their kernel's table over every pair of codes -------------------

_BINARY = ("DIV", "EQUAL", "NOT_EQUAL", "LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL")


def _pair_table(op, opts, out_dtypes):
    """The kernel's output for every (a, b) pair of 8-bit codes: a 256 × 256 table."""
    a_t, b_t = op.inputs[0], op.inputs[1]
    a_lo, a_hi = _limits(a_t.dtype.numpy)
    b_lo, b_hi = _limits(b_t.dtype.numpy)
    b_codes = np.arange(b_lo, b_hi + 1)
    divide = op.op_type == "DIV"
    if divide:   # LiteRT fails on a divisor at its zero point; a compiled program cannot fail
        b_codes = b_codes[b_codes != _zp(b_t)]
    a, b = np.meshgrid(np.arange(a_lo, a_hi + 1), b_codes, indexing="ij")
    kernel = ops.require(op.op_type).kernel_for(op)
    values = np.asarray(kernel(KernelCall(opts, op, out_dtypes), a.astype(a_t.dtype.numpy), b.astype(b_t.dtype.numpy)))
    if divide:   # ... so x / 0 saturates by the sign of x (0 / 0 gives the output's zero)
        lo, hi = _limits(out_dtypes[0])
        sign = np.sign(np.arange(a_lo, a_hi + 1) - _zp(a_t))
        by_zero = np.where(sign > 0, hi, np.where(sign < 0, lo, _zp(op.outputs[0]))).astype(values.dtype)
        values = np.insert(values, _zp(b_t) - b_lo, by_zero, axis=1)
    return values, a_lo, b_lo


def _binary_lookup(call, a, b):
    values, a_lo, b_lo = _pair_table(call.op, call.opts, call.out_dtypes)
    a, b = jnp.broadcast_arrays(jnp.asarray(a).astype(jnp.int32) - a_lo, jnp.asarray(b).astype(jnp.int32) - b_lo)
    return jnp.take(jnp.asarray(values.reshape(-1)), a * values.shape[1] + b, axis=0)


def _binary_check(op, opts):
    """8-bit elementwise ops whose kernel rescales (DIV, comparisons of differently
    quantized inputs): exact as a table when the kernel is defined on every pair of codes."""
    if len(op.inputs) != 2 or any(t is None or t.dtype not in (DType.INT8, DType.UINT8) for t in op.inputs):
        return f"{op.name}: only 8-bit operand pairs are lowered (as a table)"
    key = operand_types(op)
    if key not in ops.require(op.op_type).quantized:
        return f"{op.name}: kiln has no {key} kernel to tabulate"
    reason = _per_tensor(op, (DType.INT8, DType.UINT8))
    if reason is None:
        try:
            _pair_table(op, opts, [t.dtype.numpy for t in op.outputs])
        except KilnError as exc:
            return f"{op.name}: its kernel refuses some pairs of codes, so it has no table ({exc})"
    return reason


def _binary_tables(rows) -> None:
    """Equally quantized operands whose kernel is the float one on the codes (comparisons of
    int16 / uint8) keep the float lowering (kiln/xla/table.py's `fill`); the other 8-bit pairs
    (DIV, int8 comparisons, which rescale) are looked up in the kernel's table."""
    for name in _BINARY:
        record = ops.require(name)
        rows.gap(name, _binary_lookup, _binary_check,
                 [k for k in ("int8", "uint8") if k in record.quantized and record.quantized[k] is not record.kernel])


# -- pooling ------------------------------------------------------------------------------------

def _pool_taps(call, x):
    opts = call.opts
    k = (opts.filter_height, opts.filter_width)
    (oh, ow), pads = window_geometry(opts, x.shape[1:3], k, (1, 1))
    return k, (oh, ow), pads, (opts.stride_h, opts.stride_w)


def _pool_range(call):
    act = call.opts.fused_activation_function
    if act == Activation.NONE:
        return _limits(call.out_dtypes[0])
    return _activation_range(act, call.op.outputs[0].quantization, call.out_dtypes[0])


def _max_pool(call, x):
    """Integer MAX_POOL_2D: the kernel's arithmetic (`kiln.kernels.nn.xp_max_pool2d`) on jax.numpy."""
    k, out_hw, pads, strides = _pool_taps(call, x)
    return xp_max_pool2d(jnp, x, k, out_hw, pads, strides, *_pool_range(call)).astype(call.out_dtypes[0])


def _average_pool(call, x):
    """Integer AVERAGE_POOL_2D: `kiln.kernels.nn.xp_average_pool2d` on jax.numpy."""
    k, out_hw, pads, strides = _pool_taps(call, x)
    return xp_average_pool2d(jnp, x, k, out_hw, pads, strides, *_pool_range(call)).astype(call.out_dtypes[0])


def _pool_check(op, opts):
    reason = _per_tensor(op, (DType.INT8, DType.UINT8, DType.INT16))
    if reason:
        return reason
    q_in, q_out = _q(op.inputs[0]), _q(op.outputs[0])
    if np.float32(q_in.scale[0]) != np.float32(q_out.scale[0]) or q_in.zero_point[0] != q_out.zero_point[0]:
        return f"{op.name}: input and output quantization differ (the reference kernel refuses it)"
    if opts.fused_activation_function not in _SIMPLE_ACTS or min(opts.filter_height, opts.filter_width) < 1:
        return f"{op.name}: fused activation or filter size has no integer kernel"
    if len(op.inputs[0].shape) != 4:
        return f"{op.name}: input must be 4-D"
    return None


# -- MEAN -----------------------------------------------------------------------------------------

def _mean(call, x, axes):
    """int8 / 16x8 MEAN: the kernel's arithmetic (`kiln.kernels.nn.xp_mean`) on jax.numpy."""
    out = xp_mean(jnp, x, _q(call.op.inputs[0]), reduced_axes(x, np.asarray(axes)), _q(call.op.outputs[0]),
                  bool(call.opts.keep_dims), call.out_dtypes[0])
    return out.astype(call.out_dtypes[0])


def _sum(call, x, axes):
    """int8 SUM: LiteRT's optimized kernel, as kiln's (`kiln.kernels.nn.xp_quantized_sum`) on jax.numpy."""
    out = xp_quantized_sum(jnp, x, _q(call.op.inputs[0]), reduced_axes(x, np.asarray(axes)),
                           _q(call.op.outputs[0]), bool(call.opts.keep_dims), call.out_dtypes[0])
    return out.astype(call.out_dtypes[0])


def _mean_check(op, opts):
    return _per_tensor(op, (DType.INT8, DType.INT16))


def _sum_check(op, opts):
    return _per_tensor(op, (DType.INT8,))


# -- SOFTMAX (int8: the reference kernel's fixed point, kiln.kernels.softmax) -------------

def _round_half_away(v):
    v = v.astype(jnp.float64)
    return jnp.sign(v) * jnp.floor(jnp.abs(v) + 0.5)


def _softmax(call, x):
    """int8 SOFTMAX: `softmax_fixed_point`, the reference kernel's own arithmetic on
    jax.numpy; rows so wide and flat that BUILTIN_REF aborts get the kernel's fallback (the
    optimized kernel's float table), traced only where such a row can occur."""
    q_x, out_dtype = _q(call.op.inputs[0]), call.out_dtypes[0]
    multiplier, left_shift, diff_min = softmax_input_scaling(float(np.float32(q_x.scale[0])), float(call.opts.beta))
    exps = jnp.asarray(softmax_fixed_exps(multiplier, left_shift))
    out, aborts = softmax_fixed_point(jnp, x.astype(_I64), exps, diff_min, out_dtype)
    if softmax_may_abort(x.shape[-1], out_dtype):
        out = jnp.where(aborts, _softmax_float_table(call, x), out)
    return out.astype(out_dtype)


def _softmax_float_table(call, x):
    """kiln.kernels.softmax.softmax_float_table: exps from the float32 table, summed left
    to right (unrolled for short rows, a loop for long ones), rounded half away."""
    f32 = np.float32
    q_x, q_y = _q(call.op.inputs[0]), _q(call.op.outputs[0])
    values = softmax_exp_table(q_x, float(call.opts.beta))
    xi = x.astype(jnp.int32)
    exps = jnp.take(jnp.asarray(values), jnp.max(xi, axis=-1, keepdims=True) - xi, axis=0)
    n = x.shape[-1]
    if n <= 64:
        total = jnp.zeros(x.shape[:-1] + (1,), jnp.float32)
        for j in range(n):
            total = total + exps[..., j:j + 1]
    else:
        cols = jnp.moveaxis(exps, -1, 0)
        total = lax.fori_loop(0, n, lambda j, acc: acc + cols[j], jnp.zeros(x.shape[:-1], jnp.float32))[..., None]
    inverse = jnp.float32(1) / (total * f32(q_y.scale[0]))
    out = _round_half_away(exps * inverse) + _zp(call.op.outputs[0])
    return jnp.clip(out, *_limits(call.out_dtypes[0]))


def _softmax_int16(call, x):
    """16x8 SOFTMAX: the kernel's arithmetic (`softmax_int16_fixed_point`) on jax.numpy."""
    exps, reciprocals = softmax_int16_tables(float(np.float32(_q(call.op.inputs[0]).scale[0])), float(call.opts.beta))
    return softmax_int16_fixed_point(jnp, x.astype(_I64), jnp.asarray(exps), jnp.asarray(reciprocals)).astype(jnp.int16)


def _any_softmax(call, x):
    return _softmax_int16(call, x) if np.dtype(x.dtype) == np.int16 else _softmax(call, x)


def _softmax_check(op, opts):
    kind = op.inputs[0].dtype
    if kind not in (DType.INT8, DType.INT16) or op.outputs[0].dtype != kind or len(op.inputs[0].shape) == 0:
        return f"{op.name}: only int8 and 16x8 SOFTMAX (at least 1-D) are lowered"
    if kind == DType.INT16 and (operand_types(op) not in ops.require("SOFTMAX").quantized
                                or any(t.quantization.zero_point.any() for t in (op.inputs[0], op.outputs[0]))):
        return f"{op.name}: 16x8 SOFTMAX needs zero points 0 (and kiln's int16 kernel)"
    return _per_tensor(op, (kind,))


# -- BATCH_MATMUL / SQUARED_DIFFERENCE / TRANSPOSE_CONV (int8) ----------------------------------

def _batch_matmul(call, a, b):
    op = call.op
    a = a.astype(_I64) - _zp(op.inputs[0])
    b = b.astype(_I64) - _zp(op.inputs[1])
    if call.opts.adj_x:
        a = jnp.swapaxes(a, -1, -2)
    if call.opts.adj_y:
        b = jnp.swapaxes(b, -1, -2)
    if a.shape[-1] != b.shape[-2]:
        raise OpError(f"BATCH_MATMUL: contraction sizes {a.shape[-1]} and {b.shape[-2]} differ")
    wide = op.inputs[0].dtype == DType.INT16   # 16x8: int64 accumulator, 15-bit multiplier
    acc_type = _I64 if wide else jnp.int32
    acc = jnp.matmul(a.astype(acc_type), b.astype(acc_type), preferred_element_type=acc_type)
    product = np.float32(np.float32(_q(op.inputs[0]).scale[0]) * np.float32(_q(op.inputs[1]).scale[0]))
    m, s = quantize_multiplier(float(product) / float(_q(op.outputs[0]).scale[0]))
    out = (rescale_int64 if wide else rescale_twice)(acc, m, s).astype(_I64) + _zp(op.outputs[0])
    return jnp.clip(out, *_limits(call.out_dtypes[0])).astype(call.out_dtypes[0])


def _squared_difference(call, a, b):
    """int8 SQUARED_DIFFERENCE: `kiln.kernels.elementwise.xp_squared_difference` on jax.numpy."""
    op = call.op
    out = xp_squared_difference(jnp, a.astype(_I64), _q(op.inputs[0]), b.astype(_I64), _q(op.inputs[1]),
                                _q(op.outputs[0]), call.out_dtypes[0])
    return out.astype(call.out_dtypes[0])


def _hybrid_transpose_conv(call, output_shape, w, x, bias=None):
    opts = call.opts
    x = jnp.asarray(x).astype(jnp.float32)
    out_hw, pads = transpose_conv_geometry(opts, np.asarray(output_shape), x.shape, w.shape)
    y = hybrid_transpose_conv(x, w, call.in_quant(1).scale, bias, out_hw=out_hw, pads=pads,
                              strides=(opts.stride_h, opts.stride_w))
    lo, hi = fused_range(opts.fused_activation_function, np.float32)
    return jnp.clip(y, np.float32(lo), np.float32(hi))


def _transpose_conv(call, output_shape, w, x, bias=None):
    op, opts = call.op, call.opts
    if is_hybrid_transpose_conv(op):
        return _hybrid_transpose_conv(call, output_shape, w, x, bias)
    out_c = w.shape[0]
    wide = op.inputs[2].dtype == DType.INT16
    # 16x8 sums may leave int32: float64 holds them exactly (|x·w| < 2^22, far fewer than 2^31 taps).
    acc_type = jnp.float64 if wide else jnp.int32
    xc = (x.astype(jnp.int32) - _zp(op.inputs[2])).astype(acc_type)
    acc = transpose_conv_2d(opts, output_shape, xc, jnp.asarray(np.asarray(w, np.int32), acc_type), acc_type=acc_type)
    acc = acc.astype(_I64)
    if bias is not None:
        acc = acc + jnp.asarray(bias).astype(_I64).reshape(-1)
    m, s = _channel_multipliers(_q(op.inputs[2]), _q(op.inputs[1]), _q(op.outputs[0]), out_c)
    out = (rescale_int64 if wide else rescale_twice)(acc, m, s).astype(_I64) + _zp(op.outputs[0])
    lo, hi = _activation_range(opts.fused_activation_function, _q(op.outputs[0]), call.out_dtypes[0])
    return jnp.clip(out, lo, hi).astype(call.out_dtypes[0])


def is_hybrid_transpose_conv(op) -> bool:
    x_t, w_t = op.inputs[2], op.inputs[1]
    return (x_t.dtype, w_t.dtype, op.outputs[0].dtype) == (DType.FLOAT32, DType.INT8, DType.FLOAT32)


def _hybrid_transpose_conv_check(op, opts):
    w_t = op.inputs[1]
    b_t = op.inputs[3] if len(op.inputs) > 3 else None
    if b_t is not None and b_t.dtype != DType.FLOAT32:
        return f"{op.name}: hybrid kernel with a {b_t.dtype.name} bias (float32 only)"
    if not w_t.is_constant:
        return f"{op.name}: hybrid int8 filter must be constants"
    if w_t.quantization is None or w_t.quantization.scale.size not in (1, w_t.shape[0]):
        return f"{op.name}: hybrid filter needs one scale or one per output channel"
    if len(op.inputs[2].shape) != 4:
        return f"{op.name}: input must be 4-D NHWC"
    if opts.fused_activation_function not in _SIMPLE_ACTS:
        return f"{op.name}: fused activation has no hybrid kernel"
    return None


def _transpose_conv_check(op, opts):
    x_t, w_t, out_t = op.inputs[2], op.inputs[1], op.outputs[0]
    b_t = op.inputs[3] if len(op.inputs) > 3 else None
    if is_hybrid_transpose_conv(op):
        return _hybrid_transpose_conv_check(op, opts)
    int8 = (x_t.dtype, w_t.dtype, out_t.dtype) == (DType.INT8,) * 3 and (b_t is None or b_t.dtype == DType.INT32)
    int16 = (x_t.dtype, w_t.dtype, out_t.dtype) == (DType.INT16, DType.INT8, DType.INT16) \
        and (b_t is None or b_t.dtype in (DType.INT32, DType.INT64))
    if not (int8 or int16):
        return (f"{op.name}: only the int8 kernel (int8 input, filter and output, int32 bias), the 16x8 one "
                "(int16 input and output, int8 filter, int32 / int64 bias) and the hybrid one (float32 around an "
                "int8 filter) are lowered")
    if int16 and operand_types(op) not in ops.require("TRANSPOSE_CONV").quantized:
        return f"{op.name}: kiln has no {operand_types(op)} TRANSPOSE_CONV kernel"
    if not w_t.is_constant or (b_t is not None and not b_t.is_constant):
        return f"{op.name}: quantized filter and bias must be constants"
    if np.any(w_t.quantization.zero_point != 0):
        return f"{op.name}: filter with non-zero zero points"
    if opts.fused_activation_function not in _SIMPLE_ACTS:
        return f"{op.name}: fused activation has no integer kernel"
    return None


def _same_params_check(op, opts):
    """CONCATENATION / PACK on codes: the kernel (as LiteRT's) takes only inputs quantized as
    the output, so the result is the codes moved."""
    q_out = op.outputs[0].quantization
    if op.outputs[0].dtype not in (DType.INT8, DType.UINT8, DType.INT16) or q_out is None or q_out.scale.size != 1:
        return f"{op.name}: only 8- and 16-bit outputs with one scale are lowered"
    for t in op.inputs:
        q = t.quantization
        same = q is not None and q.scale.size == 1 and np.float32(q.scale[0]) == np.float32(q_out.scale[0]) \
            and int(q.zero_point[0]) == int(q_out.zero_point[0])
        if t.dtype != op.outputs[0].dtype or not same:
            return f"{op.name}: input {t.name!r} is not quantized as the output (its kernel refuses it)"
    return None


def _int8_check(op, opts):
    return _per_tensor(op)


def _batch_matmul_check(op, opts):
    """int8, or 16x8 (int16 lhs and output, int16 or int8 rhs) where kiln has that kernel."""
    if op.inputs[0].dtype == DType.INT16:
        if operand_types(op) not in ops.require("BATCH_MATMUL").quantized:
            return f"{op.name}: kiln has no {operand_types(op)} BATCH_MATMUL kernel"
        return _per_tensor(op, (DType.INT16, DType.INT8))
    return _per_tensor(op)


def kernel_check(op) -> str | None:
    """Why not, when kiln has no reference kernel for the node's operand types."""
    key = operand_types(op)
    if key not in ops.require(op.op_type).quantized:
        return f"{op.name}: kiln has no {key} {op.op_type} kernel"
    return None


# -- RESIZE_BILINEAR ------------------------------------------------------------------------------

def _resize_bilinear(call, x, size):
    """Integer RESIZE_BILINEAR: `kiln.kernels.image.xp_resize_bilinear` on jax.numpy."""
    size = np.asarray(size).reshape(-1)
    out = xp_resize_bilinear(jnp, jnp.asarray(x).astype(_I64), (int(size[0]), int(size[1])),
                             bool(call.opts.align_corners), bool(call.opts.half_pixel_centers))
    return out.astype(call.out_dtypes[0])


def _resize_check(op, opts):
    x_t, size_t, y_t = op.inputs[0], op.inputs[1], op.outputs[0]
    if x_t.dtype not in (DType.INT8, DType.INT16) or y_t.dtype != x_t.dtype:
        return f"{op.name}: only int8 and int16 RESIZE_BILINEAR (output of the input's type) are lowered"
    if len(x_t.shape) != 4:
        return f"{op.name}: input must be 4-D NHWC"
    if opts.align_corners and opts.half_pixel_centers:
        return f"{op.name}: align_corners with half_pixel_centers (the reference kernel refuses it)"
    if size_t.is_constant:
        size = np.asarray(size_t.data).reshape(-1)
        if size.size != 2 or np.any(size <= 0):
            return f"{op.name}: size {size.tolist()} is not a positive [new_height, new_width]"
    return kernel_check(op)


#: Quantized forms of ops with float lowerings, each for the keys no plain row lowers
#: (kiln/xla/table.py's `fill`).
ROWS = Rows()
for _name in _UNARY:
    ROWS.gap(_name, _unary_lookup, _unary_check, [k for k in CODES if k in ops.require(_name).quantized])
ROWS.gap("MAX_POOL_2D", _max_pool, _pool_check, CODES)
ROWS.gap("AVERAGE_POOL_2D", _average_pool, _pool_check, CODES)
ROWS.gap("MEAN", _mean, _mean_check, ("int8", "int16"))
ROWS.gap("SUM", _sum, _sum_check, ("int8",))
ROWS.gap("SOFTMAX", _any_softmax, _softmax_check, ("int8", "int16"))
ROWS.gap("BATCH_MATMUL", _batch_matmul, _batch_matmul_check, ("int8", "int16"))
ROWS.gap("SQUARED_DIFFERENCE", _squared_difference, _int8_check, ("int8",))
ROWS.gap("TRANSPOSE_CONV", _transpose_conv, _transpose_conv_check, ("int8", "int16", HYBRID))
ROWS.gap("RESIZE_BILINEAR", _resize_bilinear, _resize_check, ("int8", "int16"))
_SHAPE_FLOAT = {row.op_name: row.fn for row in SHAPE_ROWS}
for _name in ("CONCATENATION", "PACK"):   # their float lowering, run on the codes
    ROWS.gap(_name, _SHAPE_FLOAT[_name], _same_params_check, CODES)
_binary_tables(ROWS)
