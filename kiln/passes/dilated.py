"""Dilated convolutions: SPACE_TO_BATCH_ND -> CONV_2D / DEPTHWISE_CONV_2D / CONV_3D ->
BATCH_TO_SPACE_ND (how ``tf.nn`` implements dilation) becomes one convolution with dilation
factors. For CONV_3D this is also what makes the model loadable: LiteRT's SPACE_TO_BATCH_ND
refuses the 5-D form."""

from __future__ import annotations

from .. import ops
from ..rules import Rule
from ..schema import Padding
from .manager import PassError, RulePass
from .rewrite import bypass, const, describe, sole_user


def _spatial(op_type: str) -> tuple[tuple[int, ...], tuple[str, ...]] | None:
    """A convolution's filter spatial dims (its record's ``weights.spatial``) and the spatial
    axes' option suffixes ("h", "w"; "d", "h", "w"); None for other ops."""
    record = ops.get(op_type)
    dims = record.weights.spatial if record is not None and record.weights is not None else ()
    if not dims:
        return None
    return dims, ("d", "h", "w")[3 - len(dims):]


def _effective_padding(kernel, block, pads, crops) -> Padding | None:
    """SAME or VALID when the space-to-batch paddings minus the crops are what that padding
    adds on every spatial axis (the same kind on all of them), else None."""
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


def _match(site):
    """A convolution reading a SPACE_TO_BATCH_ND: (conv, space_to_batch)."""
    _, conv = site
    if _spatial(conv.op_type) is None:
        return None
    stb = conv.inputs[0].producer
    if stb is None or stb.op_type != "SPACE_TO_BATCH_ND":
        return None
    return conv, stb


def _refusal(match) -> str | None:
    conv, stb = match
    _, axes = _spatial(conv.op_type)
    o = conv.options
    if o["padding"] != Padding.VALID:
        return "the convolution between the space-to-batch ops pads (it must be VALID)"
    if any(o[f"stride_{a}"] != 1 or o[f"dilation_{a}_factor"] != 1 for a in axes):
        return "the convolution is strided or dilated already"
    if sole_user(conv.inputs[0]) is not conv:
        return "the SPACE_TO_BATCH_ND output is also read elsewhere"
    conv_out = conv.outputs[0]
    bts = sole_user(conv_out)
    if bts is None or bts.op_type != "BATCH_TO_SPACE_ND":
        return "the convolution's output does not go (only) to a BATCH_TO_SPACE_ND"
    if o["fused_activation_function"]:
        return "the convolution applies a fused activation before BATCH_TO_SPACE_ND"
    if bts.outputs[0].is_variable:
        return "the BATCH_TO_SPACE_ND writes a variable"
    block, pads = const(stb.inputs[1]), const(stb.inputs[2])
    block2, crops = const(bts.inputs[1]), const(bts.inputs[2])
    if any(v is None for v in (block, pads, block2, crops)):
        return "the block shape, paddings or crops are not constant"
    if list(block) != list(block2):
        return f"the block shapes differ ({list(block)} vs {list(block2)})"
    if len(block) != len(axes):
        return f"the block shape has {len(block)} dims, the convolution {len(axes)} spatial ones"
    dims, _ = _spatial(conv.op_type)
    kernel = [conv.inputs[1].signature[d] for d in dims]
    if _effective_padding(kernel, block, pads, crops) is None:
        return "the paddings minus the crops are neither SAME nor VALID padding"
    return None


def _rewrite(match) -> bool:
    conv, stb = match
    dims, axes = _spatial(conv.op_type)
    conv_out = conv.outputs[0]
    bts = sole_user(conv_out)
    block, pads, crops = const(stb.inputs[1]), const(stb.inputs[2]), const(bts.inputs[2])
    padding = _effective_padding([conv.inputs[1].signature[d] for d in dims], block, pads, crops)
    conv.set_input(0, stb.inputs[0])
    conv.options["padding"] = int(padding)
    for a, r in zip(axes, block):
        conv.options[f"dilation_{a}_factor"] = int(r)
    final = bts.outputs[0]
    conv_out.shape, conv_out.shape_signature = final.shape, final.shape_signature
    if not bypass(conv.subgraph, bts, conv_out):
        raise PassError(f"fuse-dilated-conv: {describe(bts)} could not be removed after the convolution took it over")
    return True


FUSE_DILATED = Rule("fuse-dilated-conv", "pass", _match, _rewrite, check=_refusal,
                    subject=lambda m: describe(m[0]),
                    detail=lambda m: f"{describe(m[0])}: took its space-to-batch ops as dilation")


class FuseDilatedConv(RulePass):
    name = "fuse-dilated-conv"
    rules = (FUSE_DILATED,)
