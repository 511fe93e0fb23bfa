"""PAD + VALID convolution -> SAME convolution, when the padding is exactly what SAME adds
(Keras' ZeroPadding2D before a strided depthwise conv in MobileNet)."""

from __future__ import annotations

import numpy as np

from ..kernels.windows import out_size, pad_before_after
from ..rules import Rule
from ..schema import Padding
from .manager import RulePass
from .rewrite import const, describe, sole_user


def same_padding(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    """(before, after) padding LiteRT's SAME adds along one spatial dim (the kernels' own
    geometry, kiln/ops/windowed.py)."""
    return pad_before_after(size, kernel, stride, dilation, out_size(Padding.SAME, size, kernel, stride, dilation))


def _match(site):
    """A VALID convolution reading a PAD / PADV2."""
    sg, conv = site
    if conv.op_type not in ("CONV_2D", "DEPTHWISE_CONV_2D") or conv.options["padding"] != Padding.VALID:
        return None
    pad = conv.inputs[0].producer
    if pad is None or pad.op_type not in ("PAD", "PADV2"):
        return None
    return conv, pad


def _refusal(match) -> str | None:
    conv, pad = match
    if sole_user(conv.inputs[0]) is not conv:
        return "the padded tensor is also read elsewhere"
    if pad.op_type == "PADV2":
        value = const(pad.inputs[2])
        if value is None or np.any(value != 0):
            return "PADV2 pads with a value other than a constant zero"
    pads = const(pad.inputs[1])
    if pads is None or pads.shape != (4, 2):
        return "the paddings are not a constant [4, 2] tensor"
    if np.any(pads[0]) or np.any(pads[3]):
        return "it pads the batch or channel dimension"
    x, w, o = pad.inputs[0], conv.inputs[1].signature, conv.options
    for axis, (k, s, d) in ((1, (w[1], o["stride_h"], o["dilation_h_factor"])),
                            (2, (w[2], o["stride_w"], o["dilation_w_factor"]))):
        size = x.signature[axis]
        if size < 0:
            return f"spatial dim {axis} of the input is not known at conversion time"
        padding = tuple(int(p) for p in pads[axis])
        if s < 1 or d < 1 or padding != same_padding(size, k, s, d):
            return f"the padding {padding} of dim {axis} is not what SAME adds"
    return None


def _rewrite(match) -> bool:
    conv, pad = match
    conv.set_input(0, pad.inputs[0])
    conv.options["padding"] = int(Padding.SAME)
    return True


FUSE_PAD = Rule("fuse-pad-into-conv", "pass", _match, _rewrite, check=_refusal,
                subject=lambda m: describe(m[0]),
                detail=lambda m: f"{describe(m[0])}: took its {m[1].op_type} as SAME padding")


class FusePadIntoConv(RulePass):
    name = "fuse-pad-into-conv"
    rules = (FUSE_PAD,)
