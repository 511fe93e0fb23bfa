"""Image ops: resizing and non-max suppression."""

from __future__ import annotations

import numpy as np

from ...errors import ConversionError
from ...ir import Tensor
from ...schema import DType
from ..context import EmitContext
from .common import as_int32, emitter_table, int32_const, reshape

EMITTERS, emits = emitter_table()


@emits("ResizeBilinear", "ResizeNearestNeighbor")
def emit_resize(ctx: EmitContext):
    op_type = "RESIZE_BILINEAR" if ctx.type == "ResizeBilinear" else "RESIZE_NEAREST_NEIGHBOR"
    return ctx.emit1(op_type, [ctx.input(0), as_int32(ctx, 1, "size")],
                     align_corners=bool(ctx.attr("align_corners", False)),
                     half_pixel_centers=bool(ctx.attr("half_pixel_centers", False)))


# -- non-max suppression ---------------------------------------------------------------------------

def _float_input(ctx: EmitContext, i: int, what: str) -> Tensor:
    t = ctx.input(i)
    if t.dtype != DType.FLOAT32:
        raise ctx.fail(f"{what} is {t.dtype.name.lower()}: LiteRT's NON_MAX_SUPPRESSION takes float32")
    return t


def _constant_scalar(ctx: EmitContext, i: int) -> float | None:
    value = ctx.const(i)
    return None if value is None else float(np.asarray(value).reshape(-1)[0])


def _check_range(ctx: EmitContext, value: float | None, what: str, lo: float, hi: float = np.inf) -> None:
    """TensorFlow refuses these values on every run; a constant one is refused here, at once."""
    if value is not None and not lo <= value <= hi:
        bounds = f"in [{lo:g}, {hi:g}]" if np.isfinite(hi) else f">= {lo:g}"
        raise ConversionError(f"{ctx.type} {ctx.op.name!r}: {what} is {value:g}, it must be {bounds} "
                              "(TensorFlow refuses it when the model runs)")


def _litert_iou_threshold(ctx: EmitContext, soft: bool) -> Tensor:
    """The iou_threshold that makes LiteRT's kernel select what TensorFlow's selects.

    TensorFlow suppresses a box whose IoU with a selected one is *above* the threshold, LiteRT
    at or above it: the next float32 up gives TF's rule (below 1 only: LiteRT re-queues a
    selected box, and a threshold of 1 is what suppresses it against itself). With soft-NMS
    (sigma > 0) TensorFlow suppresses by score decay alone, LiteRT still hard at the
    threshold, so 1 there. A threshold or sigma known only at run time is passed as it is, as
    TF's converter does.
    """
    iou = _float_input(ctx, 3, "iou_threshold")
    value = _constant_scalar(ctx, 3)
    _check_range(ctx, value, "iou_threshold", 0.0, 1.0)
    sigma = _constant_scalar(ctx, 5) if soft else 0.0
    _check_range(ctx, sigma, "soft_nms_sigma", 0.0)
    if value is None or sigma is None:
        return iou
    if sigma > 0:
        wanted = np.float32(1.0)
    elif value < 1:
        wanted = np.nextafter(np.float32(value), np.float32(np.inf))
    else:
        return iou
    return ctx.constant(np.asarray(wanted, np.float32), DType.FLOAT32, f"{ctx.name}/litert_iou_threshold")


@emits("NonMaxSuppressionV3", "NonMaxSuppressionV4", "NonMaxSuppressionV5")
def emit_non_max_suppression(ctx: EmitContext):
    """NON_MAX_SUPPRESSION_V4 (V3 and V4) or _V5 (soft-NMS, with scores), as TF's converter
    writes them. LiteRT's outputs always hold max_output_size entries, zero-padded; where
    TensorFlow returns only the selected ones (V3, and pad_to_max_output_size false) they
    are sliced to the count, so the model returns what TensorFlow returns."""
    soft = ctx.type == "NonMaxSuppressionV5"
    boxes, scores = _float_input(ctx, 0, "boxes"), _float_input(ctx, 1, "scores")
    max_size = as_int32(ctx, 2, "max_output_size")
    limit = _constant_scalar(ctx, 2)
    _check_range(ctx, limit, "max_output_size", 0.0)
    inputs = [boxes, scores, max_size, _litert_iou_threshold(ctx, soft), _float_input(ctx, 4, "score_threshold")]
    if soft:
        inputs.append(_float_input(ctx, 5, "soft_nms_sigma"))
    padded = ctx.type != "NonMaxSuppressionV3" and bool(ctx.attr("pad_to_max_output_size"))
    sig = (-1,) if limit is None else (int(limit),)
    selected = [ctx.out(i) if padded else ctx.temp(name, dtype, sig)
                for i, (name, dtype) in enumerate([("indices", DType.INT32), ("scores", DType.FLOAT32)][:1 + soft])]
    count = ctx.temp("count", DType.INT32, ()) if ctx.type == "NonMaxSuppressionV3" else ctx.out(1 + soft)
    op_type = "NON_MAX_SUPPRESSION_V5" if soft else "NON_MAX_SUPPRESSION_V4"
    ctx.emit(op_type, inputs, [*selected, count])
    if not padded:
        size = reshape(ctx, count, [1], suffix="count")
        begin = int32_const(ctx, [0], "begin")
        selected = [ctx.emit1("SLICE", [t, begin, size], ctx.out(i)) for i, t in enumerate(selected)]
    return selected if ctx.type == "NonMaxSuppressionV3" else [*selected, count]
