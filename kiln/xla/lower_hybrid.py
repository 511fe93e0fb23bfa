"""Hybrid (dynamic-range) FULLY_CONNECTED / CONV_2D / DEPTHWISE_CONV_2D: float activations,
int8 weights, as kiln.kernels.hybrid computes them and bit-exact with it.

Each row (FULLY_CONNECTED) or batch entry (the convolutions) of the input is quantized on the
fly — float32 steps and the float64 ones exactly where the reference takes them — multiplied
with the int8 weights in int32, and rescaled to float in the reference's order.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..errors import OpError
from ..kernels.float_math import Float32
from ..ops.windowed import window_geometry
from ..schema import Activation, DType

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

    def sum_last(self, x):
        """Left to right over the last axis, one float32 sum at a time (a scan over it)."""
        columns = jnp.moveaxis(jnp.asarray(x).astype(F32), -1, 0)
        total, _ = lax.scan(lambda acc, column: (self.add(acc, column), None), columns[0], columns[1:])
        return total[..., None]


#: The float32 arithmetic of the hybrid lowerings.
FLOAT32 = XlaFloat32()


def _round_half_away(x):
    return jnp.sign(x) * jnp.floor(jnp.abs(x) + 0.5)


def _divide_exactly(a, constant: float):
    """float64 ``a / constant`` correctly rounded: XLA turns a division by a constant into a
    product with its reciprocal, so the divisor is one it cannot fold."""
    return a / lax.optimization_barrier(jnp.full(jnp.shape(a), constant, F64))


def quantize_rows_asymmetric(x):
    """(int32 values in [-128, 127], float32 scale, int32 zero point) per row of 2-D ``x``."""
    f = FLOAT32
    rmin = jnp.minimum(F32(0), x.min(axis=1)).astype(F32)
    rmax = jnp.maximum(F32(0), x.max(axis=1)).astype(F32)
    flat = rmin == rmax
    scale = _divide_exactly(jnp.where(flat, F32(1), f.sub(rmax, rmin)).astype(F64), 255.0)
    rmin64, rmax64 = rmin.astype(F64), rmax.astype(F64)
    from_min, from_max = -128.0 - rmin64 / scale, 127.0 - rmax64 / scale
    zero_point = jnp.where(128.0 + jnp.abs(rmin64 / scale) < 127.0 + jnp.abs(rmax64 / scale), from_min, from_max)
    nudged = jnp.clip(_round_half_away(zero_point), -128, 127).astype(jnp.int32)
    scale32 = jnp.where(flat, F32(1), f.round(scale))
    nudged = jnp.where(flat, 0, nudged)
    inverse = f.round(1.0 / scale32.astype(F64))
    values = f.add(nudged[:, None].astype(F32), f.mul(x, inverse[:, None]))
    q = jnp.clip(_round_half_away(values.astype(F64)), -128, 127).astype(jnp.int32)
    return jnp.where(flat[:, None], 0, q), scale32, nudged


def quantize_rows_symmetric(x):
    """(int32 values in [-127, 127], float32 scale) per row of 2-D ``x``."""
    f = FLOAT32
    rng = jnp.maximum(jnp.abs(x.min(axis=1)), jnp.abs(x.max(axis=1))).astype(F32)
    flat = rng == 0
    safe = jnp.where(flat, F32(1), rng)
    scale = jnp.where(flat, F32(1), f.div(safe, F32(127)))
    inverse = f.div(F32(127), safe)
    q = jnp.clip(_round_half_away(f.mul(x, inverse[:, None]).astype(F64)), -127, 127).astype(jnp.int32)
    return jnp.where(flat[:, None], 0, q), scale


_mul, _add = FLOAT32.mul, FLOAT32.add


def _dot(a, b):
    return lax.dot_general(a, b, (((a.ndim - 1,), (1,)), ((), ())), preferred_element_type=jnp.int32)


def hybrid_fully_connected(x, w, w_scale, bias, *, asymmetric: bool):
    """Before the activation: x [rows, depth] float32, w [units, depth] int8 (numpy)."""
    units = w.shape[0]
    out = jnp.zeros((x.shape[0], units), F32) if bias is None else \
        jnp.broadcast_to(jnp.asarray(bias).astype(F32), (x.shape[0], units))
    per_channel = np.asarray(w_scale).size > 1
    if asymmetric:
        q, scale, offset = quantize_rows_asymmetric(x)
    else:
        q, scale = quantize_rows_symmetric(x)
    if not per_channel:
        scale = _mul(scale, np.float32(np.asarray(w_scale).reshape(-1)[0]))
    dot = _dot(q, np.asarray(w, np.int32))
    if asymmetric:
        dot = dot - np.asarray(w, np.int32).sum(axis=1)[None, :] * offset[:, None]
    factor = scale[:, None] if not per_channel else _mul(scale[:, None], np.asarray(w_scale, np.float32)[None, :])
    result = _add(out, _mul(dot.astype(F32), factor))
    return jnp.where(jnp.any(x != 0), result, out)  # LiteRT skips the product for an all-zero input


def _batch_windows(call, x, w, kernel_hw):
    """Per batch entry: quantize (asymmetric), centre, pad; returns (taps list, scale, geometry)."""
    opts = call.opts
    n = x.shape[0]
    q, scale, offset = quantize_rows_asymmetric(x.reshape(n, -1))
    centered = q.reshape(x.shape) - offset.reshape(-1, 1, 1, 1)
    dil = (opts.dilation_h_factor, opts.dilation_w_factor)
    (oh, ow), pads = window_geometry(opts, x.shape[1:3], kernel_hw, dil)
    xp = jnp.pad(centered, ((0, 0), *pads, (0, 0)))
    sh, sw = opts.stride_h, opts.stride_w
    taps = [lax.slice(xp, (0, i * dil[0], j * dil[1], 0),
                      (n, i * dil[0] + (oh - 1) * sh + 1, j * dil[1] + (ow - 1) * sw + 1, xp.shape[3]), (1, sh, sw, 1))
            for i in range(kernel_hw[0]) for j in range(kernel_hw[1])]
    return taps, scale, (oh, ow)


def hybrid_conv(call, x, w, w_scale, bias):
    out_c, kh, kw, in_c = w.shape
    if x.shape[3] != in_c:
        raise OpError(f"CONV_2D: hybrid kernel for input {list(x.shape)} and filter {list(w.shape)} (one group only)")
    taps, scale, (oh, ow) = _batch_windows(call, x, w, (kh, kw))
    cols = jnp.concatenate(taps, axis=3) if len(taps) > 1 else taps[0]
    acc = _dot(cols.reshape(-1, kh * kw * in_c), np.asarray(w, np.int32).reshape(out_c, -1))
    out = _mul(acc.reshape(x.shape[0], oh, ow, out_c).astype(F32), np.asarray(w_scale, np.float32))
    out = _mul(out, scale.reshape(-1, 1, 1, 1))
    return out if bias is None else _add(out, jnp.asarray(bias).astype(F32).reshape(-1))


def hybrid_depthwise(call, x, w, w_scale, bias):
    _, kh, kw, out_c = w.shape
    if x.shape[3] == 0 or out_c % x.shape[3]:
        raise OpError(f"DEPTHWISE_CONV_2D: filter channels {out_c} are not a multiple of the input's {list(x.shape)}")
    taps, scale, _ = _batch_windows(call, x, w, (kh, kw))
    multiplier = out_c // x.shape[3]
    weights = np.asarray(w, np.int32)[0].reshape(kh * kw, out_c)
    acc = None
    for k, tap in enumerate(taps):
        tap = jnp.repeat(tap, multiplier, axis=3) if multiplier > 1 else tap
        acc = tap * weights[k] if acc is None else acc + tap * weights[k]
    factor = _mul(np.asarray(w_scale, np.float32)[None, :], scale[:, None])
    out = _mul(acc.astype(F32), factor[:, None, None, :])
    return out if bias is None else _add(out, jnp.asarray(bias).astype(F32).reshape(-1))


def is_hybrid(op) -> bool:
    """Float32 input and output around int8 weights: LiteRT's hybrid kernels."""
    x, w = op.inputs[0], op.inputs[1] if len(op.inputs) > 1 else None
    return (x is not None and w is not None and x.dtype == DType.FLOAT32 and w.dtype == DType.INT8
            and op.outputs[0].dtype == DType.FLOAT32)


