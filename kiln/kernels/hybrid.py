"""LiteRT's hybrid (dynamic-range) kernels: float activations, int8 weights.

Each batch row of the float input is quantized on the fly — asymmetrically (zero point by
the smaller-error rule) for per-channel weights and for FULLY_CONNECTED with
``asymmetric_quantize_inputs``, symmetrically otherwise — then multiplied with the int8
weights in exact integer arithmetic and rescaled to float. The float steps follow the
order of LiteRT's kernels (tensor_utils, reference HybridConvPerChannel,
DepthwiseConvHybridPerChannel) so results are bit-exact with its reference kernels.
"""

from __future__ import annotations

import numpy as np

from .fixedpoint import round_half_away

F32 = np.float32


def quantize_rows_asymmetric(x: np.ndarray):
    """(int8 values, float32 scale, int32 zero point) per row of a 2-D float array."""
    x = np.asarray(x, F32)
    rmin = np.minimum(F32(0), x.min(axis=1, initial=np.inf)).astype(F32)
    rmax = np.maximum(F32(0), x.max(axis=1, initial=-np.inf)).astype(F32)
    flat = rmin == rmax
    # The range's width is a float32 difference, only then divided in double (measured:
    # a double-precision width moves the scale by an ulp and every output of its row).
    span = np.where(flat, F32(1), (rmax - rmin).astype(F32)).astype(np.float64)
    scale = span / 255.0
    rmin, rmax = rmin.astype(np.float64), rmax.astype(np.float64)
    from_min, from_max = -128.0 - rmin / scale, 127.0 - rmax / scale
    zero_point = np.where(128.0 + np.abs(rmin / scale) < 127.0 + np.abs(rmax / scale), from_min, from_max)
    nudged = np.where(zero_point <= -128, -128,
                      np.where(zero_point >= 127, 127, round_half_away(zero_point))).astype(np.int32)
    scale32 = np.where(flat, F32(1), scale.astype(F32)).astype(F32)
    nudged = np.where(flat, 0, nudged).astype(np.int32)
    inverse = (1.0 / scale32.astype(np.float64)).astype(F32)
    values = (nudged[:, None].astype(F32) + x * inverse[:, None]).astype(F32)
    q = np.clip(round_half_away(values), -128, 127).astype(np.int8)
    q[flat] = 0
    return q, scale32, nudged


def quantize_rows_symmetric(x: np.ndarray):
    """(int8 values in [-127, 127], float32 scale) per row of a 2-D float array."""
    x = np.asarray(x, F32)
    rng = np.maximum(np.abs(x.min(axis=1, initial=np.inf)), np.abs(x.max(axis=1, initial=-np.inf))).astype(F32)
    flat = rng == 0
    safe = np.where(flat, F32(1), rng).astype(F32)
    scale = np.where(flat, F32(1), (safe / F32(127)).astype(F32)).astype(F32)
    inverse = (F32(127) / safe).astype(F32)
    q = np.clip(round_half_away((x * inverse[:, None]).astype(F32)), -127, 127).astype(np.int8)
    q[flat] = 0
    return q, scale


#: Bytes of b's columns widened to float64 at a time (a large model's int8 weights are never
#: widened whole: 8 bytes a weight).
_WIDE_BLOCK = 8 << 20


