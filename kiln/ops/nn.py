"""Op family: neural-network layers (fully connected, convolutions, batch matmul).

Kernels are float reference kernels written with NumPy matrix products: convolutions go
through im2col (one GEMM per chunk of output rows), depthwise and pooling accumulate the
filter taps in order over the whole tensor, so no Python loop ever runs per pixel (pooling:
kiln/ops/pool.py; the shared geometry and window views: kiln/ops/windowed.py). They are pure
functions of their operands and options; the compiled delegate (kiln/delegates) runs the
same arithmetic with weights packed and buffers planned once per input shape.
Geometry (output size, SAME padding split) follows LiteRT's ``ComputePaddingHeightWidth``
exactly: the extra pixel of an odd total padding goes after, not before.

Fused activations clamp like LiteRT's builtin kernels (``elementwise.activation_range``).
These are the float kernels; the records' ``quantized`` kernels (int8, 16x8 and hybrid:
float input, int8 weights) are in kiln.ops.quantized_kernels.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import OpError
from ..schema import Activation, DType, Padding
from . import quantized_kernels
from .record import KernelCall, OpDef, OptionsSpec, input_dtype, output_dtype, reject_quantized, takes
from .traits import Shapes, Weights, elements, output_times_weights, own, shape_of
from .windowed import (
    _add_bias,
    _finish,
    _float_operand,
    _nhwc,
    _tap,
    padded_windows,
    transpose_conv_geometry,
    window_geometry,
)

#: The fused activations LiteRT's FULLY_CONNECTED accepts at all.
_FC_ACTIVATIONS = (Activation.NONE, Activation.RELU, Activation.RELU6, Activation.RELU_N1_TO_1)

#: Element budget of one im2col patch matrix; larger convolutions run in row chunks.
_IM2COL_BUDGET = 1 << 24


# -- FULLY_CONNECTED ----------------------------------------------------------------------------

_WEIGHTS_DEFAULT = 0


def _per_channel(tensor, channels: int, strict: bool) -> bool:
    """Whether a weight tensor is quantized per channel (op_signature.cc's test)."""
    q = tensor.quantization if tensor is not None else None
    if q is None or q.scale.size == 0:
        return False
    return q.scale.size == channels and (q.scale.size > 1 or not strict)


def _fc_version(op) -> int:
    opts = op.options
    t_in, t_w, t_out = input_dtype(op, 0), input_dtype(op, 1), output_dtype(op, 0)
    weights = op.inputs[1] if len(op.inputs) > 1 else None
    f32, i8, i16 = DType.FLOAT32, DType.INT8, DType.INT16
    if (t_in, t_w, t_out) == (f32, i8, f32) and weights is not None and weights.shape \
            and _per_channel(weights, weights.shape[0], strict=True):
        return 12
    if (t_in, t_w, t_out) == (i16, i8, i16) and opts["quantized_bias_type"]:
        return 11
    if weights is not None and weights.sparsity is not None:
        return 8
    if (t_in, t_w, t_out) == (i16, i16, i16):
        return 7
    if len(op.inputs) == 2:
        return 6
    if opts["keep_num_dims"]:
        return 5
    if (t_in, t_w, t_out) == (i8, i8, i8):
        return 4
    if (t_in, t_w, t_out) == (i8, DType.INT4, i8):
        return 10
    if (t_in, t_w, t_out) == (f32, i8, f32):
        return 9 if opts["asymmetric_quantize_inputs"] else 3
    if opts["weights_format"] != _WEIGHTS_DEFAULT:
        return 2
    return 1


def _fc_shape(opts, shapes):
    x, w = shapes[0], shapes[1]
    if len(w) != 2:
        raise OpError(f"FULLY_CONNECTED: weights must be 2-D [units, depth], got {list(w)}")
    units, depth = w
    if opts.keep_num_dims:
        if not x or x[-1] != depth:
            raise OpError(f"FULLY_CONNECTED: input {list(x)} last dim must equal weights depth {depth}")
        return [(*x[:-1], units)]
    size = int(np.prod(x)) if x else 1
    if depth == 0 or size % depth:
        raise OpError(f"FULLY_CONNECTED: input {list(x)} does not split into rows of {depth}")
    return [(size // depth, units)]


def _fc_kernel(call: KernelCall, x, w, bias=None):
    reject_quantized(call)
    opts = call.opts
    if opts.weights_format != _WEIGHTS_DEFAULT:
        raise OpError("FULLY_CONNECTED: only the DEFAULT weights format is supported, got "
                      f"{opts.weights_format}")
    if opts.fused_activation_function not in _FC_ACTIVATIONS:
        act = opts.fused_activation_function
        name = Activation(act).name if act in set(Activation) else str(act)
        raise OpError(f"FULLY_CONNECTED: fused activation {name} is not supported (LiteRT "
                      "accepts NONE, RELU, RELU_N1_TO_1 and RELU6)")
    xf = _float_operand(call, x, "input")
    wf = _float_operand(call, w, "weights")
    (out_shape,) = _fc_shape(opts, [x.shape, wf.shape])
    units, depth = wf.shape
    y = xf.reshape(-1, depth) @ wf.T
    y = _add_bias(call, y, bias)
    return _finish(call, y, opts.fused_activation_function).reshape(out_shape)


# -- multiply-accumulate counts ------------------------------------------------------------------

def _transpose_conv_macs(op, shapes: Shapes | None = None) -> int:
    """Every input element meets every kh × kw × out_c tap of the filter."""
    w = op.inputs[1]
    return elements(op.inputs[2], shapes) * w.shape[0] * w.shape[1] * w.shape[2] if w is not None else 0


def _batch_matmul_macs(op, shapes: Shapes | None = None) -> int:
    """Output elements × the contracted dimension of input 0."""
    if op.inputs[0] is None or not op.outputs or op.outputs[0] is None:
        return 0
    x = shape_of(op.inputs[0], shapes)
    return elements(op.outputs[0], shapes) * (x[-2] if op.options["adj_x"] else x[-1])


FULLY_CONNECTED = OpDef(
    name="FULLY_CONNECTED",
    quantized=quantized_kernels.FULLY_CONNECTED,
    kernel=_fc_kernel,
    options=OptionsSpec("FullyConnectedOptions", {
        "fused_activation_function": Activation.NONE,
        "weights_format": _WEIGHTS_DEFAULT,
        "keep_num_dims": False,
        "asymmetric_quantize_inputs": False,
        "quantized_bias_type": DType.FLOAT32,
    }),
    version=_fc_version,
    max_version=14,
    shape=_fc_shape,
    fused_activation_host=True,
    runtime_versions=("1.5.0", "1.10.0", "1.14.0", "1.14.0", "2.0.0", "2.1.0", "2.3.0", "2.3.0",
                      "2.3.0", "2.11.0", "2.15.0", "2.17.0", "2.18.0", "2.21.0"),
                      operands=("input", "weights", "bias"), weights=Weights((1,), axis=0, bias=2),
    quantization=own(int4_weights=True, hybrid=True), macs=output_times_weights(lambda w: w[-1]),
    types=takes("float32 int8 uint8 int16"),
)


# -- CONV_2D --------------------------------------------------------------------------------------

def _conv_version(op) -> int:
    t_in, t_w, t_out = input_dtype(op, 0), input_dtype(op, 1), output_dtype(op, 0)
    f32, i8, i16 = DType.FLOAT32, DType.INT8, DType.INT16
    if (t_in, t_w, t_out) == (i16, i8, i16) and op.options["quantized_bias_type"]:
        return 8
    x, w = op.inputs[0], op.inputs[1]
    if x is not None and w is not None and len(x.shape) == 4 and len(w.shape) == 4 \
            and x.shape[3] != w.shape[3]:
        return 6  # grouped convolution
    if (t_in, t_w, t_out) == (i16, i16, i16):
        return 4
    if (t_in, t_w, t_out) == (i8, i8, i8):
        return 3
    if (t_in, t_w, t_out) == (i8, DType.INT4, i8):
        return 7
    if (t_in, t_w, t_out) == (f32, i8, f32):
        return 5 if w is not None and w.shape and _per_channel(w, w.shape[0], False) else 2
    return 1


def _conv_shape(opts, shapes):
    x, w = shapes[0], shapes[1]
    if len(x) != 4 or len(w) != 4:
        raise OpError(f"CONV_2D: input {list(x)} and filter {list(w)} must both be 4-D")
    if w[3] == 0 or x[3] % w[3] or w[0] % (x[3] // w[3] or 1):
        raise OpError(f"CONV_2D: input channels {x[3]} and filter {list(w)} do not form groups")
    (oh, ow), _ = window_geometry(opts, x[1:3], w[1:3], (opts.dilation_h_factor, opts.dilation_w_factor))
    return [(x[0], oh, ow, w[0])]


def _conv_kernel(call: KernelCall, x, w, bias=None):
    """im2col: the windows of a chunk of output rows as one patch matrix, times the filter."""
    reject_quantized(call)
    opts = call.opts
    xf = _float_operand(call, _nhwc(call, x), "input")
    wf = _float_operand(call, _nhwc(call, w, "filter"), "filter")
    _conv_shape(opts, [xf.shape, wf.shape])  # validates the grouping
    n = xf.shape[0]
    dil = (opts.dilation_h_factor, opts.dilation_w_factor)
    (oh, ow), pads = window_geometry(opts, xf.shape[1:3], wf.shape[1:3], dil)
    cout, kh, kw, cg = wf.shape
    groups = xf.shape[3] // cg
    strides = (opts.stride_h, opts.stride_w)
    depth = kh * kw * cg
    if kh == kw == 1 and groups == 1:
        # SAME padding of a 1x1 window is always zero, so the input is its only tap.
        taps = _tap(xf, 0, 0, (oh, ow), strides, (1, 1)) if strides != (1, 1) else xf
        y = (taps.reshape(-1, cg) @ wf.reshape(cout, cg).T).reshape(n, oh, ow, cout)
    else:
        if groups == 1:
            wmat = wf.reshape(cout, depth).T
        else:  # [G, KH*KW*Cg, Cout/G]
            wmat = wf.reshape(groups, cout // groups, depth).transpose(0, 2, 1)
        windows, _ = padded_windows(xf, (kh, kw), (oh, ow), pads, strides, dil)
        rows = max(1, _IM2COL_BUDGET // max(1, n * ow * depth * groups))
        if rows >= oh:
            y = _conv_rows(windows, wmat, groups, n * oh * ow).reshape(n, oh, ow, cout)
        else:
            y = np.empty((n, oh, ow, cout), np.result_type(xf, wf))
            for r0 in range(0, oh, rows):
                count = min(rows, oh - r0)
                out = _conv_rows(windows[:, r0:r0 + count], wmat, groups, n * count * ow)
                y[:, r0:r0 + count] = out.reshape(n, count, ow, cout)
    y = _add_bias(call, y, bias)
    return _finish(call, y, opts.fused_activation_function)


def _conv_rows(win: np.ndarray, wmat: np.ndarray, groups: int, m: int) -> np.ndarray:
    """[m, Cout] outputs of the im2col windows ``win`` [N, rows, OW, KH, KW, Cin]."""
    if groups == 1:
        return win.reshape(m, wmat.shape[0]) @ wmat
    kh, kw, cin = win.shape[3:]
    depth, cout = wmat.shape[1], wmat.shape[2] * groups
    pat = win.reshape(m, kh * kw, groups, cin // groups).transpose(2, 0, 1, 3)
    out = np.matmul(pat.reshape(groups, m, depth), wmat)
    return out.transpose(1, 0, 2).reshape(m, cout)


#: The convolutions' enum-typed options (strides, dilations and depth_multiplier are plain
#: integers: the schema's defaults, read from the bindings, need no restating).
_WINDOW_ENUMS = {"padding": Padding.SAME, "fused_activation_function": Activation.NONE}
_CONV_ENUMS = {**_WINDOW_ENUMS, "quantized_bias_type": DType.FLOAT32}

CONV_2D = OpDef(
    name="CONV_2D",
    quantized=quantized_kernels.CONV_2D,
    kernel=_conv_kernel,
    options=OptionsSpec("Conv2DOptions", _CONV_ENUMS),
    version=_conv_version,
    max_version=8,
    shape=_conv_shape,
    fused_activation_host=True,
    runtime_versions=("1.5.0", "1.14.0", "1.14.0", "2.3.0", "2.4.0", "2.9.0", "2.11.0", "2.15.0"),
    operands=("input", "filter", "bias"), weights=Weights((1,), axis=0, bias=2, spatial=(1, 2), bias_required=True),
    quantization=own(int4_weights=True, hybrid=True), macs=output_times_weights(lambda w: math.prod(w[1:]))
)


# -- DEPTHWISE_CONV_2D ----------------------------------------------------------------------------

def _dw_version(op) -> int:
    t_in, t_w, t_out = input_dtype(op, 0), input_dtype(op, 1), output_dtype(op, 0)
    f32, i8, i16 = DType.FLOAT32, DType.INT8, DType.INT16
    w = op.inputs[1] if len(op.inputs) > 1 else None
    if (t_in, t_w, t_out) == (i16, i16, i16):
        return 5
    if (t_in, t_w, t_out) == (f32, i8, f32):
        return 6 if w is not None and len(w.shape) == 4 and _per_channel(w, w.shape[3], False) else 4
    if (t_in, t_w, t_out) == (i8, i8, i8):
        return 3
    if (t_in, t_w, t_out) == (i8, DType.INT4, i8):
        return 7
    if op.options["dilation_w_factor"] != 1 or op.options["dilation_h_factor"] != 1:
        return 2
    return 1


def _dw_multiplier(x_shape, w_shape) -> int:
    cin, cout = x_shape[3], w_shape[3]
    if w_shape[0] != 1:
        raise OpError(f"DEPTHWISE_CONV_2D: filter must be [1, KH, KW, C*M], got {list(w_shape)}")
    if cin == 0 or cout % cin:
        raise OpError(f"DEPTHWISE_CONV_2D: filter channels {cout} are not a multiple of input "
                      f"channels {cin}")
    # LiteRT's builtin kernel also takes the multiplier from the shapes and ignores the
    # (redundant) depth_multiplier option, even when it disagrees.
    return cout // cin


def _dw_shape(opts, shapes):
    x, w = shapes[0], shapes[1]
    if len(x) != 4 or len(w) != 4:
        raise OpError(f"DEPTHWISE_CONV_2D: input {list(x)} and filter {list(w)} must be 4-D")
    _dw_multiplier(x, w)
    (oh, ow), _ = window_geometry(opts, x[1:3], w[1:3], (opts.dilation_h_factor, opts.dilation_w_factor))
    return [(x[0], oh, ow, w[3])]


#: Element budget of the depthwise products buffer [KH*KW, N, OH, OW, C] (and of the weights
#: tiled to its shape); larger inputs accumulate one tap at a time instead.
_DW_PRODUCTS_BUDGET = 1 << 20


def _dw_kernel(call: KernelCall, x, w, bias=None):
    """Filter taps accumulated in order over the whole tensor (no Python loop per pixel)."""
    reject_quantized(call)
    opts = call.opts
    xf = _float_operand(call, _nhwc(call, x), "input")
    wf = _float_operand(call, _nhwc(call, w, "filter"), "filter")
    mult = _dw_multiplier(xf.shape, wf.shape)
    dil = (opts.dilation_h_factor, opts.dilation_w_factor)
    (oh, ow), pads = window_geometry(opts, xf.shape[1:3], wf.shape[1:3], dil)
    n = xf.shape[0]
    _, kh, kw, cout = wf.shape
    strides = (opts.stride_h, opts.stride_w)
    dtype = np.result_type(xf, wf)
    weights = wf.reshape(kh, kw, cout)
    _, taps = padded_windows(xf, (kh, kw), (oh, ow), pads, strides, dil)
    if mult == 1 and kh * kw * n * oh * ow * cout <= _DW_PRODUCTS_BUDGET:
        # Every tap's products at once, then summed tap by tap in order (a reduction over
        # the outer axis adds whole rows sequentially, exactly like the loop below).
        products = taps.astype(dtype)
        products *= weights.reshape(kh, kw, 1, 1, 1, cout)
        y = np.add.reduce(products.reshape(kh * kw, n, oh, ow, cout), axis=0)
    else:
        y = np.empty((n, oh, ow, cout), dtype)
        scratch = np.empty_like(y)
        for i in range(kh):
            for j in range(kw):
                view = taps[i, j]
                if mult > 1:  # output channel c * mult + m reads input channel c
                    view = np.repeat(view, mult, axis=3)
                if i == j == 0:
                    np.multiply(view, weights[0, 0], out=y)
                else:
                    y += np.multiply(view, weights[i, j], out=scratch)
    y = _add_bias(call, y, bias)
    return _finish(call, y, opts.fused_activation_function)


DEPTHWISE_CONV_2D = OpDef(
    name="DEPTHWISE_CONV_2D",
    quantized=quantized_kernels.DEPTHWISE_CONV_2D,
    kernel=_dw_kernel,
    options=OptionsSpec("DepthwiseConv2DOptions", _WINDOW_ENUMS),
    version=_dw_version,
    max_version=7,
    shape=_dw_shape,
    fused_activation_host=True,
    runtime_versions=("1.5.0", "1.12.0", "1.14.0", "2.2.0", "2.3.0", "2.3.0", "2.11.0"),
    operands=("input", "filter", "bias"), weights=Weights((1,), axis=3, bias=2, spatial=(1, 2), bias_required=True),
    quantization=own(int4_weights=True, hybrid=True), macs=output_times_weights(lambda w: w[1] * w[2])
)


# -- TRANSPOSE_CONV -------------------------------------------------------------------------------

def _tconv_version(op) -> int:
    # op_version.cc tests operand 0 (the output shape) here; kept as written there.
    if (input_dtype(op, 0), input_dtype(op, 1), output_dtype(op, 0)) == \
            (DType.INT16, DType.INT8, DType.INT16) and op.options["quantized_bias_type"]:
        return 5
    if op.options["fused_activation_function"] != Activation.NONE:
        return 4
    if len(op.inputs) == 4 and op.inputs[3] is not None:
        return 3
    if input_dtype(op, 1) == DType.INT8:
        return 2
    return 1


def _tconv_kernel(call: KernelCall, output_shape, w, x, bias=None):
    """Scatter form: every input pixel adds filter * value into the (padded) output."""
    reject_quantized(call)
    opts = call.opts
    x = _float_operand(call, _nhwc(call, x), "input")
    w = _float_operand(call, _nhwc(call, w, "weights"), "weights")
    (oh, ow), (pt, pl) = transpose_conv_geometry(opts, output_shape, x.shape, w.shape)
    n, h, wd, cin = x.shape
    cout, kh, kw, _ = w.shape
    sh, sw = opts.stride_h, opts.stride_w
    cols = x.reshape(-1, cin) @ w.transpose(1, 2, 0, 3).reshape(kh * kw * cout, cin).T
    cols = cols.reshape(n, h, wd, kh, kw, cout)
    full_h = max((h - 1) * sh + kh, pt + oh)
    full_w = max((wd - 1) * sw + kw, pl + ow)
    full = np.zeros((n, full_h, full_w, cout), cols.dtype)
    for i in range(kh):
        for j in range(kw):
            full[:, i:i + (h - 1) * sh + 1:sh, j:j + (wd - 1) * sw + 1:sw] += cols[:, :, :, i, j]
    y = full[:, pt:pt + oh, pl:pl + ow]
    y = _add_bias(call, np.ascontiguousarray(y), bias)
    return _finish(call, y, opts.fused_activation_function)


TRANSPOSE_CONV = OpDef(
    name="TRANSPOSE_CONV",
    quantized=quantized_kernels.TRANSPOSE_CONV,
    kernel=_tconv_kernel,
    options=OptionsSpec("TransposeConvOptions", _CONV_ENUMS),
    version=_tconv_version,
    max_version=5,
    runtime_versions=("1.9.0", "2.2.0", "2.3.0", "2.13.0", "2.15.0"),
    operands=("output_shape", "weights", "input", "bias"), weights=Weights((1,), axis=0, bias=3, input=2),
    quantization=own(2, hybrid=True), macs=_transpose_conv_macs
)


# -- BATCH_MATMUL ----------------------------------------------------------------------------------

def _bmm_version(op) -> int:
    t_in = input_dtype(op, 0)
    if t_in == DType.INT16:
        return 3
    if t_in == DType.INT8:
        return 2
    if (t_in, input_dtype(op, 1), output_dtype(op)) == (DType.FLOAT32, DType.INT8, DType.FLOAT32) \
            and op.options["asymmetric_quantize_inputs"]:
        return 4
    return 1


def _bmm_shape(opts, shapes):
    a, b = shapes[0], shapes[1]
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
    return [(*batch, m, n)]


def _bmm_kernel(call: KernelCall, a, b):
    reject_quantized(call)
    opts = call.opts
    a = _float_operand(call, a, "lhs")
    b = _float_operand(call, b, "rhs")
    _bmm_shape(opts, [a.shape, b.shape])
    if opts.adj_x:
        a = np.swapaxes(a, -1, -2)
    if opts.adj_y:
        b = np.swapaxes(b, -1, -2)
    return np.matmul(a, b).astype(call.out_dtypes[0], copy=False)


BATCH_MATMUL = OpDef(
    name="BATCH_MATMUL",
    quantized=quantized_kernels.BATCH_MATMUL,
    kernel=_bmm_kernel,
    options=OptionsSpec("BatchMatMulOptions", {
        "adj_x": False,
        "adj_y": False,
        "asymmetric_quantize_inputs": False,
    }),
    version=_bmm_version,
    max_version=4,
    shape=_bmm_shape,
    runtime_versions=("2.3.0", "2.3.0", "2.4.0", "2.5.0"),
    quantization=own(0, 1),
    macs=_batch_matmul_macs,
    types=takes("float16 float32 int8 int16"),
)


OPS = (FULLY_CONNECTED, CONV_2D, DEPTHWISE_CONV_2D, TRANSPOSE_CONV, BATCH_MATMUL)
