"""XLA's runs of kiln's kernel families (kiln.kernels.family): a node of an op with a family is
its format's ``prepare`` while tracing (shapes and constants are static there) and its ``run``
over jax.numpy — the reference kernel's own arithmetic, so its integer formats are bit-exact
with it. Their float32 steps use `FLOAT32`, XLA's rounding of float32 arithmetic.

The checks below say which nodes of each key the backend claims (what prepare cannot take
while tracing, and what LiteRT's kernels refuse).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import ops
from ..kernels.float_math import Float32
from ..ops.record import HYBRID, operand_types
from ..schema import Activation, DType
from .lowering import CODES, Rows, per_tensor, policy_product

F32, F64 = jnp.float32, jnp.float64


class XlaFloat32(Float32):
    """kiln.kernels.float_math's float32 arithmetic (each operation rounded once to float32) as
    XLA's CPU compiler keeps it. Measured there: it fuses a float32 product into the sum it
    feeds (a multiply-add rounds once), drops a float64 -> float32 -> float64 round trip, and
    divides by a constant through its reciprocal (an ulp off). So each operation runs in
    float64 — exact for a product of float32 values, and for + - / sqrt rounded twice without
    harm (53 >= 2·24 + 2 bits) — and is rounded to float32 by ``reduce_precision``, an
    operation XLA keeps. A float32 division by a constant computed as a float64 product with
    its reciprocal still rounds right: a float32 quotient lies 2^-49 (relative) or more from a
    rounding boundary, the float64 error is 2^-52. XLA on CPU flushes float32 subnormals to
    zero: results below 1.2e-38 in magnitude may differ from NumPy's."""

    xp = jnp

    def round(self, x):
        return lax.reduce_precision(x, exponent_bits=8, mantissa_bits=23).astype(F32)

    @staticmethod
    def _wide(a):
        return jnp.asarray(a).astype(F64)

    def mul(self, a, b):
        return self.round(self._wide(a) * self._wide(b))

    def div(self, a, b):
        return self.round(self._wide(a) / self._wide(b))

    def add(self, a, b):
        return self.round(self._wide(a) + self._wide(b))

    def sub(self, a, b):
        return self.round(self._wide(a) - self._wide(b))

    def sqrt(self, a):
        return self.round(jnp.sqrt(self._wide(a)))

    def matmul(self, a, b):
        """At full precision (no TF32 on GPUs), or under the bfloat16 dtype_policy on bfloat16
        operands accumulating in float32 (the tensor cores' mode)."""
        return policy_product(jnp.matmul, a, b)

    def divide_exactly(self, a, constant: float):
        """A divisor XLA cannot fold into a product with its reciprocal."""
        return a / lax.optimization_barrier(jnp.full(jnp.shape(a), constant, F64))

    def sum_last(self, x):
        """Left to right over the last axis, one float32 sum at a time (a scan over it)."""
        columns = jnp.moveaxis(jnp.asarray(x).astype(F32), -1, 0)
        total, _ = lax.scan(lambda acc, column: (self.add(acc, column), None), columns[0], columns[1:])
        return total[..., None]

    def recur(self, step, h, xs, *, reverse: bool = False):
        def scan_step(h, x_t):
            h = step(h, x_t)
            return h, h[0] if isinstance(h, tuple) else h
        h, out = lax.scan(scan_step, h, xs, reverse=reverse)
        return out, h


#: The float32 arithmetic of the families' runs on jax.numpy (kiln/xla/table.py's `fill` hands
#: it to kiln.kernels.float_math).
FLOAT32 = XlaFloat32()


def lowering(name: str):
    """Op ``name``'s nodes through its kernel family: the node's format, prepared while tracing
    and run on jax.numpy."""
    formats = ops.require(name).formats

    def lower(call, *inputs):
        fmt = formats[operand_types(call.op)]
        prepared = fmt.prepare(call, inputs)
        return fmt.run(jnp, prepared, *[inputs[k] if k < len(inputs) else None for k in fmt.activations])

    lower.__qualname__ = f"lowering({name})"
    return lower


# -- which nodes XLA claims ------------------------------------------------------------------------

_SIMPLE_ACTS = (Activation.NONE, Activation.RELU, Activation.RELU6, Activation.RELU_N1_TO_1)


def is_hybrid(op, x: int = 0) -> bool:
    """Float32 input and output around int8 weights: LiteRT's hybrid kernels."""
    xt, w = op.inputs[x], op.inputs[1] if len(op.inputs) > 1 else None
    return (xt is not None and w is not None and xt.dtype == DType.FLOAT32 and w.dtype == DType.INT8
            and op.outputs[0].dtype == DType.FLOAT32)


def hybrid_check(op, opts):
    """None for a hybrid node lowered here, else why not."""
    w = op.inputs[1]
    if not w.is_constant:
        return f"{op.name}: hybrid int8 weights must be constants"
    if op.op_type == "TRANSPOSE_CONV":
        if w.quantization is None or w.quantization.scale.size not in (1, w.shape[0]):
            return f"{op.name}: hybrid filter needs one scale or one per output channel"
        if len(op.inputs[2].shape) != 4:
            return f"{op.name}: input must be 4-D NHWC"
    elif op.op_type != "FULLY_CONNECTED":
        channels = w.shape[3] if op.op_type == "DEPTHWISE_CONV_2D" else w.shape[0]
        if w.quantization.scale.size != channels:
            return f"{op.name}: hybrid kernel with per-tensor int8 weights (the reference kernel refuses it too)"
    if opts.fused_activation_function not in _SIMPLE_ACTS:
        return f"{op.name}: fused activation {Activation(opts.fused_activation_function).name} is not lowered"
    for t in (*op.inputs[2:], *op.outputs):
        if t is not None and t.dtype != DType.FLOAT32:
            return f"{op.name}: hybrid kernel with a {t.dtype.name} tensor {t.name!r}"
    return None


