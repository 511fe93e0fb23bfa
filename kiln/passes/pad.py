"""PAD + VALID convolution -> SAME convolution, when the padding is exactly what SAME adds
(Keras' ZeroPadding2D before a strided depthwise conv in MobileNet)."""

from __future__ import annotations

import numpy as np

from ..ir import Operator, Subgraph
from ..ops.windowed import out_size, pad_before_after
from ..schema import Padding
from .manager import OperatorPass
from .rewrite import const, sole_user


def same_padding(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    """(before, after) padding LiteRT's SAME adds along one spatial dim (the kernels' own
    geometry, kiln/ops/windowed.py)."""
    return pad_before_after(size, kernel, stride, dilation, out_size(Padding.SAME, size, kernel, stride, dilation))


def _fuse(sg: Subgraph, conv: Operator) -> bool:
    if conv.op_type not in ("CONV_2D", "DEPTHWISE_CONV_2D") or conv.options["padding"] != Padding.VALID:
        return False
    padded = conv.inputs[0]
    pad = padded.producer
    if pad is None or pad.op_type not in ("PAD", "PADV2") or sole_user(padded) is not conv:
        return False
    if pad.op_type == "PADV2":
        value = const(pad.inputs[2])
        if value is None or np.any(value != 0):
            return False
    pads = const(pad.inputs[1])
    x = pad.inputs[0]
    if pads is None or pads.shape != (4, 2) or np.any(pads[0]) or np.any(pads[3]):
        return False
    w = conv.inputs[1].signature
    o = conv.options
    for axis, (k, s, d) in ((1, (w[1], o["stride_h"], o["dilation_h_factor"])),
                            (2, (w[2], o["stride_w"], o["dilation_w_factor"]))):
        size = x.signature[axis]
        if size < 0 or s < 1 or d < 1 or tuple(int(p) for p in pads[axis]) != same_padding(size, k, s, d):
            return False
    conv.set_input(0, x)
    o["padding"] = int(Padding.SAME)
    return True


class FusePadIntoConv(OperatorPass):
    name = "fuse-pad-into-conv"

    def rewrite(self, sg, op) -> bool:
        return _fuse(sg, op)
