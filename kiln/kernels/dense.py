"""Kernel families of the dense products: FULLY_CONNECTED and BATCH_MATMUL, per number format
(kiln.kernels.family): float, integer (int8, 16x8, legacy uint8) and hybrid.

The integer formats are bit-exact with LiteRT 2.3's reference kernels (``BUILTIN_REF``):
``Σ (x − zp_x)(w − zp_w)`` exact, plus the bias, a requantization, the output zero point and
the fused activation's clamp. Measured (thousands of outputs each): FULLY_CONNECTED rescales
with one rounding (two differ on ~0.05 % of outputs), 16x8 included; BATCH_MATMUL rescales
int8 with two roundings by ``float32(s_a · s_b) / s_y`` (one differs on ~0.1 %), int16 with
the int64-accumulator rescaling. Hybrid FULLY_CONNECTED quantizes each input row on the fly
(kiln.kernels.hybrid) and rescales in float32 in LiteRT's order.

Weights and constant operands are prepared once (centred, laid out, in the exact type their
bound allows: `fixedpoint.ExactProduct`); operands a backend only knows at run time (XLA's
traced weights) are centred by ``run``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import OpError
from ..schema import Activation
from . import float_math
from .family import (
    Format,
    as_float,
    finish_float,
    float_bias,
    float_dtype,
    float_range,
    fused_activation,
    int16_zero_points,
    known,
    operand,
    out_params,
    params,
    reject_quantized,
    run_bias,
)
from .fixedpoint import (
    ExactProduct,
    Requantizer,
    activation_range,
    centred,
    centred_max,
    channel_multipliers,
    exact_matmul,
    exact_type,
    quantize_multiplier,
    uint8_multiplier,
)
from .hybrid import quantize_rows

F32 = np.float32
#: The fused activations LiteRT's FULLY_CONNECTED accepts at all.
FC_ACTIVATIONS = (Activation.NONE, Activation.RELU, Activation.RELU6, Activation.RELU_N1_TO_1)
HYBRID, INT8, INT16, UINT8 = "hybrid", "int8", "int16", "uint8"


def float_dot(xp, a, b, out=None):
    """A float product (a batch of them for 3-D operands) as the reference kernel's BLAS call
    takes it: the backend's (XLA: at full precision, or in bfloat16 under its dtype_policy).
    NumPy writes it into ``out`` when given."""
    return np.matmul(a, b, out=out) if xp is np else float_math.arithmetic(xp).matmul(a, b)


# -- FULLY_CONNECTED ------------------------------------------------------------------------------

def fc_shape(opts, x, w) -> tuple[int, ...]:
    """FULLY_CONNECTED's output shape (its records' shape rule), checked."""
    if len(w) != 2:
        raise OpError(f"FULLY_CONNECTED: weights must be 2-D [units, depth], got {list(w)}")
    units, depth = w
    if opts.keep_num_dims:
        if not x or x[-1] != depth:
            raise OpError(f"FULLY_CONNECTED: input {list(x)} last dim must equal weights depth {depth}")
        return (*x[:-1], units)
    size = int(np.prod(x)) if x else 1
    if depth == 0 or size % depth:
        raise OpError(f"FULLY_CONNECTED: input {list(x)} does not split into rows of {depth}")
    return (size // depth, units)


@dataclass
class FloatFc:
    dtype: np.dtype
    x_dtype: np.dtype
    w_dtype: np.dtype
    rows: int
    depth: int
    out_shape: tuple
    w_t: np.ndarray | None        # [depth, units], known weights
    bias: np.ndarray | None
    lo: float
    hi: float
    out_dtype: np.dtype


def prepare_float_fc(call, inputs) -> FloatFc:
    reject_quantized(call)
    x, w, bias = inputs[0], inputs[1], operand(inputs, 2)
    opts = call.opts
    if opts.weights_format != 0:
        raise OpError(f"FULLY_CONNECTED: only the DEFAULT weights format is supported, got {opts.weights_format}")
    act = opts.fused_activation_function
    if act not in FC_ACTIVATIONS:
        name = Activation(act).name if act in set(Activation) else str(act)
        raise OpError(f"FULLY_CONNECTED: fused activation {name} is not supported (LiteRT accepts NONE, RELU, "
                      "RELU_N1_TO_1 and RELU6)")
    x_dtype, w_dtype = float_dtype(call, x, "input"), float_dtype(call, w, "weights")
    dtype = np.result_type(x_dtype, w_dtype)
    out_shape = fc_shape(opts, tuple(x.shape), tuple(w.shape))
    units, depth = w.shape
    w_t = as_float(w, w_dtype).T if known(w) else None
    b = float_bias(call, bias, units)
    lo, hi = float_range(act, dtype)
    return FloatFc(dtype, x_dtype, w_dtype, int(np.prod(out_shape[:-1])), depth, out_shape, w_t, b, lo, hi,
                   call.out_dtypes[0])


def run_float_fc(xp, p: FloatFc, x, w=None, bias=None):
    w_t = p.w_t if p.w_t is not None else as_float(w, p.w_dtype).T
    y = float_dot(xp, as_float(x, p.x_dtype).reshape(p.rows, p.depth), w_t)
    return finish_float(xp, y, run_bias(p.bias, bias), p.lo, p.hi, p.out_dtype).reshape(p.out_shape)


@dataclass
class IntegerFc:
    rows: int
    depth: int
    out_shape: tuple
    zx: int
    zw: int
    product: ExactProduct | None    # the centred weights, transposed
    bound: int                      # of the partial sums, for weights known only at run time
    bias: np.ndarray | None
    requant: Requantizer


def _zp(q) -> int:
    return int(q.zero_point[0])


def _bias64(bias, channels: int):
    return None if bias is None else np.asarray(bias, np.int64).reshape(channels)


def prepare_integer_fc(call, inputs) -> IntegerFc:
    """int8 / 16x8 FULLY_CONNECTED (per-tensor or per-unit weights) and the legacy uint8 one
    (per-tensor weights with a zero point, GetQuantizedConvolutionMultipler's float32 product)."""
    x, w, bias = inputs[0], inputs[1], operand(inputs, 2)
    x_dtype = np.dtype(x.dtype)
    uint8 = x_dtype == np.uint8
    if x_dtype == np.int16:
        int16_zero_points(call, 0, -1)
    if w.ndim != 2:
        raise OpError(f"{call.op.name}: weights must be 2-D [units, depth], got {list(w.shape)}")
    x_qp, w_qp, out_qp = params(call, 0, "input"), params(call, 1, "weights", per_tensor=uint8), out_params(call)
    units, depth = w.shape
    size = int(np.prod(x.shape))
    if depth == 0 or size % depth:
        raise OpError(f"FULLY_CONNECTED: input {list(x.shape)} does not split into rows of {depth}")
    rows = size // depth
    out_shape = tuple(x.shape[:-1]) + (units,) if call.opts.keep_num_dims else (rows, units)
    zw = _zp(w_qp) if uint8 or not w_qp.per_channel else 0
    if uint8:
        m, s = uint8_multiplier(x_qp, w_qp, out_qp)
    elif w_qp.per_channel:
        m, s = channel_multipliers(x_qp, w_qp, out_qp, units)
    else:
        m, s = quantize_multiplier(float(x_qp.scale[0]) * float(w_qp.scale[0]) / float(out_qp.scale[0]))
    out_dtype = call.out_dtypes[0]
    lo, hi = activation_range(fused_activation(call), out_qp, out_dtype)
    a_bound = centred_max(x_dtype, _zp(x_qp))
    product = ExactProduct((w.astype(np.int64) - zw).T, a_bound) if known(w) else None
    b = _bias64(bias, units) if known(bias) else None
    bound = product.bound if product is not None else a_bound * depth * centred_max(w.dtype, zw)
    b_bound = int(np.abs(b).max(initial=0)) if b is not None else 0 if bias is None else 1 << 31
    requant = Requantizer("single", m, s, _zp(out_qp), lo, hi, out_dtype, bound + b_bound)
    return IntegerFc(rows, depth, out_shape, _zp(x_qp), zw, product, bound, b, requant)


def run_integer_fc(xp, p: IntegerFc, x, w=None, bias=None):
    x2 = x.reshape(p.rows, p.depth)
    if p.product is not None:
        acc = p.product(xp, centred(xp, x2, p.zx, p.product.type(xp)))
    else:   # weights known only at run time (a traced operand): an integer product
        dtype = exact_type(xp, p.bound)
        acc = exact_matmul(xp, centred(xp, x2, p.zx, dtype), centred(xp, w, p.zw, dtype).T, dtype)
    b = p.bias if p.bias is not None else (None if bias is None else bias.astype(xp.int64).reshape(-1))
    if b is not None:
        acc = acc + b
    return p.requant.requantize(xp, acc).reshape(p.out_shape)


@dataclass
class HybridFc:
    rows: int
    depth: int
    units: int
    out_shape: tuple
    product: ExactProduct
    row_sums: np.ndarray
    scales: np.ndarray
    per_channel: bool
    asymmetric: bool
    bias: np.ndarray | None
    lo: float
    hi: float
    out_dtype: np.dtype


def prepare_hybrid_fc(call, inputs) -> HybridFc:
    """Hybrid FULLY_CONNECTED: float32 input, int8 weights (one scale, or one per unit)."""
    x, w, bias = inputs[0], inputs[1], operand(inputs, 2)
    if w.ndim != 2 or w.dtype != np.int8 or x.dtype != np.float32:
        raise OpError(f"{call.op.name}: hybrid kernel takes float32 input and 2-D int8 weights, got "
                      f"{x.dtype} and {w.dtype} {list(w.shape)}")
    if not known(w):
        raise OpError(f"{call.op.name}: hybrid int8 weights must be constants")
    units, depth = w.shape
    if depth == 0 or int(np.prod(x.shape)) % depth:
        raise OpError(f"{call.op.name}: input {list(x.shape)} does not split into rows of {depth}")
    if call.opts.keep_num_dims and x.shape[-1] != depth:
        raise OpError(f"{call.op.name}: input {list(x.shape)} last dim must equal weights depth {depth}")
    rows = int(np.prod(x.shape)) // depth
    scales = np.asarray(params(call, 1, "weights", per_tensor=False).scale, F32).reshape(-1)
    lo, hi = float_range(call.opts.fused_activation_function, F32)
    out_shape = tuple(x.shape[:-1]) + (units,) if call.opts.keep_num_dims else (rows, units)
    return HybridFc(rows, depth, units, out_shape, ExactProduct(w.T, 128), w.sum(axis=1, dtype=np.int64),
                    scales, scales.size > 1, bool(call.opts.asymmetric_quantize_inputs),
                    hybrid_bias(call, bias, units), lo, hi, call.out_dtypes[0])


def hybrid_bias(call, bias, channels: int):
    """A hybrid kernel's float32 bias, checked (None where prepare does not see its value)."""
    if bias is None:
        return None
    if np.dtype(bias.dtype).kind != "f" or int(np.prod(bias.shape)) != channels:
        raise OpError(f"{call.op.name}: hybrid bias must be float with {channels} values, got "
                      f"{bias.dtype} {list(bias.shape)}")
    return np.asarray(bias).astype(F32, copy=False).reshape(-1) if known(bias) else None


def run_hybrid_fc(xp, p: HybridFc, x, w=None, bias=None):
    """Before the clamp: rows quantized, the exact int8 product, LiteRT's float32 rescaling
    ``bias + float(dot − zp·Σw) · (s_row · s_w)``; an all-zero input skips the product (LiteRT
    does), which gives the bias."""
    f = float_math.arithmetic(xp)
    rows = x.reshape(p.rows, p.depth).astype(F32)
    b = run_bias(p.bias, bias)
    base = xp.zeros((p.rows, p.units), F32) if b is None else xp.broadcast_to(b.astype(F32), (p.rows, p.units))
    if xp is np and not rows.any():
        y = np.array(base, F32)
    else:
        q, scale, offset = quantize_rows(xp, rows, p.asymmetric)
        if not p.per_channel:
            scale = f.mul(scale, p.scales[0])
        dot = p.product(xp, q)
        if p.asymmetric:
            dot = dot - p.row_sums[None, :] * offset[:, None].astype(xp.int64)
        factor = scale[:, None] if not p.per_channel else f.mul(scale[:, None], p.scales[None, :])
        y = f.add(base, f.mul(dot.astype(F32), factor))
        if xp is not np:
            y = xp.where(xp.any(rows != 0), y, base)
    return clamp_float(xp, y, p.lo, p.hi, p.out_dtype).reshape(p.out_shape)


def clamp_float(xp, y, lo, hi, out_dtype):
    """The hybrid kernels' fused activation: a clamp of their float32 result."""
    if xp is np:
        return np.clip(y, lo, hi, out=y).astype(out_dtype, copy=False)
    return xp.clip(y, F32(lo), F32(hi)).astype(out_dtype)


FULLY_CONNECTED = {
    None: Format(prepare_float_fc, run_float_fc, (0, 1, 2)),
    **dict.fromkeys((INT8, INT16, UINT8), Format(prepare_integer_fc, run_integer_fc, (0, 1, 2))),
    HYBRID: Format(prepare_hybrid_fc, run_hybrid_fc, (0, 1, 2)),
}


# -- BATCH_MATMUL ---------------------------------------------------------------------------------

def bmm_shape(opts, a, b) -> tuple[int, ...]:
    """BATCH_MATMUL's output shape (its record's shape rule), checked."""
    if not (2 <= len(a) <= 5 and 2 <= len(b) <= 5):
        raise OpError(f"BATCH_MATMUL: operands must have rank 2 to 5, got {list(a)} and {list(b)}")
    m, ka = (a[-1], a[-2]) if opts.adj_x else (a[-2], a[-1])
    kb, n = (b[-1], b[-2]) if opts.adj_y else (b[-2], b[-1])
    if ka != kb:
        raise OpError(f"BATCH_MATMUL: contraction sizes differ ({list(a)} adj_x={opts.adj_x}, "
                      f"{list(b)} adj_y={opts.adj_y})")
    try:
        batch = np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
    except ValueError:
        raise OpError(f"BATCH_MATMUL: batch dims of {list(a)} and {list(b)} do not broadcast") from None
    return (*batch, m, n)


def _adjoint(xp, a, b, opts):
    return (xp.swapaxes(a, -1, -2) if opts.adj_x else a), (xp.swapaxes(b, -1, -2) if opts.adj_y else b)


@dataclass
class FloatBmm:
    opts: object
    dtype_a: np.dtype
    dtype_b: np.dtype
    out_dtype: np.dtype


def prepare_float_bmm(call, inputs) -> FloatBmm:
    reject_quantized(call)
    a, b = inputs[0], inputs[1]
    dtypes = float_dtype(call, a, "lhs"), float_dtype(call, b, "rhs")
    bmm_shape(call.opts, tuple(a.shape), tuple(b.shape))
    return FloatBmm(call.opts, *dtypes, call.out_dtypes[0])


def run_float_bmm(xp, p: FloatBmm, a, b):
    a, b = _adjoint(xp, as_float(a, p.dtype_a), as_float(b, p.dtype_b), p.opts)
    y = float_dot(xp, a, b)
    return y.astype(p.out_dtype) if xp is not np else y.astype(p.out_dtype, copy=False)


@dataclass
class IntegerBmm:
    opts: object
    zero_points: tuple[int, int]
    dtype: np.dtype                 # the exact type on NumPy (`exact_type`)
    bound: int
    fixed: list                     # operands known when prepared, centred (NumPy)
    requant: Requantizer


def prepare_integer_bmm(call, inputs) -> IntegerBmm:
    a, b = inputs[0], inputs[1]
    if np.dtype(a.dtype) == np.int16:
        int16_zero_points(call, 0, 1, -1)
    a_qp, b_qp, out_qp = params(call, 0, "lhs"), params(call, 1, "rhs"), out_params(call)
    bmm_shape(call.opts, tuple(a.shape), tuple(b.shape))
    za, zb = _zp(a_qp), _zp(b_qp)
    depth = a.shape[-2] if call.opts.adj_x else a.shape[-1]
    bound = depth * centred_max(a.dtype, za) * centred_max(b.dtype, zb)
    product = np.float32(np.float32(a_qp.scale[0]) * np.float32(b_qp.scale[0]))
    m, s = quantize_multiplier(float(product) / float(out_qp.scale[0]))
    out_dtype = call.out_dtypes[0]
    kind = "int64" if np.dtype(a.dtype) == np.int16 else "double"   # 16x8: rhs int16 or int8
    requant = Requantizer(kind, m, s, _zp(out_qp), *activation_range(Activation.NONE, out_qp, out_dtype),
                          out_dtype, bound)
    dtype = exact_type(np, bound)
    fixed = [centred(np, v, z, dtype) if known(v) else None for v, z in ((a, za), (b, zb))]
    return IntegerBmm(call.opts, (za, zb), dtype, bound, fixed, requant)


def run_integer_bmm(xp, p: IntegerBmm, a, b):
    dtype = exact_type(xp, p.bound)
    fa, fb = [f if f is not None and xp is np else centred(xp, v, z, dtype)
              for f, v, z in zip(p.fixed, (a, b), p.zero_points)]
    fa, fb = _adjoint(xp, fa, fb, p.opts)
    return p.requant.requantize(xp, exact_matmul(xp, fa, fb, dtype))


BATCH_MATMUL = {
    None: Format(prepare_float_bmm, run_float_bmm, (0, 1)),
    **dict.fromkeys((INT8, INT16), Format(prepare_integer_bmm, run_integer_bmm, (0, 1))),
}
