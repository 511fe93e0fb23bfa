"""Identity / no-op removal: ops whose output equals their first input."""

from __future__ import annotations

import numpy as np

from ..ir import Model, Operator
from .manager import Pass
from .rewrite import bypass, const


def _same_signature(op: Operator) -> bool:
    """Input 0 and output 0 provably have the same shape (at most one unknown dim)."""
    a, b = op.inputs[0], op.outputs[0]
    if a is None or b is None:
        return False
    sa, sb = tuple(a.signature), tuple(b.signature)
    return sa == sb and sum(d < 0 for d in sa) <= 1


def _keeps_shape(x, c, out) -> bool:
    """``x`` broadcast against constant ``c`` keeps ``x``'s shape for any value of its dynamic
    dims: every dim of ``c`` is 1 or equals a static dim of ``x``."""
    if c is None or not c.is_constant or tuple(out.signature) != tuple(x.signature):
        return False
    xs, cs = tuple(x.signature), tuple(c.signature)
    if len(cs) > len(xs):
        return False
    return all(cd == 1 or cd == xd >= 0 for cd, xd in zip(cs[::-1], xs[::-1]))


def _all(value, x) -> bool:
    return value is not None and value.size > 0 and bool(np.all(value == x))


def is_noop(op: Operator) -> bool:
    """Whether ``op`` returns its first input unchanged."""
    t = op.op_type
    if len(op.outputs) != 1 or not op.inputs or op.inputs[0] is None:
        return False
    if op.options.get("fused_activation_function"):
        return False
    x, out = op.inputs[0], op.outputs[0]
    if x.dtype != out.dtype:
        return False
    if t in ("RESHAPE", "SQUEEZE", "EXPAND_DIMS"):  # same element count: one unknown dim is fine
        return _same_signature(op)
    if t == "BROADCAST_TO":  # may grow a dim that is 1 at conversion time: fully static only
        return _same_signature(op) and all(d >= 0 for d in x.signature)
    if t == "CAST":
        return True
    if t == "TRANSPOSE":
        perm = const(op.inputs[1])
        return perm is not None and list(perm.reshape(-1)) == list(range(perm.size))
    if t in ("ADD", "SUB"):
        return _keeps_shape(x, op.inputs[1], out) and _all(const(op.inputs[1]), 0)
    if t in ("MUL", "DIV"):
        return _keeps_shape(x, op.inputs[1], out) and _all(const(op.inputs[1]), 1)
    if t in ("PAD", "PADV2", "TILE"):
        value = const(op.inputs[1])
        return value is not None and (_all(value, 1) if t == "TILE" else not np.any(value))
    if t == "CONCATENATION":
        return len(op.inputs) == 1
    if t == "SLICE":  # a full-size slice must start at 0
        return _same_signature(op) and all(d >= 0 for d in x.signature)
    return False


class RemoveNoOps(Pass):
    """Bypass operators that leave their input unchanged (reshape to the same shape, add 0,
    multiply by 1, identity transpose, same-type cast, ...)."""

    name = "remove-no-ops"

    def run(self, model: Model) -> bool:
        changed = False
        for sg in model.subgraphs:
            for op in list(sg.operators):
                if op.subgraph is sg and is_noop(op):
                    # Commutative ops may hold the constant first.
                    changed |= bypass(sg, op, op.inputs[0])
            for op in list(sg.operators):
                if op.subgraph is sg and op.op_type in ("ADD", "MUL") and len(op.inputs) == 2:
                    first = const(op.inputs[0])
                    neutral = 0 if op.op_type == "ADD" else 1
                    if (_all(first, neutral) and not op.options["fused_activation_function"]
                            and op.inputs[1].dtype == op.outputs[0].dtype
                            and _keeps_shape(op.inputs[1], op.inputs[0], op.outputs[0])):
                        changed |= bypass(sg, op, op.inputs[1])
        return changed
