"""Neural-network ops: matmuls, convolutions, pooling, batch norm."""

from __future__ import annotations

import numpy as np

from ...schema import Activation, DType, Padding
from ..context import EmitContext
from .common import as_int32, emitter_table, f32, like, padding_of, reshape, transpose

EMITTERS, emits = emitter_table()


def _zeros_bias(ctx: EmitContext, n: int, dtype: DType = DType.FLOAT32):
    return ctx.constant(np.zeros(n, dtype.numpy), dtype, f"{ctx.name}/bias")


@emits("MatMul", "SparseMatMul")
def emit_matmul(ctx: EmitContext):
    """FULLY_CONNECTED with constant or transposed weights, else BATCH_MATMUL (SparseMatMul's
    sparsity hints change nothing)."""
    a, b = ctx.input(0), ctx.input(1)
    if a.dtype != b.dtype:
        raise ctx.fail(f"{a.dtype.name.lower()} times {b.dtype.name.lower()} has no builtin")
    ta, tb = bool(ctx.attr("transpose_a")), bool(ctx.attr("transpose_b"))
    if ta:
        a = transpose(ctx, a, [1, 0], suffix="transpose_a")
    w = ctx.const(1)
    if w is not None or tb:
        # FULLY_CONNECTED wants weights [out, in]: TF's b is [in, out] unless transposed.
        weights = b if tb else transpose(ctx, b, [1, 0], suffix="weights")
        return ctx.emit1("FULLY_CONNECTED", [a, weights, None], keep_num_dims=False)
    return ctx.emit1("BATCH_MATMUL", [a, b], adj_x=False, adj_y=False)


@emits("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")
def emit_batch_matmul(ctx: EmitContext):
    x, y = ctx.input(0), ctx.input(1)
    adj_x, adj_y = bool(ctx.attr("adj_x")), bool(ctx.attr("adj_y"))
    if ctx.const(1) is not None and y.rank == 2 and not adj_x and x.dtype == DType.FLOAT32:
        weights = y if adj_y else transpose(ctx, y, [1, 0], suffix="weights")
        return ctx.emit1("FULLY_CONNECTED", [x, weights, None], keep_num_dims=x.rank > 2)
    return ctx.emit1("BATCH_MATMUL", [x, y], adj_x=adj_x, adj_y=adj_y)


def _check_nhwc(ctx: EmitContext) -> None:
    fmt = ctx.attr("data_format", "NHWC")
    if fmt not in ("NHWC", "NDHWC"):
        raise ctx.fail(f"data_format {fmt} is not supported (only channels-last)")


#: NCHW -> NHWC and back: TF's converter transposes an NCHW Conv2D / pool to the NHWC builtin.
_TO_NHWC, _TO_NCHW = (0, 2, 3, 1), (0, 3, 1, 2)


def _layout(ctx: EmitContext) -> tuple[int, ...]:
    """The order that puts the op's NHWC or NCHW dims (input, strides, sizes) in NHWC order."""
    fmt = ctx.attr("data_format", "NHWC")
    if fmt not in ("NHWC", "NCHW"):
        raise ctx.fail(f"data_format {fmt} is not supported")
    return _TO_NHWC if fmt == "NCHW" else (0, 1, 2, 3)


def _emit_nhwc(ctx: EmitContext, op_type: str, inputs, **options):
    """``op_type`` into TF's output; for NCHW into an NHWC tensor, transposed back as TF writes it."""
    if ctx.attr("data_format", "NHWC") != "NCHW":
        return ctx.emit1(op_type, inputs, **options)
    n, c, h, w = ctx.out_signature(0)
    y = ctx.emit1(op_type, inputs, ctx.temp("nhwc", ctx.out_dtype(0), (n, h, w, c)), **options)
    return transpose(ctx, y, _TO_NCHW, out=ctx.out(0))


def _explicit_pad(ctx: EmitContext, x, rank: int = 4, order=None):
    """For padding='EXPLICIT': a PAD op in front; returns (input, padding)."""
    if ctx.attr("padding") != "EXPLICIT":
        return x, padding_of(ctx)
    pads = np.asarray(ctx.attr("explicit_paddings"), np.int32).reshape(rank, 2)[list(order or range(rank))]
    sig = [d if d < 0 else d + int(p.sum()) for d, p in zip(x.signature, pads)]
    padded = ctx.emit1("PAD", [x, ctx.constant(pads, DType.INT32, f"{ctx.name}/paddings")],
                       ctx.temp("pad", x.dtype, sig))
    return padded, Padding.VALID


def _conv2d_operands(ctx: EmitContext):
    """A 2-D convolution's NHWC input (explicit padding already applied), filter, strides,
    dilations and padding mode."""
    order = _layout(ctx)
    x, padding = _explicit_pad(ctx, transpose(ctx, ctx.input(0), order, suffix="nhwc"), 4, order)
    strides, dil = ([ctx.attr(name, [1] * 4)[i] for i in order] for name in ("strides", "dilations"))
    return x, ctx.input(1), strides, dil, padding


