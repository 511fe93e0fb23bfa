"""Transpose / reshape canonicalisation.

- a chain of reshapes (RESHAPE, EXPAND_DIMS, SQUEEZE) ending in a RESHAPE, or a RESHAPE then an
  EXPAND_DIMS / SQUEEZE, is one RESHAPE;
- a RESHAPE whose shape is computed at run time but whose result has at most one unknown
  dim gets a constant shape (the SHAPE / STRIDED_SLICE / PACK chain becomes dead);
- two TRANSPOSEs in a row are one (or none); a TRANSPOSE that only moves size-1 dims is a
  RESHAPE; a DYNAMIC_UPDATE_SLICE that overwrites its whole operand is its update; a TRANSPOSE
  of the last two dims feeding BATCH_MATMUL becomes its adj flag;
- a reduction (MEAN, SUM, REDUCE_MAX/MIN/PROD) over dims of size 1 is a RESHAPE (a
  squeeze-and-excite pooling over a 1×1 map; with keepdims the reshape then goes away);
- a DIV by a float constant is a MUL by its reciprocal, MAXIMUM(x, 0) a RELU,
  MINIMUM(RELU(x), 6) a RELU6 and x + (-y) a SUB (as TF's converter writes them);
- a RESHAPE that only flattens the input of a FULLY_CONNECTED is dropped (FULLY_CONNECTED
  flattens its input itself); reshape -> FULLY_CONNECTED -> reshape back over the leading dims
  is a FULLY_CONNECTED with keep_num_dims.

Each is a `kiln.rules.Rule`. A rule only speaks about sites where its pattern is there and
something specific stops it (the inner op's output is read elsewhere, a permutation is not
constant, the result has more than one unknown dim, ...): a real transpose or reduction is
not a "declined" rewrite.
"""

from __future__ import annotations

import numpy as np

from .. import ops
from ..ir import Operator, Subgraph
from ..rules import Decline, Rule
from ..schema import DType
from .manager import PassError, RulePass
from .rewrite import add_constant, bypass, const, describe, is_output, sole_user, writes_variable

_SHARED = "the output of {} is also read elsewhere"
_UNKNOWN_DIMS = "the result has more than one unknown dim (no constant shape describes it)"


def _const_shape_sig(op: Operator) -> list[int] | None:
    sig = list(op.outputs[0].signature)
    if sum(d < 0 for d in sig) > 1:
        return None
    return sig


def _rule(name: str, match, rewrite, check=lambda m: None, what: str = "") -> Rule:
    """A canonicalisation rule over one operator site; ``match`` returns the operator (or a
    tuple starting with it), which names the decision."""
    def op_of(m):
        return m[0] if isinstance(m, tuple) else m

    return Rule(name, "pass", match, rewrite, check=check, subject=lambda m: describe(op_of(m)),
                detail=lambda m: f"{describe(op_of(m))}: {what}")


def _shape_constant(op: Operator):
    return add_constant(op.subgraph, f"{op.outputs[0].name}/shape",
                        np.asarray(_const_shape_sig(op), np.int32), DType.INT32)


# -- reshapes -----------------------------------------------------------------------------------

def _match_reshape_chain(site):
    _, op = site
    if not ops.states(op.op_type, "reshapes") or not op.inputs:
        return None
    prev = op.inputs[0].producer
    if prev is None or not ops.states(prev.op_type, "reshapes"):
        return None
    return op if op.op_type == "RESHAPE" or prev.op_type == "RESHAPE" else None


def _reshape_chain_refusal(op: Operator) -> str | None:
    if sole_user(op.inputs[0]) is not op:
        return _SHARED.format(describe(op.inputs[0].producer))
    return _UNKNOWN_DIMS if _const_shape_sig(op) is None else None


def _merge_reshapes(op: Operator) -> bool:
    source = op.inputs[0].producer.inputs[0]
    if op.op_type != "RESHAPE":  # RESHAPE then EXPAND_DIMS / SQUEEZE (rgb_to_grayscale's tensordot)
        return _replace(op, "RESHAPE", [source, _shape_constant(op)])
    op.set_input(0, source)
    if const(op.inputs[1]) is None:
        op.set_input(1, _shape_constant(op))
    return True


MERGE_RESHAPES = _rule("merge-reshapes", _match_reshape_chain, _merge_reshapes, _reshape_chain_refusal,
                       "reads the first reshape's input directly")


