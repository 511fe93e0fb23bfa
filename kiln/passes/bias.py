"""Bias fusion: FULLY_CONNECTED / CONV_2D / DEPTHWISE_CONV_2D / CONV_3D / TRANSPOSE_CONV followed by an ADD
(or SUB) of a per-output-channel constant take it as their bias — also across a reshape that
splits the channels into trailing dims (an einsum projection [b, t, 16] -> [b, t, 2, 8] + a
[2, 8] bias, as Keras' MultiHeadAttention writes it)."""

from __future__ import annotations

import numpy as np

from .. import ops
from ..ir import Operator, Subgraph
from ..rules import Decline, Rule
from ..schema import DType
from .manager import PassError, RulePass
from .rewrite import add_constant, broadcastable_to_last, bypass, const, describe, is_output, sole_user, writes_variable


def bias_operand(op_type: str) -> int | None:
    """The position of an affine op's bias operand (its record's ``weights.bias``); None for
    an op without one."""
    record = ops.get(op_type)
    return None if record is None or record.weights is None else record.weights.bias


def out_channels(op: Operator) -> int:
    """An affine op's output channels: its weights' per-channel dimension."""
    weights = ops.require(op.op_type).weights
    return op.inputs[weights.first].signature[weights.axis]


def through_reshapes(t):
    """Follow ``t`` back through reshapes that keep the last (channel) dim and are the only
    readers of their inputs; returns the tensor an affine op may produce."""
    while True:
        op = t.producer
        if op is None or not ops.states(op.op_type, "reshapes") or sole_user(t) is None:
            return t
        src = op.inputs[0]
        if not src.signature or not t.signature or src.signature[-1] != t.signature[-1] or src.signature[-1] < 0:
            return t
        if sole_user(src) is not op:
            return t
        t = src


def producer_refusal(t) -> tuple[Operator | None, str]:
    """(the affine op producing ``t``, possibly through channel-preserving reshapes, when its
    output is unshared and activation-free; else None and why not)."""
    t = through_reshapes(t)
    op = t.producer
    if op is None or bias_operand(op.op_type) is None:
        return None, _blocking_reshape(t) or "it does not follow a FULLY_CONNECTED, convolution or TRANSPOSE_CONV"
    if sole_user(t) is None:
        return None, f"the output of {describe(op)} is also read elsewhere"
    if op.options["fused_activation_function"]:
        return None, f"{describe(op)} applies a fused activation first"
    if op.outputs[0].dtype != DType.FLOAT32:
        return None, f"{describe(op)} is not float32"
    if const(op.inputs[1]) is None:
        return None, f"the weights of {describe(op)} are not constant"
    return op, ""


def _blocking_reshape(t) -> str | None:
    """When reshapes lead from ``t`` back to an affine op but `through_reshapes` stopped at
    ``t``: why it could not go through."""
    reshape, src = t.producer, t
    while src.producer is not None and ops.states(src.producer.op_type, "reshapes"):
        src = src.producer.inputs[0]
    if reshape is None or not ops.states(reshape.op_type, "reshapes") or src.producer is None \
            or bias_operand(src.producer.op_type) is None:
        return None
    if sole_user(t) is None:
        return f"the output of {describe(reshape)} is also read elsewhere"
    if sole_user(reshape.inputs[0]) is not reshape:
        return f"the input of {describe(reshape)} is also read elsewhere"
    return f"{describe(reshape)} between it and {describe(src.producer)} changes the channel dim"


def fusable_producer(t) -> Operator | None:
    """The affine op producing ``t`` (possibly through channel-preserving reshapes) when its
    output is unshared and activation-free."""
    return producer_refusal(t)[0]


