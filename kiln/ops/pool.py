"""Op family: 2-D pooling (MAX_POOL_2D, AVERAGE_POOL_2D).

Both accumulate the window taps in order over the whole tensor (no Python loop per pixel);
AVERAGE_POOL_2D divides by the in-bounds part of each window, as LiteRT. MAX_POOL_2D also
takes integer tensors whose input and output share one quantization (max commutes with it).
"""

from __future__ import annotations

import numpy as np

from ..errors import OpError
from ..schema import Activation, DType, Padding
from . import quantized_kernels
from .record import KernelCall, OpDef, OptionsSpec, activation_range, input_dtype, output_dtype, reject_quantized, takes
from .traits import same
from .windowed import (
    _float_operand,
    _nhwc,
    _pad_hw,
    _tap,
    padded_windows,
    window_geometry,
)


def _pool_version(op) -> int:
    if input_dtype(op) == DType.INT16 and output_dtype(op) == DType.INT16:
        return 3
    if input_dtype(op) == DType.INT8:
        return 2
    return 1


def _pool_shape(opts, shapes):
    x = shapes[0]
    if len(x) != 4:
        raise OpError(f"pooling input must be 4-D NHWC, got {list(x)}")
    (oh, ow), _ = window_geometry(opts, x[1:3], (opts.filter_height, opts.filter_width))
    return [(x[0], oh, ow, x[3])]


def _pool_setup(call: KernelCall, x):
    opts = call.opts
    _nhwc(call, x)
    if opts.filter_height <= 0 or opts.filter_width <= 0:
        raise OpError(f"{call.op.name}: filter size {opts.filter_height}x{opts.filter_width} "
                      "must be positive")
    kernel = (opts.filter_height, opts.filter_width)
    out_hw, pads = window_geometry(opts, x.shape[1:3], kernel)
    return kernel, out_hw, pads, (opts.stride_h, opts.stride_w)


def _max_pool_kernel(call: KernelCall, x):
    if x.dtype.kind == "f":
        reject_quantized(call)
    elif x.dtype in (np.int8, np.uint8, np.int16):
        reject_quantized(call, shared_ok=True)  # max commutes with a shared affine map
    else:
        raise OpError(f"MAX_POOL_2D: input type {x.dtype} is not supported")
    (kh, kw), out_hw, pads, strides = _pool_setup(call, x)
    integer = x.dtype.kind != "f"
    if integer and call.opts.fused_activation_function != Activation.NONE:
        raise OpError("MAX_POOL_2D: fused activation on integer input is not implemented")
    low = np.iinfo(x.dtype).min if integer else -np.inf
    _, taps = padded_windows(x, (kh, kw), out_hw, pads, strides, (1, 1), low)
    y = None
    for i in range(kh):
        for j in range(kw):
            y = taps[i, j].copy() if y is None else np.maximum(y, taps[i, j], out=y)
    if not integer:
        lo, hi = activation_range(call.opts.fused_activation_function, x.dtype)
        y.clip(lo, hi, out=y)
    return y.astype(call.out_dtypes[0], copy=False)


def _avg_pool_kernel(call: KernelCall, x):
    """Mean over the in-bounds part of each window (padding is not counted), as LiteRT."""
    reject_quantized(call)
    xf = _float_operand(call, x, "input")
    (kh, kw), (oh, ow), pads, strides = _pool_setup(call, xf)
    _, taps = padded_windows(xf, (kh, kw), (oh, ow), pads, strides, (1, 1))
    total = np.zeros((xf.shape[0], oh, ow, xf.shape[3]), xf.dtype)
    for i in range(kh):
        for j in range(kw):
            total += taps[i, j]
    y = total / window_counts(xf.shape, xf.dtype, (kh, kw), (oh, ow), pads, strides)
    lo, hi = activation_range(call.opts.fused_activation_function, xf.dtype)
    y.clip(lo, hi, out=y)
    return y.astype(call.out_dtypes[0], copy=False)


def window_counts(x_shape, dtype, kernel_hw, out_hw, pads, strides) -> np.ndarray:
    """[1, OH, OW, 1]: how many in-bounds pixels each window covers (AVERAGE_POOL_2D's divisor)."""
    inside = _pad_hw(np.ones((1, x_shape[1], x_shape[2], 1), dtype), pads)
    count = np.zeros((1, *out_hw, 1), dtype)
    for i in range(kernel_hw[0]):
        for j in range(kernel_hw[1]):
            count += _tap(inside, i, j, out_hw, strides, (1, 1))
    return count


_POOL_OPTIONS = OptionsSpec("Pool2DOptions", {
    "padding": Padding.SAME,
    "stride_w": 0,
    "stride_h": 0,
    "filter_width": 0,
    "filter_height": 0,
    "fused_activation_function": Activation.NONE,
})

MAX_POOL_2D = OpDef(
    name="MAX_POOL_2D", kernel=_max_pool_kernel, options=_POOL_OPTIONS,
    version=_pool_version, max_version=3, shape=_pool_shape, fused_activation_host=True,
    runtime_versions=("1.5.0", "1.14.0", "2.3.0"), quantized=quantized_kernels.MAX_POOL_2D,
    quantization=same(),
    types=takes("float32 int8 uint8 int16"),
)
AVERAGE_POOL_2D = OpDef(
    name="AVERAGE_POOL_2D", kernel=_avg_pool_kernel, options=_POOL_OPTIONS,
    version=_pool_version, max_version=3, shape=_pool_shape, fused_activation_host=True,
    runtime_versions=("1.5.0", "1.14.0", "2.3.0"), quantized=quantized_kernels.AVERAGE_POOL_2D,
    quantization=same(),
    types=takes("float16 float32 int8 uint8 int16"),
)


OPS = (MAX_POOL_2D, AVERAGE_POOL_2D)
