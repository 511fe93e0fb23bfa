"""Batch-norm folding: constant scales and shifts around affine ops go into their weights.

- ``MUL`` (or ``DIV``) of a conv / depthwise conv / fully-connected output by a per-output-
  channel constant scales the weights and the bias (inference batch norm is a MUL + ADD; the
  ADD then becomes the bias through bias fusion);
- a ``MUL`` / ``DIV`` / ``ADD`` / ``SUB`` of a per-input-feature constant right before a
  FULLY_CONNECTED folds into its weights or bias (TF's FuseBinaryOpToFollowingAffineOp).

Each is a `kiln.rules.Rule` whose check says why a scale stayed (the multiplier is not
constant, not one value per channel, the producer's output is shared, ...).
"""

from __future__ import annotations

import numpy as np

from ..ir import Operator
from ..rules import Rule
from ..schema import DType
from .bias import bias_operand, out_channels, producer_refusal, through_reshapes
from .manager import PassError, RulePass
from .rewrite import add_constant, broadcastable_to_last, bypass, const, describe, is_output, sole_user, writes_variable


def _scale_weights(op: Operator, w: np.ndarray, vec: np.ndarray) -> np.ndarray:
    if op.op_type in ("DEPTHWISE_CONV_2D", "CONV_3D"):
        return w * vec  # output channels last
    return w * vec.reshape((-1,) + (1,) * (w.ndim - 1))  # output channels first


def _operands(op: Operator) -> tuple[int, ...]:
    """Positions of the activation operand: either for MUL / ADD, the first for DIV / SUB
    (c / x and c - x are no scale or shift of x)."""
    return (0, 1) if op.op_type in ("MUL", "ADD") else (0,)


def _scale_vector(mul: Operator) -> tuple[object, np.ndarray] | str:
    """(activation operand, constant scale) of a MUL / DIV by a float constant, or why not."""
    if mul.options["fused_activation_function"]:
        return f"the {mul.op_type} applies a fused activation"
    reason = f"the {'divisor' if mul.op_type == 'DIV' else 'multiplier'} is not constant"
    for i in _operands(mul):
        x, value = mul.inputs[i], const(mul.inputs[1 - i])
        if value is None:
            continue
        if value.dtype != np.float32:
            reason = f"the constant is {value.dtype}, not float32"
            continue
        if tuple(mul.outputs[0].signature) != tuple(x.signature):
            reason = "the constant broadcasts the result to a larger shape"
            continue
        if mul.op_type == "DIV":
            if np.any(value == 0):
                return "the divisor has zeros"
            value = (1.0 / value.astype(np.float64)).astype(np.float32)
        return x, value
    return reason


# -- a scale after an affine op ------------------------------------------------------------------

def _match_scale(site):
    """A MUL / DIV of the output of an affine op (possibly through channel-keeping reshapes)."""
    _, mul = site
    if mul.op_type not in ("MUL", "DIV") or len(mul.inputs) != 2 or writes_variable(mul):
        return None
    for i in _operands(mul):
        producer = through_reshapes(mul.inputs[i]).producer
        if producer is not None and bias_operand(producer.op_type) is not None:
            return mul
    return None


def _scale_plan(mul: Operator):
    """(affine op, activation operand, per-channel scale), or why the scale stays."""
    found = _scale_vector(mul)
    if isinstance(found, str):
        return found
    x, value = found
    op, why = producer_refusal(x)
    if op is None:
        return why
    n = out_channels(op)
    vec = broadcastable_to_last(value, n) if n >= 0 and value.ndim <= x.rank else None
    if vec is None:
        return "the constant is not one value per output channel"
    idx = bias_operand(op.op_type)
    if len(op.inputs) > idx and op.inputs[idx] is not None and const(op.inputs[idx]) is None:
        return f"the bias of {describe(op)} is not constant"
    if is_output(mul.outputs[0]) and is_output(x):
        return "its input and output are both subgraph outputs (LiteRT cannot alias them)"
    return op, x, vec.astype(np.float32)


def _scale_refusal(mul: Operator) -> str | None:
    plan = _scale_plan(mul)
    return plan if isinstance(plan, str) else None


