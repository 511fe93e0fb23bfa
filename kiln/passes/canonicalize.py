"""Transpose / reshape canonicalisation.

- a chain of reshapes (RESHAPE, EXPAND_DIMS, SQUEEZE) ending in a RESHAPE is one RESHAPE;
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
"""

from __future__ import annotations

import numpy as np

from ..ir import Model, Operator, Subgraph
from ..schema import DType
from .manager import Pass
from .rewrite import add_constant, bypass, const, is_output, sole_user, writes_variable

_RESHAPES = ("RESHAPE", "EXPAND_DIMS", "SQUEEZE")


def _const_shape_sig(op: Operator) -> list[int] | None:
    sig = list(op.outputs[0].signature)
    if sum(d < 0 for d in sig) > 1:
        return None
    return sig


def _merge_reshapes(sg: Subgraph, op: Operator) -> bool:
    if op.op_type != "RESHAPE":
        return False
    src = op.inputs[0]
    prev = src.producer
    if prev is None or prev.op_type not in _RESHAPES or sole_user(src) is not op:
        return False
    sig = _const_shape_sig(op)
    if sig is None:
        return False
    op.set_input(0, prev.inputs[0])
    if const(op.inputs[1]) is None:
        op.set_input(1, add_constant(sg, f"{op.outputs[0].name}/shape", np.asarray(sig, np.int32), DType.INT32))
    return True


def _constant_shape(sg: Subgraph, op: Operator) -> bool:
    if op.op_type != "RESHAPE" or len(op.inputs) < 2 or op.inputs[1] is None or const(op.inputs[1]) is not None:
        return False
    sig = _const_shape_sig(op)
    if sig is None:
        return False
    op.set_input(1, add_constant(sg, f"{op.outputs[0].name}/shape", np.asarray(sig, np.int32), DType.INT32))
    return True


def _stacked(op: Operator, op_type: str):
    """(inner op, its constant 2nd operand, op's constant 2nd operand) when ``op`` applies
    ``op_type`` directly to the sole result of another ``op_type``; else None."""
    if op.op_type != op_type:
        return None
    src = op.inputs[0]
    prev = src.producer
    if prev is None or prev.op_type != op_type or sole_user(src) is not op:
        return None
    inner, outer = const(prev.inputs[1]), const(op.inputs[1])
    if inner is None or outer is None:
        return None
    return prev, np.asarray(inner).reshape(-1), np.asarray(outer).reshape(-1)


def _merge_transposes(sg: Subgraph, op: Operator) -> bool:
    pair = _stacked(op, "TRANSPOSE")
    if pair is None:
        return False
    prev, p1, p2 = pair
    op.set_input(0, prev.inputs[0])
    op.set_input(1, add_constant(sg, f"{op.outputs[0].name}/perm", p1[p2].astype(np.int32), DType.INT32))
    return True


def _cancel_reverses(sg: Subgraph, op: Operator) -> bool:
    """REVERSE_V2 of a REVERSE_V2 over the same axes is the original tensor."""
    pair = _stacked(op, "REVERSE_V2")
    if pair is None:
        return False
    prev, a1, a2 = pair
    rank = op.inputs[0].rank
    if rank == 0 or {int(x) % rank for x in a1} != {int(x) % rank for x in a2}:
        return False
    return bypass(sg, op, prev.inputs[0])


def _flatten_into_fc(sg: Subgraph, op: Operator) -> bool:
    """RESHAPE x -> [batch, K] feeding only FULLY_CONNECTED(keep_num_dims=False) over K."""
    if op.op_type != "RESHAPE":
        return False
    out = op.outputs[0]
    user = sole_user(out)
    if user is None or user.op_type != "FULLY_CONNECTED" or user.options["keep_num_dims"]:
        return False
    if user.inputs[0] is not out or user.inputs[1] is None or len(out.signature) != 2:
        return False
    x = op.inputs[0]
    k = user.inputs[1].signature[-1]
    if k < 0 or out.signature[1] != k or x.rank < 2 or x.signature[0] != out.signature[0]:
        return False
    inner = x.signature[1:]
    if any(d < 0 for d in inner) or int(np.prod(inner)) != k:
        return False
    user.set_input(0, x)
    return True


