"""Lowerings of the element-wise, activation and reduction ops (kiln/ops/elementwise.py,
activations.py, reduce.py), with the LiteRT behaviour those kernels reproduce.

Differences XLA imposes, all on inputs where the reference kernel raises an error: integer
division (and FLOOR_DIV / FLOOR_MOD) by zero and POW with a negative integer exponent cannot
fail inside a compiled program, so they give XLA's value instead of an OpError.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.scipy.special import erfc

from ..errors import OpError
from ..ops.activations import gelu, l2_normalization, log_softmax, prelu, softmax
from ..ops.elementwise import float_to_int, floor_div, floor_mod, select
from ..ops.misc import bitwise_xor, right_shift
from ..ops.reduce import REDUCERS, arg_extreme, cumsum, top_k
from ..schema import Activation
from .lower_quant import int8_add_sub, int8_elementwise_check, int8_mul
from .lowering import Rows, fused_range, is_float, on_jnp

#: This module's entries of the XLA table (kiln/xla/table.py's `fill` registers them).
ROWS = Rows()


def clamp_activation(x, act: int):
    """A fused activation as LiteRT's arithmetic kernels apply it: a clamp to its range.

    Floats clamp even for NONE (to +-FLT_MAX); TANH / SIGN_BIT have no range and are ignored.
    """
    dtype = np.dtype(x.dtype)
    if dtype == np.bool_ or not (is_float(dtype) or dtype.kind in "iu") or \
            (dtype.kind in "iu" and act == Activation.NONE):
        return x
    lo, hi = fused_range(act, dtype)
    return jnp.clip(x, jnp.asarray(lo, dtype), jnp.asarray(hi, dtype))


def _is_int(x) -> bool:
    return np.dtype(x.dtype).kind in "iu"


def _as(x, like):
    return x if x.dtype == like.dtype else x.astype(like.dtype)


# -- arithmetic ----------------------------------------------------------------------------

def _div(a, b):
    if not _is_int(a):
        if isinstance(b, np.ndarray) and b.dtype == np.float32 and np.dtype(a.dtype) == np.float32:
            # XLA turns a / constant into a * (1 / constant), one ulp off for about a sixth of
            # all values; the float64 quotient rounded to float32 is LiteRT's float32 one.
            return (a.astype(jnp.float64) / b.astype(np.float64)).astype(jnp.float32)
        return a / b
    a, b = jnp.broadcast_arrays(a, b)
    top = jnp.iinfo(a.dtype)  # C division truncates toward zero; INT_MIN / -1 saturates, as in LiteRT
    return jnp.where((a == top.min) & (b == -1), top.max, lax.div(a, b))


def _arith(fn):
    def lower(call, a, b):
        a = jnp.asarray(a)  # b may stay NumPy: DIV by a constant divides exactly (see _div)
        return clamp_activation(_as(fn(a, b), a), call.opts.fused_activation_function)
    return lower


def _binary(fn):
    def lower(call, a, b):
        a, b = jnp.asarray(a), jnp.asarray(b)
        return _as(fn(a, b), a)
    return lower


ROWS.add("ADD", _arith(jnp.add))
ROWS.add("SUB", _arith(jnp.subtract))
ROWS.add("MUL", _arith(jnp.multiply))
ROWS.add("DIV", _arith(_div))
# int8 and 16x8
ROWS.add("ADD", int8_add_sub(+1), types=("int8", "int16"), check=int8_elementwise_check)
ROWS.add("SUB", int8_add_sub(-1), types=("int8", "int16"), check=int8_elementwise_check)
ROWS.add("MUL", int8_mul, types=("int8", "int16"), check=int8_elementwise_check)
ROWS.add("FLOOR_DIV", _binary(partial(floor_div, jnp)))
ROWS.add("FLOOR_MOD", _binary(partial(floor_mod, jnp)))
ROWS.add("SQUARED_DIFFERENCE", _binary(lambda a, b: (a - b) * (a - b)))
ROWS.add("POW", _binary(jnp.power))
ROWS.add("MAXIMUM", _binary(lambda a, b: jnp.where(a > b, a, b)))  # a NaN in a loses, in b wins (as LiteRT)
ROWS.add("MINIMUM", _binary(lambda a, b: jnp.where(a < b, a, b)))
ROWS.add("ATAN2", _binary(jnp.arctan2))


# -- unary -----------------------------------------------------------------------------------

def _float_only(name, fn):
    def lower(call, x):
        if not is_float(x.dtype):
            raise OpError(f"{name}: input type {x.dtype} is not supported (float only)")
        return _as(fn(jnp.asarray(x)), x)
    return lower


def _any_type(fn):
    def lower(call, x):
        return _as(fn(jnp.asarray(x)), x)
    return lower


def _compare(fn):
    def lower(call, a, b):
        return fn(a, b)
    return lower


ROWS.add("RSQRT", _float_only("RSQRT", lambda x: jnp.ones((), x.dtype) / jnp.sqrt(x)))
ROWS.add("SQRT", _float_only("SQRT", jnp.sqrt))
ROWS.add("EXP", _float_only("EXP", jnp.exp))
ROWS.add("LOG", _float_only("LOG", jnp.log))
ROWS.add("SIN", _float_only("SIN", jnp.sin))
ROWS.add("COS", _float_only("COS", jnp.cos))
ROWS.add("FLOOR", _float_only("FLOOR", jnp.floor))
ROWS.add("CEIL", _float_only("CEIL", jnp.ceil))
ROWS.add("ROUND", _float_only("ROUND", jnp.round))  # half to even, as LiteRT's RoundToNearest
ROWS.add("SQUARE", _any_type(lambda x: x * x))
ROWS.add("NEG", _any_type(jnp.negative))
ROWS.add("ABS", _any_type(jnp.abs))
ROWS.add("SIGN", _any_type(jnp.sign))
ROWS.add("LESS", _compare(jnp.less))
ROWS.add("LESS_EQUAL", _compare(jnp.less_equal))
ROWS.add("GREATER", _compare(jnp.greater))
ROWS.add("GREATER_EQUAL", _compare(jnp.greater_equal))
ROWS.add("EQUAL", _compare(jnp.equal))
ROWS.add("NOT_EQUAL", _compare(jnp.not_equal))


def _logical(fn):
    def lower(call, *xs):
        for x in xs:
            if x.dtype != np.bool_:
                raise OpError(f"{call.op.name}: inputs must be bool, got {x.dtype}")
        return fn(*xs)
    return lower


ROWS.add("LOGICAL_AND", _logical(jnp.logical_and))
ROWS.add("LOGICAL_OR", _logical(jnp.logical_or))
ROWS.add("LOGICAL_NOT", _logical(jnp.logical_not))


ROWS.add("SELECT", on_jnp(select))
ROWS.add("SELECT_V2", lambda call, cond, x, y: jnp.where(jnp.asarray(cond).astype(bool), x, y))


def _cast(call, x):
    dst = np.dtype(call.out_dtypes[0])
    x = jnp.asarray(x)
    if x.dtype == dst:
        return x
    if dst == np.bool_:
        return x != 0
    if dst.kind in "iu" and is_float(x.dtype):
        return float_to_int(x, dst, jnp)
    return x.astype(dst)


ROWS.add("CAST", _cast)
ROWS.add("ZEROS_LIKE", lambda call, x: jnp.zeros(x.shape, x.dtype))


def _add_n(call, *xs):
    if len(xs) < 2:
        raise OpError(f"ADD_N needs at least two inputs, got {len(xs)}")
    acc = jnp.asarray(xs[0])
    for x in xs[1:]:  # sequential, in operand order, like LiteRT
        acc = acc + x
    return acc


ROWS.add("ADD_N", _add_n)


# -- activations -------------------------------------------------------------------------------

def _clamp(lo, hi):
    def lower(call, x):
        x = jnp.asarray(x)
        return jnp.maximum(x, lo).astype(x.dtype) if hi is None else jnp.clip(x, lo, hi).astype(x.dtype)
    return lower


def _hard_swish(call, x):
    return x * jnp.clip(x + 3, 0, 6).astype(x.dtype) / jnp.asarray(6, x.dtype)


def _float_input(fn):
    def lower(call, x, *rest):
        if not is_float(x.dtype):
            raise OpError(f"{call.op.name}: input type {x.dtype} is not supported (float only)")
        if call.op.op_type in ("SOFTMAX", "LOG_SOFTMAX", "L2_NORMALIZATION") and x.ndim < 1:
            raise OpError(f"{call.op.name}: input must have at least one dimension")
        return _as(fn(call, jnp.asarray(x), *rest), x)
    return lower


ROWS.add("RELU", _clamp(0, None))
ROWS.add("RELU6", _clamp(0, 6))
ROWS.add("RELU_N1_TO_1", _clamp(-1, 1))
# float input only
ROWS.add("TANH", _float_input(lambda call, x: jnp.tanh(x)))
ROWS.add("LOGISTIC", _float_input(lambda call, x: jax.nn.sigmoid(x)))
ROWS.add("ELU", _float_input(lambda call, x: jnp.where(x < 0, jnp.expm1(x), x)))
ROWS.add("GELU", _float_input(on_jnp(gelu, erfc=erfc)))
ROWS.add("HARD_SWISH", _float_input(_hard_swish))
ROWS.add("LEAKY_RELU", _float_input(lambda call, x: jnp.where(x > 0, x, x * jnp.asarray(call.opts.alpha, x.dtype))))
ROWS.add("PRELU", _float_input(on_jnp(prelu)))
ROWS.add("SOFTMAX", _float_input(on_jnp(softmax, wide=None)))
ROWS.add("LOG_SOFTMAX", _float_input(on_jnp(log_softmax, wide=None)))
ROWS.add("L2_NORMALIZATION", _float_input(on_jnp(l2_normalization)))


# -- reductions --------------------------------------------------------------------------------

for _name, _reduce in REDUCERS.items():
    ROWS.add(_name, on_jnp(_reduce), static=(1,))


def _arg(pick_max: bool):
    def lower(call, x, axis):
        return arg_extreme(jnp, call, jnp.asarray(x), axis, pick_max)
    return lower


ROWS.add("ARG_MAX", _arg(True), static=(1,))
ROWS.add("ARG_MIN", _arg(False), static=(1,))


def _integer_top_k(x, k: int):
    values, order = lax.top_k(x.astype(jnp.int32) if x.dtype == np.bool_ else x, k)
    return values.astype(x.dtype), order


ROWS.add("TOPK_V2", on_jnp(top_k, integer_top_k=_integer_top_k), static=(1,))


ROWS.add("CUMSUM", on_jnp(cumsum), static=(1,))



# -- bit operations -------------------------------------------------------------------------------

ROWS.add("BITWISE_XOR", on_jnp(bitwise_xor))
ROWS.add("RIGHT_SHIFT", on_jnp(right_shift))
