"""Shared machinery of the windowed NN ops (convolutions, pooling).

Geometry follows LiteRT's ``ComputePaddingHeightWidth`` exactly — output size, and the SAME
padding split whose extra pixel of an odd total goes after, not before — and is the one copy
the kernels, the passes (kiln/passes/pad.py) and the backends use. Window views over a
zero-padded input, and the float-operand checks and activation clamp of the float kernels,
live here too.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import OpError
from ..schema import Padding
from .record import KernelCall, activation_range


def _float_operand(call: KernelCall, x: np.ndarray, what: str) -> np.ndarray:
    """The operand as a float array (float64 stays float64); other types are refused."""
    if x.dtype.kind != "f":
        raise OpError(f"{call.op.name}: {what} of type {x.dtype} is not supported (float only)")
    return x if x.dtype == np.float64 else x.astype(np.float32, copy=False)



def _finish(call: KernelCall, y: np.ndarray, act: int) -> np.ndarray:
    """Clamp a scratch result in place to the fused activation's range and cast it.

    LiteRT's builtin float kernels clamp even for NONE (to +-FLT_MAX, so an infinity comes
    out as FLT_MAX) and have no range for TANH or SIGN_BIT, which they thus ignore.
    """
    lo, hi = activation_range(act, y.dtype)
    y.clip(lo, hi, out=y)  # np.clip, without its wrappers
    return y.astype(call.out_dtypes[0], copy=False)


def _add_bias(call: KernelCall, y: np.ndarray, bias) -> np.ndarray:
    """Add bias over the last (channel) axis of ``y``, a scratch array the kernel owns."""
    if bias is None:
        return y
    b = _float_operand(call, bias, "bias").reshape(-1)
    if b.size != y.shape[-1]:
        raise OpError(f"{call.op.name}: bias has {b.size} elements for {y.shape[-1]} output "
                      "channels")
    y += b
    return y


# -- geometry -----------------------------------------------------------------------------------

def _trunc_div(a: int, b: int) -> int:
    """C integer division (rounds toward zero), as LiteRT's size arithmetic does."""
    q = abs(a) // b
    return q if a >= 0 else -q


def out_size(padding: int, size: int, kernel: int, stride: int, dilation: int = 1) -> int:
    """Output extent of a windowed op along one axis (LiteRT's ComputeOutSize)."""
    if stride <= 0 or dilation <= 0:
        raise OpError(f"stride ({stride}) and dilation ({dilation}) must be positive")
    effective = (kernel - 1) * dilation + 1
    if padding == Padding.SAME:
        return _trunc_div(size + stride - 1, stride)
    if padding == Padding.VALID:
        return _trunc_div(size + stride - effective, stride)
    raise OpError(f"unknown padding {padding}")


def pad_before_after(size: int, kernel: int, stride: int, dilation: int, out: int) -> tuple[int, int]:
    """Padding split (before, after) that LiteRT derives from the output size."""
    effective = (kernel - 1) * dilation + 1
    total = max(0, (out - 1) * stride + effective - size)
    return total // 2, total - total // 2


def window_geometry(opts, shape_hw: Sequence[int], kernel_hw: Sequence[int],
                    dilation: Sequence[int] = (1, 1)):
    """(out_h, out_w), ((top, bottom), (left, right)) of a 2-D windowed op."""
    strides = (opts.stride_h, opts.stride_w)
    outs, pads = [], []
    for size, k, s, d in zip(shape_hw, kernel_hw, strides, dilation):
        o = out_size(opts.padding, size, k, s, d)
        if o < 0:
            raise OpError(f"window {k} (dilation {d}, stride {s}) does not fit input extent {size}")
        outs.append(o)
        pads.append(pad_before_after(size, k, s, d, o))
    return tuple(outs), tuple(pads)