def _match_computed_shape(site):
    _, op = site
    if op.op_type != "RESHAPE" or len(op.inputs) < 2 or op.inputs[1] is None or const(op.inputs[1]) is not None:
        return None
    return op


def _constant_shape(op: Operator) -> bool:
    op.set_input(1, _shape_constant(op))
    return True


CONSTANT_SHAPE = _rule("constant-reshape-target", _match_computed_shape, _constant_shape,
                       lambda op: _UNKNOWN_DIMS if _const_shape_sig(op) is None else None,
                       "its shape computed at run time became a constant")


# -- stacked transposes and reverses --------------------------------------------------------------

def _match_stacked(op_type: str):
    def match(site):
        _, op = site
        if op.op_type != op_type:
            return None
        prev = op.inputs[0].producer
        return (op, prev) if prev is not None and prev.op_type == op_type else None
    return match


def _stacked_refusal(m) -> str | None:
    op, prev = m
    if sole_user(op.inputs[0]) is not op:
        return _SHARED.format(describe(prev))
    if const(prev.inputs[1]) is None or const(op.inputs[1]) is None:
        return f"the {'permutation' if op.op_type == 'TRANSPOSE' else 'axes'} of one of them is not constant"
    return None


def _flat(t) -> np.ndarray:
    return np.asarray(const(t)).reshape(-1)


def _merge_transposes(m) -> bool:
    op, prev = m
    p1, p2 = _flat(prev.inputs[1]), _flat(op.inputs[1])
    op.set_input(0, prev.inputs[0])
    op.set_input(1, add_constant(op.subgraph, f"{op.outputs[0].name}/perm", p1[p2].astype(np.int32), DType.INT32))
    return True


MERGE_TRANSPOSES = _rule("merge-transposes", _match_stacked("TRANSPOSE"), _merge_transposes, _stacked_refusal,
                         "one TRANSPOSE with the composed permutation")


def _reverses_refusal(m) -> str | None:
    reason = _stacked_refusal(m)
    if reason is not None:
        return reason
    op, prev = m
    rank = op.inputs[0].rank
    if rank == 0 or {int(x) % rank for x in _flat(prev.inputs[1])} != {int(x) % rank for x in _flat(op.inputs[1])}:
        return "the two reverse different axes"
    return None


def _cancel_reverses(m) -> bool:
    """REVERSE_V2 of a REVERSE_V2 over the same axes is the original tensor."""
    op, prev = m
    if not bypass(op.subgraph, op, prev.inputs[0]):
        raise Decline("its output is a subgraph output and the original tensor is a subgraph input "
                      "or constant (LiteRT cannot alias them)")
    return True


CANCEL_REVERSES = _rule("cancel-reverses", _match_stacked("REVERSE_V2"), _cancel_reverses, _reverses_refusal,
                        "cancelled the REVERSE_V2 before it")


# -- FULLY_CONNECTED ------------------------------------------------------------------------------

def _match_flatten(site):
    """RESHAPE read only by a FULLY_CONNECTED(keep_num_dims=False), as its input."""
    _, op = site
    if op.op_type != "RESHAPE":
        return None
    out = op.outputs[0]
    user = sole_user(out)
    if user is None or user.op_type != "FULLY_CONNECTED" or user.options["keep_num_dims"]:
        return None
    if user.inputs[0] is not out or user.inputs[1] is None:
        return None
    return op, user


def _flatten_refusal(m) -> str | None:
    op, user = m
    out, x = op.outputs[0], op.inputs[0]
    k = user.inputs[1].signature[-1]
    if len(out.signature) != 2 or k < 0 or out.signature[1] != k:
        return f"the reshape does not produce [batch, {k}] for {describe(user)}"
    if x.rank < 2 or x.signature[0] != out.signature[0]:
        return "the reshape changes the batch dim"
    inner = x.signature[1:]
    if any(d < 0 for d in inner) or int(np.prod(inner)) != k:
        return f"the input's dims after the batch are not static or do not hold {k} features"
    return None


def _flatten_into_fc(m) -> bool:
    """RESHAPE x -> [batch, K] feeding only FULLY_CONNECTED(keep_num_dims=False) over K."""
    op, user = m
    user.set_input(0, op.inputs[0])
    return True


