"""Quantized activations — PRELU, L2_NORMALIZATION and LOG_SOFTMAX — bit-exact with their
kernels in kiln.kernels.activations (the 8-bit unary ones are lookups: lower_quant_ops).

* PRELU (int8, uint8 and 16x8): the kernel's own arithmetic, written once over an array
  namespace (`kiln.kernels.activations.xp_prelu`) and run here on jax.numpy int64.
* L2_NORMALIZATION (int8): the inverse-square-root Newton steps are
  `kiln.kernels.activations.l2_normalize_centered`, written once over an array namespace and run here
  on jax.numpy int64.
* LOG_SOFTMAX (int8): the kernel's float32 steps from tables of its own NumPy values, the
  row sums in NumPy's pairwise order, and each row sum's log (see `_log_softmax`).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..kernels.activations import l2_normalize_centered, xp_prelu
from ..schema import Activation, DType
from ..kernels.fixedpoint import dtype_range as _limits
from .lower_quant_ops import _q, _zp, kernel_check
from .lowering import Rows

_I64 = jnp.int64
F32 = np.float32


def _one_scale(op) -> str | None:
    for t in (*op.inputs, *op.outputs):
        if t is None or t.dtype.name.startswith("FLOAT"):
            continue
        q = t.quantization
        if q is None or q.scale.size != 1:
            return f"{op.name}: tensor {t.name!r} is not quantized with one scale"
    return None


# -- PRELU ----------------------------------------------------------------------------------------

def _prelu(call, x, alpha):
    """Integer PRELU: the kernel's arithmetic (`kiln.kernels.activations.xp_prelu`) on jax.numpy."""
    op = call.op
    out = xp_prelu(jnp, jnp.asarray(x).astype(_I64), _q(op.inputs[0]), jnp.asarray(alpha).astype(_I64),
                   _q(op.inputs[1]), _q(op.outputs[0]), call.out_dtypes[0])
    return out.astype(call.out_dtypes[0])


def _prelu_check(op, opts):
    x_t, a_t, y_t = op.inputs[0], op.inputs[1], op.outputs[0]
    kinds = (x_t.dtype, a_t.dtype, y_t.dtype)
    if kinds not in ((DType.INT8,) * 3, (DType.UINT8,) * 3, (DType.INT16, DType.INT8, DType.INT16)):
        return (f"{op.name}: only int8, uint8 and 16x8 (int16 input and output, int8 alpha) PRELU are lowered, "
                f"not {[k.name for k in kinds]}")
    try:
        if np.broadcast_shapes(tuple(a_t.shape), tuple(x_t.shape)) != tuple(x_t.shape):
            raise ValueError
    except ValueError:
        return f"{op.name}: alpha {list(a_t.shape)} does not broadcast into the input {list(x_t.shape)}"
    return kernel_check(op) or _one_scale(op)


# -- L2_NORMALIZATION -----------------------------------------------------------------------------

def _l2_normalization(call, x):
    centered = jnp.asarray(x).astype(_I64) - _zp(call.op.inputs[0])
    out = l2_normalize_centered(jnp, centered)
    return jnp.clip(out, *_limits(call.out_dtypes[0])).astype(call.out_dtypes[0])


def _l2_check(op, opts):
    x_t, y_t = op.inputs[0], op.outputs[0]
    if (x_t.dtype, y_t.dtype) != (DType.INT8, DType.INT8) or len(x_t.shape) == 0:
        return f"{op.name}: only int8 L2_NORMALIZATION (at least 1-D) is lowered"
    if opts.fused_activation_function != Activation.NONE:
        return f"{op.name}: fused activation {Activation(opts.fused_activation_function).name} has no integer kernel"
    reason = _one_scale(op)
    if reason:
        return reason
    q = y_t.quantization
    if F32(q.scale[0]) != F32(1 / 128) or int(q.zero_point[0]) != 0:
        return f"{op.name}: int8 output must have scale 1/128 and zero point 0 (the reference kernel refuses it)"
    return None


