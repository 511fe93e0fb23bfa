"""Resource variables: read-only ones are constants, mutable ones LiteRT resource variables."""

from __future__ import annotations

import numpy as np

from ...schema import DType
from ..context import EmitContext
from ..values import ResourceRef
from .common import emitter_table

EMITTERS, emits = emitter_table()


def _var(ctx: EmitContext, i: int = 0):
    v = ctx.value(i)
    if not isinstance(v, ResourceRef):
        raise ctx.fail("the resource does not resolve to a captured variable")
    return v.var


def read(ctx: EmitContext, var, out=None):
    """The variable's current value: its constant, or READ_VARIABLE of its handle."""
    tf_dtype = ctx.attr("dtype", None)
    if not var.mutable:
        return ctx.scope.importer.variable_constant(ctx.scope, var, tf_dtype, ctx.name)
    handle = ctx.scope.importer.var_handle(ctx.scope, var)
    return ctx.emit1("READ_VARIABLE", [handle], out)


@emits("ReadVariableOp")
def emit_read(ctx: EmitContext):
    return read(ctx, _var(ctx), ctx.out(0))


@emits("AssignVariableOp")
def emit_assign(ctx: EmitContext):
    var = _var(ctx)
    handle = ctx.scope.importer.var_handle(ctx.scope, var)
    ctx.emit("ASSIGN_VARIABLE", [handle, ctx.input(1)], [], fold=False)
    return None


@emits("AssignAddVariableOp", "AssignSubVariableOp")
def emit_assign_update(ctx: EmitContext):
    var = _var(ctx)
    handle = ctx.scope.importer.var_handle(ctx.scope, var)
    delta = ctx.input(1)
    current = ctx.emit1("READ_VARIABLE", [handle], ctx.temp("read", delta.dtype, delta.signature))
    op_type = "ADD" if ctx.type == "AssignAddVariableOp" else "SUB"
    new = ctx.emit1(op_type, [current, delta], ctx.temp("update", delta.dtype, delta.signature))
    ctx.emit("ASSIGN_VARIABLE", [handle, new], [], fold=False)
    return None


@emits("VarIsInitializedOp")
def emit_is_initialized(ctx: EmitContext):
    return ctx.constant(np.asarray(True), DType.BOOL, ctx.name)


@emits("ResourceGather")
def emit_resource_gather(ctx: EmitContext):
    var = _var(ctx)
    out = ctx.temp("params", ctx.out_dtype(0), var.value().shape) if var.mutable else None
    params = read(ctx, var, out)
    indices = ctx.input(1)
    return ctx.emit1("GATHER", [params, indices], axis=0, batch_dims=int(ctx.attr("batch_dims", 0)))