def hybrid_check(op, opts):
    """None for a hybrid node lowered here, else why not."""
    w = op.inputs[1]
    if not w.is_constant:
        return f"{op.name}: hybrid int8 weights must be constants"
    if op.op_type != "FULLY_CONNECTED":
        channels = w.shape[3] if op.op_type == "DEPTHWISE_CONV_2D" else w.shape[0]
        if w.quantization.scale.size != channels:
            return f"{op.name}: hybrid kernel with per-tensor int8 weights (the reference kernel refuses it too)"
    if opts.fused_activation_function not in (Activation.NONE, Activation.RELU, Activation.RELU6,
                                              Activation.RELU_N1_TO_1):
        return f"{op.name}: fused activation {Activation(opts.fused_activation_function).name} is not lowered"
    for t in (*op.inputs[2:], *op.outputs):
        if t is not None and t.dtype != DType.FLOAT32:
            return f"{op.name}: hybrid kernel with a {t.dtype.name} tensor {t.name!r}"
    return None


def hybrid_transpose_conv(x, w, w_scale, bias, *, out_hw, pads, strides):
    """Hybrid TRANSPOSE_CONV before its activation (kiln.kernels.hybrid.transpose_conv): each
    term ``float32(acc) · channel_scale · batch_scale`` rounded to float32 twice, then added
    in float32 in LiteRT's scatter order (input row, column, channel). For one output
    position the input row ascends as the filter row descends, so the order is: filter taps
    (ky, kx) descending, input channels ascending — each tap's terms placed by a strided pad,
    the channels added one by one in a scan."""
    n, h, wd, in_c = x.shape
    out_c, kh, kw, _ = w.shape
    (oh, ow), (pt, pl), (sh, sw) = out_hw, pads, strides
    q, scale, offset = quantize_rows_asymmetric(x.reshape(n, -1))
    centered = q.reshape(x.shape) - offset.reshape(-1, 1, 1, 1)
    channel_scale = np.broadcast_to(np.asarray(w_scale, np.float32).reshape(-1), (out_c,))
    taps = np.asarray(w, np.int32).transpose(1, 2, 3, 0)                  # [kh, kw, in_c, out_c]
    full_h, full_w = max((h - 1) * sh + kh, pt + oh), max((wd - 1) * sw + kw, pl + ow)
    full = jnp.zeros((n, full_h, full_w, out_c), F32)
    for ky in reversed(range(kh)):
        for kx in reversed(range(kw)):
            acc = centered[:, :, :, :, None] * taps[ky, kx]                # [n, h, w, in_c, out_c]
            terms = _mul(_mul(acc.astype(F32), channel_scale), scale.reshape(-1, 1, 1, 1, 1))
            placed = lax.pad(terms, F32(0), ((0, 0, 0), (ky, full_h - ky - (h - 1) * sh - 1, sh - 1),
                                             (kx, full_w - kx - (wd - 1) * sw - 1, sw - 1), (0, 0, 0), (0, 0, 0)))
            full, _ = lax.scan(lambda total, term: (_add(total, term), None), full, jnp.moveaxis(placed, 3, 0))
    out = full[:, pt:pt + oh, pl:pl + ow]
    return out if bias is None else _add(out, jnp.asarray(bias).astype(F32).reshape(-1))