FLATTEN_INTO_FC = _rule("flatten-into-fully-connected", _match_flatten, _flatten_into_fc, _flatten_refusal,
                        "dropped: FULLY_CONNECTED flattens its input itself")


def _restores_leading_dims(post: Operator, x, n: int) -> bool:
    """Whether RESHAPE ``post``'s run-time target is exactly x.shape[:-1] + [n]."""
    from .shapes import Dim, partial_value

    part = partial_value(post.inputs[1]) if len(post.inputs) > 1 else None
    if part is None or len(part) != x.rank:
        return False
    expected = [d if d >= 0 else Dim(x, i) for i, d in enumerate(x.signature[:-1])] + [n]
    return all(p == e and type(p) is type(e) for p, e in zip(part, expected))


def _match_keep_dims(site):
    """RESHAPE -> FULLY_CONNECTED(keep_num_dims=False) -> RESHAPE: (fc, pre, post)."""
    _, fc = site
    if fc.op_type != "FULLY_CONNECTED" or fc.options["keep_num_dims"] or fc.inputs[1] is None:
        return None
    pre, post = fc.inputs[0].producer, sole_user(fc.outputs[0])
    if pre is None or pre.op_type != "RESHAPE" or post is None or post.op_type != "RESHAPE":
        return None
    return fc, pre, post


def _keep_dims_refusal(m) -> str | None:
    fc, pre, post = m
    flat = fc.inputs[0]
    if sole_user(flat) is not fc:
        return _SHARED.format(describe(pre))
    x, final = pre.inputs[0], post.outputs[0]
    if x.rank < 3:
        return "the input before the reshape has rank < 3 (nothing to keep)"
    k, n = fc.inputs[1].signature[-1], fc.inputs[1].signature[0]
    xs, fs = tuple(x.signature), tuple(final.signature)
    if k < 0 or xs[-1] != k or fs[:-1] != xs[:-1] or fs[-1] != n:
        return "the reshape after it does not restore the leading dims of the input"
    if sum(d < 0 for d in xs) > 1 and not _restores_leading_dims(post, x, n):
        return "the leading dims are not provably the ones restored after it"
    if flat.rank != 2 or flat.signature[-1] != k:
        return f"the reshape before it does not produce [-1, {k}]"
    if final.is_variable:
        return "the reshape after it writes a variable"
    return None


def _fc_keep_dims(m) -> bool:
    """RESHAPE x[..., K] -> [P, K] -> FULLY_CONNECTED -> RESHAPE [..., N] is one
    FULLY_CONNECTED(x, keep_num_dims=True) (what a Keras Dense on a rank-3 input traces to)."""
    fc, pre, post = m
    out, final = fc.outputs[0], post.outputs[0]
    fc.set_input(0, pre.inputs[0])
    fc.options["keep_num_dims"] = True
    out.shape, out.shape_signature = final.shape, final.shape_signature
    if not bypass(fc.subgraph, post, out):
        raise PassError(f"canonicalize: {describe(post)} could not be removed after keep_num_dims was set")
    return True


FC_KEEP_DIMS = _rule("fully-connected-keep-num-dims", _match_keep_dims, _fc_keep_dims, _keep_dims_refusal,
                     "keeps the leading dims instead of reshaping around them")


# -- single-op forms ------------------------------------------------------------------------------

def _replace(op: Operator, op_type: str, inputs: list, **options) -> bool:
    """Swap ``op`` for a new ``op_type`` op producing the same output, at the same place."""
    sg: Subgraph = op.subgraph
    out = op.outputs[0]
    index = sg.operators.index(op)
    op.set_outputs([])
    sg.remove_operator(op)
    sg.add_operator(op_type, inputs, [out], index=index, options=options)
    return True


def _match_transpose(site):
    """A TRANSPOSE with a constant permutation that keeps the order of its non-1 dims (as far
    as the known dims tell)."""
    _, op = site
    if op.op_type != "TRANSPOSE":
        return None
    perm, x = const(op.inputs[1]), op.inputs[0]
    if perm is None or x.rank != perm.size:
        return None
    moved = [int(p) for p in np.asarray(perm).reshape(-1) if x.signature[int(p)] != 1]
    return op if moved == sorted(moved) else None


def _transpose_as_reshape(op: Operator) -> bool:
    """A TRANSPOSE that only moves size-1 dims keeps the element order: a RESHAPE."""
    out = op.outputs[0]
    shape = add_constant(op.subgraph, f"{out.name}/shape", np.asarray(out.signature, np.int32), DType.INT32)
    return _replace(op, "RESHAPE", [op.inputs[0], shape])


