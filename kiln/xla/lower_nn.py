"""Lowerings of the NN ops (kiln/ops/nn.py, conv3d.py, image.py resizes): convolutions as
lax.conv_general_dilated with LiteRT's padding split, pools as lax.reduce_window.

Geometry (output sizes, SAME padding before/after, resize source coordinates) comes from
the reference kernels' own helpers, evaluated on static shapes while tracing, so it cannot
drift from them.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..errors import OpError
from ..ops.conv3d import window_params
from ..ops.image import bilinear_axis, nearest_axis, new_size
from ..ops.misc import lrn_factor
from ..ops.record import HYBRID
from ..ops.windowed import (
    out_size,
    pad_before_after,
    transpose_conv_geometry,
    window_geometry,
)
from ..schema import Activation
from .lower_hybrid import hybrid_conv, hybrid_depthwise, hybrid_fully_connected
from .lower_quant import (
    int8_conv,
    int8_depthwise,
    int8_fully_connected,
    int8_weighted_check,
)
from .lowering import CODES, Rows, computed_once, fused_range, is_float

_FC_ACTIVATIONS = (Activation.NONE, Activation.RELU, Activation.RELU6, Activation.RELU_N1_TO_1)

#: This module's entries of the XLA table (kiln/xla/table.py's `fill` registers them).
ROWS = Rows()


def _float(call, x, what: str):
    if not is_float(x.dtype):
        raise OpError(f"{call.op.name}: {what} of type {x.dtype} is not supported (float only)")
    x = jnp.asarray(x)
    return x if x.dtype in (jnp.float64, jnp.bfloat16) else x.astype(jnp.float32)


def _finish(call, y, bias, act):
    """Bias over the channel axis, then the fused activation's clamp (to +-FLT_MAX for NONE)."""
    if bias is not None:
        b = _float(call, bias, "bias").reshape(-1)
        if b.size != y.shape[-1]:
            raise OpError(f"{call.op.name}: bias has {b.size} elements for {y.shape[-1]} output channels")
        y = y + b
    lo, hi = fused_range(act, np.dtype(y.dtype))
    return jnp.clip(y, jnp.asarray(lo, y.dtype), jnp.asarray(hi, y.dtype))


