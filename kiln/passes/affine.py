"""Batch-norm folding: constant scales and shifts around affine ops go into their weights.

- ``MUL`` (or ``DIV``) of a conv / depthwise conv / fully-connected output by a per-output-
  channel constant scales the weights and the bias (inference batch norm is a MUL + ADD; the
  ADD then becomes the bias through bias fusion);
- a ``MUL`` / ``DIV`` / ``ADD`` / ``SUB`` of a per-input-feature constant right before a
  FULLY_CONNECTED folds into its weights or bias (TF's FuseBinaryOpToFollowingAffineOp).
"""

from __future__ import annotations

import numpy as np

from ..ir import Operator, Subgraph
from ..schema import DType
from .bias import BIAS_INPUT, fusable_producer, out_channels
from .manager import OperatorPass
from .rewrite import add_constant, broadcastable_to_last, bypass, const, sole_user, writes_variable


def _scale_weights(op: Operator, w: np.ndarray, vec: np.ndarray) -> np.ndarray:
    if op.op_type in ("DEPTHWISE_CONV_2D", "CONV_3D"):
        return w * vec  # output channels last
    return w * vec.reshape((-1,) + (1,) * (w.ndim - 1))  # output channels first


def _scale_vector(mul: Operator) -> tuple[object, np.ndarray] | None:
    """(activation operand, constant) of a MUL/DIV by a constant, or None."""
    if mul.op_type not in ("MUL", "DIV") or len(mul.inputs) != 2 or writes_variable(mul):
        return None
    if mul.options["fused_activation_function"]:
        return None
    for i in (0, 1):
        if mul.op_type == "DIV" and i == 1:
            break
        x, value = mul.inputs[i], const(mul.inputs[1 - i])
        if value is None or value.dtype != np.float32 or tuple(mul.outputs[0].signature) != tuple(x.signature):
            continue
        if mul.op_type == "DIV":
            if np.any(value == 0):
                return None
            value = (1.0 / value.astype(np.float64)).astype(np.float32)
        return x, value
    return None


def _fold_scale_backward(sg: Subgraph, mul: Operator) -> bool:
    found = _scale_vector(mul)
    if found is None:
        return False
    x, value = found
    op = fusable_producer(x)
    if op is None:
        return False
    n = out_channels(op)
    if n < 0 or value.ndim > x.rank:
        return False
    vec = broadcastable_to_last(value, n)
    if vec is None:
        return False
    vec = vec.astype(np.float32)
    w = const(op.inputs[1])
    op.set_input(1, add_constant(sg, f"{op.inputs[1].name}/scaled", _scale_weights(op, w, vec), DType.FLOAT32))
    idx = BIAS_INPUT[op.op_type]
    if len(op.inputs) > idx and op.inputs[idx] is not None:
        b = const(op.inputs[idx])
        if b is None:
            return False
        op.set_input(idx, add_constant(sg, f"{op.inputs[idx].name}/scaled", b * vec, DType.FLOAT32))
    return bypass(sg, mul, x)


def _fold_into_next_fc(sg: Subgraph, op: Operator) -> bool:
    """x (*|/|+|-) c feeding only a FULLY_CONNECTED: fold c into its weights / bias."""
    if op.op_type not in ("MUL", "DIV", "ADD", "SUB") or op.options["fused_activation_function"]:
        return False
    if writes_variable(op):
        return False
    out = op.outputs[0]
    fc = sole_user(out)
    if fc is None or fc.op_type != "FULLY_CONNECTED" or fc.inputs[0] is not out:
        return False
    w = const(fc.inputs[1])
    if w is None or w.dtype != np.float32 or fc.inputs[0].dtype != DType.FLOAT32:
        return False
    k = w.shape[1]
    if op.op_type in ("MUL", "DIV"):
        found = _scale_vector(op)
        if found is None:
            return False
        x, value = found
        vec = broadcastable_to_last(value, k) if value.ndim <= x.rank else None
        if vec is None or x.signature[-1] != k:
            return False
        fc.set_input(1, add_constant(sg, f"{fc.inputs[1].name}/scaled", w * vec.astype(np.float32)[None, :],
                                     DType.FLOAT32))
        fc.set_input(0, x)
        return True
    for i in (0, 1):
        if op.op_type == "SUB" and i == 1:
            break
        x, value = op.inputs[i], const(op.inputs[1 - i])
        if value is None or value.dtype != np.float32 or tuple(out.signature) != tuple(x.signature):
            continue
        if value.ndim > x.rank or x.signature[-1] != k:
            continue
        vec = broadcastable_to_last(value, k)
        if vec is None:
            continue
        if op.op_type == "SUB":
            vec = -vec
        shift = (w.astype(np.float64) @ vec.astype(np.float64)).astype(np.float32)
        b = const(fc.inputs[2]) if len(fc.inputs) > 2 and fc.inputs[2] is not None else None
        if len(fc.inputs) > 2 and fc.inputs[2] is not None and b is None:
            return False
        bias = shift + (0 if b is None else b)
        inputs = list(fc.inputs) + [None] * (3 - len(fc.inputs))
        inputs[0] = x
        inputs[2] = add_constant(sg, f"{fc.outputs[0].name}/bias", bias, DType.FLOAT32)
        fc.set_inputs(inputs)
        return True
    return False


class FoldAffine(OperatorPass):
    name = "fold-batch-norm"

    def rewrite(self, sg, op) -> bool:
        return _fold_scale_backward(sg, op) or _fold_into_next_fc(sg, op)
