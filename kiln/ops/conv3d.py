"""Op family: 3-D convolutions (CONV_3D, CONV_3D_TRANSPOSE) on NDHWC tensors.

Layouts follow LiteRT's conv3d.cc / conv3d_transpose.cc (and TensorFlow's Conv3D ops):
CONV_3D's filter is [KD, KH, KW, Cin, Cout]; CONV_3D_TRANSPOSE takes
(output_shape, filter [KD, KH, KW, Cout, Cin], input, optional bias). Geometry is LiteRT's
``ComputePadding3DValues``: the 2-D rules per axis, the odd pixel of SAME padding after.

LiteRT runs both ops on float32 only (its transposed convolution also has int8/int16
kernels, not written here: quantized operands are refused). Kernels are im2col + one GEMM
per chunk of output depth slices (CONV_3D) and one GEMM per filter tap scattered into the
output (CONV_3D_TRANSPOSE); no Python loop runs per pixel. Fused activations clamp like
LiteRT's builtin float kernels (NONE still maps +-inf to +-FLT_MAX).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..errors import OpError
from ..kernels.windows import Window, out_size, pad_before_after, windows
from ..schema import Activation, Padding
from .record import KernelCall, OpDef, OptionsSpec, clamp_activation, reject_quantized
from .traits import Shapes, Weights, elements, output_times_weights

#: Element budget of one im2col patch matrix; larger convolutions run in depth-slice chunks.
_IM2COL_BUDGET = 1 << 24

_AXES = ("depth", "height", "width")


def _float(call: KernelCall, x: np.ndarray, what: str) -> np.ndarray:
    """A float operand as float32 (float64 kept); LiteRT's 3-D convolutions are float only."""
    if x.dtype.kind != "f":
        raise OpError(f"{call.op.name}: {what} of type {x.dtype} is not supported (float32 only)")
    return x if x.dtype == np.float64 else x.astype(np.float32, copy=False)


def _rank5(call: KernelCall, x: np.ndarray, what: str) -> np.ndarray:
    if x.ndim != 5:
        raise OpError(f"{call.op.name}: {what} must be 5-D, got shape {list(x.shape)}")
    return x


def window_params(call: KernelCall):
    """((stride_d, stride_h, stride_w), (dilation_d, dilation_h, dilation_w)), checked."""
    o = call.opts
    strides = (o.stride_d, o.stride_h, o.stride_w)
    dilations = (o.dilation_d_factor, o.dilation_h_factor, o.dilation_w_factor)
    if min(strides) <= 0 or min(dilations) <= 0:
        raise OpError(f"{call.op.name}: strides {list(strides)} and dilations {list(dilations)} "
                      "(d, h, w) must be positive")
    if o.padding not in (Padding.SAME, Padding.VALID):
        raise OpError(f"{call.op.name}: unknown padding {o.padding}")
    return strides, dilations


def geometry(call: KernelCall, sizes: Sequence[int], kernel: Sequence[int], strides, dilations):
    """Output extents and (before, after) padding per spatial axis, as LiteRT computes them."""
    outs, pads = [], []
    for axis, size, k, s, d in zip(_AXES, sizes, kernel, strides, dilations):
        o = out_size(call.opts.padding, size, k, s, d)
        if o < 0:
            raise OpError(f"{call.op.name}: filter {k} (dilation {d}) does not fit input {axis} "
                          f"{size}")
        outs.append(o)
        pads.append(pad_before_after(size, k, s, d, o))
    return tuple(outs), tuple(pads)


def _bias(call: KernelCall, bias, channels: int):
    if bias is None:
        return None
    b = _float(call, bias, "bias").reshape(-1)
    if b.size != channels:
        raise OpError(f"{call.op.name}: bias has {b.size} elements for {channels} output channels")
    return b


def _finish(call: KernelCall, y: np.ndarray, bias) -> np.ndarray:
    """Add the bias, clamp to the fused activation (in place) and cast to the output type."""
    if bias is not None:
        y += bias
    y = clamp_activation(y, call.opts.fused_activation_function, in_place=True)
    out = call.out_dtypes[0] if call.out_dtypes else y.dtype
    return y.astype(out, copy=False)


# -- CONV_3D --------------------------------------------------------------------------------------

