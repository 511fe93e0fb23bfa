"""Quantization parameters as TensorFlow 2.21's converter derives them.

Activations (int8, MLIR quantizer with ``legacy_float_scale``): the calibrated range is
widened to contain 0, the scale is ``(max − min) / 255`` computed in float32 and the zero
point ``round(−128 − min / scale)``. int16 activations (16x8) are symmetric with zero point 0.
Weights are symmetric and narrow-range ([−127, 127]), per output channel; biases are int32
(int64 for 16x8) with scale ``input_scale · weight_scale``. Sources: shared/quantization.md §4.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels.fixedpoint import round_half_away

#: Smallest calibrated range; narrower ones are widened so the scale is never 0.
MIN_RANGE = 1e-6


@dataclass(frozen=True)
class Affine:
    """``real = scale · (q − zero_point)``: per tensor (scalars) or per channel (1-D arrays
    along ``axis``)."""

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int = 0


def _range_with_zero(rmin: float, rmax: float) -> tuple[np.float32, np.float32]:
    rmin, rmax = min(float(rmin), 0.0), max(float(rmax), 0.0)
    if rmax - rmin < MIN_RANGE:
        rmin, rmax = rmin - MIN_RANGE, rmax + MIN_RANGE
    return np.float32(rmin), np.float32(rmax)


def activation_int8(rmin: float, rmax: float) -> Affine:
    """Asymmetric int8 parameters of an activation calibrated to [rmin, rmax]."""
    lo, hi = _range_with_zero(rmin, rmax)
    scale = np.float32((hi - lo) / np.float32(255.0))
    zero_point = np.clip(round_half_away(np.float32(-128.0) - lo / scale), -128, 127)
    return Affine(np.asarray([scale], np.float32), np.asarray([zero_point], np.int64))


#: The smallest int16 activation scale: at a finer one, a fused RELU6's bound 6.0 no longer
#: fits int32 in the output's codes and LiteRT's Prepare refuses the node
#: (no_integer_overflow_from_quantization). Only a dead tensor calibrates that narrow (TF
#: 2.21 writes 3e-16 for one in MobileNetV2, and LiteRT cannot run its 16x8 model).
MIN_INT16_SCALE = np.float32(2.0 ** -28)


def activation_int16(rmin: float, rmax: float) -> Affine:
    """Symmetric int16 parameters (16x8 mode): zero point 0, scale max|range| / 32767 (at
    least `MIN_INT16_SCALE`)."""
    lo, hi = _range_with_zero(rmin, rmax)
    scale = max(np.float32(max(abs(float(lo)), abs(float(hi))) / 32767.0), MIN_INT16_SCALE)
    return Affine(np.asarray([scale], np.float32), np.zeros(1, np.int64))


def _channel_max_abs(w: np.ndarray, axis: int | None) -> np.ndarray:
    if axis is None:
        return np.asarray([np.max(np.abs(w))], np.float32)
    others = tuple(d for d in range(w.ndim) if d != axis)
    return np.max(np.abs(w), axis=others).astype(np.float32)


def symmetric_weights(w: np.ndarray, axis: int | None, bits: int = 8) -> tuple[np.ndarray, Affine]:
    """Narrow-range symmetric quantization of a constant, per channel along ``axis`` (None:
    per tensor). A channel of zeros gets scale 1 (any scale represents it exactly)."""
    scale = _symmetric_scale(w, axis, bits)
    return _quantize_symmetric(w, np.where(scale > 0, scale, np.float32(1.0)).astype(np.float32),
                               axis, bits)


def _symmetric_scale(w, axis: int | None, bits: int) -> np.ndarray:
    """``max|w_c| / qmax`` per channel, computed as TF does (2·max / (2·qmax), float32)."""
    max_abs = _channel_max_abs(np.asarray(w, np.float32), axis)
    return (np.float32(2.0) * max_abs / np.float32(2 * ((1 << (bits - 1)) - 1))).astype(np.float32)


def _quantize_symmetric(w, scale: np.ndarray, axis: int | None, bits: int):
    w = np.asarray(w, np.float32)
    qmax = (1 << (bits - 1)) - 1
    shape = [1] * w.ndim
    if axis is not None:
        shape[axis] = -1
    # In double precision, as TF's quantizer: float32 division turns a few values into
    # exact ties that then round the other way (measured on a 64×256 Dense).
    q = np.clip(round_half_away(w.astype(np.float64) / scale.reshape(shape).astype(np.float64)),
                -qmax, qmax)
    dtype = np.int8 if bits <= 8 else np.int16
    return q.astype(dtype), Affine(scale, np.zeros(scale.size, np.int64), 0 if axis is None else axis)


def bias(b: np.ndarray, input_scale: float, weight_scale: np.ndarray,
         bits: int = 32, by_reciprocal: bool = False) -> tuple[np.ndarray, Affine]:
    """int32 (or int64) bias with scale ``input_scale · weight_scale`` per channel.

    ``by_reciprocal``: multiply by the float32 reciprocal of the scale instead of dividing,
    as TF's older quantizer (the one its 16x8 mode uses, quantization_utils.cc
    SymmetricPerChannelBiasQuantize) does — the int64 results then differ by a few units.
    """
    b = np.asarray(b, np.float32)
    scale = (np.float32(input_scale) * np.asarray(weight_scale, np.float32)).astype(np.float32)
    if scale.size == 1 and b.size > 1:
        scale = np.full(b.shape, scale.item(), np.float32)
    safe = np.where(scale > 0, scale, np.float32(1.0))
    limit = (1 << (bits - 1)) - 1
    if by_reciprocal:
        inverse = (1.0 / safe.astype(np.float64)).astype(np.float32)
        quotient = (b * inverse).astype(np.float32)
    else:  # a float32 quotient (TF's APFloat in the float type), rounded exactly
        quotient = (b / safe).astype(np.float32)
    q = np.clip(round_half_away(quotient.astype(np.float64)), -limit, limit)
    return q.astype(np.int32 if bits == 32 else np.int64), Affine(scale, np.zeros(scale.size, np.int64))


def weights_and_bias(w: np.ndarray, axis: int | None, b: np.ndarray | None, input_scale: float,
                     *, bits: int = 8, bias_bits: int = 32, bias_by_reciprocal: bool = False):
    """Weights and bias of a FULLY_CONNECTED / CONV as TensorFlow's MLIR quantizer makes them.

    Where ``|b| / (input_scale · weight_scale)`` would pass half the bias integer range — a
    channel of zero (or tiny) weights with a non-zero bias — the bias scale is raised to
    ``|b| / (INT_MAX / 2)`` and that channel's weight scale to ``bias_scale / input_scale``
    (quantization_driver.cc SetBiasParamsWithAdjustments), and its weights are re-quantized.
    Returns (q_weights, weight Affine, q_bias or None, bias Affine or None).
    """
    w_scale = _symmetric_scale(w, axis, bits)
    if b is not None:
        b = np.asarray(b, np.float32)
        half = np.float32(((1 << (bias_bits - 1)) - 1) / 2)
        in_scale = np.float32(input_scale)
        b_scale = (in_scale * w_scale).astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            too_big = (np.abs(b) / b_scale > half) & (b != 0)
        adjusted = (np.abs(b) / half).astype(np.float32)
        w_scale = np.where(too_big, (adjusted / in_scale).astype(np.float32), w_scale)
    w_scale = np.where(w_scale > 0, w_scale, np.float32(1.0)).astype(np.float32)
    qw, wa = _quantize_symmetric(w, w_scale, axis, bits)
    if b is None:
        return qw, wa, None, None
    qb, ba = bias(b, input_scale, wa.scale, bias_bits, bias_by_reciprocal)
    return qw, wa, qb, ba
