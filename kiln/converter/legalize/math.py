"""Element-wise math, comparisons, activations and reductions."""

from __future__ import annotations

import numpy as np

from ...ops import takes_type
from ...schema import DType
from ..context import EmitContext
from .common import as_int32, cast, emitter_table, f32, int32_const, like, scalar

EMITTERS, emits = emitter_table()

_BINARY = {
    "AddV2": "ADD", "Add": "ADD", "Sub": "SUB", "Mul": "MUL", "RealDiv": "DIV", "Div": "DIV",
    "Maximum": "MAXIMUM", "Minimum": "MINIMUM", "Pow": "POW", "SquaredDifference": "SQUARED_DIFFERENCE",
    "FloorDiv": "FLOOR_DIV", "FloorMod": "FLOOR_MOD", "Less": "LESS", "LessEqual": "LESS_EQUAL",
    "Greater": "GREATER", "GreaterEqual": "GREATER_EQUAL", "Equal": "EQUAL", "NotEqual": "NOT_EQUAL",
    "LogicalAnd": "LOGICAL_AND", "LogicalOr": "LOGICAL_OR", "Atan2": "ATAN2",
    "BitwiseXor": "BITWISE_XOR", "RightShift": "RIGHT_SHIFT",
}
_UNARY = {
    "Abs": "ABS", "Ceil": "CEIL", "Cos": "COS", "Exp": "EXP", "Floor": "FLOOR", "Log": "LOG",
    "Neg": "NEG", "Rsqrt": "RSQRT", "Sin": "SIN", "Sqrt": "SQRT", "Square": "SQUARE", "Tanh": "TANH",
    "Sigmoid": "LOGISTIC", "Relu6": "RELU6", "Elu": "ELU", "Round": "ROUND",
    "Rint": "ROUND", "Sign": "SIGN", "LogicalNot": "LOGICAL_NOT", "ZerosLike": "ZEROS_LIKE",
    "Softmax": "SOFTMAX", "LogSoftmax": "LOG_SOFTMAX",
}
_REDUCE = {
    "Mean": "MEAN", "Sum": "SUM", "Max": "REDUCE_MAX", "Min": "REDUCE_MIN", "Prod": "REDUCE_PROD",
    "Any": "REDUCE_ANY", "All": "REDUCE_ALL",
}


#: Types LiteRT's math kernels never take: such ops stay TF ops (custom / unsupported), as
#: with TF's converter (e.g. float64 Sin becomes the custom op "Sin").
_NO_BUILTIN_TYPES = {DType.FLOAT64, DType.COMPLEX64, DType.COMPLEX128, DType.STRING, DType.UINT64,
                     DType.UINT32, DType.UINT16}


#: The math ops LiteRT also runs on complex64 (MUL; TF's converter writes Square as x * x).
_COMPLEX64_OPS = {"Mul", "Square"}


def check_types(ctx: EmitContext) -> None:
    for i in range(ctx.num_inputs):
        t = ctx.input(i)
        if t.dtype == DType.COMPLEX64 and ctx.type in _COMPLEX64_OPS:
            continue
        if t.dtype in _NO_BUILTIN_TYPES:
            raise ctx.fail(f"{t.dtype.name.lower()} has no builtin kernel")


@emits(*_BINARY)
def emit_binary(ctx: EmitContext):
    check_types(ctx)
    a, b = ctx.input(0), ctx.input(1)
    if ctx.type == "SquaredDifference":
        if not takes_type("SQUARED_DIFFERENCE", a.dtype):  # int64: as TF lowers it
            difference = like(ctx, "SUB", a, b, sig=ctx.out_signature(0))
            return ctx.emit1("MUL", [difference, difference])
    return ctx.emit1(_BINARY[ctx.type], [a, b])


@emits("BiasAdd", "BiasAddV1")
def emit_bias_add(ctx: EmitContext):
    x, bias = ctx.input(0), ctx.input(1)
    if ctx.attr("data_format", "NHWC") == "NCHW":
        rank = ctx.in_rank(0)
        value = ctx.require_const(1, "NCHW bias")
        bias = ctx.constant(value.reshape((-1,) + (1,) * (rank - 2)), bias.dtype, f"{ctx.name}/bias")
    return ctx.emit1("ADD", [x, bias])