@emits("Conv2D")
def emit_conv2d(ctx: EmitContext):
    x, w, strides, dil, padding = _conv2d_operands(ctx)
    weights = transpose(ctx, w, [3, 0, 1, 2], suffix="filter")  # HWIO -> OHWI
    out_ch = w.signature[3]
    return _emit_nhwc(
        ctx, "CONV_2D", [x, weights, _zeros_bias(ctx, out_ch, x.dtype if x.dtype.is_float else DType.FLOAT32)],
        padding=int(padding), stride_h=int(strides[1]), stride_w=int(strides[2]),
        dilation_h_factor=int(dil[1]), dilation_w_factor=int(dil[2]),
        fused_activation_function=int(Activation.NONE))


@emits("DepthwiseConv2dNative")
def emit_depthwise(ctx: EmitContext):
    x, w, strides, dil, padding = _conv2d_operands(ctx)
    kh, kw, cin, mult = w.signature
    weights = reshape(ctx, w, [1, kh, kw, cin * mult], suffix="filter")
    return _emit_nhwc(
        ctx, "DEPTHWISE_CONV_2D", [x, weights, _zeros_bias(ctx, cin * mult)],
        padding=int(padding), stride_h=int(strides[1]), stride_w=int(strides[2]),
        depth_multiplier=int(mult), dilation_h_factor=int(dil[1]), dilation_w_factor=int(dil[2]),
        fused_activation_function=int(Activation.NONE))


@emits("Conv2DBackpropInput")
def emit_conv_transpose(ctx: EmitContext):
    _check_nhwc(ctx)
    sizes = as_int32(ctx, 0, "output_shape")
    w, x = ctx.input(1), ctx.input(2)
    strides = ctx.attr("strides")
    dil = ctx.attr("dilations", [1, 1, 1, 1])
    if list(dil) != [1, 1, 1, 1]:
        raise ctx.fail("dilated transposed convolution is not supported")
    padding = padding_of(ctx)
    weights = transpose(ctx, w, [2, 0, 1, 3], suffix="filter")  # HW(out)(in) -> (out)HW(in)
    return ctx.emit1("TRANSPOSE_CONV", [sizes, weights, x], padding=int(padding),
                     stride_h=int(strides[1]), stride_w=int(strides[2]))


@emits("Conv3D")
def emit_conv3d(ctx: EmitContext):
    _check_nhwc(ctx)
    x, w = ctx.input(0), ctx.input(1)
    strides = ctx.attr("strides")
    dil = ctx.attr("dilations", [1, 1, 1, 1, 1])
    padding = padding_of(ctx)
    return ctx.emit1(
        "CONV_3D", [x, w, None], padding=int(padding), stride_d=int(strides[1]), stride_h=int(strides[2]),
        stride_w=int(strides[3]), dilation_d_factor=int(dil[1]), dilation_h_factor=int(dil[2]),
        dilation_w_factor=int(dil[3]), fused_activation_function=int(Activation.NONE))


@emits("Conv3DBackpropInputV2")
def emit_conv3d_transpose(ctx: EmitContext):
    _check_nhwc(ctx)
    sizes = as_int32(ctx, 0, "output_shape")
    w, x = ctx.input(1), ctx.input(2)
    strides = ctx.attr("strides")
    dil = ctx.attr("dilations", [1, 1, 1, 1, 1])
    return ctx.emit1(
        "CONV_3D_TRANSPOSE", [sizes, w, x, None], padding=int(padding_of(ctx)), stride_d=int(strides[1]),
        stride_h=int(strides[2]), stride_w=int(strides[3]), dilation_d_factor=int(dil[1]),
        dilation_h_factor=int(dil[2]), dilation_w_factor=int(dil[3]))


@emits("MaxPool", "AvgPool", "MaxPoolV2")
def emit_pool(ctx: EmitContext):
    order = _layout(ctx)
    x = transpose(ctx, ctx.input(0), order, suffix="nhwc")
    if ctx.type == "MaxPoolV2":
        ksize = ctx.require_const(1, "ksize").tolist()
        strides = ctx.require_const(2, "strides").tolist()
    else:
        ksize, strides = ctx.attr("ksize"), ctx.attr("strides")
    ksize, strides = [ksize[i] for i in order], [strides[i] for i in order]
    if ksize[0] != 1 or ksize[3] != 1 or strides[0] != 1 or strides[3] != 1:
        raise ctx.fail("pooling over the batch or channel dimension is not supported")
    op_type = "AVERAGE_POOL_2D" if ctx.type == "AvgPool" else "MAX_POOL_2D"
    return _emit_nhwc(ctx, op_type, [x], padding=int(padding_of(ctx)), stride_h=int(strides[1]),
                      stride_w=int(strides[2]), filter_height=int(ksize[1]), filter_width=int(ksize[2]),
                      fused_activation_function=int(Activation.NONE))