def _fully_connected(call, x, w, bias=None):
    opts = call.opts
    if opts.fused_activation_function not in _FC_ACTIVATIONS:
        raise OpError("FULLY_CONNECTED: fused activation "
                      f"{Activation(opts.fused_activation_function).name} is not supported (LiteRT "
                      "accepts NONE, RELU, RELU6, RELU_N1_TO_1)")
    if opts.weights_format != 0:
        raise OpError("FULLY_CONNECTED: shuffled weights are not supported")
    hybrid = np.dtype(w.dtype) == np.int8
    x, w = _float(call, x, "input"), (w if hybrid else _float(call, w, "weights"))
    if w.ndim != 2:
        raise OpError(f"FULLY_CONNECTED: weights must be 2-D [units, depth], got {list(w.shape)}")
    units, depth = w.shape
    if opts.keep_num_dims:
        if not x.shape or x.shape[-1] != depth:
            raise OpError(f"FULLY_CONNECTED: input {list(x.shape)} last dim must equal weights depth {depth}")
        out_shape = (*x.shape[:-1], units)
    else:
        if depth == 0 or x.size % depth:
            raise OpError(f"FULLY_CONNECTED: input {list(x.shape)} does not split into rows of {depth}")
        out_shape = (x.size // depth, units)
    if hybrid:
        y = hybrid_fully_connected(x.reshape(-1, depth).astype(jnp.float32), w, call.in_quant(1).scale, bias,
                                   asymmetric=bool(opts.asymmetric_quantize_inputs))
        return _finish(call, y, None, opts.fused_activation_function).reshape(out_shape)
    y = jnp.dot(x.reshape(-1, depth), w.T, precision=lax.Precision.HIGHEST)
    return _finish(call, y, bias, opts.fused_activation_function).reshape(out_shape)


def _nhwc(call, x, what="input"):
    if x.ndim != 4:
        raise OpError(f"{call.op.name}: {what} must be 4-D NHWC, got shape {list(x.shape)}")
    return x


def _conv_as_matmul(x, w, strides, dil, pads, out_hw):
    """An ungrouped convolution as one matrix product over gathered windows (im2col): XLA's
    CPU dot is much faster than its convolution on the small images of mobile models."""
    cout, kh, kw, cin = w.shape
    (oh, ow), (sh, sw) = out_hw, strides
    xp = jnp.pad(x, ((0, 0), *pads, (0, 0))) if any(p for pair in pads for p in pair) else x
    if kh * kw > 1:
        xp = computed_once(xp)
    taps = []
    for i in range(kh):
        for j in range(kw):
            r0, c0 = i * dil[0], j * dil[1]
            taps.append(lax.slice(xp, (0, r0, c0, 0), (xp.shape[0], r0 + (oh - 1) * sh + 1,
                                                       c0 + (ow - 1) * sw + 1, cin), (1, sh, sw, 1)))
    cols = taps[0] if len(taps) == 1 else jnp.concatenate(taps, axis=3)   # [N, OH, OW, KH*KW*Cin]
    y = jnp.dot(cols.reshape(-1, kh * kw * cin), w.reshape(cout, kh * kw * cin).T,
                precision=lax.Precision.HIGHEST)
    return y.reshape(x.shape[0], oh, ow, cout)


def _hybrid_conv(call, x, w, bias, conv):
    y = conv(call, _nhwc(call, jnp.asarray(x).astype(jnp.float32)), w, call.in_quant(1).scale, bias)
    return _finish(call, y, None, call.opts.fused_activation_function)


def _conv(call, x, w, bias=None):
    opts = call.opts
    if np.dtype(w.dtype) == np.int8:
        return _hybrid_conv(call, x, w, bias, hybrid_conv)
    x, w = _float(call, _nhwc(call, x), "input"), _float(call, _nhwc(call, w, "filter"), "filter")
    cout, kh, kw, cg = w.shape
    if cg == 0 or x.shape[3] % cg or cout % (x.shape[3] // cg or 1):
        raise OpError(f"CONV_2D: input channels {x.shape[3]} and filter {list(w.shape)} do not form groups")
    dil = (opts.dilation_h_factor, opts.dilation_w_factor)
    (oh, ow), pads = window_geometry(opts, x.shape[1:3], (kh, kw), dil)
    if cg == x.shape[3] and oh > 0 and ow > 0:  # 1x1 too: a dot fuses with its neighbours
        y = _conv_as_matmul(x, w, (opts.stride_h, opts.stride_w), dil, pads, (oh, ow))
        return _finish(call, y, bias, opts.fused_activation_function)
    y = lax.conv_general_dilated(x, w, (opts.stride_h, opts.stride_w), pads, rhs_dilation=dil,
                                 dimension_numbers=("NHWC", "OHWI", "NHWC"),
                                 feature_group_count=x.shape[3] // cg, precision=lax.Precision.HIGHEST)
    return _finish(call, y, bias, opts.fused_activation_function)


def _depthwise(call, x, w, bias=None):
    opts = call.opts
    if np.dtype(w.dtype) == np.int8:
        return _hybrid_conv(call, x, w, bias, hybrid_depthwise)
    x, w = _float(call, _nhwc(call, x), "input"), _float(call, _nhwc(call, w, "filter"), "filter")
    cin, (one, kh, kw, cout) = x.shape[3], w.shape
    if one != 1:
        raise OpError(f"DEPTHWISE_CONV_2D: filter must be [1, KH, KW, C*M], got {list(w.shape)}")
    if cin == 0 or cout % cin:
        raise OpError(f"DEPTHWISE_CONV_2D: filter channels {cout} are not a multiple of input channels {cin}")
    dil = (opts.dilation_h_factor, opts.dilation_w_factor)
    (oh, ow), pads = window_geometry(opts, x.shape[1:3], (kh, kw), dil)
    # A sum of kh * kw shifted windows times their per-channel weights, in tap order as the
    # reference kernel adds them: XLA fuses it into one loop, where its grouped convolution
    # on CPU is many times slower.
    xp = jnp.pad(x, ((0, 0), *pads, (0, 0)))
    mult = cout // cin
    if mult > 1:  # output channel c * M + m reads input channel c
        xp = jnp.repeat(xp, mult, axis=3)
    if kh * kw > 1:
        xp = computed_once(xp)
    sh, sw = opts.stride_h, opts.stride_w
    if oh <= 0 or ow <= 0 or kh * kw == 0:
        return _finish(call, jnp.zeros((x.shape[0], max(oh, 0), max(ow, 0), cout), x.dtype), bias,
                       opts.fused_activation_function)
    y = None
    for i in range(kh):
        for j in range(kw):
            r0, c0 = i * dil[0], j * dil[1]
            tap = lax.slice(xp, (0, r0, c0, 0), (xp.shape[0], r0 + (oh - 1) * sh + 1, c0 + (ow - 1) * sw + 1, cout),
                            (1, sh, sw, 1)) * w[0, i, j]
            y = tap if y is None else y + tap
    return _finish(call, y, bias, opts.fused_activation_function)


def conv_transpose(x, w, rhs_spec: str, strides, dilations, pads_before, out_spatial, *, acc_type=None):
    """The reference kernels' scatter form (every input element adds filter * value into the
    output, shifted by the forward convolution's leading padding) as one convolution of the
    stride-dilated input with the spatially flipped filter, padded or cropped to the output.
    ``acc_type`` (the quantized lowerings): operands already of that type, summed exactly in it."""
    rank = len(strides)
    kernel = [w.shape[rhs_spec.index(c)] for c in rhs_spec if c not in "OI"]
    flip = tuple(slice(None, None, -1) if c not in "OI" else slice(None) for c in rhs_spec)
    reach = [(k - 1) * d for k, d in zip(kernel, dilations)]
    lhs_spec = "N" + rhs_spec.replace("O", "").replace("I", "") + "C"
    full = lax.conv_general_dilated(x, w[flip], (1,) * rank, [(r, r) for r in reach], lhs_dilation=strides,
                                    rhs_dilation=dilations, dimension_numbers=(lhs_spec, rhs_spec, lhs_spec),
                                    precision=lax.Precision.HIGHEST if acc_type is None else None,
                                    preferred_element_type=acc_type)
    grow = [max(0, p + o - f) for p, o, f in zip(pads_before, out_spatial, full.shape[1:-1])]
    if any(grow):
        full = jnp.pad(full, [(0, 0), *[(0, g) for g in grow], (0, 0)])
    index = (slice(None), *[slice(p, p + o) for p, o in zip(pads_before, out_spatial)], slice(None))
    return full[index]


def transpose_conv_2d(opts, output_shape, x, w, *, acc_type=None):
    """TRANSPOSE_CONV's geometry (the reference kernels' helper) and scatter sum, NHWC input
    and OHWI filter: shared by the float lowering and, with ``acc_type``, the integer ones."""
    out_hw, pads = transpose_conv_geometry(opts, np.asarray(output_shape), x.shape, w.shape)
    return conv_transpose(x, w, "OHWI", (opts.stride_h, opts.stride_w), (1, 1), pads, out_hw, acc_type=acc_type)


def _transpose_conv(call, output_shape, w, x, bias=None):
    x, w = _float(call, _nhwc(call, x), "input"), _float(call, _nhwc(call, w, "weights"), "weights")
    return _finish(call, transpose_conv_2d(call.opts, output_shape, x, w), bias, call.opts.fused_activation_function)


def _conv3d_geometry(call, sizes, kernel):
    """The reference kernel's checked strides and dilations, and the pads per spatial axis."""
    strides, dilations = window_params(call)
    pads = []
    for size, k, s, d in zip(sizes, kernel, strides, dilations):
        n = out_size(call.opts.padding, size, k, s, d)
        if n < 0:
            raise OpError(f"{call.op.name}: filter {k} (dilation {d}) does not fit input extent {size}")
        pads.append(pad_before_after(size, k, s, d, n))
    return strides, dilations, pads


def _conv3d(call, x, w, bias=None):
    x, w = _float(call, x, "input"), _float(call, w, "filter")
    if x.ndim != 5 or w.ndim != 5:
        raise OpError(f"CONV_3D: input {list(x.shape)} and filter {list(w.shape)} must be 5-D")
    if w.shape[3] != x.shape[4]:
        raise OpError(f"CONV_3D: filter {list(w.shape)} [KD, KH, KW, Cin, Cout] expects {w.shape[3]} input "
                      f"channels, the input {list(x.shape)} has {x.shape[4]}")
    strides, dilations, pads = _conv3d_geometry(call, x.shape[1:4], w.shape[:3])
    y = lax.conv_general_dilated(x, w, strides, pads, rhs_dilation=dilations,
                                 dimension_numbers=("NDHWC", "DHWIO", "NDHWC"),
                                 precision=lax.Precision.HIGHEST)
    return _finish(call, y, bias, call.opts.fused_activation_function)


def _conv3d_transpose(call, output_shape, w, x, bias=None):
    shape = np.asarray(output_shape)
    if shape.dtype != np.int32 or shape.shape != (5,) or shape.min() < 0:
        raise OpError(f"CONV_3D_TRANSPOSE: output_shape must be an int32 vector of 5 non-negative dims, "
                      f"got {shape.dtype} {shape.tolist()}")
    dims = [int(v) for v in shape]
    x, w = _float(call, x, "input"), _float(call, w, "filter")
    if x.ndim != 5 or w.ndim != 5:
        raise OpError(f"CONV_3D_TRANSPOSE: input {list(x.shape)} and filter {list(w.shape)} must be 5-D")
    kd, kh, kw, cout, wcin = w.shape
    if wcin != x.shape[4] or dims[0] != x.shape[0] or dims[4] != cout:
        raise OpError(f"CONV_3D_TRANSPOSE: input {list(x.shape)}, filter {list(w.shape)} [KD, KH, KW, Cout, Cin] "
                      f"and output_shape {dims} disagree")
    out_sp = tuple(dims[1:4])
    strides, dilations, pads = _conv3d_geometry(call, out_sp, (kd, kh, kw))
    fwd = tuple(out_size(call.opts.padding, o, k, s, d)
                for o, k, s, d in zip(out_sp, (kd, kh, kw), strides, dilations))
    if fwd != tuple(x.shape[1:4]):
        raise OpError(f"CONV_3D_TRANSPOSE: output_shape {dims} convolved with filter {[kd, kh, kw]} gives "
                      f"spatial extents {list(fwd)}, not the input's {list(x.shape[1:4])}")
    y = conv_transpose(x, w, "DHWOI", strides, dilations, [p[0] for p in pads], out_sp)
    return _finish(call, y, bias, call.opts.fused_activation_function)


def _local_response_normalization(call, x):
    if x.dtype != np.float32:
        raise OpError(f"LOCAL_RESPONSE_NORMALIZATION: input type {x.dtype} is not supported (float32 only)")
    if x.ndim != 4:
        raise OpError(f"LOCAL_RESPONSE_NORMALIZATION: input must be 4-D, got shape {list(x.shape)}")
    o = call.opts
    radius = int(o.radius)
    if radius < 0:
        raise OpError(f"LOCAL_RESPONSE_NORMALIZATION: radius must not be negative, got {radius}")
    alpha, bias, beta = np.float32(o.alpha), np.float32(o.bias), np.float32(o.beta)
    x = jnp.asarray(x)
    squares = (x * x * alpha).astype(jnp.float64)
    # The window sum over channels [c - radius, c + radius], zero outside the tensor.
    window = (1, 1, 1, 2 * radius + 1)
    sums = lax.reduce_window(squares, 0.0, lax.add, window, (1, 1, 1, 1), ((0, 0),) * 3 + ((radius, radius),))
    scale = sums.astype(jnp.float32) + bias
    return x * lrn_factor(jnp, scale, beta)


# -- pooling -----------------------------------------------------------------------------------

def _pool_setup(call, x):
    opts = call.opts
    _nhwc(call, x)
    if opts.filter_height <= 0 or opts.filter_width <= 0:
        raise OpError(f"{call.op.name}: filter size {opts.filter_height}x{opts.filter_width} must be positive")
    kernel = (opts.filter_height, opts.filter_width)
    _, pads = window_geometry(opts, x.shape[1:3], kernel)
    return (1, *kernel, 1), (1, opts.stride_h, opts.stride_w, 1), ((0, 0), *pads, (0, 0))


def _max_pool(call, x):
    window, strides, pads = _pool_setup(call, x)
    x = jnp.asarray(x)
    integer = not is_float(x.dtype)
    if integer and call.opts.fused_activation_function != Activation.NONE:
        raise OpError("MAX_POOL_2D: fused activation on integer input is not implemented")
    low = np.iinfo(x.dtype).min if integer else -np.inf
    y = lax.reduce_window(x, jnp.asarray(low, x.dtype), lax.max, window, strides, pads)
    if integer:
        return y
    lo, hi = fused_range(call.opts.fused_activation_function, np.dtype(x.dtype))
    return jnp.clip(y, jnp.asarray(lo, y.dtype), jnp.asarray(hi, y.dtype))


def _average_pool(call, x):
    """Mean over the in-bounds part of each window (padding is not counted), as LiteRT."""
    x = _float(call, x, "input")
    window, strides, pads = _pool_setup(call, x)
    total = lax.reduce_window(x, jnp.asarray(0, x.dtype), lax.add, window, strides, pads)
    ones = np.ones((1, x.shape[1], x.shape[2], 1), np.float64)
    count = lax.reduce_window(ones, 0.0, lax.add, window, strides, pads)  # static: folded by XLA
    y = total / jnp.asarray(count, x.dtype)
    lo, hi = fused_range(call.opts.fused_activation_function, np.dtype(x.dtype))
    return jnp.clip(y, jnp.asarray(lo, y.dtype), jnp.asarray(hi, y.dtype))


def _batch_matmul(call, a, b):
    a, b = _float(call, a, "lhs"), _float(call, b, "rhs")
    if not (2 <= a.ndim <= 5 and 2 <= b.ndim <= 5):
        raise OpError(f"BATCH_MATMUL: operands must have rank 2 to 5, got {list(a.shape)} and {list(b.shape)}")
    if call.opts.adj_x:
        a = jnp.swapaxes(a, -1, -2)
    if call.opts.adj_y:
        b = jnp.swapaxes(b, -1, -2)
    if a.shape[-1] != b.shape[-2]:
        raise OpError(f"BATCH_MATMUL: contraction sizes differ ({list(a.shape)}, {list(b.shape)} after adj)")
    return jnp.matmul(a, b, precision=lax.Precision.HIGHEST)


# -- resizing ------------------------------------------------------------------------------------

def _resize_bilinear(call, x, size):
    x = _nhwc(call, x)
    if not is_float(x.dtype):
        raise OpError(f"RESIZE_BILINEAR: input type {x.dtype} is not implemented (float only)")
    oh, ow = new_size(call, size)
    ac, hp = bool(call.opts.align_corners), bool(call.opts.half_pixel_centers)
    if ac and hp:
        raise OpError("RESIZE_BILINEAR: if half_pixel_centers is True, align_corners must be False")
    y0, y1, dy = bilinear_axis(x.shape[1], oh, ac, hp)
    x0, x1, dx = bilinear_axis(x.shape[2], ow, ac, hp)
    xf = jnp.asarray(x).astype(jnp.float32)
    top, bottom = xf[:, y0], xf[:, y1]
    dy = jnp.asarray(dy)[None, :, None, None]
    dx = jnp.asarray(dx)[None, None, :, None]
    one = np.float32(1)
    return (top[:, :, x0] * (one - dy) * (one - dx) + bottom[:, :, x0] * dy * (one - dx)
            + top[:, :, x1] * (one - dy) * dx + bottom[:, :, x1] * dy * dx)


def _resize_nearest(call, x, size):
    x = _nhwc(call, x)
    oh, ow = new_size(call, size)
    ac, hp = bool(call.opts.align_corners), bool(call.opts.half_pixel_centers)
    rows = nearest_axis(x.shape[1], oh, ac, hp)
    cols = nearest_axis(x.shape[2], ow, ac, hp)
    return jnp.asarray(x)[:, rows][:, :, cols]


for _name, _real, _codes in (("FULLY_CONNECTED", _fully_connected, int8_fully_connected),
                             ("CONV_2D", _conv, int8_conv), ("DEPTHWISE_CONV_2D", _depthwise, int8_depthwise)):
    ROWS.add(_name, _real)
    ROWS.add(_name, _codes, types=CODES, check=int8_weighted_check)    # int8, 16x8, legacy uint8
    ROWS.add(_name, _real, types=(HYBRID,), check=int8_weighted_check)  # float around int8 weights
ROWS.add("TRANSPOSE_CONV", _transpose_conv, static=(0,))
ROWS.add("CONV_3D", _conv3d)
ROWS.add("CONV_3D_TRANSPOSE", _conv3d_transpose, static=(0,))
ROWS.add("LOCAL_RESPONSE_NORMALIZATION", _local_response_normalization)
ROWS.add("MAX_POOL_2D", _max_pool)
ROWS.add("AVERAGE_POOL_2D", _average_pool)
ROWS.add("BATCH_MATMUL", _batch_matmul)
ROWS.add("RESIZE_BILINEAR", _resize_bilinear, static=(1,))
ROWS.add("RESIZE_NEAREST_NEIGHBOR", _resize_nearest, static=(1,))