def int_matmul(a: np.ndarray, b: np.ndarray, wide: np.dtype = np.dtype(np.float64),
               block_bytes: int | None = None) -> np.ndarray:
    """Exact integer a @ b as int64, computed in the float type ``wide`` (float64 BLAS is exact
    below 2^53, which int8 sums stay under; a caller that bounds its sums may pass float32),
    widening b ``block_bytes`` of columns at a time."""
    block_bytes = _WIDE_BLOCK if block_bytes is None else block_bytes
    if b.ndim != 2 or b.size * wide.itemsize <= block_bytes:
        return (a.astype(wide, copy=False) @ b.astype(wide)).astype(np.int64)
    wide_a = a.astype(wide, copy=False)
    out = np.empty(a.shape[:-1] + (b.shape[1],), np.int64)
    block = max(1, block_bytes // (wide.itemsize * b.shape[0]))
    for start in range(0, b.shape[1], block):
        out[..., start:start + block] = wide_a @ b[:, start:start + block].astype(wide)
    return out


def fully_connected(x: np.ndarray, w: np.ndarray, w_scale: np.ndarray, bias, *,
                    asymmetric: bool) -> np.ndarray:
    """Hybrid FULLY_CONNECTED before its activation: x [rows, depth] float32, w [units,
    depth] int8 with one scale (per tensor) or one per unit."""
    rows = np.asarray(x, F32)
    units = w.shape[0]
    out = np.zeros((rows.shape[0], units), F32) if bias is None else \
        np.broadcast_to(np.asarray(bias, F32), (rows.shape[0], units)).copy()
    if not rows.any():   # LiteRT skips the product for an all-zero input
        return out
    per_channel = np.asarray(w_scale).size > 1
    if asymmetric:
        q, scale, offset = quantize_rows_asymmetric(rows)
    else:
        q, scale = quantize_rows_symmetric(rows)
        offset = np.zeros(rows.shape[0], np.int32)
    if not per_channel:
        scale = (scale * F32(np.asarray(w_scale).reshape(-1)[0])).astype(F32)
    dot = int_matmul(q, w.T)
    if asymmetric:
        dot = dot - w.sum(axis=1, dtype=np.int64)[None, :] * offset[:, None].astype(np.int64)
    factor = scale[:, None] if not per_channel else \
        (scale[:, None] * np.asarray(w_scale, F32)[None, :]).astype(F32)
    return (out + (dot.astype(F32) * factor).astype(F32)).astype(F32)


def quantize_batches_asymmetric(x: np.ndarray):
    """Asymmetric quantization with one (scale, zero point) per batch entry (NHWC input)."""
    q, scale, offset = quantize_rows_asymmetric(x.reshape(x.shape[0], -1))
    return q.reshape(x.shape), scale, offset


def tap_windows(xc: np.ndarray, kh: int, kw: int, out_hw, strides, dilation) -> np.ndarray:
    """[n, oh, ow, kh, kw, c] view of the (already padded) input under each filter tap."""
    n, _, _, c = xc.shape
    (oh, ow), (sh, sw), (dh, dw) = out_hw, strides, dilation
    s = xc.strides
    return np.lib.stride_tricks.as_strided(
        xc, (n, oh, ow, kh, kw, c), (s[0], s[1] * sh, s[2] * sw, s[1] * dh, s[2] * dw, s[3]),
        writeable=False)


def _centered_padded(x_q: np.ndarray, offset: np.ndarray, pads) -> np.ndarray:
    """x_q − zero point per batch, padded with zeros (a padded point adds nothing, as the
    reference kernels skip it)."""
    centered = x_q.astype(np.int32) - offset.reshape(-1, 1, 1, 1)
    (t, b), (l, r) = pads
    return np.pad(centered, ((0, 0), (t, b), (l, r), (0, 0)))


def conv2d_per_channel(x: np.ndarray, w: np.ndarray, w_scale: np.ndarray, bias, *,
                       out_hw, pads, strides, dilation) -> np.ndarray:
    """Hybrid CONV_2D with per-channel int8 weights [out_c, kh, kw, in_c] (one group),
    before its activation: ``(acc · channel_scale) · input_scale + bias``."""
    q, scale, offset = quantize_batches_asymmetric(np.asarray(x, F32))
    cols = tap_windows(_centered_padded(q, offset, pads), w.shape[1], w.shape[2], out_hw, strides, dilation)
    n = x.shape[0]
    acc = int_matmul(cols.reshape(-1, cols[0, 0, 0].size), w.reshape(w.shape[0], -1).T)
    acc = acc.reshape(n, out_hw[0], out_hw[1], w.shape[0]).astype(F32)
    out = (acc * np.asarray(w_scale, F32)).astype(F32)
    out = (out * scale.reshape(-1, 1, 1, 1)).astype(F32)
    if bias is not None:
        out = (out + np.asarray(bias, F32)).astype(F32)
    return out


def depthwise_per_channel(x: np.ndarray, w: np.ndarray, w_scale: np.ndarray, bias, *,
                          multiplier: int, out_hw, pads, strides, dilation) -> np.ndarray:
    """Hybrid DEPTHWISE_CONV_2D with per-channel int8 weights [1, kh, kw, c·m], before its
    activation: ``acc · (channel_scale · input_scale) + bias``."""
    q, scale, offset = quantize_batches_asymmetric(np.asarray(x, F32))
    cols = tap_windows(_centered_padded(q, offset, pads), w.shape[1], w.shape[2], out_hw, strides, dilation)
    cols = np.repeat(cols, multiplier, axis=-1) if multiplier > 1 else cols
    acc = np.einsum("nyxhwc,hwc->nyxc", cols.astype(np.int64), w[0].astype(np.int64))
    factor = (np.asarray(w_scale, F32)[None, :] * scale[:, None]).astype(F32)
    out = (acc.astype(F32) * factor[:, None, None, :]).astype(F32)
    if bias is not None:
        out = (out + np.asarray(bias, F32)).astype(F32)
    return out


def transpose_conv_sums(centered: np.ndarray, w: np.ndarray, *, out_hw, pads, strides) -> np.ndarray:
    """TRANSPOSE_CONV's integer accumulator [n, oh, ow, out_c]: every input pixel (zero point
    already removed) scatters ``x · w`` (filter [out_c, kh, kw, in_c]) into the uncropped
    output, which ``pads`` = (top, left) then crops — the hybrid and the int8 kernels share it."""
    n, h, wd, in_c = centered.shape
    out_c, kh, kw, _ = w.shape
    (oh, ow), (pt, pl), (sh, sw) = out_hw, pads, strides
    taps = int_matmul(centered.reshape(-1, in_c), w.transpose(1, 2, 0, 3).reshape(kh * kw * out_c, in_c).T)
    taps = taps.reshape(n, h, wd, kh, kw, out_c)
    full = np.zeros((n, max((h - 1) * sh + kh, pt + oh), max((wd - 1) * sw + kw, pl + ow), out_c), np.int64)
    for i in range(kh):
        for j in range(kw):
            full[:, i:i + (h - 1) * sh + 1:sh, j:j + (wd - 1) * sw + 1:sw] += taps[:, :, :, i, j]
    return full[:, pt:pt + oh, pl:pl + ow]


def transpose_conv(x: np.ndarray, w: np.ndarray, w_scale: np.ndarray, bias, *, out_hw, pads, strides) -> np.ndarray:
    """Hybrid TRANSPOSE_CONV (reference HybridTransposeConv), before its activation: each
    batch entry quantized asymmetrically; every input code less the zero point, times each
    int8 filter tap [out_c, kh, kw, in_c], is rescaled on its own —
    ``float32(acc) · channel_scale · input_scale``, two float32 roundings — and added in
    float32 to the output it lands on, in LiteRT's scatter order (input row, column, channel),
    then the bias. Measured: one integer accumulator rescaled once (any product order) misses
    by a few ulps on most outputs; this order gives LiteRT's bits."""
    q, scale, offset = quantize_batches_asymmetric(np.asarray(x, F32))
    n, h, wd, _ = q.shape
    out_c, kh, kw, _ = w.shape
    (oh, ow), (pt, pl), (sh, sw) = out_hw, pads, strides
    channel_scale = np.broadcast_to(np.asarray(w_scale, F32).reshape(-1), (out_c,))
    centered = q.astype(np.int64) - offset.reshape(-1, 1, 1, 1)
    taps = w.transpose(3, 1, 2, 0).astype(np.int64)                     # [in_c, kh, kw, out_c]
    batch_scale = scale.reshape(-1, 1, 1, 1, 1)
    full = np.zeros((n, max((h - 1) * sh + kh, pt + oh), max((wd - 1) * sw + kw, pl + ow), out_c), F32)
    for iy in range(h):
        for ix in range(wd):
            acc = centered[:, iy, ix, :, None, None, None] * taps[None]     # [n, in_c, kh, kw, out_c]
            terms = ((acc.astype(F32) * channel_scale).astype(F32) * batch_scale).astype(F32)
            block = full[:, iy * sh:iy * sh + kh, ix * sw:ix * sw + kw]
            # np.cumsum adds left to right in float32: the block, then channel 0, 1, ...
            block[...] = np.cumsum(np.concatenate([block[:, None], terms], axis=1), axis=1, dtype=F32)[:, -1]
    out = full[:, pt:pt + oh, pl:pl + ow]
    if bias is not None:
        out = (out + np.asarray(bias, F32)).astype(F32)
    return out
