"""The quantized delegate's TRANSPOSE_CONV lowerings (operands: output_shape, filter
[out_c, kh, kw, in_c], input, bias; the first two constant).

int8 / 16x8: every input pixel's taps as one exact float GEMM (centred input × the filter
laid out [in_c, kh·kw·out_c]), scattered tap by tap into a zeroed float buffer of the
uncropped output — integer sums stay exact while ``in_c·kh·kw · max|x − zp| · max|w|`` is below
the float type's integer range (integer_lowerings' bound rule) — then cropped and given the
convolutions' output stage (`Requantizer`), as `kiln.kernels.nn.transpose_conv`.

Hybrid: `kiln.kernels.hybrid.transpose_conv` rescales each product on its own in float32 and
adds the terms into the output in scatter order (input row, column, then channel). For one
output element, ascending input rows and columns are descending filter taps, so visiting the
taps (i, j) from the last to the first and the channels in order — each step one vectorised
float32 addition over every input pixel (a tap maps distinct pixels to distinct outputs) —
adds every element's terms in the kernel's order, bit for bit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from ..kernels import hybrid
from ..kernels import nn as nn_kernels
from ..ops.elementwise import activation_range as float_activation_range
from ..ops.windowed import transpose_conv_geometry
from ..schema import Activation
from .integer_lowerings import I64, Requantizer, _centred_max, _exact_float

if TYPE_CHECKING:  # pragma: no cover
    from .quantized import QNode

F32 = np.dtype(np.float32)


def _geometry(node: "QNode"):
    """(x, filter, (oh, ow), (pt, pl), (sh, sw), full buffer's (H, W)) or None."""
    if len(node.ins) < 3:
        return None
    shape, w, x = node.ins[0], node.consts[1], node.ins[2]     # a run-time output_shape keys the plan
    if shape is None or w is None or x is None or node.in_slots[2] < 0 or x.ndim != 4 or w.ndim != 4:
        return None
    (oh, ow), (pt, pl) = transpose_conv_geometry(node.opts, shape, x.shape, w.shape)
    _, h, wd, _ = x.shape
    _, kh, kw, _ = w.shape
    sh, sw = node.opts.stride_h, node.opts.stride_w
    full_hw = (max((h - 1) * sh + kh, pt + oh), max((wd - 1) * sw + kw, pl + ow))
    return x, w, (oh, ow), (pt, pl), (sh, sw), full_hw


def _tap_view(full: np.ndarray, i: int, j: int, hw, strides) -> np.ndarray:
    """The output positions that filter tap (i, j) of every input pixel lands on."""
    (h, wd), (sh, sw) = hw, strides
    return full[:, i:i + (h - 1) * sh + 1:sh, j:j + (wd - 1) * sw + 1:sw]


def lower_transpose_conv(node: "QNode") -> Callable | None:
    """int8 / 16x8 TRANSPOSE_CONV with a constant filter (per-channel scales)."""
    geometry = _geometry(node)
    if geometry is None or node.ins[2].dtype not in (np.int8, np.int16):
        return None
    x, w, (oh, ow), (pt, pl), strides, full_hw = geometry
    n, h, wd, cin = x.shape
    cout, kh, kw, _ = w.shape
    x_qp, w_qp = node.op.inputs[2].quantization, node.op.inputs[1].quantization
    out_qp = node.op.outputs[0].quantization
    zx = int(x_qp.zero_point[0])
    w64 = w.astype(I64)
    acc_bound = cin * kh * kw * _centred_max(x.dtype, zx) * int(np.abs(w64).max(initial=0))
    ft = _exact_float(acc_bound)
    if ft is None:
        return None
    bias = node.consts[3] if len(node.consts) > 3 else None
    bias = None if bias is None else np.asarray(bias, I64).reshape(cout)
    m, s = nn_kernels._channel_multipliers(x_qp, w_qp, out_qp, cout)
    out_dtype = node.call.out_dtypes[0]
    lo, hi = nn_kernels.activation_range(Activation(node.opts.fused_activation_function), out_qp, out_dtype)
    kind = "int64" if x.dtype == np.int16 else "double"
    requant = Requantizer(kind, m, s, out_qp.zero_point[0], lo, hi, out_dtype,
                          acc_bound + (0 if bias is None else int(np.abs(bias).max(initial=0))))
    w_mat = np.ascontiguousarray(w64.transpose(3, 1, 2, 0).reshape(cin, kh * kw * cout).astype(ft))
    xf = np.empty((n * h * wd, cin), ft)
    full = np.empty((n, *full_hw, cout), ft)
    views = [(i, j, _tap_view(full, i, j, (h, wd), strides)) for i in range(kh) for j in range(kw)]
    xi, oi = node.in_slots[2], node.out_slots[0]

    def run(slots):
        np.subtract(slots[xi].reshape(xf.shape), zx, out=xf, dtype=ft)
        taps = np.dot(xf, w_mat).reshape(n, h, wd, kh, kw, cout)
        full.fill(0)
        for i, j, view in views:
            view += taps[:, :, :, i, j]
        acc = full[:, pt:pt + oh, pl:pl + ow].astype(I64)
        if bias is not None:
            acc += bias
        slots[oi] = requant(acc)

    return run


def lower_hybrid_transpose_conv(node: "QNode") -> Callable | None:
    """Hybrid TRANSPOSE_CONV (float input, int8 filter): see the module doc."""
    geometry = _geometry(node)
    if geometry is None or node.ins[2].dtype != F32 or node.call.out_dtypes[0] != F32:
        return None
    x, w, (oh, ow), (pt, pl), strides, full_hw = geometry
    if w.dtype != np.int8:
        return None
    n, h, wd, cin = x.shape
    cout, kh, kw, _ = w.shape
    scales = np.asarray(node.op.inputs[1].quantization.scale, F32).reshape(-1)
    if scales.size not in (1, cout):
        return None
    channel_scale = np.ascontiguousarray(np.broadcast_to(scales, (cout,)))
    bias = node.consts[3] if len(node.consts) > 3 else None
    if bias is not None and (bias.dtype.kind != "f" or bias.size != cout):
        return None
    bias = None if bias is None else np.asarray(bias, F32).reshape(cout)
    lo, hi = float_activation_range(node.opts.fused_activation_function, F32)
    taps = [(i, j, w[:, i, j, :].T.astype(F32)) for i in reversed(range(kh)) for j in reversed(range(kw))]
    full = np.empty((n, *full_hw, cout), F32)
    views = {(i, j): _tap_view(full, i, j, (h, wd), strides) for i in range(kh) for j in range(kw)}
    xi, oi = node.in_slots[2], node.out_slots[0]

    def run(slots):
        q, scale, offset = hybrid.quantize_batches_asymmetric(np.asarray(slots[xi], F32))
        centred = (q.astype(I64) - offset.reshape(-1, 1, 1, 1)).astype(F32)     # |x| <= 255: exact
        batch_scale = np.asarray(scale, F32).reshape(-1, 1, 1, 1)
        full.fill(0)
        for i, j, w_ij in taps:                                                  # w_ij: [in_c, out_c]
            view = views[(i, j)]
            for c in range(cin):
                term = centred[..., c:c + 1] * w_ij[c]            # exact products, as float32(acc)
                term *= channel_scale
                term *= batch_scale
                view += term
        out = full[:, pt:pt + oh, pl:pl + ow]
        out = out + bias if bias is not None else out.copy()
        np.clip(out, lo, hi, out=out)
        slots[oi] = out

    return run