def transpose_conv_geometry(opts, output_shape, x_shape, w_shape):
    """Checked TRANSPOSE_CONV geometry: ((oh, ow), (pad_top, pad_left)). LiteRT pads as if
    the output were the input of the forward convolution; the input must be that
    convolution's output size."""
    shape = [int(d) for d in np.asarray(output_shape).reshape(-1)]
    if len(shape) != 4:
        raise OpError(f"TRANSPOSE_CONV: output_shape must hold 4 dims, got {shape}")
    n, h, wd, cin = x_shape
    cout, kh, kw, wcin = w_shape
    if wcin != cin or shape[3] != cout or shape[0] != n:
        raise OpError(f"TRANSPOSE_CONV: input {list(x_shape)}, weights {list(w_shape)} and "
                      f"output_shape {shape} disagree")
    oh, ow = shape[1], shape[2]
    (fh, fw), ((pt, _), (pl, _)) = window_geometry(opts, (oh, ow), (kh, kw))
    if (fh, fw) != (h, wd):
        raise OpError(f"TRANSPOSE_CONV: output_shape {shape} with {kh}x{kw} weights and strides "
                      f"{opts.stride_h}x{opts.stride_w} needs an input of {fh}x{fw}, got {h}x{wd}")
    return (oh, ow), (pt, pl)


def _pad_hw(x: np.ndarray, pads, value=0.0) -> np.ndarray:
    """Pad the H and W axes of an NHWC array; a no-op when nothing is to be padded."""
    (t, b), (l, r) = pads
    if t == b == l == r == 0:
        return x
    return np.pad(x, ((0, 0), (t, b), (l, r), (0, 0)), constant_values=value)


def _tap(xp: np.ndarray, i: int, j: int, out_hw, strides, dilation) -> np.ndarray:
    """View of the padded input seen by filter tap (i, j) at every output position."""
    (oh, ow), (sh, sw), (dh, dw) = out_hw, strides, dilation
    y0, x0 = i * dh, j * dw
    return xp[:, y0:y0 + (oh - 1) * sh + 1:sh, x0:x0 + (ow - 1) * sw + 1:sw, :]


def _nhwc(call: KernelCall, x: np.ndarray, what: str = "input") -> np.ndarray:
    if x.ndim != 4:
        raise OpError(f"{call.op.name}: {what} must be 4-D NHWC, got shape {x.shape}")
    return x


def padded_windows(x: np.ndarray, kernel_hw, out_hw, pads, strides, dilation, fill=0):
    """Read-only window views over a zero- (or ``fill``-) padded copy of the NHWC input ``x``:
    ``(windows, taps)``, the same windows pixel-major [N, OH, OW, KH, KW, C] (the im2col
    layout) and tap-major [KH, KW, N, OH, OW, C]."""
    n, h, w, c = x.shape
    (t, b), (l, r) = pads
    padded = np.full((n, h + t + b, w + l + r, c), fill, x.dtype)
    padded[:, t:t + h, l:l + w, :] = x
    return window_views(padded, kernel_hw, out_hw, strides, dilation)


def window_views(padded: np.ndarray, kernel_hw, out_hw, strides, dilation):
    """Read-only views of every window of an already padded NHWC array: ``(windows, taps)``,
    pixel-major [N, OH, OW, KH, KW, C] and tap-major [KH, KW, N, OH, OW, C]."""
    n, _, _, c = padded.shape
    (kh, kw), (oh, ow), (sh, sw), (dh, dw) = kernel_hw, out_hw, strides, dilation
    if oh and ow and ((oh - 1) * sh + (kh - 1) * dh >= padded.shape[1]
                      or (ow - 1) * sw + (kw - 1) * dw >= padded.shape[2]):
        raise OpError(f"internal: windows {kh}x{kw} overrun the padded input {padded.shape}")
    sn, sh_, sw_, sc = padded.strides
    as_strided = np.lib.stride_tricks.as_strided
    windows = as_strided(padded, shape=(n, oh, ow, kh, kw, c),
                         strides=(sn, sh_ * sh, sw_ * sw, sh_ * dh, sw_ * dw, sc), writeable=False)
    taps = as_strided(padded, shape=(kh, kw, n, oh, ow, c),
                      strides=(sh_ * dh, sw_ * dw, sn, sh_ * sh, sw_ * sw, sc), writeable=False)
    return windows, taps