def _conv3d_kernel(call: KernelCall, x, w, bias=None):
    reject_quantized(call)
    x = _float(call, _rank5(call, x, "input"), "input")
    w = _float(call, _rank5(call, w, "filter"), "filter")
    n, d, h, wd, cin = x.shape
    kd, kh, kw, wcin, cout = w.shape
    if wcin != cin:
        raise OpError(f"CONV_3D: filter {list(w.shape)} [KD, KH, KW, Cin, Cout] expects {wcin} "
                      f"input channels, the input {list(x.shape)} has {cin}")
    b = _bias(call, bias, cout)
    strides, dilations = window_params(call)
    (od, oh, ow), pads = geometry(call, (d, h, wd), (kd, kh, kw), strides, dilations)
    dtype = np.result_type(x, w)
    y = np.empty((n, od, oh, ow, cout), dtype)
    if y.size == 0:
        return _finish(call, y, b)
    if any(before or after for before, after in pads):
        x = np.pad(x, ((0, 0), *pads, (0, 0)))
    depth = kd * kh * kw * cin
    wmat = w.reshape(depth, cout)
    windows_ = windows(np, x, Window((kd, kh, kw), (od, oh, ow), pads, strides, dilations))
    rows = max(1, _IM2COL_BUDGET // max(1, n * oh * ow * depth))
    for z0 in range(0, od, rows):
        chunk = windows_[:, z0:z0 + rows]
        m = chunk.shape[0] * chunk.shape[1] * oh * ow
        y[:, z0:z0 + rows] = (chunk.reshape(m, depth) @ wmat).reshape(chunk.shape[:4] + (cout,))
    return _finish(call, y, b)


# -- CONV_3D_TRANSPOSE ----------------------------------------------------------------------------

def _output_shape(call: KernelCall, output_shape) -> list[int]:
    shape = np.asarray(output_shape)
    if shape.dtype != np.int32:
        raise OpError(f"CONV_3D_TRANSPOSE: output_shape must be int32, got {shape.dtype}")
    if shape.ndim != 1 or shape.size != 5:
        raise OpError(f"CONV_3D_TRANSPOSE: output_shape must be a vector of 5 dims, got "
                      f"{shape.tolist()}")
    dims = [int(v) for v in shape]
    if min(dims) < 0:
        raise OpError(f"CONV_3D_TRANSPOSE: output_shape {dims} has a negative dim")
    return dims


def _conv3d_transpose_kernel(call: KernelCall, output_shape, w, x, bias=None):
    """Scatter form: each filter tap's products are added into the (padded) output."""
    reject_quantized(call)
    dims = _output_shape(call, output_shape)
    x = _float(call, _rank5(call, x, "input"), "input")
    w = _float(call, _rank5(call, w, "filter"), "filter")
    n, d, h, wd, cin = x.shape
    kd, kh, kw, cout, wcin = w.shape
    if wcin != cin or dims[0] != n or dims[4] != cout:
        raise OpError(f"CONV_3D_TRANSPOSE: input {list(x.shape)}, filter {list(w.shape)} "
                      f"[KD, KH, KW, Cout, Cin] and output_shape {dims} disagree")
    b = _bias(call, bias, cout)
    strides, dilations = window_params(call)
    out_sp = tuple(dims[1:4])
    # LiteRT pads as if the output were the input of the forward convolution.
    fwd, pads = geometry(call, out_sp, (kd, kh, kw), strides, dilations)
    if fwd != (d, h, wd):
        raise OpError(f"CONV_3D_TRANSPOSE: output_shape {dims} convolved with filter "
                      f"{[kd, kh, kw]} gives spatial extents {list(fwd)}, not the input's "
                      f"{[d, h, wd]}")
    dtype = np.result_type(x, w)
    # Buffer covering every position a tap can reach, shifted by the leading padding.
    full = [max((i - 1) * s + (k - 1) * dl + 1, p[0] + o) if i else p[0] + o
            for i, k, s, dl, p, o in zip((d, h, wd), (kd, kh, kw), strides, dilations, pads,
                                         out_sp)]
    acc = np.zeros((n, *full, cout), dtype)
    if x.size and acc.size:
        cols = x.reshape(-1, cin)
        (td, th, tw), (dd, dh, dw) = strides, dilations
        for i in range(kd):
            for j in range(kh):
                for k in range(kw):
                    tap = (cols @ w[i, j, k].T).reshape(n, d, h, wd, cout)
                    z, y, xx = i * dd, j * dh, k * dw
                    acc[:, z:z + (d - 1) * td + 1:td, y:y + (h - 1) * th + 1:th,
                        xx:xx + (wd - 1) * tw + 1:tw] += tap
    (pd, _), (ph, _), (pw, _) = pads
    out = acc[:, pd:pd + out_sp[0], ph:ph + out_sp[1], pw:pw + out_sp[2]]
    return _finish(call, np.ascontiguousarray(out), b)


# -- records --------------------------------------------------------------------------------------

_CONV3D_OPTIONS = OptionsSpec("Conv3DOptions", {
    "padding": Padding.SAME,
    "stride_d": 0,
    "stride_w": 0,
    "stride_h": 0,
    "fused_activation_function": Activation.NONE,
    "dilation_d_factor": 1,
    "dilation_w_factor": 1,
    "dilation_h_factor": 1,
})

# op_version.cc has no rule for either op (always version 1); register.cc registers 1 only.


def _conv3d_transpose_macs(op, shapes: Shapes | None = None) -> int:
    w = op.inputs[1]
    return elements(op.inputs[2], shapes) * math.prod(w.shape[:4]) if w is not None else 0


OPS: tuple[OpDef, ...] = (
    OpDef("CONV_3D", _conv3d_kernel, _CONV3D_OPTIONS,
          runtime_versions=("2.5.0",),
          weights=Weights((1,), axis=4, bias=2, spatial=(0, 1, 2)), macs=output_times_weights(lambda w: math.prod(w[:4]))),
    OpDef("CONV_3D_TRANSPOSE", _conv3d_transpose_kernel, _CONV3D_OPTIONS,
          runtime_versions=("2.6.0",),
          macs=_conv3d_transpose_macs),
)

__all__ = ["OPS"]