def _restores_leading_dims(post: Operator, x, n: int) -> bool:
    """Whether RESHAPE ``post``'s run-time target is exactly x.shape[:-1] + [n]."""
    from .shapes import Dim, partial_value

    part = partial_value(post.inputs[1]) if len(post.inputs) > 1 else None
    if part is None or len(part) != x.rank:
        return False
    expected = [d if d >= 0 else Dim(x, i) for i, d in enumerate(x.signature[:-1])] + [n]
    return all(p == e and type(p) is type(e) for p, e in zip(part, expected))


def _fc_keep_dims(sg: Subgraph, fc: Operator) -> bool:
    """RESHAPE x[..., K] -> [P, K] -> FULLY_CONNECTED -> RESHAPE [..., N] is one
    FULLY_CONNECTED(x, keep_num_dims=True) (what a Keras Dense on a rank-3 input traces to)."""
    if fc.op_type != "FULLY_CONNECTED" or fc.options["keep_num_dims"] or fc.inputs[1] is None:
        return False
    flat = fc.inputs[0]
    pre = flat.producer
    if pre is None or pre.op_type != "RESHAPE" or sole_user(flat) is not fc:
        return False
    x = pre.inputs[0]
    out = fc.outputs[0]
    post = sole_user(out)
    if post is None or post.op_type != "RESHAPE" or x.rank < 3:
        return False
    final = post.outputs[0]
    k = fc.inputs[1].signature[-1]
    n = fc.inputs[1].signature[0]
    xs, fs = tuple(x.signature), tuple(final.signature)
    if k < 0 or xs[-1] != k or fs[:-1] != xs[:-1] or fs[-1] != n:
        return False
    if sum(d < 0 for d in xs) > 1 and not _restores_leading_dims(post, x, n):
        return False
    if flat.rank != 2 or flat.signature[-1] != k:
        return False
    fc.set_input(0, x)
    fc.options["keep_num_dims"] = True
    out.shape, out.shape_signature = final.shape, final.shape_signature
    return bypass(sg, post, out)


def _transpose_as_reshape(sg: Subgraph, op: Operator) -> bool:
    """A TRANSPOSE that only moves size-1 dims keeps the element order: a RESHAPE."""
    if op.op_type != "TRANSPOSE":
        return False
    perm = const(op.inputs[1])
    x, out = op.inputs[0], op.outputs[0]
    if perm is None or any(d < 0 for d in x.signature) or x.rank != len(perm):
        return False
    moved = [int(p) for p in np.asarray(perm).reshape(-1) if x.signature[int(p)] != 1]
    if moved != sorted(moved):
        return False
    shape = add_constant(sg, f"{out.name}/shape", np.asarray(out.signature, np.int32), DType.INT32)
    index = sg.operators.index(op)
    op.set_outputs([])
    sg.remove_operator(op)
    sg.add_operator("RESHAPE", [x, shape], [out], index=index)
    return True


def _whole_update(sg: Subgraph, op: Operator) -> bool:
    """DYNAMIC_UPDATE_SLICE whose update covers the whole operand is the update itself."""
    if op.op_type != "DYNAMIC_UPDATE_SLICE":
        return False
    base, update = op.inputs[0], op.inputs[1]
    if tuple(base.signature) != tuple(update.signature) or any(d < 0 for d in base.signature):
        return False
    return bypass(sg, op, update)


def _div_as_mul(sg: Subgraph, op: Operator) -> bool:
    """x / c with a float constant c is x * (1 / c), as TF's converter writes it."""
    if op.op_type != "DIV" or len(op.inputs) != 2:
        return False
    c = const(op.inputs[1])
    if c is None or c.dtype != np.float32 or np.any(c == 0) or writes_variable(op):
        return False
    recip = add_constant(sg, f"{op.inputs[1].name}/reciprocal", (np.float32(1) / c).astype(np.float32), DType.FLOAT32)
    act = op.options["fused_activation_function"]
    index = sg.operators.index(op)
    x, out = op.inputs[0], op.outputs[0]
    op.set_outputs([])
    sg.remove_operator(op)
    sg.add_operator("MUL", [x, recip], [out], index=index, options={"fused_activation_function": act})
    return True


