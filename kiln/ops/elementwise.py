"""Op family: element-wise arithmetic, math, comparison, logical, select and cast ops.

Semantics follow LiteRT's builtin (non-delegated) kernels, which are the oracle:

* Float arithmetic with a fused activation clamps to the activation's range with the C++
  limits of the type, so even ``NONE`` maps +-inf to +-FLT_MAX; ``TANH`` and ``SIGN_BIT``
  fused into ADD/SUB/MUL/DIV are ignored by LiteRT and here (see ``clamp_activation``).
* MAXIMUM/MINIMUM pick ``a if a > b else b``: a NaN in the first operand loses, in the
  second it wins (NumPy's maximum would propagate both).
* Integer DIV truncates toward zero; integer division by zero, and FLOOR_DIV by zero for
  any type, is an error as in LiteRT. ROUND rounds half to even; CAST from float to an
  integer truncates and saturates (NaN -> the type's maximum), integer narrowing wraps.

Integer-quantized operands (int8/uint8/int16 with quantization parameters) are refused
with an OpError until quantized kernels exist, except by ops that only move or order raw
values and whose quantized operands all share one set of parameters.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import OpError
from ..schema import Activation, DType
from ..kernels import activations as activation_kernels
from ..kernels import elementwise as elementwise_kernels
from .record import (
    FIXED_SIZE,
    UNLISTED,
    KernelCall,
    OpDef,
    OptionsSpec,
    activation_range,
    clamp_activation,
    input_dtype,
    is_quantized,
    on_codes,
    output_dtype,
    reject_quantized,
    takes,
)
from .traits import INT8_ONLY, INT16, own, requantize


def _same_type(x, like: np.ndarray) -> np.ndarray:
    """The result as an array of ``like``'s dtype (ops whose output type is the input's)."""
    return np.asarray(x).astype(like.dtype, copy=False)


def _is_int(x: np.ndarray) -> bool:
    return x.dtype.kind in "iu"


def _check_nonzero(call: KernelCall, divisor: np.ndarray) -> None:
    if np.any(divisor == 0):
        raise OpError(f"{call.op.name}: division by 0")


def _broadcast(call: KernelCall, *xs: np.ndarray) -> None:
    """Raise an OpError (not a NumPy error) when operand shapes do not broadcast."""
    if len(xs) == 2:
        a, b = xs[0].shape, xs[1].shape
        if a == b or not a or not b:  # equal shapes, or a scalar operand
            return
    try:
        np.broadcast_shapes(*(x.shape for x in xs))
    except ValueError:
        shapes = " and ".join(str(list(x.shape)) for x in xs)
        raise OpError(f"{call.op.name}: operand shapes {shapes} do not broadcast") from None


# -- version-rule helpers ---------------------------------------------------------------------

def _in_is(op, i: int, *types: DType) -> bool:
    return input_dtype(op, i) in types


def _out_is(op, i: int, *types: DType) -> bool:
    return output_dtype(op, i) in types


def _input_quantized(op, i: int = 0) -> bool:
    t = op.inputs[i] if i < len(op.inputs) else None
    return t is not None and t.quantization is not None and not t.quantization.is_empty


def _broadcast_rank_gt4(op) -> bool:
    """TF's NeedBroadcastForBinaryInputs(op) && GetInputMaxDims(op) > 4."""
    ins = [t for t in op.inputs if t is not None]
    if len(ins) < 2 or ins[0].shape == ins[1].shape:
        return False
    return max(len(t.shape) for t in ins) > 4


def _by_type(table: dict, i: int = 0, default: int = 1):
    """Version rule: first matching input-``i`` type in ``table`` (type or tuple of types)."""

    def rule(op) -> int:
        dt = input_dtype(op, i)
        for types, version in table.items():
            if dt == types or (isinstance(types, tuple) and dt in types):
                return version
        return default

    return rule


_I8, _U8, _I16, _I32, _I64 = DType.INT8, DType.UINT8, DType.INT16, DType.INT32, DType.INT64
_F16, _F32, _F64 = DType.FLOAT16, DType.FLOAT32, DType.FLOAT64


def _add_version(op) -> int:
    if _in_is(op, 0, _F16):
        return 6
    if _in_is(op, 0, _I16) and not _input_quantized(op):
        return 5
    if _in_is(op, 0, _I64):
        return 4
    if _in_is(op, 0, _I16) and _out_is(op, 0, _I16) and not op.options["pot_scale_int16"]:
        return 3
    return 2 if _in_is(op, 0, _I8) else 1