def _channel_split(x, value: np.ndarray) -> tuple[Operator, np.ndarray] | None:
    """(affine producer, per-channel bias) when ``x`` is a sole-use RESHAPE of an affine op's
    output that only splits its last dim ``n`` into trailing dims, and ``value`` broadcasts
    over those trailing dims alone."""
    reshape = x.producer
    if reshape is None or reshape.op_type != "RESHAPE" or sole_user(x) is None:
        return None
    t = reshape.inputs[0]
    op = fusable_producer(t) if sole_user(t) is reshape else None
    if op is None:
        return None
    n, lead, sig = out_channels(op), tuple(t.signature[:-1]), tuple(x.signature)
    if n <= 0 or len(sig) <= len(lead) or sig[:len(lead)] != lead:
        return None
    trailing = sig[len(lead):]
    if any(d < 0 for d in trailing) or int(np.prod(trailing)) != n or value.ndim > len(sig):
        return None
    extra = value.shape[:max(0, value.ndim - len(trailing))]
    if any(d != 1 for d in extra):
        return None
    core = value.reshape(value.shape[len(extra):])
    if any(c not in (1, d) for c, d in zip(core.shape[::-1], trailing[::-1])):
        return None   # does not broadcast over the trailing dims
    return op, np.broadcast_to(core, trailing).reshape(n)


def _set_bias(sg: Subgraph, op: Operator, vec: np.ndarray, name: str) -> bool:
    """Add ``vec`` to ``op``'s bias (creating it); False when its bias is not a constant."""
    idx = bias_operand(op.op_type)
    old = const(op.inputs[idx]) if len(op.inputs) > idx and op.inputs[idx] is not None else None
    if len(op.inputs) > idx and op.inputs[idx] is not None and old is None:
        return False
    bias = vec.astype(np.float32) + (0 if old is None else old.astype(np.float32))
    inputs = list(op.inputs) + [None] * (idx + 1 - len(op.inputs))
    inputs[idx] = add_constant(sg, name, bias, DType.FLOAT32)
    op.set_inputs(inputs)
    return True


def _match(site):
    """An ADD / SUB with a constant operand that could be a bias."""
    sg, add = site
    if add.op_type not in ("ADD", "SUB") or len(add.inputs) != 2 or writes_variable(add):
        return None
    operands = (0, 1) if add.op_type == "ADD" else (0,)   # c - x is not a bias
    if not any(const(add.inputs[1 - i]) is not None for i in operands):
        return None
    return sg, add, operands


def _rewrite(match) -> bool:
    sg, add, operands = match
    reasons = []
    for i in operands:
        x, value = add.inputs[i], const(add.inputs[1 - i])
        if value is None:
            continue
        if tuple(add.outputs[0].signature) != tuple(x.signature):
            reasons.append("the constant broadcasts the result to a larger shape")
            continue
        op, why = producer_refusal(x)
        vec = None
        if op is not None:
            n = out_channels(op)
            if n >= 0 and value.ndim <= len(x.signature):
                vec = broadcastable_to_last(value, n)
            why = "the constant is not one value per output channel"
        elif not add.options["fused_activation_function"]:  # the activation would land
            split = _channel_split(x, value)                # before the reshape
            if split is not None:
                op, vec = split
        if vec is None:
            reasons.append(why)
            continue
        if is_output(x) and is_output(add.outputs[0]):
            reasons.append("its input and output are both subgraph outputs (LiteRT cannot alias them)")
            continue
        if add.op_type == "SUB":
            vec = -vec
        if not _set_bias(sg, op, vec, f"{add.outputs[0].name}/bias"):
            reasons.append(f"the bias of {describe(op)} is not a constant")
            continue
        op.options["fused_activation_function"] = add.options["fused_activation_function"]
        if not bypass(sg, add, x):
            raise PassError(f"fuse-bias: {describe(add)} could not be removed after its bias was moved")
        return True
    raise Decline("; ".join(dict.fromkeys(reasons)))


FUSE_BIAS = Rule("fuse-bias", "pass", _match, _rewrite, subject=lambda m: describe(m[1]),
                 detail=lambda m: f"{describe(m[1])}: folded into the preceding op's bias")


class FuseBias(RulePass):
    name = "fuse-bias"
    rules = (FUSE_BIAS,)
