"""Dilated convolutions: SPACE_TO_BATCH_ND -> CONV_2D / DEPTHWISE_CONV_2D -> BATCH_TO_SPACE_ND
(how ``tf.nn`` implements dilation) becomes one convolution with dilation factors."""

from __future__ import annotations


from ..ir import Operator, Subgraph
from ..schema import Padding
from .manager import OperatorPass
from .rewrite import bypass, const, sole_user


def _effective_padding(op: Operator, block, pads, crops) -> Padding | None:
    kh, kw = (op.inputs[1].signature[1], op.inputs[1].signature[2])
    for i, (k, r) in enumerate(zip((kh, kw), block)):
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
    if conv.op_type not in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        return False
    o = conv.options
    if o.get("padding") != Padding.VALID or o.get("stride_h", 1) != 1 or o.get("stride_w", 1) != 1:
        return False
    if o.get("dilation_h_factor", 1) != 1 or o.get("dilation_w_factor", 1) != 1:
        return False
    stb_out = conv.inputs[0]
    stb = stb_out.producer
    if stb is None or stb.op_type != "SPACE_TO_BATCH_ND" or sole_user(stb_out) is not conv:
        return False
    conv_out = conv.outputs[0]
    bts = sole_user(conv_out)
    if bts is None or bts.op_type != "BATCH_TO_SPACE_ND" or o.get("fused_activation_function", 0):
        return False
    block, pads = const(stb.inputs[1]), const(stb.inputs[2])
    block2, crops = const(bts.inputs[1]), const(bts.inputs[2])
    if any(v is None for v in (block, pads, block2, crops)) or list(block) != list(block2) or len(block) != 2:
        return False
    padding = _effective_padding(conv, block, pads, crops)
    if padding is None:
        return False
    conv.set_input(0, stb.inputs[0])
    o["padding"] = int(padding)
    o["dilation_h_factor"], o["dilation_w_factor"] = int(block[0]), int(block[1])
    final = bts.outputs[0]
    conv_out.shape, conv_out.shape_signature = final.shape, final.shape_signature
    return bypass(sg, bts, conv_out)


class FuseDilatedConv(OperatorPass):
    name = "fuse-dilated-conv"

    def rewrite(self, sg, op) -> bool:
        return _fuse(sg, op)
