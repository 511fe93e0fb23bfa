"""The op records' quantized kernels: adapters from a node to LiteRT's integer and hybrid
arithmetic in `kiln.kernels`.

Each adapter reads the node's options, geometry and quantization parameters, checks what
LiteRT's Prepare checks, and calls the pure function of kiln.kernels, which is bit-exact with
LiteRT's reference kernels (``BUILTIN_REF``). The dictionaries at the end are the records'
``quantized`` entries, keyed by operand types (`kiln.ops.record.OpDef.kernel_for` picks one
per node); the families import them from here.
"""

from __future__ import annotations

import numpy as np

from ..errors import OpError
from ..kernels import activations as act
from ..kernels import elementwise as elementwise_kernels
from ..kernels import hybrid as hybrid_kernels
from ..kernels import hybrid_lstm
from ..kernels import image as image_kernels
from ..kernels import lstm as lstm_kernels
from ..kernels import softmax as softmax_kernels
from ..kernels import nn as nn_kernels
from ..kernels.fixedpoint import IntegerKernelError
from ..schema import (
    BIDIRECTIONAL_LSTM_AUX_INPUT,
    BIDIRECTIONAL_LSTM_BW,
    BIDIRECTIONAL_LSTM_FW,
    UNIDIRECTIONAL_LSTM,
    Activation,
    LstmLayout,
)
from .record import HYBRID, INT8, INT16, UINT8, KernelCall, activation_range, with_state
from .windowed import transpose_conv_geometry, window_geometry

# -- operand parameters and the fused activation --------------------------------------------

def params(call: KernelCall, i: int, what: str, *, per_tensor: bool = True):
    """Input ``i``'s (or, with i < 0, the output's) QuantParams, checked."""
    t = call.op.outputs[0] if i < 0 else call.op.inputs[i]
    q = None if t is None else t.quantization
    if q is None or q.scale.size == 0:
        raise OpError(f"{call.op.name}: {what} {t.name if t is not None else ''!r} has no quantization "
                      "parameters")
    if per_tensor and q.scale.size != 1:
        raise OpError(f"{call.op.name}: {what} {t.name!r} is quantized per channel ({q.scale.size} "
                      "scales); this kernel takes one scale")
    return q


def out_params(call: KernelCall):
    return params(call, -1, "output")


def int16_zero_points(call: KernelCall, *indices: int) -> None:
    """16x8 kernels take symmetric int16 activations (LiteRT checks zero point 0)."""
    for i in indices:
        t = call.op.outputs[0] if i < 0 else call.op.inputs[i]
        if t is not None and t.quantization is not None and np.any(t.quantization.zero_point):
            raise OpError(f"{call.op.name}: int16 tensor {t.name!r} has zero point "
                          f"{int(t.quantization.zero_point[0])}; 16x8 kernels need 0")


def fused_activation(call: KernelCall) -> Activation:
    return Activation(call.opts.fused_activation_function)


def _binary(fn):
    def kernel(call: KernelCall, a, b):
        try:
            np.broadcast_shapes(a.shape, b.shape)
        except ValueError:
            raise OpError(f"{call.op.name}: shapes {list(a.shape)} and {list(b.shape)} do not broadcast") from None
        return fn(a, params(call, 0, "input 0"), b, params(call, 1, "input 1"), out_params(call),
                  activation=fused_activation(call), out_dtype=call.out_dtypes[0])
    return kernel




def _squared_difference(call: KernelCall, a, b):
    try:
        np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise OpError(f"{call.op.name}: shapes {list(a.shape)} and {list(b.shape)} do not broadcast") from None
    return elementwise_kernels.squared_difference(a, params(call, 0, "input 0"), b, params(call, 1, "input 1"),
                                          out_params(call), out_dtype=call.out_dtypes[0])



def _int16_table(fn):
    """A 16x8 table kernel: int16 in and out (zero points 0, checked by ``fn``)."""
    def kernel(call: KernelCall, x):
        if call.out_dtypes[0] != np.int16:
            raise OpError(f"{call.op.name}: int16 input needs an int16 output, got {np.dtype(call.out_dtypes[0])}")
        return fn(x, params(call, 0, "input"), out_params(call))
    return kernel


def _abs(call: KernelCall, x):
    if x.dtype == np.int16:
        int16_zero_points(call, 0, -1)
    return act.abs_(x, params(call, 0, "input"), out_params(call), out_dtype=call.out_dtypes[0])




def comparison(fn):
    """An int8 comparison's kernel: ``fn`` on LiteRT's rescaled values (`comparison_values`)."""
    def kernel(call: KernelCall, a, b):
        try:
            np.broadcast_shapes(a.shape, b.shape)
        except ValueError:
            raise OpError(f"{call.op.name}: shapes {list(a.shape)} and {list(b.shape)} do not broadcast") from None
        return fn(*elementwise_kernels.comparison_values(a, params(call, 0, "input 0"), b, params(call, 1, "input 1")))
    return kernel