@emits("AddN")
def emit_add_n(ctx: EmitContext):
    """ADD_N; ADDs where it takes no such type (int64, int16), as TF's converter writes them."""
    ins = ctx.inputs()
    if len(ins) > 2 and takes_type("ADD_N", ins[0].dtype):
        return ctx.emit1("ADD_N", ins)
    total = ins[0]
    for k, x in enumerate(ins[1:], 2):
        total = ctx.emit1("ADD", [total, x], None if k == len(ins) else ctx.temp("sum", x.dtype, ctx.out_signature(0)))
    return total


@emits(*_UNARY)
def emit_unary(ctx: EmitContext):
    check_types(ctx)
    op_type, x = _UNARY[ctx.type], ctx.input(0)
    fallback = not takes_type(op_type, x.dtype)  # where the builtin takes no such type, as TF lowers them
    if ctx.type == "Square":
        if fallback:  # integers, complex64
            return ctx.emit1("MUL", [x, x])
    elif ctx.type == "ZerosLike":
        if fallback:  # int8, int16, bool ...: zeros broadcast to its shape
            return ctx.emit1("BROADCAST_TO", [scalar(ctx, 0, x.dtype), _shape_of(ctx, x)])
    options = {"beta": 1.0} if op_type == "SOFTMAX" else {}
    return ctx.emit1(op_type, [ctx.input(0)], **options)


@emits("Relu")
def emit_relu(ctx: EmitContext):
    """RELU; on integers MAXIMUM(x, 0), as TF writes it (LiteRT's RELU refuses int32 / int64 and
    reads int8 as quantized values)."""
    check_types(ctx)
    x = ctx.input(0)
    if np.dtype(x.dtype.numpy).kind in "iu":
        return ctx.emit1("MAXIMUM", [x, ctx.constant(np.zeros((), x.dtype.numpy), x.dtype)])
    return ctx.emit1("RELU", [x])


@emits("LeakyRelu")
def emit_leaky_relu(ctx: EmitContext):
    return ctx.emit1("LEAKY_RELU", [ctx.input(0)], alpha=float(ctx.attr("alpha")))


_SELU = (1.0507009873554805, 1.6732632423543772)  # selu's scale and alpha


@emits("Selu")
def emit_selu(ctx: EmitContext):
    """selu(x) = scale * (x > 0 ? x : alpha * (exp(x) - 1)), built from builtins like TF."""
    x = ctx.input(0)
    scale, alpha = _SELU
    sig = x.signature
    zero = scalar(ctx, 0, x.dtype)
    positive = ctx.emit1("GREATER", [x, zero], ctx.temp("positive", DType.BOOL, sig))
    scaled = ctx.emit1("MUL", [x, scalar(ctx, scale, x.dtype)], ctx.temp("scaled", x.dtype, sig))
    e = ctx.emit1("EXP", [x], ctx.temp("exp", x.dtype, sig))
    em1 = ctx.emit1("SUB", [e, scalar(ctx, 1.0, x.dtype)], ctx.temp("expm1", x.dtype, sig))
    neg = ctx.emit1("MUL", [em1, scalar(ctx, scale * alpha, x.dtype)], ctx.temp("negative", x.dtype, sig))
    return ctx.emit1("SELECT_V2", [positive, scaled, neg])


@emits("Softplus")
def emit_softplus(ctx: EmitContext):
    """softplus(x) = log(exp(x) + 1), as TF's converter lowers it."""
    x = ctx.input(0)
    e = ctx.emit1("EXP", [x], ctx.temp("exp", x.dtype, x.signature))
    p = ctx.emit1("ADD", [e, scalar(ctx, 1.0, x.dtype)], ctx.temp("add", x.dtype, x.signature))
    return ctx.emit1("LOG", [p])


@emits("Softsign")
def emit_softsign(ctx: EmitContext):
    x = ctx.input(0)
    a = ctx.emit1("ABS", [x], ctx.temp("abs", x.dtype, x.signature))
    p = ctx.emit1("ADD", [a, scalar(ctx, 1.0, x.dtype)], ctx.temp("add", x.dtype, x.signature))
    return ctx.emit1("DIV", [x, p])


@emits("Reciprocal", "Inv")
def emit_reciprocal(ctx: EmitContext):
    x = ctx.input(0)
    one = ctx.constant(np.ones((), x.dtype.numpy), x.dtype)
    return ctx.emit1("DIV", [one, x])


@emits("Expm1")
def emit_expm1(ctx: EmitContext):
    x = ctx.input(0)
    e = ctx.emit1("EXP", [x], ctx.temp("exp", x.dtype, x.signature))
    return ctx.emit1("SUB", [e, ctx.constant(np.ones((), x.dtype.numpy), x.dtype)])


