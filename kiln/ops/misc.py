"""Op family: ops that fit no other family — LOCAL_RESPONSE_NORMALIZATION, BUCKETIZE and
the bit ops BITWISE_XOR and RIGHT_SHIFT.

Semantics follow the LiteRT kernels the builtin op resolver registers:

* LOCAL_RESPONSE_NORMALIZATION is the optimized kernel: the window over channels is
  ``[c - radius, c + radius]`` inclusive, as in TensorFlow (LiteRT's *reference* kernel
  leaves out ``c + radius``; it is not what LiteRT runs by default).
  ``out = x * (bias + alpha * sum(x^2)) ** -beta`` on 4-D float32 input.
* BUCKETIZE returns, as int32, the index of the first boundary greater than the value
  (``std::upper_bound``). Boundaries are float32; int inputs are compared as float32, as the
  C++ comparison converts them. Boundaries must be sorted.
* BITWISE_XOR takes 8/16/32-bit signed or unsigned ints. RIGHT_SHIFT too, and clamps the
  shift to ``[0, bits - 1]``; signed values shift arithmetically. Both broadcast at any
  rank (LiteRT 2.3 does, checked against it).
"""

from __future__ import annotations

import numpy as np

from ..errors import OpError
from .elementwise import reject_quantized
from .record import KernelCall, OpDef, OptionsSpec


# -- LOCAL_RESPONSE_NORMALIZATION -----------------------------------------------------------------

def _lrn(call: KernelCall, x):
    reject_quantized(call)
    if x.dtype != np.float32:
        raise OpError(f"LOCAL_RESPONSE_NORMALIZATION: input type {x.dtype} is not supported "
                      "(float32 only)")
    if x.ndim != 4:
        raise OpError(f"LOCAL_RESPONSE_NORMALIZATION: input must be 4-D, got shape "
                      f"{list(x.shape)}")
    o = call.opts
    radius = int(o.radius)
    if radius < 0:
        raise OpError(f"LOCAL_RESPONSE_NORMALIZATION: radius must not be negative, got {radius}")
    depth = x.shape[-1]
    if x.size == 0:
        return x.copy()
    alpha, bias, beta = np.float32(o.alpha), np.float32(o.bias), np.float32(o.beta)
    squares = (x * x * alpha).astype(np.float64)
    # Window sums over channels from a running (prefix) sum, zero outside the tensor.
    prefix = np.zeros(x.shape[:-1] + (depth + 1,), np.float64)
    np.cumsum(squares, axis=-1, out=prefix[..., 1:])
    c = np.arange(depth)
    hi, lo = np.minimum(c + radius + 1, depth), np.maximum(c - radius, 0)
    scale = (prefix[..., hi] - prefix[..., lo]).astype(np.float32) + bias
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if beta == 1:
            factor = np.float32(1) / scale
        elif beta == 0.5:
            factor = np.float32(1) / np.sqrt(scale)
        else:
            factor = np.power(scale, -beta)
        return (x * factor).astype(np.float32)


# -- BUCKETIZE ------------------------------------------------------------------------------------

_BUCKETIZE_TYPES = {np.dtype(t) for t in (np.float32, np.float64, np.int32, np.int64)}


def _bucketize(call: KernelCall, x):
    if x.dtype not in _BUCKETIZE_TYPES:
        raise OpError(f"BUCKETIZE: input type {x.dtype} is not supported "
                      "(float32, float64, int32, int64)")
    bounds = np.asarray(call.opts.boundaries or (), np.float32).reshape(-1)
    if np.any(bounds[1:] < bounds[:-1]):
        raise OpError("BUCKETIZE: boundaries must be sorted in increasing order")
    # C++ compares an integer with a float boundary in float; a double input in double.
    values = x if x.dtype == np.float64 else x.astype(np.float32)
    keys = bounds.astype(values.dtype)
    return np.searchsorted(keys, values, side="right").astype(np.int32)


# -- bit ops --------------------------------------------------------------------------------------

_BIT_TYPES = {np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32)}


def _bit_operands(call: KernelCall, a: np.ndarray, b: np.ndarray) -> None:
    reject_quantized(call)
    if a.dtype != b.dtype:
        raise OpError(f"{call.op.name}: operand types {a.dtype} and {b.dtype} differ")
    if a.dtype not in _BIT_TYPES:
        raise OpError(f"{call.op.name}: type {a.dtype} is not supported (8, 16 or 32-bit "
                      "signed or unsigned integers)")
    if a.shape == b.shape:
        return
    try:
        np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise OpError(f"{call.op.name}: operand shapes {list(a.shape)} and {list(b.shape)} do "
                      "not broadcast") from None


def _bitwise_xor(call: KernelCall, a, b):
    _bit_operands(call, a, b)
    return np.bitwise_xor(a, b)


def _right_shift(call: KernelCall, a, b):
    _bit_operands(call, a, b)
    bits = a.dtype.itemsize * 8
    shift = np.clip(b, 0, bits - 1) if a.dtype.kind == "i" else np.minimum(b, bits - 1)
    return np.right_shift(a, shift.astype(a.dtype, copy=False))


# -- records --------------------------------------------------------------------------------------

def _table(name: str, **defaults) -> OptionsSpec:
    return OptionsSpec(table=name, defaults=defaults)


# op_version.cc has no rule for these ops (always version 1); register.cc registers 1 only.
OPS: tuple[OpDef, ...] = (
    OpDef("LOCAL_RESPONSE_NORMALIZATION", _lrn,
          _table("LocalResponseNormalizationOptions", radius=0, bias=0.0, alpha=0.0, beta=0.0)),
    OpDef("BUCKETIZE", _bucketize, _table("BucketizeOptions", boundaries=())),
    OpDef("BITWISE_XOR", _bitwise_xor, _table("BitwiseXorOptions")),
    OpDef("RIGHT_SHIFT", _right_shift, _table("RightShiftOptions")),
)

__all__ = ["OPS"]