# -- weighted ops ----------------------------------------------------------------------------

def _fully_connected(call: KernelCall, x, w, bias=None):
    if x.dtype == np.int16:
        int16_zero_points(call, 0, -1)
    if w.ndim != 2:
        raise OpError(f"{call.op.name}: weights must be 2-D [units, depth], got {list(w.shape)}")
    return nn_kernels.fully_connected(
        x, params(call, 0, "input"), w, params(call, 1, "weights", per_tensor=False), bias, out_params(call),
        activation=fused_activation(call), keep_num_dims=bool(call.opts.keep_num_dims), out_dtype=call.out_dtypes[0])


def _geometry(call: KernelCall, x, kernel_hw, dilation=(1, 1)) -> dict:
    if x.ndim != 4:
        raise OpError(f"{call.op.name}: input must be 4-D NHWC, got {list(x.shape)}")
    out_hw, pads = window_geometry(call.opts, x.shape[1:3], kernel_hw, dilation)
    return dict(out_hw=out_hw, pads=pads, strides=(call.opts.stride_h, call.opts.stride_w))


def _dilation(call: KernelCall):
    return (call.opts.dilation_h_factor, call.opts.dilation_w_factor)


def _conv(call: KernelCall, x, w, bias=None):
    if x.dtype == np.int16:
        int16_zero_points(call, 0, -1)
    geometry = _geometry(call, x, w.shape[1:3], _dilation(call))
    return nn_kernels.conv2d(x, params(call, 0, "input"), w, params(call, 1, "filter", per_tensor=False), bias,
                          out_params(call), dilation=_dilation(call), activation=fused_activation(call),
                          out_dtype=call.out_dtypes[0], **geometry)


def _depthwise(call: KernelCall, x, w, bias=None):
    if x.dtype == np.int16:
        int16_zero_points(call, 0, -1)
    geometry = _geometry(call, x, w.shape[1:3], _dilation(call))
    if x.shape[3] == 0 or w.shape[3] % x.shape[3]:
        raise OpError(f"{call.op.name}: filter channels {w.shape[3]} are not a multiple of input channels "
                      f"{x.shape[3]}")
    return nn_kernels.depthwise_conv2d(
        x, params(call, 0, "input"), w, params(call, 1, "filter", per_tensor=False), bias, out_params(call),
        multiplier=w.shape[3] // x.shape[3], dilation=_dilation(call), activation=fused_activation(call),
        out_dtype=call.out_dtypes[0], **geometry)


def _transpose_conv(call: KernelCall, output_shape, w, x, bias=None):
    if x.dtype == np.int16:
        int16_zero_points(call, 2, -1)
    out_hw, pads = transpose_conv_geometry(call.opts, output_shape, x.shape, w.shape)
    return nn_kernels.transpose_conv(
        x, params(call, 2, "input"), w, params(call, 1, "filter", per_tensor=False), bias, out_params(call),
        out_hw=out_hw, pads=pads, strides=(call.opts.stride_h, call.opts.stride_w),
        activation=fused_activation(call), out_dtype=call.out_dtypes[0])


def _transpose_conv_hybrid(call: KernelCall, output_shape, w, x, bias=None):
    if w.dtype != np.int8 or x.dtype != np.float32:
        raise OpError(f"{call.op.name}: hybrid kernel takes float32 input and int8 filter, got {x.dtype} "
                      f"and {w.dtype}")
    out_hw, pads = transpose_conv_geometry(call.opts, output_shape, x.shape, w.shape)
    scales = _weight_scales(call, "filter")
    if scales.size not in (1, w.shape[0]):
        raise OpError(f"{call.op.name}: filter has {scales.size} scales for {w.shape[0]} output channels")
    y = hybrid_kernels.transpose_conv(x, w, scales, _float_bias(call, bias, w.shape[0]), out_hw=out_hw, pads=pads,
                              strides=(call.opts.stride_h, call.opts.stride_w))
    return _float_finish(call, y)


def _batch_matmul(call: KernelCall, a, b):
    if a.dtype == np.int16:
        int16_zero_points(call, 0, 1, -1)
    return nn_kernels.batch_matmul(a, params(call, 0, "lhs"), b, params(call, 1, "rhs"), out_params(call),
                                adj_x=bool(call.opts.adj_x), adj_y=bool(call.opts.adj_y),
                                out_dtype=call.out_dtypes[0])


# -- hybrid (float activations, int8 weights) ---------------------------------------------------

def _weight_scales(call: KernelCall, what: str) -> np.ndarray:
    return params(call, 1, what, per_tensor=False).scale


def _float_bias(call: KernelCall, bias, channels: int):
    if bias is None:
        return None
    if bias.dtype.kind != "f" or bias.size != channels:
        raise OpError(f"{call.op.name}: hybrid bias must be float with {channels} values, got "
                      f"{bias.dtype} {list(bias.shape)}")
    return bias.astype(np.float32, copy=False).reshape(-1)