@emits("Log1p")
def emit_log1p(ctx: EmitContext):
    x = ctx.input(0)
    p = ctx.emit1("ADD", [x, ctx.constant(np.ones((), x.dtype.numpy), x.dtype)], ctx.temp("add", x.dtype, x.signature))
    return ctx.emit1("LOG", [p])


#: TF op -> (the operand whose zeros give zeros, the builtin on x and y), as lower_tf.td lowers them.
_ZERO_GUARDED = {"DivNoNan": (1, "DIV"), "MulNoNan": (1, "MUL"), "Xdivy": (0, "DIV"), "Xlogy": (0, "MUL"),
                 "Xlog1py": (0, "MUL")}


@emits(*_ZERO_GUARDED)
def emit_zero_guarded(ctx: EmitContext):
    """op(x, y), but zero where the guarded operand is zero (even against NaN / inf in the
    other): DivNoNan, MulNoNan (y == 0); Xdivy, Xlogy, Xlog1py (x == 0; x times log(y),
    log(1 + y)). The scalar zero SELECT_V2 broadcasts, as TF writes it."""
    x, y = ctx.input(0), ctx.input(1)
    guard, op_type = _ZERO_GUARDED[ctx.type]
    zero = scalar(ctx, 0, x.dtype)
    is_zero = like(ctx, "EQUAL", (x, y)[guard], zero, dtype=DType.BOOL)
    if ctx.type in ("Xlogy", "Xlog1py"):
        y = like(ctx, "LOG", like(ctx, "ADD", y, scalar(ctx, 1, y.dtype)) if ctx.type == "Xlog1py" else y)
    return ctx.emit1("SELECT_V2", [is_zero, zero, like(ctx, op_type, x, y, sig=ctx.out_signature(0))])


@emits("SigmoidGrad", "TanhGrad", "RsqrtGrad", "SqrtGrad")
def emit_activation_grad(ctx: EmitContext):
    """dy * f'(x) from y = f(x), as lower_tf.td lowers them: sigmoid y (1 - y), tanh 1 - y^2,
    rsqrt y^3 / -2, sqrt 1 / (2 y)."""
    check_types(ctx)
    y, dy = ctx.input(0), ctx.input(1)
    one = scalar(ctx, 1, y.dtype)
    if ctx.type == "SigmoidGrad":
        slope = like(ctx, "MUL", y, like(ctx, "SUB", one, y))
    elif ctx.type == "TanhGrad":
        slope = like(ctx, "SUB", one, like(ctx, "SQUARE", y))
    elif ctx.type == "RsqrtGrad":
        slope = like(ctx, "MUL", like(ctx, "MUL", like(ctx, "MUL", y, y), y), scalar(ctx, -0.5, y.dtype))
    else:
        slope = like(ctx, "DIV", scalar(ctx, 0.5, y.dtype), y)
    return ctx.emit1("MUL", [dy, slope])


@emits("SeluGrad")
def emit_selu_grad(ctx: EmitContext):
    """gradients * (outputs > 0 ? scale : outputs + scale * alpha)."""
    g, y = ctx.input(0), ctx.input(1)
    scale, alpha = _SELU
    positive = like(ctx, "GREATER", y, scalar(ctx, 0, y.dtype), dtype=DType.BOOL)
    negative = like(ctx, "MUL", g, like(ctx, "ADD", y, scalar(ctx, scale * alpha, y.dtype)))
    return ctx.emit1("SELECT_V2", [positive, like(ctx, "MUL", g, scalar(ctx, scale, g.dtype)), negative])


@emits("BiasAddGrad")
def emit_bias_add_grad(ctx: EmitContext):
    """The sum over every axis but the channels' (the last, or 1 in NCHW)."""
    rank = ctx.in_rank(0)
    channel = 1 if ctx.attr("data_format", "NHWC") == "NCHW" else rank - 1
    axes = int32_const(ctx, [a for a in range(rank) if a != channel], "axes")
    return ctx.emit1("SUM", [ctx.input(0), axes], keep_dims=False)


def _shape_of(ctx: EmitContext, x):
    """x's shape: a constant when static, else SHAPE's."""
    sig = x.signature
    return int32_const(ctx, sig, "shape") if all(d >= 0 for d in sig) else \
        ctx.emit1("SHAPE", [x], ctx.temp("shape", DType.INT32, (len(sig),)), out_type=int(DType.INT32))