@emits("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
def emit_fused_batch_norm(ctx: EmitContext):
    """Inference batch norm as MUL + ADD with folded per-channel constants."""
    if ctx.attr("is_training", False):
        # Keras sets is_training=False for inference; a training-mode op computes batch
        # statistics, which only matters when the mean/variance inputs are empty.
        if ctx.const(3) is None or np.size(ctx.const(3)) == 0:
            raise ctx.fail("training-mode batch normalization is not supported")
    fmt = ctx.attr("data_format", "NHWC")
    if fmt not in ("NHWC", "NDHWC"):
        raise ctx.fail(f"data_format {fmt} is not supported")
    x = ctx.input(0)
    scale, offset, mean, var = (ctx.require_const(i, "batch-norm parameters").astype(np.float64) for i in range(1, 5))
    eps = float(ctx.attr("epsilon"))
    mult = scale / np.sqrt(var + eps)
    shift = offset - mean * mult
    sig = ctx.out_signature(0)
    scaled = ctx.emit1("MUL", [x, ctx.constant(mult, x.dtype, f"{ctx.name}/scale")], ctx.temp("scaled", x.dtype, sig))
    y = ctx.emit1("ADD", [scaled, ctx.constant(shift, x.dtype, f"{ctx.name}/offset")], ctx.out(0))
    rest = [ctx.input(i) for i in (3, 4)]
    extra = [ctx.constant(np.zeros(0, np.float32), name=f"{ctx.name}/unused") for _ in range(len(ctx.op.outputs) - 3)]
    return [y, *rest, *extra]


@emits("LRN")
def emit_lrn(ctx: EmitContext):
    return ctx.emit1("LOCAL_RESPONSE_NORMALIZATION", [ctx.input(0)], radius=int(ctx.attr("depth_radius")),
                     bias=float(ctx.attr("bias")), alpha=float(ctx.attr("alpha")), beta=float(ctx.attr("beta")))


@emits("SparseSoftmaxCrossEntropyWithLogits")
def emit_sparse_softmax_cross_entropy(ctx: EmitContext):
    """loss = -log_softmax(logits)[label]: a boolean ONE_HOT picks it (SELECT_V2, SUM, NEG), so
    a -inf logit elsewhere in the row changes nothing (4 to 7 ops; TF's converter writes 9
    to 13). A label outside [0, classes) gives NaN, as TF's converted file does (TensorFlow's
    CPU kernel raises). backprop = softmax - one_hot."""
    logits, labels = ctx.input(0), ctx.input(1)
    classes = ctx.in_signature(0)[-1]
    if classes < 0 or logits.dtype != DType.FLOAT32:
        raise ctx.fail("the logits must be float32 with a known number of classes")
    hot_sig, last = (*labels.signature, classes), ctx.constant(np.int32([-1]))
    depth = ctx.constant(np.int32(classes))
    hot = like(ctx, "ONE_HOT", labels, depth, ctx.constant(np.bool_(True)), ctx.constant(np.bool_(False)),
               dtype=DType.BOOL, sig=hot_sig, axis=-1)
    picked = like(ctx, "SELECT_V2", hot, like(ctx, "LOG_SOFTMAX", logits), f32(ctx, 0))
    loss = like(ctx, "NEG", like(ctx, "SUM", picked, last, sig=labels.signature, keep_dims=False))
    if not (hot.is_constant and np.asarray(hot.data).any(-1).all()):
        valid = like(ctx, "REDUCE_ANY", hot, last, sig=labels.signature, keep_dims=False)
        loss = like(ctx, "SELECT_V2", valid, loss, f32(ctx, np.nan))
    one_hot = like(ctx, "ONE_HOT", labels, depth, f32(ctx, 1), f32(ctx, 0), dtype=DType.FLOAT32, sig=hot_sig,
                   axis=-1)
    return [loss, like(ctx, "SUB", like(ctx, "SOFTMAX", logits, beta=1.0), one_hot)]


@emits("SoftmaxCrossEntropyWithLogits")
def emit_softmax_cross_entropy(ctx: EmitContext):
    """loss = sum(labels * -log_softmax(logits)), a zero label weighing nothing even against a
    -inf logit (TF's converter's 6 ops; 3 with constant labels, the sign folded into them and
    the select left out when no label is zero); backprop = softmax - labels."""
    logits, labels = ctx.input(0), ctx.input(1)
    sig = ctx.out_signature(1)
    log_p = like(ctx, "LOG_SOFTMAX", logits)
    if labels.is_constant:
        weighted = like(ctx, "MUL", ctx.constant(-np.asarray(labels.data), labels.dtype), log_p, sig=sig)
    else:
        weighted = like(ctx, "MUL", labels, like(ctx, "NEG", log_p), sig=sig)
    terms = weighted
    if not (labels.is_constant and np.all(np.asarray(labels.data) != 0)):
        unlabelled = like(ctx, "EQUAL", labels, f32(ctx, 0), dtype=DType.BOOL)
        terms = like(ctx, "SELECT_V2", unlabelled, f32(ctx, 0), weighted, sig=sig)
    loss = like(ctx, "SUM", terms, ctx.constant(np.int32([-1])), sig=ctx.out_signature(0), keep_dims=False)
    return [loss, like(ctx, "SUB", like(ctx, "SOFTMAX", logits, beta=1.0), labels, sig=sig)]