# -- LOG_SOFTMAX (int8: the kernel's float32 steps) -------------------------------------------------

def _numpy_sum(v):
    """float32 sum over the last axis (kept) in NumPy's pairwise order — the order of
    kiln's kernel's ``sum(axis=-1, dtype=float32)``: below 8 terms left to right; up to 128,
    eight running lanes, combined ((0+1)+(2+3))+((4+5)+(6+7)), then the tail; beyond,
    split in two (the first half a multiple of 8) and each half summed so."""
    n = v.shape[-1]
    if n < 8:
        total = jnp.zeros(v.shape[:-1], jnp.float32)
        for i in range(n):
            total = total + v[..., i]
        return total
    if n <= 128:
        lanes = v[..., :8]
        body = n - n % 8
        for i in range(8, body, 8):
            lanes = lanes + v[..., i:i + 8]
        r = [lanes[..., j] for j in range(8)]
        total = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        for i in range(body, n):
            total = total + v[..., i]
        return total
    half = n // 2
    half -= half % 8
    return _numpy_sum(v[..., :half]) + _numpy_sum(v[..., half:])


def _log_softmax(call, x):
    """kiln.kernels.activations.log_softmax step for step. The dequantized codes, their
    differences to the row maximum and those differences' exp are tables over (maximum, code)
    pairs the kernel's own NumPy calls fill; the row sums add in NumPy's order; log(Σ) is
    the float64 log rounded to float32. Measured on 840,000 outputs (row lengths 5-1,000,
    input scales 0.01-1): equal to the kernel's everywhere; kernel and lowering alike differ
    from BUILTIN_REF on 4 (NumPy's float32 exp / log against the C library's)."""
    q_x, q_y = _q(call.op.inputs[0]), _q(call.op.outputs[0])
    lo, hi = _limits(np.int8)
    real = (F32(q_x.scale[0]) * (np.arange(lo, hi + 1) - int(q_x.zero_point[0])).astype(F32)).astype(F32)
    shifted = (real[None, :] - real[:, None]).astype(F32)            # [maximum's code, code]
    with np.errstate(under="ignore", over="ignore"):   # (pairs above the maximum are never read)
        exps = np.exp(shifted).astype(F32)
    codes = jnp.asarray(x).astype(jnp.int32) - lo
    pair = jnp.max(codes, axis=-1, keepdims=True) * (hi - lo + 1) + codes
    diff = jnp.take(jnp.asarray(shifted.reshape(-1)), pair)
    total = _numpy_sum(jnp.take(jnp.asarray(exps.reshape(-1)), pair))[..., None]
    log_total = jnp.log(total.astype(jnp.float64)).astype(jnp.float32)
    f64 = jnp.float64
    result = (diff.astype(f64) - log_total.astype(f64)).astype(jnp.float32)      # float32 a − b
    scaled = (result.astype(f64) / float(F32(q_y.scale[0]))).astype(jnp.float32).astype(f64)
    out = jnp.sign(scaled) * jnp.floor(jnp.abs(scaled) + 0.5) + int(q_y.zero_point[0])
    return jnp.clip(out, *_limits(call.out_dtypes[0])).astype(call.out_dtypes[0])


def _log_softmax_check(op, opts):
    x_t, y_t = op.inputs[0], op.outputs[0]
    if (x_t.dtype, y_t.dtype) != (DType.INT8, DType.INT8) or len(x_t.shape) == 0:
        return f"{op.name}: only int8 LOG_SOFTMAX (at least 1-D) is lowered"
    return kernel_check(op) or _one_scale(op)


#: Quantized forms of ops with float lowerings, for the keys no plain row lowers.
ROWS = Rows()
ROWS.gap("PRELU", _prelu, _prelu_check, ("int8", "uint8", "int16"))
ROWS.gap("L2_NORMALIZATION", _l2_normalization, _l2_check, ("int8",))
ROWS.gap("LOG_SOFTMAX", _log_softmax, _log_softmax_check, ("int8",))