def _static_input_shape(whose: str):
    """A rule's check: the rewrite needs input 0's shape known at conversion time."""
    return lambda op: f"{whose} shape is not static" if any(d < 0 for d in op.inputs[0].signature) else None


TRANSPOSE_AS_RESHAPE = _rule(
    "transpose-as-reshape", _match_transpose, _transpose_as_reshape,
    _static_input_shape("the input's"),
    "moves only size-1 dims: a RESHAPE")


def _match_whole_update(site):
    _, op = site
    if op.op_type != "DYNAMIC_UPDATE_SLICE":
        return None
    base, update = op.inputs[0], op.inputs[1]
    return op if tuple(base.signature) == tuple(update.signature) else None


def _whole_update(op: Operator) -> bool:
    """DYNAMIC_UPDATE_SLICE whose update covers the whole operand is the update itself."""
    if not bypass(op.subgraph, op, op.inputs[1]):
        raise Decline("its output is a subgraph output and the update a subgraph input or constant")
    return True


WHOLE_UPDATE = _rule(
    "whole-update-is-update", _match_whole_update, _whole_update,
    _static_input_shape("the operand's"),
    "overwrites its whole operand: replaced by the update")


def _match_div(site):
    _, op = site
    if op.op_type != "DIV" or len(op.inputs) != 2 or writes_variable(op) or const(op.inputs[1]) is None:
        return None
    return op


def _div_refusal(op: Operator) -> str | None:
    c = const(op.inputs[1])
    if c.dtype != np.float32:
        return f"the divisor is {c.dtype}, not float32"
    return "the divisor has zeros" if np.any(c == 0) else None


def _div_as_mul(op: Operator) -> bool:
    """x / c with a float constant c is x * (1 / c), as TF's converter writes it."""
    c = const(op.inputs[1])
    recip = add_constant(op.subgraph, f"{op.inputs[1].name}/reciprocal",
                         (np.float32(1) / c).astype(np.float32), DType.FLOAT32)
    return _replace(op, "MUL", [op.inputs[0], recip], fused_activation_function=op.options["fused_activation_function"])


DIV_AS_MUL = _rule("div-as-mul", _match_div, _div_as_mul, _div_refusal, "a MUL by the reciprocal")


def _transposes_into(op: Operator) -> list:
    """The distinct operands of BATCH_MATMUL ``op`` that a TRANSPOSE produces, in input order."""
    return [t for t in dict.fromkeys(op.inputs)
            if t is not None and t.producer is not None and t.producer.op_type == "TRANSPOSE"]


def _swaps_last_two(t) -> bool:
    perm = const(t.producer.inputs[1])
    if perm is None:
        return False
    perm = [int(p) for p in np.asarray(perm).reshape(-1)]
    n = len(perm)
    return n >= 2 and perm == list(range(n - 2)) + [n - 1, n - 2]


def _absorbable(op: Operator, t) -> bool:
    return not is_output(t) and all(u is op for u, _ in t.users) and _swaps_last_two(t)


def _matmul_refusal(op: Operator) -> str | None:
    if any(_absorbable(op, t) for t in _transposes_into(op)):
        return None
    if any(is_output(t) or any(u is not op for u, _ in t.users) for t in _transposes_into(op)):
        return "the transposed operand is also read elsewhere"
    return "the TRANSPOSE does not (constantly) swap the last two dims"


def _transpose_into_matmul(op: Operator) -> bool:
    """BATCH_MATMUL of a TRANSPOSE that swaps the last two dims uses adj_x / adj_y instead."""
    t = next(t for t in _transposes_into(op) if _absorbable(op, t))
    for i, flag in ((0, "adj_x"), (1, "adj_y")):
        if op.inputs[i] is t:
            op.set_input(i, t.producer.inputs[0])
            op.options[flag] = not op.options[flag]
    return True


TRANSPOSE_INTO_MATMUL = _rule(
    "transpose-into-batch-matmul",
    lambda site: site[1] if site[1].op_type == "BATCH_MATMUL" and _transposes_into(site[1]) else None,
    _transpose_into_matmul, _matmul_refusal, "took the TRANSPOSE as its adj flag")