def weighted_check(op, opts):
    """None when the node is the integer (or hybrid) kernel lowered here, else why not."""
    x = 2 if op.op_type == "TRANSPOSE_CONV" else 0
    if is_hybrid(op, x):
        return hybrid_check(op, opts)

    def dtype(k):
        return op.inputs[k].dtype if k < len(op.inputs) and op.inputs[k] is not None else None

    b = 3 if op.op_type == "TRANSPOSE_CONV" else 2
    x_t, w_t, b_t, out_t = dtype(x), dtype(1), dtype(b), op.outputs[0].dtype
    types = [x_t, w_t, b_t, out_t]
    int8 = (x_t, w_t, out_t) == (DType.INT8,) * 3 and b_t in (None, DType.INT32)
    int16 = (x_t, w_t, out_t) == (DType.INT16, DType.INT8, DType.INT16) and b_t in (None, DType.INT32, DType.INT64)
    uint8 = (x_t, w_t, out_t) == (DType.UINT8,) * 3 and b_t in (None, DType.INT32) and op.op_type != "TRANSPOSE_CONV"
    if not (int8 or int16 or uint8):
        return (f"{op.name} with {[t.name if t else None for t in types]} tensors: only the int8 kernel "
                "(int8 input, weights and output, int32 bias), the 16x8 one (int16 activations, int8 "
                "weights, int32/int64 bias), the legacy uint8 one (uint8 input, weights and output, int32 "
                "bias) and the hybrid one (float32 around int8 weights) are lowered")
    if operand_types(op) not in ops.require(op.op_type).quantized:
        return f"{op.name}: kiln has no {operand_types(op)} {op.op_type} kernel"
    if uint8 and op.inputs[1].quantization.scale.size != 1:
        return f"{op.name}: uint8 weights with {op.inputs[1].quantization.scale.size} scales (the kernel takes one)"
    if int16 and (op.inputs[x].quantization.zero_point.any() or op.outputs[0].quantization.zero_point.any()):
        return f"{op.name}: 16x8 activations with non-zero zero points (the reference kernel refuses them)"
    if op.op_type != "FULLY_CONNECTED" and (not op.inputs[1].is_constant or
                                            (b_t is not None and not op.inputs[b].is_constant)):
        return f"{op.name}: quantized filter and bias must be constants"
    q_w = op.inputs[1].quantization
    if (q_w.scale.size > 1 or op.op_type == "TRANSPOSE_CONV") and np.any(q_w.zero_point != 0):
        return f"{op.name}: per-channel weights with non-zero zero points"
    if opts.fused_activation_function not in _SIMPLE_ACTS:
        return f"{op.name}: fused activation {Activation(opts.fused_activation_function).name} has no integer kernel"
    if op.op_type == "FULLY_CONNECTED" and opts.weights_format != 0:
        return "FULLY_CONNECTED: shuffled weights are not lowered"
    return None


def _pool_check(op, opts):
    reason = per_tensor(op, (DType.INT8, DType.UINT8, DType.INT16))
    if reason:
        return reason
    q_in, q_out = op.inputs[0].quantization, op.outputs[0].quantization
    if np.float32(q_in.scale[0]) != np.float32(q_out.scale[0]) or q_in.zero_point[0] != q_out.zero_point[0]:
        return f"{op.name}: input and output quantization differ (the reference kernel refuses it)"
    if opts.fused_activation_function not in _SIMPLE_ACTS or min(opts.filter_height, opts.filter_width) < 1:
        return f"{op.name}: fused activation or filter size has no integer kernel"
    if len(op.inputs[0].shape) != 4:
        return f"{op.name}: input must be 4-D"
    return None


def _batch_matmul_check(op, opts):
    """int8, or 16x8 (int16 lhs and output, int16 or int8 rhs) where kiln has that kernel."""
    if op.inputs[0].dtype == DType.INT16:
        if operand_types(op) not in ops.require("BATCH_MATMUL").quantized:
            return f"{op.name}: kiln has no {operand_types(op)} BATCH_MATMUL kernel"
        return per_tensor(op, (DType.INT16, DType.INT8))
    return per_tensor(op)


#: Every family's entries of the XLA table: the float format, then the quantized ones.
ROWS = Rows()
for _name in ("FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D"):
    ROWS.add(_name, lowering(_name))
    ROWS.add(_name, lowering(_name), types=(*CODES, HYBRID), check=weighted_check)
ROWS.add("TRANSPOSE_CONV", lowering("TRANSPOSE_CONV"), static=(0,))
ROWS.add("TRANSPOSE_CONV", lowering("TRANSPOSE_CONV"), types=("int8", "int16", HYBRID), static=(0,),
         check=weighted_check)
ROWS.add("BATCH_MATMUL", lowering("BATCH_MATMUL"))
ROWS.add("BATCH_MATMUL", lowering("BATCH_MATMUL"), types=("int8", "int16"), check=_batch_matmul_check)
for _name in ("MAX_POOL_2D", "AVERAGE_POOL_2D"):
    ROWS.add(_name, lowering(_name))
    ROWS.add(_name, lowering(_name), types=CODES, check=_pool_check)
ROWS.add("MEAN", lowering("MEAN"), static=(1,))
ROWS.add("MEAN", lowering("MEAN"), types=("int8", "int16"), static=(1,),
         check=lambda op, opts: per_tensor(op, (DType.INT8, DType.INT16)))
ROWS.add("SUM", lowering("SUM"), static=(1,))
ROWS.add("SUM", lowering("SUM"), types=("int8",), static=(1,), check=lambda op, opts: per_tensor(op))
