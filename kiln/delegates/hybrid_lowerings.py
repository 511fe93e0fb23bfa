"""The quantized delegate's lowerings of LiteRT's hybrid (dynamic-range) convolutions and
FULLY_CONNECTED: float activations, constant int8 weights.

Each invoke still quantizes its input with kiln.kernels.hybrid's own functions (the input
changes every run); what moves to prepare time is the rest of the kernel's per-call work:
checks, the weight layout, padded buffers, scale vectors. The integer products run as exact
float GEMMs (integer_lowerings' bound rule), and the float rescaling repeats the pure
kernel's float32 operations in its order, so results are kiln.kernels.hybrid's bit for bit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from ..kernels import hybrid
from ..ops.elementwise import activation_range
from .integer_lowerings import IM2COL_BUDGET, _conv_geometry, _DepthwiseSum, _exact_float, _Padded

if TYPE_CHECKING:  # pragma: no cover
    from .quantized import QNode

F32 = np.dtype(np.float32)
#: Bytes a lowering may keep of its weights widened to the exact float type. Above it the int8
#: weights stay as they are (memory-mapped from the model) and each invoke widens one block of
#: output columns at a time: LiteRT's hybrid kernels keep int8 weights too, and a widened copy
#: of a large model costs 4-8x its size. Integer sums are exact in either order, so both ways
#: give the same bits.
WIDEN_BUDGET = 64 << 20
#: Bytes of one widened block of weight columns.
BLOCK_BYTES = 4 << 20


def _max_magnitude(w: np.ndarray) -> int:
    """max |w| of integer weights, without a widened copy of them."""
    return max(int(w.max(initial=0)), -int(w.min(initial=0)))


def _int8_product(w_t: np.ndarray, ft: np.dtype) -> Callable[[np.ndarray], np.ndarray]:
    """``q -> q @ w_t`` as exact integers (int64), ``w_t`` int8 of shape (depth, units): widened
    once when that fits WIDEN_BUDGET, else block by block at each call (`hybrid.int_matmul`)."""
    if w_t.size * ft.itemsize <= WIDEN_BUDGET:
        wide = np.ascontiguousarray(w_t.astype(ft))
        return lambda q: np.dot(q.astype(ft, copy=False), wide).astype(np.int64)
    block_bytes = BLOCK_BYTES
    return lambda q: hybrid.int_matmul(q, w_t, ft, block_bytes)


def _setup(node: "QNode", channels: int):
    """(per-channel float32 weight scales, float32 bias or None, the activation's clamp) or None."""
    w_q = node.op.inputs[1].quantization
    scales = np.asarray(w_q.scale, F32)
    bias = node.consts[2] if len(node.consts) > 2 else None
    if bias is not None and (bias.dtype.kind != "f" or bias.size != channels):
        return None
    bias = None if bias is None else bias.astype(F32).reshape(-1)
    lo, hi = activation_range(node.opts.fused_activation_function, F32)
    return scales, bias, (lo, hi)


def lower_hybrid_conv(node: "QNode") -> Callable | None:
    """Hybrid CONV_2D with per-channel int8 weights (`hybrid.conv2d_per_channel`)."""
    x, w = node.ins[0], node.consts[1]
    if (w is None or x.dtype != F32 or w.dtype != np.int8 or x.ndim != 4 or w.ndim != 4
            or x.shape[3] != w.shape[3] or node.call.out_dtypes[0] != F32):
        return None
    cout, kh, kw, cin = w.shape
    setup = _setup(node, cout)
    if setup is None or setup[0].size != cout:
        return None
    scales, bias, (lo, hi) = setup
    depth = kh * kw * cin
    ft = _exact_float(depth * 255 * _max_magnitude(w))
    if ft is None:
        return None
    (oh, ow), pads, strides, dil = _conv_geometry(node, (kh, kw))
    n = x.shape[0]
    if n * oh * ow * depth > IM2COL_BUDGET:
        return None
    padded = _Padded(x.shape, (kh, kw), (oh, ow), pads, strides, dil, ft, 0)
    product = _int8_product(w.reshape(cout, depth).T, ft)
    cols = np.empty((n, oh, ow, kh, kw, cin), ft)
    xi, oi = node.in_slots[0], node.out_slots[0]

    pointwise = kh == kw == 1 and pads == ((0, 0), (0, 0)) and strides == (1, 1)
    if pointwise:
        cols = padded.buf   # the centred input is the column matrix

    def run(slots):
        q, scale, offset = hybrid.quantize_batches_asymmetric(slots[xi])
        np.subtract(q, offset.reshape(-1, 1, 1, 1), out=padded.interior, dtype=ft)
        if not pointwise:
            np.copyto(cols, padded.windows)
        acc = product(cols.reshape(-1, depth)).astype(F32).reshape(n, oh, ow, cout)
        out = (acc * scales).astype(F32)
        out = (out * scale.reshape(-1, 1, 1, 1)).astype(F32)
        if bias is not None:
            out = (out + bias).astype(F32)
        slots[oi] = np.clip(out, lo, hi, out=out)

    return run


def lower_hybrid_depthwise(node: "QNode") -> Callable | None:
    """Hybrid DEPTHWISE_CONV_2D with per-channel int8 weights (`hybrid.depthwise_per_channel`)."""
    x, w = node.ins[0], node.consts[1]
    if (w is None or x.dtype != F32 or w.dtype != np.int8 or x.ndim != 4 or w.ndim != 4 or w.shape[0] != 1
            or node.call.out_dtypes[0] != F32):
        return None
    _, kh, kw, cout = w.shape
    cin = x.shape[3]
    if cin == 0 or cout % cin:
        return None
    setup = _setup(node, cout)
    if setup is None or setup[0].size != cout:
        return None
    scales, bias, (lo, hi) = setup
    ft = _exact_float(kh * kw * 255 * _max_magnitude(w))
    if ft is None:
        return None
    taps_sum = _DepthwiseSum(node, x.shape, w, ft, 0)
    xi, oi = node.in_slots[0], node.out_slots[0]

    def run(slots):
        q, scale, offset = hybrid.quantize_batches_asymmetric(slots[xi])
        np.subtract(q, offset.reshape(-1, 1, 1, 1), out=taps_sum.padded.interior, dtype=ft)
        total = taps_sum()
        factor = (scales[None, :] * scale[:, None]).astype(F32)
        out = (total.astype(F32) * factor[:, None, None, :]).astype(F32)
        if bias is not None:
            out = (out + bias).astype(F32)
        slots[oi] = np.clip(out, lo, hi, out=out)

    return run


def lower_hybrid_fully_connected(node: "QNode") -> Callable | None:
    """Hybrid FULLY_CONNECTED (`hybrid.fully_connected`): rows quantized per call, the integer
    dot an exact float GEMM, the asymmetric correction by precomputed weight row sums."""
    x, w = node.ins[0], node.consts[1]
    if (w is None or x.dtype != F32 or w.dtype != np.int8 or w.ndim != 2 or node.call.out_dtypes[0] != F32
            or w.shape[1] == 0 or x.size % w.shape[1]):
        return None
    units, depth = w.shape
    setup = _setup(node, units)
    if setup is None:
        return None
    scales, bias, (lo, hi) = setup
    per_channel = scales.size > 1
    asymmetric = bool(node.opts.asymmetric_quantize_inputs)
    ft = _exact_float(depth * 128 * _max_magnitude(w))
    if ft is None:
        return None
    rows = x.size // depth
    product = _int8_product(w.T, ft)
    row_sums = w.sum(axis=1, dtype=np.int64)[None, :]
    tensor_scale = None if per_channel else F32.type(scales.reshape(-1)[0])
    out_shape = x.shape[:-1] + (units,) if node.opts.keep_num_dims else (rows, units)
    base = np.zeros((rows, units), F32) if bias is None else np.broadcast_to(bias, (rows, units))
    xi, oi = node.in_slots[0], node.out_slots[0]

    def run(slots):
        x2 = slots[xi].reshape(rows, depth)
        if not x2.any():   # the kernel skips the product for an all-zero input
            out = np.array(base, F32)
        else:
            if asymmetric:
                q, scale, offset = hybrid.quantize_rows_asymmetric(x2)
            else:
                q, scale = hybrid.quantize_rows_symmetric(x2)
            if tensor_scale is not None:
                scale = (scale * tensor_scale).astype(F32)
            dot = product(q)
            if asymmetric:
                dot = dot - row_sums * offset[:, None].astype(np.int64)
            factor = scale[:, None] if not per_channel else (scale[:, None] * scales[None, :]).astype(F32)
            out = (base + (dot.astype(F32) * factor).astype(F32)).astype(F32)
        np.clip(out, lo, hi, out=out)
        slots[oi] = out.reshape(out_shape)

    return run