def _sub_version(op) -> int:
    if _in_is(op, 0, _I16) and _out_is(op, 0, _I16) and not op.options["pot_scale_int16"]:
        return 5
    if _in_is(op, 0, _I64):
        return 4
    if _broadcast_rank_gt4(op):
        return 3
    return 2 if _in_is(op, 0, _I8) else 1


def _scale(t) -> float:
    q = None if t is None else t.quantization
    return float(q.scale[0]) if q is not None and q.scale.size else 0.0


def _mul_version(op) -> int:
    if _in_is(op, 0, _F16):
        return 8
    if (_in_is(op, 0, _I16) and not _input_quantized(op)) or _in_is(op, 0, DType.UINT32):
        return 7
    if _in_is(op, 0, DType.COMPLEX64):
        return 6
    if _in_is(op, 0, _I64):
        return 5
    if _in_is(op, 0, _I16):
        return 4
    s1, s2 = _scale(op.inputs[0]), _scale(op.inputs[1] if len(op.inputs) > 1 else None)
    so = _scale(op.outputs[0] if op.outputs else None)
    if s1 and s2 and so and s1 * s2 / so >= 1.0:
        return 3
    return 2 if _in_is(op, 0, _I8) else 1


def _div_version(op) -> int:
    return 2 if _broadcast_rank_gt4(op) else 1


def _max_min_version(op) -> int:
    if _in_is(op, 0, _I16) and _out_is(op, 0, _I16):
        return 4
    if _broadcast_rank_gt4(op):
        return 3
    return 2 if _in_is(op, 0, _I8) else 1


def _abs_version(op) -> int:
    if _in_is(op, 0, _I32):
        return 5
    if _in_is(op, 0, _I16):
        return 3 if _input_quantized(op) else 4
    return 2 if _in_is(op, 0, _I8, _U8) else 1


def _select_version(op) -> int:
    if _in_is(op, 0, DType.UINT32):
        return 4
    if any(t is not None and len(t.shape) == 5 for t in op.inputs[:3]):
        return 3
    return 2 if _in_is(op, 0, _I8) else 1


def _cast_version(op) -> int:
    src, dst = input_dtype(op, 0), output_dtype(op, 0)
    either = {src, dst}
    if DType.BFLOAT16 in either:
        return 7
    if src == DType.INT4 and dst == _F32:
        return 6
    if either & {_F64, _F16}:
        return 5
    if DType.UINT16 in either:
        return 4
    if _I8 in either:
        return 3
    if DType.UINT32 in either:
        return 2
    return 1


# -- arithmetic -----------------------------------------------------------------------------

