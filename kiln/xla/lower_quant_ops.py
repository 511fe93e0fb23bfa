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
* Integer arithmetic of kiln.kernels on jax.numpy: SOFTMAX (int8's float-table kernel),
  SQUARED_DIFFERENCE, and RESIZE_BILINEAR (int8, int16: `kiln.kernels.image.xp_resize_bilinear`,
  its source rows / columns and fractions computed while tracing from the static sizes). The
  weighted and windowed ops and MEAN / SUM run their kernel families (lower_families.py).

The other quantized activations (PRELU, L2_NORMALIZATION, LOG_SOFTMAX) are in
lower_quant_activations.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .. import ops
from ..errors import KilnError
from ..kernels.elementwise import xp_squared_difference
from ..kernels.fixedpoint import dtype_range as _limits
from ..kernels.image import xp_resize_bilinear
from ..kernels.softmax import softmax_codes
from ..ops.record import KernelCall, operand_types
from ..schema import DType
from .lower_shape import ROWS as SHAPE_ROWS
from .lowering import CODES, Rows, per_tensor

_I64 = jnp.int64


def _q(t):
    return t.quantization


def _zp(t) -> int:
    return int(t.quantization.zero_point[0])


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
    return per_tensor(op, codes)


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
    reason = per_tensor(op, (DType.INT8, DType.UINT8))
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


# -- SOFTMAX (int8: the reference kernel's fixed point, kiln.kernels.softmax) -------------

def _softmax(call, x):
    """int8 and 16x8 SOFTMAX: the reference kernel's `softmax_codes` on jax.numpy; rows so
    wide and flat that BUILTIN_REF aborts get the kernel's fallback (the optimized kernel's
    float table), traced only where such a row can occur."""
    op = call.op
    return softmax_codes(x.dtype, _q(op.inputs[0]), _q(op.outputs[0]), float(call.opts.beta), call.out_dtypes[0])(jnp, x)


def _softmax_check(op, opts):
    kind = op.inputs[0].dtype
    if kind not in (DType.INT8, DType.INT16) or op.outputs[0].dtype != kind or len(op.inputs[0].shape) == 0:
        return f"{op.name}: only int8 and 16x8 SOFTMAX (at least 1-D) are lowered"
    if kind == DType.INT16 and (operand_types(op) not in ops.require("SOFTMAX").quantized
                                or any(t.quantization.zero_point.any() for t in (op.inputs[0], op.outputs[0]))):
        return f"{op.name}: 16x8 SOFTMAX needs zero points 0 (and kiln's int16 kernel)"
    return per_tensor(op, (kind,))


# -- SQUARED_DIFFERENCE, CONCATENATION / PACK ---------------------------------------------------------

def _squared_difference(call, a, b):
    """int8 SQUARED_DIFFERENCE: `kiln.kernels.elementwise.xp_squared_difference` on jax.numpy."""
    op = call.op
    out = xp_squared_difference(jnp, a.astype(_I64), _q(op.inputs[0]), b.astype(_I64), _q(op.inputs[1]),
                                _q(op.outputs[0]), call.out_dtypes[0])
    return out.astype(call.out_dtypes[0])


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
    return per_tensor(op)


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
ROWS.gap("SOFTMAX", _softmax, _softmax_check, ("int8", "int16"))
ROWS.gap("SQUARED_DIFFERENCE", _squared_difference, _int8_check, ("int8",))
ROWS.gap("RESIZE_BILINEAR", _resize_bilinear, _resize_check, ("int8", "int16"))
_SHAPE_FLOAT = {row.op_name: row.fn for row in SHAPE_ROWS}
for _name in ("CONCATENATION", "PACK"):   # their float lowering, run on the codes
    ROWS.gap(_name, _SHAPE_FLOAT[_name], _same_params_check, CODES)
_binary_tables(ROWS)
