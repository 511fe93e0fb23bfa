"""Einsum (Keras EinsumDense, MultiHeadAttention) as TRANSPOSE / RESHAPE around one matmul.

For ``A,B->O`` the labels split into batch (in A, B and O), contracted (A and B only) and
free ones (one operand and O). A becomes ``[batch, free_a, K]`` and B ``[batch, K, free_b]``
(transposes only where the layout needs them; BATCH_MATMUL's adj flags absorb the rest).
With a constant B and no batch labels the product is a FULLY_CONNECTED over A's last axis,
which is what TF's converter writes for EinsumDense.
"""

from __future__ import annotations

import numpy as np

from ...ir import Tensor
from ...schema import DType
from ..context import EmitContext
from .common import emitter_table, reshape_to, transpose

EMITTERS, emits = emitter_table()


def _parse(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    equation = equation.replace(" ", "")
    lhs, _, out = equation.partition("->")
    terms = lhs.split(",")
    used = set(equation) - set(".,->")
    spare = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in used]
    ell_rank = 0
    for term, rank in zip(terms, ranks):
        if "..." in term:
            ell_rank = max(ell_rank, rank - (len(term) - 3))
    ell = "".join(spare[:ell_rank])
    expanded = []
    for term, rank in zip(terms, ranks):
        if "..." in term:
            n = rank - (len(term) - 3)
            term = term.replace("...", ell[ell_rank - n:])
        expanded.append(term)
    if "->" not in equation:
        counts = {c: sum(t.count(c) for t in expanded) for c in set("".join(expanded))}
        out = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    else:
        out = out.replace("...", ell)
    return expanded, out


def _reduce_unique(ctx: EmitContext, x: Tensor, term: str, keep: set, suffix: str) -> tuple[Tensor, str]:
    """Sum out labels that appear in this operand only and not in the output."""
    drop = [i for i, c in enumerate(term) if c not in keep]
    if not drop:
        return x, term
    new_term = "".join(c for c in term if c in keep)
    sig = [d for i, d in enumerate(x.signature) if i not in drop]
    axes = ctx.constant(np.asarray(drop, np.int32), DType.INT32, f"{ctx.name}/{suffix}/axes")
    return ctx.emit1("SUM", [x, axes], ctx.temp(f"{suffix}/sum", x.dtype, sig), keep_dims=False), new_term


def _permute(ctx: EmitContext, x: Tensor, term: str, order: str, suffix: str) -> Tensor:
    if term == order:
        return x
    return transpose(ctx, x, [term.index(c) for c in order], suffix=suffix)


@emits("Einsum")
def emit_einsum(ctx: EmitContext):
    equation = ctx.attr("equation")
    ins = ctx.inputs()
    terms, out = _parse(equation, [t.rank for t in ins])
    if any(len(set(t)) != len(t) for t in terms) or len(set(out)) != len(out):
        raise ctx.fail(f"repeated labels (diagonals/traces) in {equation!r} are not supported")
    if len(ins) == 1:
        x, term = _reduce_unique(ctx, ins[0], terms[0], set(out), "a")
        return _permute(ctx, x, term, out, "out")
    if len(ins) != 2:
        raise ctx.fail("einsum with more than two operands is not supported")
    a, b = ins
    ta, tb = terms
    a, ta = _reduce_unique(ctx, a, ta, set(out) | set(tb), "a")
    b, tb = _reduce_unique(ctx, b, tb, set(out) | set(ta), "b")
    batch = "".join(c for c in out if c in ta and c in tb)
    contract = "".join(c for c in ta if c in tb and c not in out)
    free_a = "".join(c for c in ta if c not in tb)
    free_b = "".join(c for c in tb if c not in ta)

    def dim(c):
        """Where label ``c``'s size comes from: its static size, else (operand, axis)."""
        for t, term in ((a, ta), (b, tb)):
            if c in term and t.signature[term.index(c)] >= 0:
                return t.signature[term.index(c)]
        return [(a, ta.index(c))] if c in ta else [(b, tb.index(c))]

    def source(c):
        return (a, ta.index(c)) if c in ta else (b, tb.index(c))

    def group(labels):
        """One flattened dim: its static size, else the run-time product of its labels."""
        items = [dim(c) for c in labels]
        if all(isinstance(i, int) for i in items):
            return int(np.prod(items)) if items else 1
        return [source(c) for c in labels]

    def sig_of(item):
        return item if isinstance(item, int) else -1

    batch_items = [dim(c) for c in batch]
    k_item, fa_item, fb_item = group(contract), group(free_a), group(free_b)
    result_items = batch_items + [dim(c) for c in free_a] + [dim(c) for c in free_b]
    result_sig = [sig_of(i) for i in result_items]
    k, fb = sig_of(k_item), sig_of(fb_item)
    if not batch and b.is_constant and a.dtype == DType.FLOAT32 and k >= 0 and fb >= 0:
        # FULLY_CONNECTED: A [free_a..., K] x W [free_b, K]
        a2 = _permute(ctx, a, ta, free_a + contract, "lhs")
        if len(contract) > 1:
            a2 = reshape_to(ctx, a2, [dim(c) for c in free_a] + [k], suffix="lhs_flat")
        w = _permute(ctx, b, tb, free_b + contract, "weights")
        w = reshape_to(ctx, w, [fb, k], suffix="weights_flat")
        keep = len(free_a) > 1
        prod_sig = [sig_of(dim(c)) for c in free_a] + [fb] if keep else [sig_of(fa_item), fb]
        y = ctx.emit1("FULLY_CONNECTED", [a2, w, None], ctx.temp("matmul", a.dtype, prod_sig), keep_num_dims=keep)
        y_items = ([dim(c) for c in free_a] if keep else [fa_item]) + [fb]
    else:
        # BATCH_MATMUL: A [batch, free_a, K] x B [batch, K, free_b]
        adj_x = ta == batch + contract + free_a and len(contract) == 1 and len(free_a) == 1
        adj_y = tb == batch + free_b + contract and len(contract) == 1 and len(free_b) == 1
        a2 = a if adj_x else _permute(ctx, a, ta, batch + free_a + contract, "lhs")
        b2 = b if adj_y else _permute(ctx, b, tb, batch + contract + free_b, "rhs")
        if not adj_x and (len(free_a) != 1 or len(contract) != 1):
            a2 = reshape_to(ctx, a2, [[(a, ta.index(c))] if isinstance(i, list) else i for c, i in zip(batch, batch_items)]
                            + [fa_item, k_item], suffix="lhs_flat")
        if not adj_y and (len(free_b) != 1 or len(contract) != 1):
            b2 = reshape_to(ctx, b2, [[(b, tb.index(c))] if isinstance(i, list) else i for c, i in zip(batch, batch_items)]
                            + [k_item, fb_item], suffix="rhs_flat")
        y_items = batch_items + [fa_item, fb_item]
        y = ctx.emit1("BATCH_MATMUL", [a2, b2], ctx.temp("matmul", a.dtype, [sig_of(i) for i in y_items]),
                      adj_x=adj_x, adj_y=adj_y)
    order = batch + free_a + free_b
    if [sig_of(i) for i in y_items] != result_sig or len(y_items) != len(result_items):
        y = reshape_to(ctx, y, result_items, None if order != out else ctx.out(0), suffix="unflat")
    if order != out:
        return transpose(ctx, y, [order.index(c) for c in out], ctx.out(0), suffix="out")
    return y
