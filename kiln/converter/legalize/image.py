"""Image resizing."""

from __future__ import annotations

from ..context import EmitContext
from .common import as_int32, emitter_table

EMITTERS, emits = emitter_table()


@emits("ResizeBilinear", "ResizeNearestNeighbor")
def emit_resize(ctx: EmitContext):
    op_type = "RESIZE_BILINEAR" if ctx.type == "ResizeBilinear" else "RESIZE_NEAREST_NEIGHBOR"
    return ctx.emit1(op_type, [ctx.input(0), as_int32(ctx, 1, "size")],
                     align_corners=bool(ctx.attr("align_corners", False)),
                     half_pixel_centers=bool(ctx.attr("half_pixel_centers", False)))