@emits("OnesLike")
def emit_ones_like(ctx: EmitContext):
    """BROADCAST_TO of a one (LiteRT has no ONES_LIKE), to the static shape or SHAPE's, as TF writes."""
    x = ctx.input(0)
    return ctx.emit1("BROADCAST_TO", [scalar(ctx, 1, x.dtype), _shape_of(ctx, x)])


def _float32_input(ctx: EmitContext):
    x = ctx.input(0)
    if x.dtype != DType.FLOAT32:
        raise ctx.fail(f"{x.dtype.name.lower()} is not supported (float32 only, as TF's converter)")
    return x


@emits("IsNan")
def emit_is_nan(ctx: EmitContext):
    """x != x: true only for NaN (TF's converter writes the same)."""
    x = _float32_input(ctx)
    return ctx.emit1("NOT_EQUAL", [x, x])


@emits("IsFinite")
def emit_is_finite(ctx: EmitContext):
    """x - x == 0: NaN for NaN and for +-inf (inf - inf), 0 for every finite x."""
    x = _float32_input(ctx)
    return ctx.emit1("EQUAL", [like(ctx, "SUB", x, x), f32(ctx, 0)])


@emits("IsInf")
def emit_is_inf(ctx: EmitContext):
    x = _float32_input(ctx)
    return ctx.emit1("EQUAL", [like(ctx, "ABS", x), f32(ctx, np.inf)])


@emits("TruncateDiv")
def emit_truncate_div(ctx: EmitContext):
    """LiteRT's int32 DIV truncates toward zero; a float quotient is rounded toward zero."""
    a, b = ctx.input(0), ctx.input(1)
    if a.dtype == DType.INT32:
        return ctx.emit1("DIV", [a, b])
    if a.dtype != DType.FLOAT32:
        raise ctx.fail(f"{a.dtype.name.lower()} has no builtin (LiteRT's DIV takes float32 and int32)")
    sig = ctx.out_signature(0)
    q = like(ctx, "DIV", a, b, sig=sig)
    negative = like(ctx, "LESS", q, f32(ctx, 0), dtype=DType.BOOL)
    return ctx.emit1("SELECT_V2", [negative, like(ctx, "CEIL", q), like(ctx, "FLOOR", q)])


#: Lanczos approximation (g = 7, 8 terms) of TF's converter's lgamma, in float32.
_LANCZOS_G = 7.0
_LANCZOS = (676.5203681218851, -1259.1392167224028, 771.32342877765313, -176.61502916214059,
            12.507343278686905, -0.13857109526572012, 9.9843695780195716e-6, 1.5056327351493116e-7)


@emits("Lgamma")
def emit_lgamma(ctx: EmitContext):
    """lgamma as TF's converter lowers it — a Lanczos series, the reflection formula for
    x < 1/2, +inf at the poles and at +-inf — with the series' eight terms summed by one
    vector DIV and SUM instead of 24 scalar ops. float16 runs in float32, as in TF."""
    x = ctx.input(0)
    if x.dtype not in (DType.FLOAT32, DType.FLOAT16):
        raise ctx.fail(f"{x.dtype.name.lower()} is not supported (float32 and float16, as TF's converter)")
    x = cast(ctx, x, DType.FLOAT32, "to_float32")
    reflect = like(ctx, "LESS", x, f32(ctx, 0.5), dtype=DType.BOOL)
    z = like(ctx, "SELECT_V2", reflect, like(ctx, "NEG", x), like(ctx, "SUB", x, f32(ctx, 1)), sig=x.signature)
    column = like(ctx, "EXPAND_DIMS", z, ctx.constant(np.int32(-1)), sig=(*z.signature, 1))
    shifted = like(ctx, "ADD", column, f32(ctx, np.arange(1, 9)), sig=(*z.signature, 8))
    terms = like(ctx, "DIV", f32(ctx, _LANCZOS), shifted)
    series = like(ctx, "SUM", terms, ctx.constant(np.int32([-1])), sig=z.signature, keep_dims=False)
    accum = like(ctx, "ADD", series, f32(ctx, 1))
    t = like(ctx, "ADD", z, f32(ctx, _LANCZOS_G + 0.5))
    scaled = like(ctx, "ADD", like(ctx, "MUL", z, f32(ctx, 1 / (_LANCZOS_G + 0.5))), f32(ctx, 1))
    log_t = like(ctx, "ADD", like(ctx, "LOG", scaled), f32(ctx, np.log(_LANCZOS_G + 0.5)))
    power = like(ctx, "ADD", z, like(ctx, "SUB", f32(ctx, 0.5), like(ctx, "DIV", t, log_t)))
    log_y = like(ctx, "ADD", like(ctx, "ADD", like(ctx, "MUL", power, log_t), like(ctx, "LOG", accum)),
                f32(ctx, 0.5 * np.log(2 * np.pi)))
    size = like(ctx, "ABS", x)
    frac = like(ctx, "SUB", size, like(ctx, "FLOOR", size))
    upper = like(ctx, "GREATER", frac, f32(ctx, 0.5), dtype=DType.BOOL)
    reduced = like(ctx, "SELECT_V2", upper, like(ctx, "SUB", f32(ctx, 1), frac), frac)
    log_sin = like(ctx, "LOG", like(ctx, "SIN", like(ctx, "MUL", reduced, f32(ctx, np.pi))))
    finite = like(ctx, "EQUAL", like(ctx, "SUB", log_sin, log_sin), f32(ctx, 0), dtype=DType.BOOL)
    reflected = like(ctx, "SUB", like(ctx, "SUB", f32(ctx, np.log(np.pi)), log_sin), log_y)
    reflection = like(ctx, "SELECT_V2", finite, reflected, like(ctx, "NEG", log_sin))
    result = like(ctx, "SELECT_V2", reflect, reflection, log_y)
    infinite = like(ctx, "EQUAL", size, f32(ctx, np.inf), dtype=DType.BOOL)
    if ctx.out_dtype(0) == DType.FLOAT32:
        return ctx.emit1("SELECT_V2", [infinite, f32(ctx, np.inf), result])
    return ctx.emit1("CAST", [like(ctx, "SELECT_V2", infinite, f32(ctx, np.inf), result)])