def _transpose_into_matmul(sg: Subgraph, op: Operator) -> bool:
    """BATCH_MATMUL of a TRANSPOSE that swaps the last two dims uses adj_x / adj_y instead."""
    if op.op_type != "BATCH_MATMUL":
        return False
    for t in set(op.inputs):
        tr = t.producer if t is not None else None
        if tr is None or tr.op_type != "TRANSPOSE" or is_output(t) or any(u is not op for u, _ in t.users):
            continue
        perm = const(tr.inputs[1])
        if perm is None:
            continue
        perm = [int(p) for p in np.asarray(perm).reshape(-1)]
        n = len(perm)
        if n < 2 or perm != list(range(n - 2)) + [n - 1, n - 2]:
            continue
        for i, flag in ((0, "adj_x"), (1, "adj_y")):
            if op.inputs[i] is t:
                op.set_input(i, tr.inputs[0])
                op.options[flag] = not op.options[flag]
        return True
    return False


_REDUCTIONS = ("MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD")


def _reduce_over_ones(sg: Subgraph, op: Operator) -> bool:
    """A reduction over axes that all have static size 1 moves no data: a RESHAPE."""
    if op.op_type not in _REDUCTIONS or len(op.inputs) < 2 or writes_variable(op):
        return False
    x, out = op.inputs[0], op.outputs[0]
    axes = const(op.inputs[1])
    sig = _const_shape_sig(op)
    if axes is None or sig is None or x.dtype != out.dtype or not x.signature:
        return False
    rank = len(x.signature)
    picked = {int(a) % rank for a in np.asarray(axes).reshape(-1)} if axes.size else set()
    if not picked or any(x.signature[a] != 1 for a in picked):
        return False
    _replace(sg, op, "RESHAPE", [x, add_constant(sg, f"{out.name}/shape", np.asarray(sig, np.int32), DType.INT32)])
    return True


def _replace(sg: Subgraph, op: Operator, op_type: str, inputs: list, **options) -> None:
    """Swap ``op`` for a new ``op_type`` op producing the same output, at the same place."""
    out = op.outputs[0]
    index = sg.operators.index(op)
    op.set_outputs([])
    sg.remove_operator(op)
    sg.add_operator(op_type, inputs, [out], index=index, options=options)


def _all_equal(t, value) -> bool:
    v = const(t)
    return v is not None and v.size > 0 and bool(np.all(v == value))


def _relu_forms(sg: Subgraph, op: Operator) -> bool:
    """MAXIMUM(x, 0) is RELU; MINIMUM(RELU(x), 6) is RELU6 (how TF's converter writes them)."""
    if op.op_type not in ("MAXIMUM", "MINIMUM") or len(op.inputs) != 2 or writes_variable(op):
        return False
    out = op.outputs[0]
    if out.dtype != DType.FLOAT32:
        return False
    for i in (0, 1):
        x, c = op.inputs[i], op.inputs[1 - i]
        if tuple(x.signature) != tuple(out.signature) or const(c) is None:
            continue
        if op.op_type == "MAXIMUM" and _all_equal(c, 0):
            _replace(sg, op, "RELU", [x])
            return True
        relu = x.producer
        if (op.op_type == "MINIMUM" and _all_equal(c, 6) and relu is not None and relu.op_type == "RELU"
                and sole_user(x) is op):
            _replace(sg, op, "RELU6", [relu.inputs[0]])
            return True
    return False


def _add_of_neg(sg: Subgraph, op: Operator) -> bool:
    """x + (-y) is x - y."""
    if op.op_type != "ADD" or len(op.inputs) != 2 or writes_variable(op):
        return False
    for i in (0, 1):
        neg = op.inputs[i].producer
        if neg is None or neg.op_type != "NEG" or sole_user(op.inputs[i]) is not op:
            continue
        x, y = op.inputs[1 - i], neg.inputs[0]  # same broadcasting as ADD(x, NEG(y))
        _replace(sg, op, "SUB", [x, y], fused_activation_function=op.options["fused_activation_function"])
        return True
    return False


class Canonicalize(Pass):
    name = "canonicalize-reshape-transpose"

    def run(self, model: Model) -> bool:
        changed = False
        for sg in model.subgraphs:
            for op in list(sg.operators):
                if op.subgraph is not sg:
                    continue
                changed |= (_constant_shape(sg, op) | _merge_reshapes(sg, op) | _merge_transposes(sg, op)
                            | _cancel_reverses(sg, op)
                            | _flatten_into_fc(sg, op) | _fc_keep_dims(sg, op) | _transpose_as_reshape(sg, op)
                            | _whole_update(sg, op) | _div_as_mul(sg, op) | _transpose_into_matmul(sg, op)
                            | _relu_forms(sg, op) | _add_of_neg(sg, op) | _reduce_over_ones(sg, op))
        return changed