def _binary(fn: Callable, *, act: bool = False, shared_ok: bool = False, fresh: bool = False,
            quiet_ints: bool = False):
    """Kernel for a broadcasting binary op; ``fn(call, a, b)`` computes the raw result.

    ``fresh``: fn always returns a new array (never an operand), so the fused activation
    may clamp it in place. ``quiet_ints``: fn never warns on integer operands (no division),
    so they skip the floating-point error state that silences float warnings.
    """

    def kernel(call: KernelCall, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        reject_quantized(call, shared_ok=shared_ok)
        _broadcast(call, a, b)
        if quiet_ints and a.dtype.kind in "iub" and b.dtype.kind in "iub":
            out = fn(call, a, b)  # integer arrays wrap without a warning here
        else:
            with np.errstate(all="ignore"):
                out = fn(call, a, b)
        if type(out) is not np.ndarray:
            out = np.asarray(out)
        dtype = out.dtype
        if dtype != a.dtype and dtype != np.bool_:
            out = out.astype(a.dtype)
        if act:
            out = clamp_activation(out, call.opts.fused_activation_function, in_place=fresh)
        return out

    return kernel


def _add(call, a, b):
    return a + b


def _sub(call, a, b):
    return a - b


def _mul(call, a, b):
    return a * b


def _div(call, a, b):
    if not _is_int(a):
        return a / b
    _check_nonzero(call, b)
    wide = a.astype(np.int64), b.astype(np.int64)  # INT_MIN / -1 saturates, as in LiteRT
    q = np.floor_divide(*wide)
    # floor -> truncation toward zero: bump quotients of inexact negative divisions.
    q += (q < 0) & (q * wide[1] != wide[0])
    info = np.iinfo(a.dtype)
    return np.clip(q, info.min, info.max).astype(a.dtype)


def floor_div(xp, a, b):
    """FLOOR_DIV over array namespace ``xp`` (kiln.xla lowers it; a zero divisor is the
    reference kernel's error, checked by `_floor_div`)."""
    if _is_int(a):
        return xp.floor_divide(a, b)
    # LiteRT divides in double precision and floors before narrowing.
    return xp.floor(a.astype(np.float64) / b.astype(np.float64)).astype(a.dtype)


def floor_mod(xp, a, b):
    """FLOOR_MOD over array namespace ``xp``: the remainder takes the divisor's sign."""
    if _is_int(a):
        return xp.mod(a, b)
    r = xp.fmod(a, b)
    return xp.where((r != 0) & ((b < 0) != (r < 0)), r + b, r)


def _floor_div(call, a, b):
    _check_nonzero(call, b)
    return floor_div(np, a, b)


def _floor_mod(call, a, b):
    if _is_int(a):
        _check_nonzero(call, b)
    return floor_mod(np, a, b)


def _squared_difference(call, a, b):
    d = a - b
    return d * d


def _pow(call, a, b):
    if _is_int(b) and np.any(b < 0):
        raise OpError(f"{call.op.name}: integer POW does not support negative exponents")
    return np.power(a, b)


def _maximum(call, a, b):
    return np.where(a > b, a, b)


def _minimum(call, a, b):
    return np.where(a < b, a, b)


def _atan2(call, a, b):
    if a.shape != b.shape:  # LiteRT's ATAN2 does not broadcast
        raise OpError(f"ATAN2: operand shapes {list(a.shape)} and {list(b.shape)} must be equal")
    return np.arctan2(a, b)


# -- unary math -----------------------------------------------------------------------------

def _unary(fn: Callable, *, shared_ok: bool = False):
    def kernel(call: KernelCall, x: np.ndarray) -> np.ndarray:
        reject_quantized(call, shared_ok=shared_ok)
        with np.errstate(all="ignore"):
            return _same_type(fn(x), x)

    return kernel


def _float_only(name: str, fn: Callable) -> Callable:
    """Wrap a float-only math function so integer inputs fail clearly."""

    def apply(x):
        if x.dtype.kind != "f":
            raise OpError(f"{name}: input type {x.dtype} is not supported (float only)")
        return fn(x)

    return apply


def _rsqrt(x):
    return (np.ones((), x.dtype) / np.sqrt(x)).astype(x.dtype)


def _round_half_even(x):
    """LiteRT's RoundToNearest: floor, then round ties to the even neighbour."""
    f = np.floor(x)
    d = x - f
    keep = (d < 0.5) | ((d == 0.5) & (np.fmod(f, 2) == 0))
    return np.where(keep, f, f + 1).astype(x.dtype)


def _sign(x):
    return np.sign(x)


# -- comparison, logical, select ------------------------------------------------------------

def _logical(fn: Callable):
    def kernel(call: KernelCall, *xs: np.ndarray) -> np.ndarray:
        for x in xs:
            if x.dtype != np.bool_:
                raise OpError(f"{call.op.name}: inputs must be bool, got {x.dtype}")
        _broadcast(call, *xs)
        return np.asarray(fn(*xs))

    return kernel


def select(xp, call: KernelCall, cond, x, y):
    """SELECT (tf.where v1) over array namespace ``xp`` (NumPy here, jax.numpy in kiln.xla):
    x and y of one shape; cond of that shape or a rank-1 row mask."""
    if x.shape != y.shape:
        raise OpError(f"{call.op.name}: x {list(x.shape)} and y {list(y.shape)} differ in shape")
    if cond.shape != x.shape:
        if cond.ndim == 1 and x.ndim >= 1 and cond.shape[0] == x.shape[0]:
            cond = cond.reshape(cond.shape + (1,) * (x.ndim - 1))
        else:
            raise OpError(
                f"{call.op.name}: condition shape {list(cond.shape)} must equal the input "
                f"shape {list(x.shape)} or be its first dimension"
            )
    return xp.where(xp.asarray(cond).astype(bool), x, y)


def _select(call: KernelCall, cond, x, y):
    reject_quantized(call, shared_ok=True)
    return select(np, call, cond, x, y)


def _select_v2(call: KernelCall, cond, x, y):
    reject_quantized(call, shared_ok=True)
    _broadcast(call, cond, x, y)
    return np.where(cond.astype(bool), x, y)


# -- cast and friends ---------------------------------------------------------------------

def float_to_int(x, dtype: np.dtype, xp=np):
    """Truncate toward zero and saturate; NaN becomes the type's maximum (as LiteRT). Over
    array namespace ``xp`` (kiln.xla's CAST passes jax.numpy)."""
    info = np.iinfo(dtype)
    t = xp.trunc(x.astype(np.float64))
    hi = t >= float(info.max) + 1.0
    lo = t <= float(info.min) - 1.0
    nan = xp.isnan(t)
    out = xp.where(hi | lo | nan, 0.0, t).astype(dtype)
    out = xp.where(hi | nan, xp.asarray(info.max, dtype), out)
    return xp.where(lo, xp.asarray(info.min, dtype), out)


def _cast(call: KernelCall, x: np.ndarray) -> np.ndarray:
    dst = np.dtype(call.out_dtypes[0])
    if x.dtype == dst:
        return x.copy()
    if x.dtype.kind == "c" and dst.kind != "c":
        x = x.real  # LiteRT casts a complex value's real part
    with np.errstate(all="ignore"):
        if dst == np.bool_:
            return x != 0
        if np.issubdtype(dst, np.integer) and np.issubdtype(x.dtype, np.floating):
            return float_to_int(x, dst)
        if x.dtype == np.object_ or dst == np.object_:
            raise OpError(f"CAST: cannot cast {x.dtype} to {dst}")
        return x.astype(dst)


def _zeros_like(call: KernelCall, x: np.ndarray) -> np.ndarray:
    return np.zeros_like(x)


def _add_n(call: KernelCall, *xs: np.ndarray) -> np.ndarray:
    reject_quantized(call)
    if len(xs) < 2:
        raise OpError(f"ADD_N needs at least two inputs, got {len(xs)}")
    for x in xs[1:]:
        if x.shape != xs[0].shape:
            raise OpError(f"ADD_N: input shapes {[list(v.shape) for v in xs]} differ")
    acc = xs[0].copy()
    with np.errstate(all="ignore"):
        for x in xs[1:]:  # sequential, in operand order, like LiteRT
            acc = acc + x
    return acc


# -- records --------------------------------------------------------------------------------

def _table(name: str, **defaults) -> OptionsSpec:
    return OptionsSpec(table=name, defaults=defaults)


_ADD_OPTS = dict(fused_activation_function=Activation.NONE, pot_scale_int16=True)
_ACT_OPTS = dict(fused_activation_function=Activation.NONE)
_MAX_MIN = _table("MaximumMinimumOptions")
_FLOAT_UNARY = {
    "RSQRT": _rsqrt, "SQRT": np.sqrt, "EXP": np.exp, "LOG": np.log, "SIN": np.sin,
    "COS": np.cos, "FLOOR": np.floor, "CEIL": np.ceil, "ROUND": _round_half_even,
}


def _unary_float(name: str) -> Callable:
    return _unary(_float_only(name, _FLOAT_UNARY[name]))


_COMPARISONS = (  # name, function, options table, version rule, max version, runtime versions
    ("LESS", np.less, "LessOptions", _by_type({_I16: 3, _I8: 2}), 3, ("1.14.0", "1.14.0", "2.13.0")),
    ("LESS_EQUAL", np.less_equal, "LessEqualOptions", _by_type({_I8: 2}), 2, ("1.14.0", "1.14.0")),
    ("GREATER", np.greater, "GreaterOptions", _by_type({_I8: 2}), 2, ("1.14.0", "1.14.0")),
    ("GREATER_EQUAL", np.greater_equal, "GreaterEqualOptions", _by_type({_I16: 3, _I8: 2}), 3,
     ("1.14.0", "1.14.0", "2.13.0")),
    ("EQUAL", np.equal, "EqualOptions", _by_type({_I16: 5, DType.STRING: 3, _I8: 2}), 5,
     ("1.14.0", "1.14.0", "2.3.0", "2.13.0", "2.21.0")),
    ("NOT_EQUAL", np.not_equal, "NotEqualOptions",
     _by_type({_I16: 4, DType.STRING: 3, _I8: 2}), 4, ("1.14.0", "1.14.0", "2.3.0", "2.21.0")),
)


def _compare(fn: Callable) -> Callable:
    return _binary(lambda call, a, b: fn(a, b), shared_ok=True, quiet_ints=True)


def _comparison(name, fn, table, rule, top, runtime) -> OpDef:
    """int8 and uint8 rescale both sides (LiteRT's comparisons); int16 compares codes of
    shared parameters."""
    kernel, rescaled = _compare(fn), elementwise_kernels.comparison(fn)
    quantized = {**on_codes(kernel), "int8": rescaled, "uint8": rescaled}
    types = "float16 float32 int8 uint8 int16 int32 int64" + (" bool string" if name in ("EQUAL", "NOT_EQUAL") else "")
    return OpDef(name, kernel, _table(table), rule, top, runtime_versions=runtime, quantized=quantized,
                 types=takes(types))


#: Order-only kernels: on integer codes with shared parameters they give the quantized result.
_MAXIMUM, _MINIMUM = _binary(_maximum, shared_ok=True), _binary(_minimum, shared_ok=True)

OPS: tuple[OpDef, ...] = (
    # arithmetic with fused activation
    OpDef("ADD", _binary(_add, act=True, fresh=True, quiet_ints=True), _table("AddOptions", **_ADD_OPTS),
          _add_version, 6,
          runtime_versions=("1.5.0", "1.14.0", "2.4.0", "2.6.0", "2.13.0", "2.23.0"),
          fused_activation_host=True, quantized=elementwise_kernels.ADD,
          quantization=own(0, 1), takes_raw=frozenset({INT16}),
          types=takes("float16 float32 int8 uint8 int16 int32 int64")),
    OpDef("SUB", _binary(_sub, act=True, fresh=True, quiet_ints=True), _table("SubOptions", **_ADD_OPTS),
          _sub_version, 5,
          runtime_versions=("1.6.0", "1.14.0", "2.3.0", "2.4.0", "2.4.0"), fused_activation_host=True,
          quantized=elementwise_kernels.SUB,
          quantization=own(0, 1), types=takes("float16 float32 int8 uint8 int16 int32 int64")),
    OpDef("MUL", _binary(_mul, act=True, fresh=True, quiet_ints=True), _table("MulOptions", **_ACT_OPTS),
          _mul_version, 8,
          runtime_versions=("1.5.0", "1.14.0", "1.15.0", "2.3.0", "2.6.0", "2.11.0", "2.13.0", "2.23.0"),
          fused_activation_host=True, quantized=elementwise_kernels.MUL,
          quantization=own(0, 1), takes_raw=frozenset({INT16}),
          types=takes("float16 float32 complex64 int8 uint8 int16 int32 int64")),
    OpDef("DIV", _binary(_div, act=True, fresh=True), _table("DivOptions", **_ACT_OPTS),
          _div_version, 2,
          runtime_versions=("1.6.0", "2.3.0"), fused_activation_host=True, quantized=elementwise_kernels.DIV,
          types=takes("float16 float32 int8 uint8 int16 int32")),
    # other binary arithmetic
    OpDef("FLOOR_DIV", _binary(_floor_div), _table("FloorDivOptions"),
          _by_type({(_I16, _I8): 3, _F32: 2}), 3,
          runtime_versions=("1.14.0", "1.14.0", "2.13.0"), types=takes("float32 int8 int16 int32")),
    OpDef("FLOOR_MOD", _binary(_floor_mod), _table("FloorModOptions"),
          _by_type({(_I16, _I8): 2}), 2,
          runtime_versions=("1.13.0", "2.13.0"), types=takes("float32 int8 int16 int32 int64")),
    OpDef("SQUARED_DIFFERENCE", _binary(_squared_difference), _table("SquaredDifferenceOptions"),
          _by_type({_I8: 2}), 2,
          runtime_versions=("1.13.1", "2.5.0"), quantized=elementwise_kernels.SQUARED_DIFFERENCE,
          quantization=own(0, 1, types=INT8_ONLY), types=takes("float16 float32 int8 int32")),
    OpDef("POW", _binary(_pow), _table("PowOptions"),
          runtime_versions=("1.10.0",), types=takes("float32 int32")),
    OpDef("MAXIMUM", _MAXIMUM, _MAX_MIN, _max_min_version, 4,
          runtime_versions=("1.14.0", "1.14.0", "2.3.0", "2.3.0"), quantized=on_codes(_MAXIMUM),
          quantization=requantize()),
    OpDef("MINIMUM", _MINIMUM, _MAX_MIN, _max_min_version, 4,
          runtime_versions=("1.14.0", "1.14.0", "2.3.0", "2.3.0"), quantized=on_codes(_MINIMUM),
          quantization=requantize()),
    OpDef("ATAN2", _binary(_atan2), _table("ATan2Options"),
          runtime_versions=("2.10.0",)),
    # unary math
    OpDef("RSQRT", _unary_float("RSQRT"), None, _by_type({_I16: 3, _I8: 2}), 3,
          runtime_versions=("1.10.0", "2.5.0", "2.15.0"), quantized=activation_kernels.RSQRT,
          quantization=own()),
    OpDef("SQRT", _unary_float("SQRT"), None, _by_type({(_I8, _I16): 2}), 2,
          runtime_versions=("1.10.0", "2.21.0"), quantized=activation_kernels.SQRT,
          quantization=own()),
    OpDef("EXP", _unary_float("EXP"), _table("ExpOptions"), _by_type({(_I8, _I16): 2}), 2,
          runtime_versions=("1.7.0", "2.12.0"), quantized=activation_kernels.EXP,
          quantization=own(), types=takes("float16 float32 int8 int16")),
    OpDef("LOG", _unary_float("LOG"), None, _by_type({(_I8, _I16): 2}), 2,
          runtime_versions=("1.14.0", "2.15.0"), quantized=activation_kernels.LOG,
          quantization=own(), types=takes("float16 float32 int8 int16")),
    OpDef("SIN", _unary_float("SIN"), None, max_version=2,
          runtime_versions=("1.9.0", UNLISTED)),
    OpDef("COS", _unary_float("COS"), _table("CosOptions"), max_version=2,
          runtime_versions=("1.14.0", UNLISTED)),
    OpDef("FLOOR", _unary_float("FLOOR"),
          runtime_versions=("1.9.0",)),
    OpDef("CEIL", _unary_float("CEIL"),
          runtime_versions=("1.14.0",)),
    OpDef("ROUND", _unary_float("ROUND"),
          runtime_versions=("1.14.0",)),
    OpDef("SQUARE", _unary(np.square), _table("SquareOptions"),
          runtime_versions=("1.12.0",), types=takes("float16 float32")),
    OpDef("NEG", _unary(np.negative), _table("NegOptions"),
          runtime_versions=("1.9.0",)),
    OpDef("ABS", _unary(np.abs), _table("AbsOptions"), _abs_version, 5,
          runtime_versions=("1.13.0", "2.4.0", "2.5.0", "2.6.0", "2.12.0"), quantized=activation_kernels.ABS,
          quantization=own(), takes_raw=frozenset({INT16}),
          types=takes("float16 float32 int8 int16 int32")),
    OpDef("SIGN", _unary(_sign), _table("SignOptions"), _by_type({_I32: 2}), 2,
          runtime_versions=("2.11.0", "2.12.0"), types=takes("float32 float64 int32")),
    # comparisons
    *(_comparison(*row) for row in _COMPARISONS),
    # logical
    OpDef("LOGICAL_AND", _logical(np.logical_and), _table("LogicalAndOptions"),
          runtime_versions=("1.11.0",)),
    OpDef("LOGICAL_OR", _logical(np.logical_or), _table("LogicalOrOptions"),
          runtime_versions=("1.11.0",)),
    OpDef("LOGICAL_NOT", _logical(np.logical_not), _table("LogicalNotOptions"),
          runtime_versions=("1.11.0",)),
    # select, cast, fill-like
    OpDef("SELECT", _select, _table("SelectOptions"), _select_version, 4,
          runtime_versions=("1.14.0", "1.14.0", "2.12.0", "2.12.0"), quantized=on_codes(_select),
          types=takes(FIXED_SIZE), typed_operand=1),
    OpDef("SELECT_V2", _select_v2, _table("SelectV2Options"),
          _by_type({DType.UINT32: 2}), 2,
          runtime_versions=("2.2.0", "2.12.0"), quantized=on_codes(_select_v2),
          types=takes(FIXED_SIZE), typed_operand=1),
    OpDef("CAST", _cast, _table("CastOptions", in_data_type=DType.FLOAT32,
                                out_data_type=DType.FLOAT32), _cast_version, 9,
          runtime_versions=("1.5.0", "2.7.0", "2.8.0", "2.9.0", "2.12.0", "2.15.0", "2.17.0", "2.21.0",
                            UNLISTED),
          converts=True, types=takes(FIXED_SIZE) - {"uint64"}),
    OpDef("ZEROS_LIKE", _zeros_like, _table("ZerosLikeOptions"),
          runtime_versions=("1.12.0",), types=takes("float32 int32 int64")),
    OpDef("ADD_N", _add_n, _table("AddNOptions"),
          runtime_versions=("1.14.0",), types=takes("float32 int32")),
)

__all__ = [
    "OPS", "activation_range", "clamp_activation", "is_quantized", "float_to_int", "floor_div", "floor_mod",
    "reject_quantized", "select",
]