@emits("ClipByValue")
def emit_clip(ctx: EmitContext):
    x, lo, hi = ctx.inputs()
    m = ctx.emit1("MAXIMUM", [x, lo], ctx.temp("max", x.dtype, ctx.out_signature(0)))
    return ctx.emit1("MINIMUM", [m, hi])


@emits("Select")
def emit_select(ctx: EmitContext):
    """SELECT, whose kernels take TF1's rank-1 condition (whole rows) too."""
    return ctx.emit1("SELECT", ctx.inputs())


@emits("SelectV2")
def emit_select_v2(ctx: EmitContext):
    return ctx.emit1("SELECT_V2", ctx.inputs())


@emits(*_REDUCE)
def emit_reduce(ctx: EmitContext):
    x = ctx.input(0)
    axes = as_int32(ctx, 1, "axes")
    if axes.rank == 0 and axes.is_constant:
        axes = ctx.constant(np.asarray(axes.data).reshape(1), DType.INT32, f"{ctx.name}/axes")
    keep = bool(ctx.attr("keep_dims", False))
    return ctx.emit1(_REDUCE[ctx.type], [x, axes], keep_dims=keep)


@emits("ArgMax", "ArgMin")
def emit_arg(ctx: EmitContext):
    x = ctx.input(0)
    axis = as_int32(ctx, 1, "axis")
    out_type = ctx.out_dtype(0)
    op_type = "ARG_MAX" if ctx.type == "ArgMax" else "ARG_MIN"
    return ctx.emit1(op_type, [x, axis], output_type=int(out_type))


@emits("Cast")
def emit_cast(ctx: EmitContext):
    x = ctx.input(0)
    dtype = ctx.out_dtype(0)
    if x.dtype == dtype:
        return x
    return ctx.emit1("CAST", [x])


@emits("Bucketize")
def emit_bucketize(ctx: EmitContext):
    check_types(ctx)
    return ctx.emit1("BUCKETIZE", [ctx.input(0)], boundaries=tuple(float(b) for b in ctx.attr("boundaries")))


@emits("Cumsum")
def emit_cumsum(ctx: EmitContext):
    x = ctx.input(0)
    axis = as_int32(ctx, 1, "axis")
    return ctx.emit1("CUMSUM", [x, axis], exclusive=bool(ctx.attr("exclusive")), reverse=bool(ctx.attr("reverse")))


@emits("L2Loss")
def emit_l2_loss(ctx: EmitContext):
    x = ctx.input(0)
    sq = ctx.emit1("SQUARE", [x], ctx.temp("square", x.dtype, x.signature))
    axes = ctx.constant(np.arange(x.rank, dtype=np.int32), DType.INT32)
    s = ctx.emit1("SUM", [sq, axes], ctx.temp("sum", x.dtype, ()), keep_dims=False)
    return ctx.emit1("MUL", [s, scalar(ctx, 0.5, x.dtype)])


__all__ = ["EMITTERS", "cast"]
