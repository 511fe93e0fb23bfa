"""LiteRT's hybrid (dynamic-range) arithmetic: float activations quantized on the fly for a
product with int8 weights.

Each batch row of the float input is quantized — asymmetrically (zero point by the
smaller-error rule) for per-channel weights and for FULLY_CONNECTED with
``asymmetric_quantize_inputs``, symmetrically otherwise — then multiplied with the int8
weights in exact integer arithmetic and rescaled to float. The float steps follow the order
of LiteRT's kernels (tensor_utils BatchQuantizeFloats) in `float_math.Float32` arithmetic, so
the one function runs on NumPy and, with XLA's arithmetic, on jax.numpy, bit-exact with its
reference kernels. The weighted ops' hybrid formats are in kiln.kernels.conv and .dense.
"""

from __future__ import annotations

import numpy as np

from . import float_math

F32, F64 = np.float32, np.float64


def round_half_away(xp, x):
    """C's std::round on float64 values: halves away from zero."""
    return xp.sign(x) * xp.floor(xp.abs(x) + 0.5)


def quantize_rows_asymmetric(xp, x):
    """(int8 values, float32 scale, int32 zero point) per row of a 2-D float32 array."""
    f = float_math.arithmetic(xp)
    rmin = xp.minimum(F32(0), x.min(axis=1, initial=np.inf)).astype(F32)
    rmax = xp.maximum(F32(0), x.max(axis=1, initial=-np.inf)).astype(F32)
    flat = rmin == rmax
    # The range's width is a float32 difference, only then divided in double (measured:
    # a double-precision width moves the scale by an ulp and every output of its row).
    scale = f.divide_exactly(xp.where(flat, F32(1), f.sub(rmax, rmin)).astype(F64), 255.0)
    rmin, rmax = rmin.astype(F64), rmax.astype(F64)
    from_min, from_max = -128.0 - rmin / scale, 127.0 - rmax / scale
    zero_point = xp.where(128.0 + xp.abs(rmin / scale) < 127.0 + xp.abs(rmax / scale), from_min, from_max)
    nudged = xp.where(flat, 0, xp.clip(round_half_away(xp, zero_point), -128, 127)).astype(xp.int32)
    scale32 = xp.where(flat, F32(1), f.round(scale))
    inverse = f.round(1.0 / scale32.astype(F64))
    values = f.add(nudged[:, None].astype(F32), f.mul(x, inverse[:, None]))
    q = xp.clip(round_half_away(xp, values.astype(F64)), -128, 127)
    return xp.where(flat[:, None], 0, q).astype(xp.int8), scale32, nudged


def quantize_rows_symmetric(xp, x):
    """(int8 values in [-127, 127], float32 scale) per row of a 2-D float32 array."""
    f = float_math.arithmetic(xp)
    rng = xp.maximum(xp.abs(x.min(axis=1, initial=np.inf)), xp.abs(x.max(axis=1, initial=-np.inf))).astype(F32)
    flat = rng == 0
    safe = xp.where(flat, F32(1), rng)
    scale = xp.where(flat, F32(1), f.div(safe, F32(127)))
    inverse = f.div(F32(127), safe)
    q = xp.clip(round_half_away(xp, f.mul(x, inverse[:, None]).astype(F64)), -127, 127)
    return xp.where(flat[:, None], 0, q).astype(xp.int8), scale


def quantize_rows(xp, x, asymmetric: bool):
    """(int8 values, float32 scale, int32 zero point) per row: either scheme."""
    if asymmetric:
        return quantize_rows_asymmetric(xp, x)
    q, scale = quantize_rows_symmetric(xp, x)
    return q, scale, xp.zeros(x.shape[0], xp.int32)


def quantize_batches(xp, x):
    """Asymmetric quantization with one (scale, zero point) per batch entry of an [N, ...]
    input, its codes less their zero point (int32, as the hybrid convolutions take them)."""
    q, scale, offset = quantize_rows_asymmetric(xp, x.reshape(x.shape[0], -1))
    centred = q.astype(xp.int32) - offset[:, None]
    return centred.reshape(x.shape), scale