def _picked_axes(op: Operator) -> set[int]:
    axes, rank = const(op.inputs[1]), len(op.inputs[0].signature)
    return {int(a) % rank for a in np.asarray(axes).reshape(-1)} if axes.size else set()


def _match_reduction(site):
    """A reduction over constant axes that all have static size 1."""
    _, op = site
    if not ops.states(op.op_type, "reduces") or len(op.inputs) < 2 or writes_variable(op):
        return None
    x = op.inputs[0]
    if const(op.inputs[1]) is None or not x.signature:
        return None
    picked = _picked_axes(op)
    return op if picked and all(x.signature[a] == 1 for a in picked) else None


def _reduction_refusal(op: Operator) -> str | None:
    if op.inputs[0].dtype != op.outputs[0].dtype:
        return "its result type differs from its input's"
    return _UNKNOWN_DIMS if _const_shape_sig(op) is None else None


REDUCE_OVER_ONES = _rule(
    "reduction-over-ones-as-reshape", _match_reduction,
    lambda op: _replace(op, "RESHAPE", [op.inputs[0], _shape_constant(op)]), _reduction_refusal,
    "reduces only size-1 dims: a RESHAPE")


def _all_equal(t, value) -> bool:
    v = const(t)
    return v is not None and v.size > 0 and bool(np.all(v == value))


def _match_relu(site):
    """MAXIMUM(x, 0) or MINIMUM(RELU(x), 6), either operand order: (op, x)."""
    _, op = site
    if op.op_type not in ("MAXIMUM", "MINIMUM") or len(op.inputs) != 2 or writes_variable(op):
        return None
    out = op.outputs[0]
    for i in (0, 1):
        x, c = op.inputs[i], op.inputs[1 - i]
        if tuple(x.signature) != tuple(out.signature) or const(c) is None:
            continue
        if op.op_type == "MAXIMUM" and _all_equal(c, 0):
            return op, x
        if op.op_type == "MINIMUM" and _all_equal(c, 6) and x.producer is not None and x.producer.op_type == "RELU":
            return op, x
    return None


def _relu_refusal(m) -> str | None:
    op, x = m
    if op.outputs[0].dtype != DType.FLOAT32:
        return f"it computes {op.outputs[0].dtype.name}, not float32"
    if op.op_type == "MINIMUM" and sole_user(x) is not op:
        return _SHARED.format(describe(x.producer))
    return None


def _relu_forms(m) -> bool:
    """MAXIMUM(x, 0) is RELU; MINIMUM(RELU(x), 6) is RELU6 (how TF's converter writes them)."""
    op, x = m
    if op.op_type == "MAXIMUM":
        return _replace(op, "RELU", [x])
    return _replace(op, "RELU6", [x.producer.inputs[0]])


RELU_FORMS = _rule("relu-forms", _match_relu, _relu_forms, _relu_refusal, "a RELU / RELU6")


def _match_add_of_neg(site):
    _, op = site
    if op.op_type != "ADD" or len(op.inputs) != 2 or writes_variable(op):
        return None
    negs = [i for i in (0, 1) if op.inputs[i].producer is not None and op.inputs[i].producer.op_type == "NEG"]
    return (op, negs) if negs else None


def _add_of_neg(m) -> bool:
    """x + (-y) is x - y."""
    op, negs = m
    for i in negs:
        if sole_user(op.inputs[i]) is op:
            x, y = op.inputs[1 - i], op.inputs[i].producer.inputs[0]  # same broadcasting as ADD(x, NEG(y))
            return _replace(op, "SUB", [x, y], fused_activation_function=op.options["fused_activation_function"])
    raise Decline("the NEG's output is also read elsewhere")


ADD_OF_NEG = _rule("add-of-neg-as-sub", _match_add_of_neg, _add_of_neg, what="a SUB")


class Canonicalize(RulePass):
    """Every canonicalisation rule, offered each operator in this order."""

    name = "canonicalize-reshape-transpose"
    rules = (CONSTANT_SHAPE, MERGE_RESHAPES, MERGE_TRANSPOSES, CANCEL_REVERSES, FLATTEN_INTO_FC, FC_KEEP_DIMS,
             TRANSPOSE_AS_RESHAPE, WHOLE_UPDATE, DIV_AS_MUL, TRANSPOSE_INTO_MATMUL, RELU_FORMS, ADD_OF_NEG,
             REDUCE_OVER_ONES)