def _float_finish(call: KernelCall, y: np.ndarray) -> np.ndarray:
    lo, hi = activation_range(call.opts.fused_activation_function, y.dtype)
    return np.clip(y, lo, hi, out=y).astype(call.out_dtypes[0], copy=False)


def _fully_connected_hybrid(call: KernelCall, x, w, bias=None):
    if w.ndim != 2 or w.dtype != np.int8 or x.dtype != np.float32:
        raise OpError(f"{call.op.name}: hybrid kernel takes float32 input and 2-D int8 weights, got "
                      f"{x.dtype} and {w.dtype} {list(w.shape)}")
    units, depth = w.shape
    if depth == 0 or x.size % depth:
        raise OpError(f"{call.op.name}: input {list(x.shape)} does not split into rows of {depth}")
    y = hybrid_kernels.fully_connected(x.reshape(-1, depth), w, _weight_scales(call, "weights"),
                               _float_bias(call, bias, units), asymmetric=bool(call.opts.asymmetric_quantize_inputs))
    y = _float_finish(call, y)
    return y.reshape(x.shape[:-1] + (units,)) if call.opts.keep_num_dims else y


def _conv_hybrid(call: KernelCall, x, w, bias, *, depthwise: bool):
    """Hybrid CONV_2D / DEPTHWISE_CONV_2D with per-channel weights (what TF writes)."""
    if w.dtype != np.int8 or x.dtype != np.float32:
        raise OpError(f"{call.op.name}: hybrid kernel takes float32 input and int8 filter, got {x.dtype} "
                      f"and {w.dtype}")
    scales = _weight_scales(call, "filter")
    channels = w.shape[3] if depthwise else w.shape[0]
    if scales.size != channels:
        raise OpError(f"{call.op.name}: hybrid kernel with per-tensor int8 weights is not supported "
                      "(TensorFlow writes per-channel ones)")
    geometry = dict(_geometry(call, x, w.shape[1:3], _dilation(call)), dilation=_dilation(call))
    b = _float_bias(call, bias, channels)
    if depthwise:
        if x.shape[3] == 0 or channels % x.shape[3]:
            raise OpError(f"{call.op.name}: filter channels {channels} are not a multiple of input "
                          f"channels {x.shape[3]}")
        y = hybrid_kernels.depthwise_per_channel(x, w, scales, b, multiplier=channels // x.shape[3], **geometry)
    else:
        if w.shape[3] != x.shape[3]:
            raise OpError(f"{call.op.name}: hybrid kernel needs filter channels {w.shape[3]} == input "
                          f"channels {x.shape[3]} (no grouped hybrid convolution)")
        y = hybrid_kernels.conv2d_per_channel(x, w, scales, b, **geometry)
    return _float_finish(call, y)


def _conv_hybrid_2d(call: KernelCall, x, w, bias=None):
    return _conv_hybrid(call, x, w, bias, depthwise=False)


def _depthwise_hybrid(call: KernelCall, x, w, bias=None):
    return _conv_hybrid(call, x, w, bias, depthwise=True)


# -- pooling and reductions ------------------------------------------------------------------

def _pool(call: KernelCall, x, pool):
    opts = call.opts
    filter_hw = (opts.filter_height, opts.filter_width)
    if min(filter_hw) < 1:
        raise OpError(f"{call.op.name}: filter {filter_hw[0]}x{filter_hw[1]} must be at least 1x1")
    in_q, out_q = params(call, 0, "input"), out_params(call)
    if np.float32(in_q.scale[0]) != np.float32(out_q.scale[0]) or in_q.zero_point[0] != out_q.zero_point[0]:
        raise OpError(f"{call.op.name}: input and output quantization differ ({in_q.scale[0]}, "
                      f"{in_q.zero_point[0]} vs {out_q.scale[0]}, {out_q.zero_point[0]}); LiteRT requires them equal")
    return pool(x, filter_hw=filter_hw, activation=fused_activation(call), out_qp=out_q,
                out_dtype=call.out_dtypes[0], **_geometry(call, x, filter_hw))


def _max_pool(call: KernelCall, x):
    return _pool(call, x, nn_kernels.max_pool2d)


def _average_pool(call: KernelCall, x):
    return _pool(call, x, nn_kernels.average_pool2d)


def _mean(call: KernelCall, x, axes):
    axes = np.asarray(axes).reshape(-1)
    if np.any((axes < -x.ndim) | (axes >= max(x.ndim, 1))):
        raise OpError(f"{call.op.name}: axes {axes.tolist()} out of range for rank {x.ndim}")
    return nn_kernels.mean(x, params(call, 0, "input"), axes, out_params(call), keep_dims=bool(call.opts.keep_dims),
                        out_dtype=call.out_dtypes[0])


def _sum(call: KernelCall, x, axes):
    """int8 SUM: LiteRT's optimized kernel (kiln.kernels.nn.quantized_sum)."""
    axes = np.asarray(axes).reshape(-1)
    if np.any((axes < -x.ndim) | (axes >= max(x.ndim, 1))):
        raise OpError(f"{call.op.name}: axes {axes.tolist()} out of range for rank {x.ndim}")
    return nn_kernels.quantized_sum(x, params(call, 0, "input"), axes, out_params(call),
                                    keep_dims=bool(call.opts.keep_dims), out_dtype=call.out_dtypes[0])


def _concatenation(call: KernelCall, *xs):
    inputs = [params(call, k, f"input {k}") for k in range(len(xs))]
    axis = int(call.opts.axis)
    rank = xs[0].ndim if xs else 0
    if not -rank <= axis < rank:
        raise OpError(f"{call.op.name}: axis {axis} out of range for rank {rank}")
    try:
        return nn_kernels.concatenation(xs, inputs, out_params(call), axis=axis, activation=fused_activation(call),
                                     out_dtype=call.out_dtypes[0])
    except ValueError as exc:
        raise OpError(f"{call.op.name}: inputs {[list(x.shape) for x in xs]} do not concatenate on axis "
                      f"{axis}") from exc


def _pack(call: KernelCall, *xs):
    """int8 PACK: LiteRT stacks the codes and requires every input's params to be the output's."""
    out_q = out_params(call)
    for k in range(len(xs)):
        q = params(call, k, f"input {k}")
        if np.float32(q.scale[0]) != np.float32(out_q.scale[0]) or q.zero_point[0] != out_q.zero_point[0]:
            raise OpError(f"{call.op.name}: input {k} has scale {q.scale[0]} zero point {q.zero_point[0]}, the "
                          f"output {out_q.scale[0]} / {out_q.zero_point[0]}; LiteRT requires them equal")
    rank = xs[0].ndim + 1 if xs else 1
    axis = int(call.opts.axis)
    if not -rank <= axis < rank or any(x.shape != xs[0].shape for x in xs):
        raise OpError(f"{call.op.name}: inputs {[list(x.shape) for x in xs]} do not stack on axis {axis}")
    return np.stack(xs, axis=axis).astype(call.out_dtypes[0], copy=False)


# -- elementwise -----------------------------------------------------------------------------

def _unary(fn, **fixed):
    def kernel(call: KernelCall, x):
        return fn(x, params(call, 0, "input"), out_params(call), out_dtype=call.out_dtypes[0], **fixed)
    return kernel


def _int16_unary(fn):
    """A 16x8 activation with Q0.15 output (LOGISTIC, TANH): int16 in, int16 out, zero points 0."""
    def kernel(call: KernelCall, x):
        if call.out_dtypes[0] != np.int16:
            raise OpError(f"{call.op.name}: int16 input needs an int16 output, got {np.dtype(call.out_dtypes[0])}")
        int16_zero_points(call, 0, -1)
        return fn(x, params(call, 0, "input"), out_params(call))
    return kernel


def _softmax(call: KernelCall, x):
    if x.ndim == 0:
        raise OpError(f"{call.op.name}: input must have at least one dimension")
    if x.dtype == np.int16:
        int16_zero_points(call, 0, -1)
        return softmax_kernels.softmax_int16(x, params(call, 0, "input"), out_params(call), beta=float(call.opts.beta))
    return softmax_kernels.softmax(x, params(call, 0, "input"), out_params(call), beta=float(call.opts.beta),
                       out_dtype=call.out_dtypes[0])


def _log_softmax(call: KernelCall, x):
    return act.log_softmax(x, params(call, 0, "input"), out_params(call), out_dtype=call.out_dtypes[0])


def _leaky_relu(call: KernelCall, x):
    if x.dtype == np.int16:
        int16_zero_points(call, 0, -1)
    return act.leaky_relu(x, params(call, 0, "input"), out_params(call), alpha=float(call.opts.alpha),
                          out_dtype=call.out_dtypes[0])


def _gelu(call: KernelCall, x):
    if x.dtype == np.int16:
        int16_zero_points(call, 0, -1)
        return act.gelu_int16(x, params(call, 0, "input"), out_params(call), approximate=bool(call.opts.approximate))
    return act.gelu(x, params(call, 0, "input"), out_params(call), approximate=bool(call.opts.approximate),
                    out_dtype=call.out_dtypes[0])


def _hard_swish(call: KernelCall, x):
    return act.hard_swish(x, params(call, 0, "input"), out_params(call), out_dtype=call.out_dtypes[0])


def _relu(activation: Activation):
    unary = _unary(act.relu, activation=activation)

    def kernel(call: KernelCall, x):
        if x.dtype == np.int16:   # the same rescale and clamp, LiteRT checks zero points 0
            int16_zero_points(call, 0, -1)
        return unary(call, x)
    return kernel


def _run(call: KernelCall, fn, *args, **kwargs):
    """The pure function's refusals as the node's OpError."""
    try:
        return fn(*args, **kwargs)
    except IntegerKernelError as exc:
        raise OpError(f"{call.op.name}: {exc}") from exc


def _prelu(call: KernelCall, x, alpha):
    try:
        np.broadcast_to(alpha, x.shape)
    except ValueError as exc:
        raise OpError(f"{call.op.name}: alpha shape {list(alpha.shape)} does not broadcast into the input shape "
                      f"{list(x.shape)}") from exc
    return act.prelu(x, params(call, 0, "input"), alpha, params(call, 1, "alpha"), out_params(call),
                      out_dtype=call.out_dtypes[0])


def _l2_normalization(call: KernelCall, x):
    if Activation(call.opts.fused_activation_function) != Activation.NONE:
        raise OpError(f"{call.op.name}: fused activation {Activation(call.opts.fused_activation_function).name} is "
                      "not supported (LiteRT's L2_NORMALIZATION takes NONE only)")
    out_q = out_params(call)
    if np.float32(out_q.scale[0]) != np.float32(1 / 128) or int(out_q.zero_point[0]) != 0:
        raise OpError(f"{call.op.name}: int8 output must have scale 1/128 and zero point 0 (LiteRT's Prepare), got "
                      f"{out_q.scale[0]} / {out_q.zero_point[0]}")
    return _run(call, act.l2_normalization, x, params(call, 0, "input"), out_dtype=call.out_dtypes[0])


def _sqrt(call: KernelCall, x):
    if x.dtype == np.int16:   # 16x8: LiteRT's elementwise Prepare checks zero points 0
        int16_zero_points(call, 0, -1)
    return _run(call, act.sqrt, x, params(call, 0, "input"), out_params(call), out_dtype=call.out_dtypes[0])


def _elu(call: KernelCall, x):
    return act.elu(x, params(call, 0, "input"), out_params(call), out_dtype=call.out_dtypes[0])


def _resize_bilinear(call: KernelCall, x, size):
    size = np.asarray(size).reshape(-1)
    if size.size != 2 or size.dtype.kind not in "iu" or np.any(size <= 0):
        raise OpError(f"{call.op.name}: size must be a positive integer [new_height, new_width], got {size}")
    return _run(call, image_kernels.resize_bilinear, x, (int(size[0]), int(size[1])),
                align_corners=bool(call.opts.align_corners), half_pixel_centers=bool(call.opts.half_pixel_centers))


# -- uint8 weighted ops --------------------------------------------------------------------------

def _uint8_geometry(call: KernelCall, x, kernel_hw) -> dict:
    return dict(_geometry(call, x, kernel_hw, _dilation(call)), dilation=_dilation(call))


def _fully_connected_uint8(call: KernelCall, x, w, bias=None):
    if w.ndim != 2:
        raise OpError(f"{call.op.name}: weights must be 2-D [units, depth], got {list(w.shape)}")
    return _run(call, nn_kernels.fully_connected_uint8, x, params(call, 0, "input"), w, params(call, 1, "weights"), bias,
                out_params(call), activation=fused_activation(call), keep_num_dims=bool(call.opts.keep_num_dims))


def _conv_uint8(call: KernelCall, x, w, bias=None):
    return _run(call, nn_kernels.conv2d_uint8, x, params(call, 0, "input"), w, params(call, 1, "filter"), bias,
                out_params(call), activation=fused_activation(call), **_uint8_geometry(call, x, w.shape[1:3]))


def _depthwise_uint8(call: KernelCall, x, w, bias=None):
    geometry = _uint8_geometry(call, x, w.shape[1:3])
    if x.shape[3] == 0 or w.shape[3] % x.shape[3]:
        raise OpError(f"{call.op.name}: filter channels {w.shape[3]} are not a multiple of input channels "
                      f"{x.shape[3]}")
    return _run(call, nn_kernels.depthwise_conv2d_uint8, x, params(call, 0, "input"), w, params(call, 1, "filter"), bias,
                out_params(call), multiplier=w.shape[3] // x.shape[3], activation=fused_activation(call), **geometry)


# -- UNIDIRECTIONAL_SEQUENCE_LSTM -----------------------------------------------------------

def _uni_lstm_int8(call: KernelCall, *inputs):
    op, opts = call.op, call.opts
    lstm_kernels.check_operands(op, inputs)
    if opts.cell_clip < 0 or opts.proj_clip < 0:
        raise OpError(f"{lstm_kernels.NAME}: cell_clip and proj_clip must be >= 0, got {opts.cell_clip} "
                      f"and {opts.proj_clip}")
    p = lstm_kernels.prepare(op, inputs, cell_clip=float(opts.cell_clip), proj_clip=float(opts.proj_clip))
    out, h, c = lstm_kernels.run(p, np.asarray(inputs[0]), np.asarray(inputs[lstm_kernels.LAYOUT.output_state]),
                                 np.asarray(inputs[lstm_kernels.LAYOUT.cell_state]), bool(opts.time_major))
    return with_state(call, [out], (h, c))


# -- hybrid sequence LSTMs (float activations and states, int8 weights) ------------------------

def _operand(inputs, i):
    return inputs[i] if i < len(inputs) else None


def _hybrid_matrix(call: KernelCall, inputs, i: int, what: str, shape: tuple) -> tuple[np.ndarray, float]:
    """Operand ``i``: int8 weights of ``shape`` with one scale (LiteRT reads params.scale)."""
    w = _operand(inputs, i)
    if w is None:
        raise OpError(f"{call.op.name}: operand {i} ({what}) is missing")
    if w.dtype != np.int8:
        raise OpError(f"{call.op.name}: hybrid LSTM operand {i} ({what}) must be int8, got {w.dtype}")
    if w.shape != shape:
        raise OpError(f"{call.op.name}: operand {i} ({what}) has shape {list(w.shape)}, expected {list(shape)}")
    q = params(call, i, what)
    return w, float(np.float32(q.scale[0]))


def _float_operand(call: KernelCall, inputs, i: int, what: str, size: int) -> np.ndarray | None:
    a = _operand(inputs, i)
    if a is None:
        return None
    if a.dtype != np.float32 or a.size != size:
        raise OpError(f"{call.op.name}: operand {i} ({what}) must be float32 with {size} values, got "
                      f"{a.dtype} {list(a.shape)}")
    return a.reshape(-1)


def hybrid_lstm_cell(call: KernelCall, inputs, lay: LstmLayout, n_input: int, n_aux: int | None) -> hybrid_lstm.Cell:
    """One direction's operands, checked as LiteRT's Prepare checks them (sizes, types)."""
    name, opts = call.op.name, call.opts
    forget = _operand(inputs, lay.input_weights[1])
    recurrent = _operand(inputs, lay.recurrent_weights[1])
    if forget is None or recurrent is None or forget.ndim != 2 or recurrent.ndim != 2:
        raise OpError(f"{name}: input_to_forget and recurrent_to_forget weights (operands {lay.input_weights[1]}, "
                      f"{lay.recurrent_weights[1]}) must be 2-D (diagonal recurrent weights have no hybrid kernel)")
    n_cell, n_output = recurrent.shape
    cifg = _operand(inputs, lay.input_weights[0]) is None
    gates = "fco" if cifg else "ifco"
    if cifg and any(_operand(inputs, i) is not None for i in (lay.recurrent_weights[0], lay.biases[0])):
        raise OpError(f"{name}: a CIFG LSTM (no input_to_input weights) must have no input gate recurrent weights "
                      "or bias")
    first = 1 if cifg else 0
    pick = range(first, 4)
    x_parts = [_hybrid_matrix(call, inputs, lay.input_weights[g], f"input_to_{'ifco'[g]} weights", (n_cell, n_input))
               for g in pick]
    h_parts = [_hybrid_matrix(call, inputs, lay.recurrent_weights[g], f"recurrent_to_{'ifco'[g]} weights",
                              (n_cell, n_output)) for g in pick]
    biases = []
    for g in pick:
        b = _float_operand(call, inputs, lay.biases[g], f"{'ifco'[g]} gate bias", n_cell)
        if b is None:
            raise OpError(f"{name}: operand {lay.biases[g]} ({'ifco'[g]} gate bias) is missing")
        biases.append(b)
    aux = None
    if n_aux is not None and lay.aux_weights:
        aux = hybrid_lstm.Matrix.stack([_hybrid_matrix(call, inputs, lay.aux_weights[g], f"aux_input_to_{'ifco'[g]} "
                                                       "weights", (n_cell, n_aux)) for g in pick])
    peephole = {}
    for g, i in zip("ifo", lay.peepholes):
        w = _operand(inputs, i)
        if w is None or (cifg and g == "i"):
            continue
        q, scale = _hybrid_matrix(call, inputs, i, f"cell_to_{g} weights", (n_cell,))
        peephole[g] = (q.astype(np.float32) * np.float32(scale)).astype(np.float32)
    if peephole and len(peephole) != (2 if cifg else 3):
        raise OpError(f"{name}: peephole weights must be given for every gate or none")
    layer_norm = {}
    for g, i in zip("ifco", lay.layer_norm):
        coefficients = _float_operand(call, inputs, i, f"{g} layer norm coefficients", n_cell)
        if coefficients is not None and not (cifg and g == "i"):
            layer_norm[g] = coefficients
    if layer_norm and set(layer_norm) != set(gates):
        raise OpError(f"{name}: layer norm coefficients must be given for every gate or none")
    projection = projection_bias = None
    if _operand(inputs, lay.projection_weights) is not None:
        projection = hybrid_lstm.Matrix.stack([_hybrid_matrix(call, inputs, lay.projection_weights,
                                                              "projection weights", (n_output, n_cell))])
        projection_bias = _float_operand(call, inputs, lay.projection_bias, "projection bias", n_output)
    elif _operand(inputs, lay.projection_bias) is not None:
        raise OpError(f"{name}: projection bias given without projection weights")
    elif n_output != n_cell:
        raise OpError(f"{name}: {n_output} outputs for {n_cell} cells without a projection")
    if opts.cell_clip < 0 or opts.proj_clip < 0:
        raise OpError(f"{name}: cell_clip and proj_clip must be >= 0, got {opts.cell_clip} and {opts.proj_clip}")
    return hybrid_lstm.Cell(
        gates, hybrid_lstm.Matrix.stack(x_parts), hybrid_lstm.Matrix.stack(h_parts),
        np.concatenate(biases).astype(np.float32), aux=aux, peephole=peephole, layer_norm=layer_norm,
        projection=projection, projection_bias=projection_bias, activation=int(opts.fused_activation_function),
        cell_clip=float(np.float32(opts.cell_clip)), proj_clip=float(np.float32(opts.proj_clip)),
        asymmetric=bool(opts.asymmetric_quantize_inputs))


def hybrid_lstm_states(call: KernelCall, inputs, lay: LstmLayout, batch: int, cell: hybrid_lstm.Cell):
    h, c = _operand(inputs, lay.output_state), _operand(inputs, lay.cell_state)
    n_output = cell.recurrent.q.shape[1]
    for a, what, size in ((h, "output state", n_output), (c, "cell state", cell.n_cell)):
        if a is None:
            raise OpError(f"{call.op.name}: the {what} operand (a variable tensor) is missing")
        if a.dtype != np.float32 or a.size != batch * size:
            raise OpError(f"{call.op.name}: the hybrid LSTM's {what} must be float32 with batch {batch} x {size} "
                          f"values, got {a.dtype} {list(a.shape)}")
    return h.reshape(batch, -1), c.reshape(batch, -1)


def hybrid_lstm_input(call: KernelCall, x) -> np.ndarray:
    if x is None or x.dtype != np.float32 or x.ndim != 3:
        raise OpError(f"{call.op.name}: the hybrid LSTM takes a 3-D float32 input, got "
                      f"{None if x is None else (x.dtype, list(x.shape))}")
    return x if call.opts.time_major else x.transpose(1, 0, 2)


def hybrid_bidi_lstm_sources(call: KernelCall, inputs):
    """What feeds each direction of a hybrid BIDIRECTIONAL_SEQUENCE_LSTM: (the input
    time-major, the aux input time-major or None, whether it is cross-linked — the aux input
    feeding both directions through aux weights, or absent — and the aux width the cells take).
    Not cross-linked, the aux input is the backward direction's input. Over any array type."""
    xt = hybrid_lstm_input(call, inputs[0])
    aux_in = _operand(inputs, BIDIRECTIONAL_LSTM_AUX_INPUT)
    aux_t = None if aux_in is None else hybrid_lstm_input(call, aux_in)
    if aux_t is not None and aux_t.shape[:2] != xt.shape[:2]:
        raise OpError(f"{call.op.name}: aux input shape {list(aux_in.shape)} does not match the input's time and "
                      f"batch dims {list(inputs[0].shape)}")
    has_aux_weights = _operand(inputs, BIDIRECTIONAL_LSTM_FW.aux_weights[1]) is not None
    if has_aux_weights and aux_t is None:
        raise OpError(f"{call.op.name}: aux weights given but no aux input (operand {BIDIRECTIONAL_LSTM_AUX_INPUT})")
    cross_linked = aux_t is None or has_aux_weights
    n_aux = aux_t.shape[2] if cross_linked and aux_t is not None else None
    return xt, aux_t, cross_linked, n_aux


def _uni_lstm_hybrid(call: KernelCall, *inputs):
    """UNIDIRECTIONAL_SEQUENCE_LSTM v2 / v3: float input, int8 weights (lstm_eval.cc EvalHybrid)."""
    if call.opts.diagonal_recurrent_tensors:
        raise OpError(f"{call.op.name}: diagonal recurrent weights have no hybrid kernel")
    xt = hybrid_lstm_input(call, inputs[0])
    cell = hybrid_lstm_cell(call, inputs, UNIDIRECTIONAL_LSTM, xt.shape[2], None)
    h0, c0 = hybrid_lstm_states(call, inputs, UNIDIRECTIONAL_LSTM, xt.shape[1], cell)
    out, h, c = hybrid_lstm.run(cell, xt, h0, c0, time_major=bool(call.opts.time_major))
    out = out if call.opts.time_major else out.transpose(1, 0, 2)
    lay = UNIDIRECTIONAL_LSTM
    return with_state(call, [out], (h.reshape(inputs[lay.output_state].shape), c.reshape(inputs[lay.cell_state].shape)))


def _bidi_lstm_hybrid(call: KernelCall, *inputs):
    """BIDIRECTIONAL_SEQUENCE_LSTM v2 / v3 (bidirectional_sequence_lstm.cc's hybrid path): the
    aux input feeds both directions when aux weights are given, else it is the backward
    direction's input (stacked layers without cross links)."""
    xt, aux_t, cross_linked, n_aux = hybrid_bidi_lstm_sources(call, inputs)
    outs, states = [], []
    for lay, reverse in ((BIDIRECTIONAL_LSTM_FW, False), (BIDIRECTIONAL_LSTM_BW, True)):
        src = xt if (cross_linked or not reverse) else aux_t
        cell = hybrid_lstm_cell(call, inputs, lay, src.shape[2], n_aux)
        h0, c0 = hybrid_lstm_states(call, inputs, lay, xt.shape[1], cell)
        out, h, c = hybrid_lstm.run(cell, src, h0, c0, aux=aux_t if cross_linked else None, reverse=reverse,
                                    time_major=bool(call.opts.time_major))
        outs.append(out if call.opts.time_major else out.transpose(1, 0, 2))
        states += [h.reshape(inputs[lay.output_state].shape), c.reshape(inputs[lay.cell_state].shape)]
    if call.opts.merge_outputs:
        outs = [np.concatenate(outs, axis=-1)]
    return with_state(call, outs, states)


# -- the records' ``quantized`` entries ---------------------------------------------------------

FULLY_CONNECTED = {INT8: _fully_connected, INT16: _fully_connected, UINT8: _fully_connected_uint8,
                   HYBRID: _fully_connected_hybrid}
CONV_2D = {INT8: _conv, INT16: _conv, UINT8: _conv_uint8, HYBRID: _conv_hybrid_2d}
DEPTHWISE_CONV_2D = {INT8: _depthwise, INT16: _depthwise, UINT8: _depthwise_uint8, HYBRID: _depthwise_hybrid}
TRANSPOSE_CONV = {INT8: _transpose_conv, INT16: _transpose_conv, HYBRID: _transpose_conv_hybrid}
BATCH_MATMUL = {INT8: _batch_matmul, INT16: _batch_matmul}
MAX_POOL_2D = {INT8: _max_pool, UINT8: _max_pool, INT16: _max_pool}
AVERAGE_POOL_2D = {INT8: _average_pool, UINT8: _average_pool, INT16: _average_pool}
MEAN = {INT8: _mean, INT16: _mean}
SUM = {INT8: _sum}
CONCATENATION = {INT8: _concatenation, INT16: _concatenation}
PACK = {INT8: _pack, INT16: _pack}
SOFTMAX = {INT8: _softmax, INT16: _softmax}
LOGISTIC = {INT8: _unary(act.logistic), INT16: _int16_unary(act.logistic_int16)}
TANH = {INT8: _unary(act.tanh), INT16: _int16_unary(act.tanh_int16)}
RELU = dict.fromkeys((INT8, UINT8, INT16), _relu(Activation.RELU))
RELU6 = dict.fromkeys((INT8, UINT8, INT16), _relu(Activation.RELU6))
RELU_N1_TO_1 = {INT8: _relu(Activation.RELU_N1_TO_1), UINT8: _relu(Activation.RELU_N1_TO_1)}
LEAKY_RELU = {INT8: _leaky_relu, INT16: _leaky_relu}
GELU = {INT8: _gelu, INT16: _gelu}
HARD_SWISH = {INT8: _hard_swish}
LOG_SOFTMAX = {INT8: _log_softmax}
ADD = dict.fromkeys((INT8, INT16), _binary(elementwise_kernels.add))
SUB = dict.fromkeys((INT8, INT16), _binary(elementwise_kernels.sub))
MUL = dict.fromkeys((INT8, INT16), _binary(elementwise_kernels.mul))
DIV = {INT8: _binary(elementwise_kernels.div)}
SQUARED_DIFFERENCE = {INT8: _squared_difference}
RSQRT = {INT8: _unary(act.rsqrt), INT16: _int16_table(act.rsqrt_int16)}
EXP = {INT8: _unary(act.exp), INT16: _int16_table(act.exp_int16)}
LOG = {INT8: _unary(act.log), INT16: _int16_table(act.log_int16)}
ABS = {INT8: _abs, INT16: _abs}
PRELU = {INT8: _prelu, UINT8: _prelu, INT16: _prelu}   # 16x8: int16 input and output, int8 alpha
L2_NORMALIZATION = {INT8: _l2_normalization}
SQRT = {INT8: _sqrt, INT16: _sqrt}
ELU = {INT8: _elu}
RESIZE_BILINEAR = {INT8: _resize_bilinear, INT16: _resize_bilinear}   # on the codes: any width
UNIDIRECTIONAL_SEQUENCE_LSTM = {INT8: _uni_lstm_int8, HYBRID: _uni_lstm_hybrid}
BIDIRECTIONAL_SEQUENCE_LSTM = {HYBRID: _bidi_lstm_hybrid}
