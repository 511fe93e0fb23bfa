"""Scatters into a dense tensor: TensorScatterUpdate / Add / Sub and SparseToDense.

TF's converter writes ``tensor_scatter_nd_update`` as x * (1 - scatter(ones)) +
scatter(updates) (6 ops; Add gathers and adds first, 8), which turns an infinity or NaN at
an updated position into NaN; kiln selects instead: SELECT_V2(scatter(true),
scatter(updates), x), 2 or 3 ops (Add / Sub: one more), exact for every value. SCATTER_ND sums repeated indices, so with constant indices kiln keeps only the
last update of each position (TensorFlow's CPU kernels apply them in order); repeated
indices computed at run time are summed, as in TF's converted file.
"""

from __future__ import annotations

import numpy as np

from ...schema import DType
from ..context import EmitContext
from .common import as_int32, emitter_table, like, reshape

EMITTERS, emits = emitter_table()

def _shape_of(ctx: EmitContext, x):
    """x's shape as an int32 tensor: a constant when static, else a SHAPE op."""
    sig = ctx.in_signature(0)
    if all(d >= 0 for d in sig):
        return ctx.constant(np.asarray(sig, np.int32), DType.INT32)
    return like(ctx, "SHAPE", x, dtype=DType.INT32, sig=(len(sig),), out_type=int(DType.INT32))


def _scatter(ctx: EmitContext):
    """(x, indices, updates, shape, the scatter of updates); SCATTER_ND's record refuses the types
    LiteRT's kernel does not take, as TF's converter does."""
    x, updates = ctx.input(0), ctx.input(2)
    indices = as_int32(ctx, 1, "indices")
    shape = _shape_of(ctx, x)
    if ctx.type == "TensorScatterUpdate" and indices.is_constant:
        indices, updates = _last_writes(ctx, indices, updates)
    scattered = like(ctx, "SCATTER_ND", indices, updates, shape, dtype=x.dtype, sig=x.signature)
    return x, indices, updates, shape, scattered


def _last_writes(ctx: EmitContext, indices, updates):
    """Constant indices without repeats: each position keeps its last update (a GATHER of the
    updates that survive, only when some index repeats)."""
    rows = np.asarray(indices.data).reshape(-1, indices.signature[-1] if indices.rank else 1)
    _, last = np.unique(rows[::-1], axis=0, return_index=True)
    keep = np.sort(len(rows) - 1 - last)
    if len(keep) == len(rows):
        return indices, updates
    outer = indices.rank - 1
    flat_sig = (-1, *updates.signature[outer:])
    flat = reshape(ctx, updates, flat_sig, suffix="updates") if outer != 1 else updates
    kept = ctx.constant(np.asarray(keep, np.int32), DType.INT32)
    picked = like(ctx, "GATHER", flat, kept, sig=(len(keep), *flat_sig[1:]), axis=0, batch_dims=0)
    return ctx.constant(rows[keep].astype(np.int32), DType.INT32), picked


def _written(ctx: EmitContext, x, indices, updates, shape):
    """A boolean tensor of x's shape: true where an update lands."""
    if all(d >= 0 for d in updates.signature):
        flags = ctx.constant(np.ones(tuple(updates.signature), bool), DType.BOOL)
    else:
        dims = like(ctx, "SHAPE", updates, dtype=DType.INT32, sig=(updates.rank,), out_type=int(DType.INT32))
        flags = like(ctx, "FILL", dims, ctx.constant(np.bool_(True), DType.BOOL), sig=updates.signature)
    return like(ctx, "SCATTER_ND", indices, flags, shape, dtype=DType.BOOL, sig=x.signature)


@emits("TensorScatterUpdate", "TensorScatterAdd", "TensorScatterSub")
def emit_tensor_scatter(ctx: EmitContext):
    """Updated positions take the scattered updates (added to or subtracted from x for Add /
    Sub: SCATTER_ND sums repeated indices, as TensorFlow does); the others keep x as it is,
    -0.0 and infinities included (LiteRT's ADD would turn inf + 0 into the largest float)."""
    x, indices, updates, shape, scattered = _scatter(ctx)
    if ctx.type != "TensorScatterUpdate":
        scattered = like(ctx, "ADD" if ctx.type == "TensorScatterAdd" else "SUB", x, scattered)
    return ctx.emit1("SELECT_V2", [_written(ctx, x, indices, updates, shape), scattered, x])


@emits("SparseToDense")
def emit_sparse_to_dense(ctx: EmitContext):
    indices, shape, values, default = ctx.inputs()
    rank = ctx.in_signature(1)[0]
    if rank < 0 or rank > 4:
        raise ctx.fail(f"the output must have a known rank of at most 4 (LiteRT's SPARSE_TO_DENSE), got {rank}")
    if values.dtype not in (DType.FLOAT32, DType.INT32, DType.INT64, DType.INT8, DType.UINT8):
        raise ctx.fail(f"{values.dtype.name.lower()} values are not supported (float32, int32, int64, int8, uint8)")
    return ctx.emit1("SPARSE_TO_DENSE", [indices, shape, values, default])


__all__ = ["EMITTERS"]
