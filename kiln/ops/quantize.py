"""QUANTIZE and DEQUANTIZE: the edges between float and integer tensors.

Semantics of LiteRT's reference kernels: DEQUANTIZE computes ``scale · (q − zero_point)`` in
double precision per tensor and in float per channel, and casts float16 constants up;
QUANTIZE divides by the scale in float, rounds half away from zero, adds the zero point and
clamps (saturating where ``x / scale`` leaves the int32 range: LiteRT's cast is undefined
there); between two integer types it requantizes with a fixed-point multiplier
(``input_scale / output_scale``) rounded *twice* — measured: LiteRT 2.3's reference QUANTIZE
matches double rounding on every value, where its integer FULLY_CONNECTED rounds once.
"""

from __future__ import annotations

import numpy as np

from ..errors import OpError
from ..kernels.fixedpoint import (
    multiply_by_quantized_multiplier_double_rounding,
    quantize_multiplier,
    round_half_away,
)
from ..schema import DType
from .record import OpDef, input_dtype, on_codes, output_dtype


def _params(q, what: str):
    if q is None or q.scale.size == 0:
        raise OpError(f"{what} has no quantization parameters")
    return q


def _channel_shape(x: np.ndarray, axis: int) -> list[int]:
    shape = [1] * x.ndim
    shape[axis] = -1
    return shape


def dequantize(call, x):
    """DEQUANTIZE in array methods only, so the same kernel traces over jax.numpy (kiln.xla)."""
    if x.dtype == np.float16:
        return x.astype(np.float32)
    q = _params(call.in_quant(0), "DEQUANTIZE input")
    if q.scale.size > 1:  # per channel, in float (PerChannelDequantize)
        shape = _channel_shape(x, q.quantized_dimension)
        centered = x.astype(np.int32) - q.zero_point.astype(np.int32).reshape(shape)
        return centered.astype(np.float32) * q.scale.reshape(shape)   # scales are float32
    centered = x.astype(np.int64) - int(q.zero_point[0])
    return (np.float64(q.scale[0]) * centered.astype(np.float64)).astype(np.float32)


def _limits(dtype) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def _quantize(call, x):
    out_dtype = call.out_dtypes[0]
    q_out = _params(call.out_quant(0), "QUANTIZE output")
    lo, hi = _limits(out_dtype)
    if x.dtype.kind == "f":
        x = x.astype(np.float32)
        if q_out.scale.size > 1:
            shape = _channel_shape(x, q_out.quantized_dimension)
            scale, zp = q_out.scale.reshape(shape), q_out.zero_point.reshape(shape)
        else:
            scale, zp = q_out.scale[0], int(q_out.zero_point[0])
        # Saturate before the integer cast: a quotient beyond int64 (or ±inf) has no integer
        # value. LiteRT's optimized kernel saturates so; its reference kernel casts first, which
        # is undefined behaviour in C++ (measured: any sign, depending on the zero point).
        rounded = round_half_away((x / scale).astype(np.float32)).astype(np.float64)
        q = np.clip(rounded, float(lo) - 2 ** 31, float(hi) + 2 ** 31).astype(np.int64) + zp
        return np.clip(q, lo, hi).astype(out_dtype)
    q_in = _params(call.in_quant(0), "QUANTIZE input")
    multiplier, shift = quantize_multiplier(float(np.float64(q_in.scale[0]) / np.float64(q_out.scale[0])))
    centered = x.astype(np.int64) - int(q_in.zero_point[0])
    out = multiply_by_quantized_multiplier_double_rounding(centered, multiplier, shift).astype(np.int64)
    return np.clip(out + int(q_out.zero_point[0]), lo, hi).astype(out_dtype)


def _per_channel(t) -> bool:
    q = t.quantization if t is not None else None
    return bool(q is not None and q.scale.size > 1 and t.shape
                and q.scale.size == t.shape[q.quantized_dimension])


def _dequantize_version(op) -> int:
    t = input_dtype(op, 0)
    if t == DType.INT4:
        return 6
    if t in (DType.INT16, DType.FLOAT16):
        return 3
    if t == DType.INT8:
        return 5 if _per_channel(op.inputs[0]) else 2
    return 1


def _quantize_version(op) -> int:
    if DType.INT4 in (input_dtype(op, 0), output_dtype(op, 0)):
        return 4
    if _per_channel(op.outputs[0]):
        return 3
    return 2 if output_dtype(op, 0) == DType.INT16 else 1


OPS = (
    OpDef(name="DEQUANTIZE", kernel=dequantize, version=_dequantize_version, max_version=5,
          quantized=on_codes(dequantize),
          runtime_versions=("1.13.1", "1.14.0", "1.15.0", "2.2.0", "2.7.0", "2.18.0"),
          converts=True),
    OpDef(name="QUANTIZE", kernel=_quantize, version=_quantize_version, max_version=3,
          quantized=on_codes(_quantize),
          runtime_versions=("1.14.0", "1.15.0", "2.7.0", "2.21.0"),
          converts=True),
)


__all__ = ["OPS", "dequantize"]
