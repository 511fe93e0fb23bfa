"""Quantized kernels (KernelCall adapters of `kiln.quant.integer_more`) for PRELU,
L2_NORMALIZATION, SQRT, ELU, RESIZE_BILINEAR and the legacy uint8 FULLY_CONNECTED / CONV_2D /
DEPTHWISE_CONV_2D. Each reads options, geometry and the operands' QuantParams, checks what
LiteRT's Prepare checks, and calls the pure function; the dictionaries at the end are the
records' ``quantized`` entries (merged with `kiln.ops.integer`'s where a record has both)."""

from __future__ import annotations

import numpy as np

from ..errors import OpError
from ..quant import integer_more as more
from ..quant.integer import IntegerKernelError
from ..schema import Activation
from .integer_arith import fused_activation, int16_zero_points, out_params, params
from .record import INT8, INT16, UINT8, KernelCall


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
    return more.prelu(x, params(call, 0, "input"), alpha, params(call, 1, "alpha"), out_params(call),
                      out_dtype=call.out_dtypes[0])


def _l2_normalization(call: KernelCall, x):
    if Activation(call.opts.fused_activation_function) != Activation.NONE:
        raise OpError(f"{call.op.name}: fused activation {Activation(call.opts.fused_activation_function).name} is "
                      "not supported (LiteRT's L2_NORMALIZATION takes NONE only)")
    out_q = out_params(call)
    if np.float32(out_q.scale[0]) != np.float32(1 / 128) or int(out_q.zero_point[0]) != 0:
        raise OpError(f"{call.op.name}: int8 output must have scale 1/128 and zero point 0 (LiteRT's Prepare), got "
                      f"{out_q.scale[0]} / {out_q.zero_point[0]}")
    return _run(call, more.l2_normalization, x, params(call, 0, "input"), out_dtype=call.out_dtypes[0])


def _sqrt(call: KernelCall, x):
    if x.dtype == np.int16:   # 16x8: LiteRT's elementwise Prepare checks zero points 0
        int16_zero_points(call, 0, -1)
    return _run(call, more.sqrt, x, params(call, 0, "input"), out_params(call), out_dtype=call.out_dtypes[0])


def _elu(call: KernelCall, x):
    return more.elu(x, params(call, 0, "input"), out_params(call), out_dtype=call.out_dtypes[0])


def _resize_bilinear(call: KernelCall, x, size):
    size = np.asarray(size).reshape(-1)
    if size.size != 2 or size.dtype.kind not in "iu" or np.any(size <= 0):
        raise OpError(f"{call.op.name}: size must be a positive integer [new_height, new_width], got {size}")
    return _run(call, more.resize_bilinear, x, (int(size[0]), int(size[1])),
                align_corners=bool(call.opts.align_corners), half_pixel_centers=bool(call.opts.half_pixel_centers))


# -- uint8 weighted ops --------------------------------------------------------------------------

def _geometry(call: KernelCall, x, kernel_hw) -> dict:
    from .windowed import window_geometry   # here: windowed imports elementwise, which imports this module

    if x.ndim != 4:
        raise OpError(f"{call.op.name}: input must be 4-D NHWC, got {list(x.shape)}")
    dilation = (call.opts.dilation_h_factor, call.opts.dilation_w_factor)
    out_hw, pads = window_geometry(call.opts, x.shape[1:3], kernel_hw, dilation)
    return dict(out_hw=out_hw, pads=pads, strides=(call.opts.stride_h, call.opts.stride_w), dilation=dilation)


def _fully_connected_uint8(call: KernelCall, x, w, bias=None):
    if w.ndim != 2:
        raise OpError(f"{call.op.name}: weights must be 2-D [units, depth], got {list(w.shape)}")
    return _run(call, more.fully_connected_uint8, x, params(call, 0, "input"), w, params(call, 1, "weights"), bias,
                out_params(call), activation=fused_activation(call), keep_num_dims=bool(call.opts.keep_num_dims))


def _conv_uint8(call: KernelCall, x, w, bias=None):
    return _run(call, more.conv2d_uint8, x, params(call, 0, "input"), w, params(call, 1, "filter"), bias,
                out_params(call), activation=fused_activation(call), **_geometry(call, x, w.shape[1:3]))


def _depthwise_uint8(call: KernelCall, x, w, bias=None):
    geometry = _geometry(call, x, w.shape[1:3])
    if x.shape[3] == 0 or w.shape[3] % x.shape[3]:
        raise OpError(f"{call.op.name}: filter channels {w.shape[3]} are not a multiple of input channels "
                      f"{x.shape[3]}")
    return _run(call, more.depthwise_conv2d_uint8, x, params(call, 0, "input"), w, params(call, 1, "filter"), bias,
                out_params(call), multiplier=w.shape[3] // x.shape[3], activation=fused_activation(call), **geometry)


# -- the records' ``quantized`` entries ----------------------------------------------------------

PRELU = {INT8: _prelu, UINT8: _prelu, INT16: _prelu}   # 16x8: int16 input and output, int8 alpha
L2_NORMALIZATION = {INT8: _l2_normalization}
SQRT = {INT8: _sqrt, INT16: _sqrt}
ELU = {INT8: _elu}
RESIZE_BILINEAR = {INT8: _resize_bilinear, INT16: _resize_bilinear}   # on the codes: any width
FULLY_CONNECTED = {UINT8: _fully_connected_uint8}
CONV_2D = {UINT8: _conv_uint8}
DEPTHWISE_CONV_2D = {UINT8: _depthwise_uint8}
