"""Identity / no-op removal: ops whose output equals their first input.

A `kiln.rules.Rule`: an op whose operands say "identity" (add 0, multiply by 1, an identity
permutation, a reshape to the signature it has) but which stays says why (its shapes are not
provably equal, the constant broadcasts, it applies a fused activation, LiteRT cannot alias
a subgraph output to an input).
"""

from __future__ import annotations

import numpy as np

from .. import ops
from ..ir import Operator
from ..rules import Decline, Rule
from .manager import RulePass
from .rewrite import bypass, const, describe


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




def _looks_like_identity(op: Operator) -> bool:
    """Whether ``op``'s operands and signatures say it returns its first input (before the
    checks that prove it)."""
    t = op.op_type
    if len(op.outputs) != 1 or not op.inputs or op.inputs[0] is None or op.outputs[0] is None:
        return False
    x, out = op.inputs[0], op.outputs[0]
    if ops.states(t, "reshapes") or t in ("BROADCAST_TO", "SLICE"):
        return tuple(x.signature) == tuple(out.signature)
    if t == "CAST":
        return x.dtype == out.dtype
    if t == "TRANSPOSE":
        perm = const(op.inputs[1])
        return perm is not None and list(perm.reshape(-1)) == list(range(perm.size))
    if t in ("ADD", "SUB"):
        return len(op.inputs) == 2 and _all(const(op.inputs[1]), 0)
    if t in ("MUL", "DIV"):
        return len(op.inputs) == 2 and _all(const(op.inputs[1]), 1)
    if t in ("PAD", "PADV2", "TILE"):
        value = const(op.inputs[1])
        return value is not None and (_all(value, 1) if t == "TILE" else not np.any(value))
    if t == "CONCATENATION":
        return len(op.inputs) == 1
    return False


def noop_refusal(op: Operator) -> str | None:
    """Why an op that looks like an identity (see `_looks_like_identity`) is not provably one."""
    x, out = op.inputs[0], op.outputs[0]
    if op.options.get("fused_activation_function"):
        return "it applies a fused activation"
    if x.dtype != out.dtype:
        return f"it turns {x.dtype.name} into {out.dtype.name}"
    t = op.op_type
    if ops.states(t, "reshapes") and not _same_signature(op):  # same element count: one unknown dim is fine
        return "more than one dim is unknown, so the shapes may differ at run time"
    if t in ("BROADCAST_TO", "SLICE") and not all(d >= 0 for d in x.signature):
        # BROADCAST_TO may grow a dim that is 1 at conversion time; a full-size SLICE must start at 0
        return "a dim is unknown at conversion time (it may differ at run time)"
    if t in ("ADD", "SUB", "MUL", "DIV") and not _keeps_shape(x, op.inputs[1], out):
        return "the constant broadcasts its input to a larger shape"
    return None


def _remove(op: Operator, source) -> bool:
    if not bypass(op.subgraph, op, source):
        raise Decline("its output is a subgraph output (or variable) and its input a subgraph input "
                      "or constant: LiteRT cannot alias them")
    return True


REMOVE_NO_OP = Rule(
    "remove-no-op", "pass", lambda site: site[1] if _looks_like_identity(site[1]) else None,
    lambda op: _remove(op, op.inputs[0]), check=noop_refusal, subject=describe,
    detail=lambda op: f"{describe(op)}: removed (it returns its input)")


def _match_neutral_first(site):
    """ADD(0, x) / MUL(1, x): commutative ops may hold the neutral constant first."""
    _, op = site
    if op.op_type not in ("ADD", "MUL") or len(op.inputs) != 2 or op.outputs[0] is None:
        return None
    return op if _all(const(op.inputs[0]), 0 if op.op_type == "ADD" else 1) else None


def _neutral_first_refusal(op: Operator) -> str | None:
    if op.options["fused_activation_function"]:
        return "it applies a fused activation"
    if op.inputs[1].dtype != op.outputs[0].dtype:
        return "its output type differs from its input's"
    if not _keeps_shape(op.inputs[1], op.inputs[0], op.outputs[0]):
        return "the constant broadcasts its input to a larger shape"
    return None


REMOVE_NEUTRAL_FIRST = Rule(
    "remove-no-op", "pass", _match_neutral_first, lambda op: _remove(op, op.inputs[1]),
    check=_neutral_first_refusal, subject=describe,
    detail=lambda op: f"{describe(op)}: removed (it returns its input)")


class RemoveNoOps(RulePass):
    """Bypass operators that leave their input unchanged (reshape to the same shape, add 0,
    multiply by 1, identity transpose, same-type cast, ...)."""

    name = "remove-no-ops"
    rules = (REMOVE_NO_OP, REMOVE_NEUTRAL_FIRST)