def _fold_scale(mul: Operator) -> bool:
    op, x, vec = _scale_plan(mul)
    sg = mul.subgraph
    w = const(op.inputs[1])
    op.set_input(1, add_constant(sg, f"{op.inputs[1].name}/scaled", _scale_weights(op, w, vec), DType.FLOAT32))
    idx = bias_operand(op.op_type)
    if len(op.inputs) > idx and op.inputs[idx] is not None:
        b = const(op.inputs[idx])
        op.set_input(idx, add_constant(sg, f"{op.inputs[idx].name}/scaled", b * vec, DType.FLOAT32))
    if not bypass(sg, mul, x):
        raise PassError(f"fold-batch-norm: {describe(mul)} could not be removed after its scale was folded")
    return True


FOLD_SCALE = Rule("fold-scale-into-producer", "pass", _match_scale, _fold_scale, check=_scale_refusal,
                  subject=describe, detail=lambda mul: f"{describe(mul)}: folded into the preceding op's weights")


# -- a scale or shift before a FULLY_CONNECTED ---------------------------------------------------

def _match_before_fc(site):
    """A MUL / DIV / ADD / SUB with a constant operand whose result only a FULLY_CONNECTED reads,
    as its input: (op, the FULLY_CONNECTED)."""
    _, op = site
    if op.op_type not in ("MUL", "DIV", "ADD", "SUB") or len(op.inputs) != 2 or writes_variable(op):
        return None
    fc = sole_user(op.outputs[0])
    if fc is None or fc.op_type != "FULLY_CONNECTED" or fc.inputs[0] is not op.outputs[0]:
        return None
    if all(const(op.inputs[1 - i]) is None for i in _operands(op)):
        return None
    return op, fc


def _fc_plan(match):
    """(new FC inputs as (index, name, value) triples, activation operand), or why not."""
    op, fc = match
    if op.options["fused_activation_function"]:
        return f"the {op.op_type} applies a fused activation"
    w = const(fc.inputs[1])
    if w is None or w.dtype != np.float32 or fc.inputs[0].dtype != DType.FLOAT32:
        return f"the weights of {describe(fc)} are not constant float32"
    k = w.shape[1]
    per_feature = f"the constant is not one value per input feature of {describe(fc)}"
    if op.op_type in ("MUL", "DIV"):
        found = _scale_vector(op)
        if isinstance(found, str):
            return found
        x, value = found
        vec = broadcastable_to_last(value, k) if value.ndim <= x.rank else None
        if vec is None or x.signature[-1] != k:
            return per_feature
        return [(1, f"{fc.inputs[1].name}/scaled", w * vec.astype(np.float32)[None, :])], x
    reasons = []
    for i in _operands(op):
        x, value = op.inputs[i], const(op.inputs[1 - i])
        if value is None:
            continue
        if value.dtype != np.float32 or tuple(op.outputs[0].signature) != tuple(x.signature):
            reasons.append("the constant is not float32 or broadcasts the result to a larger shape")
            continue
        vec = broadcastable_to_last(value, k) if value.ndim <= x.rank and x.signature[-1] == k else None
        if vec is None:
            reasons.append(per_feature)
            continue
        if op.op_type == "SUB":
            vec = -vec
        shift = (w.astype(np.float64) @ vec.astype(np.float64)).astype(np.float32)
        has_bias = len(fc.inputs) > 2 and fc.inputs[2] is not None
        b = const(fc.inputs[2]) if has_bias else None
        if has_bias and b is None:
            return f"the bias of {describe(fc)} is not constant"
        return [(2, f"{fc.outputs[0].name}/bias", shift + (0 if b is None else b))], x
    return "; ".join(dict.fromkeys(reasons))


def _fc_refusal(match) -> str | None:
    plan = _fc_plan(match)
    return plan if isinstance(plan, str) else None


def _fold_into_fc(match) -> bool:
    _, fc = match
    changes, x = _fc_plan(match)
    sg = fc.subgraph
    inputs = list(fc.inputs) + [None] * (3 - len(fc.inputs))
    inputs[0] = x
    for index, name, value in changes:
        inputs[index] = add_constant(sg, name, value, DType.FLOAT32)
    fc.set_inputs(inputs[:max(len(fc.inputs), 1 + max(i for i, _, _ in changes))])
    return True


FOLD_INTO_FC = Rule("fold-into-next-fully-connected", "pass", _match_before_fc, _fold_into_fc,
                    check=_fc_refusal, subject=lambda m: describe(m[0]),
                    detail=lambda m: f"{describe(m[0])}: folded into the weights of {describe(m[1])}")


class FoldAffine(RulePass):
    """Both folds; a scale that fits neither stays with both reasons in the report."""

    name = "fold-batch-norm"
    rules = (FOLD_SCALE, FOLD_INTO_FC)
