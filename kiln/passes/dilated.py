"""Dilated convolutions: SPACE_TO_BATCH_ND -> CONV_2D / DEPTHWISE_CONV_2D / CONV_3D ->
BATCH_TO_SPACE_ND (how ``tf.nn`` implements dilation) becomes one convolution with dilation
factors. For CONV_3D this is also what makes the model loadable: LiteRT's SPACE_TO_BATCH_ND
refuses the 5-D form."""

from __future__ import annotations


from ..ir import Operator, Subgraph
from ..schema import Padding
from .manager import OperatorPass
from .rewrite import bypass, const, sole_user


#: Per convolution: where the filter's spatial dims sit, and the spatial axes' option suffixes.
_SPATIAL = {
    "CONV_2D": (slice(1, 3), ("h", "w")),
    "DEPTHWISE_CONV_2D": (slice(1, 3), ("h", "w")),
    "CONV_3D": (slice(0, 3), ("d", "h", "w")),
}


def _effective_padding(kernel, block, pads, crops) -> Padding | None:
    for i, (k, r) in enumerate(zip(kernel, block)):
        before = int(pads[i][0] - crops[i][0])
        after = int(pads[i][1] - crops[i][1])
        if crops[i][0] != 0:
            return None
        total = (k - 1) * int(r)
        if (before, after) == (0, 0):
            kind = Padding.VALID
        elif (before, after) == (total // 2, total - total // 2):
            kind = Padding.SAME
        else:
            return None
        if i == 0:
            first = kind
        elif kind != first:
            return None
    return first


def _fuse(sg: Subgraph, conv: Operator) -> bool:
    if conv.op_type not in _SPATIAL:
        return False
    where, axes = _SPATIAL[conv.op_type]
    o = conv.options
    if o["padding"] != Padding.VALID:
        return False
    if any(o[f"stride_{a}"] != 1 or o[f"dilation_{a}_factor"] != 1 for a in axes):
        return False
    stb_out = conv.inputs[0]
    stb = stb_out.producer
    if stb is None or stb.op_type != "SPACE_TO_BATCH_ND" or sole_user(stb_out) is not conv:
        return False
    conv_out = conv.outputs[0]
    bts = sole_user(conv_out)
    if bts is None or bts.op_type != "BATCH_TO_SPACE_ND" or o["fused_activation_function"]:
        return False
    block, pads = const(stb.inputs[1]), const(stb.inputs[2])
    block2, crops = const(bts.inputs[1]), const(bts.inputs[2])
    if any(v is None for v in (block, pads, block2, crops)) or list(block) != list(block2) \
            or len(block) != len(axes):
        return False
    kernel = conv.inputs[1].signature[where]
    padding = _effective_padding(kernel, block, pads, crops)
    if padding is None:
        return False
    conv.set_input(0, stb.inputs[0])
    o["padding"] = int(padding)
    for a, r in zip(axes, block):
        o[f"dilation_{a}_factor"] = int(r)
    final = bts.outputs[0]
    conv_out.shape, conv_out.shape_signature = final.shape, final.shape_signature
    return bypass(sg, bts, conv_out)


class FuseDilatedConv(OperatorPass):
    name = "fuse-dilated-conv"

    def rewrite(self, sg, op) -> bool:
        return _fuse(sg, op)
