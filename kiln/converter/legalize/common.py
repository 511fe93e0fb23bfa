"""Helpers shared by the legalisation modules: the per-module emitter table, reshapes,
transposes and casts that fold when their input is constant."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ...ir import Tensor
from ...schema import DType, Padding
from ..context import EmitContext

Emitter = Callable[[EmitContext], object]


def emitter_table() -> tuple[dict[str, Emitter], Callable]:
    """A module's own table {TF op type: emitter} and the decorator that fills it."""
    table: dict[str, Emitter] = {}

    def emits(*tf_types: str):
        def register(fn: Emitter) -> Emitter:
            for name in tf_types:
                table[name] = fn
            return fn

        return register

    return table, emits


def padding_of(ctx: EmitContext) -> Padding:
    pad = ctx.attr("padding")
    if pad == "SAME":
        return Padding.SAME
    if pad == "VALID":
        return Padding.VALID
    raise ctx.fail(f"padding {pad!r} is not SAME or VALID")


def shape_const(ctx: EmitContext, signature: Sequence[int], name: str = "shape") -> Tensor | None:
    """A constant int32 shape for ``signature`` when at most one dim is unknown (as -1)."""
    sig = [int(d) for d in signature]
    if sum(d < 0 for d in sig) > 1:
        return None
    return ctx.constant(np.asarray(sig, np.int32), DType.INT32, f"{ctx.name}/{name}")


def reshape(ctx: EmitContext, x: Tensor, signature: Sequence[int], out: Tensor | None = None,
            suffix: str = "reshape") -> Tensor:
    """RESHAPE ``x`` to ``signature`` (at most one unknown dim)."""
    shape = shape_const(ctx, signature, f"{suffix}/shape")
    if shape is None:
        raise ctx.fail(f"cannot reshape to {list(signature)}: more than one unknown dimension")
    if out is None:
        out = ctx.temp(suffix, x.dtype, signature)
    return ctx.emit1("RESHAPE", [x, shape], out)


def _static(item, sig_of) -> int:
    if isinstance(item, int):
        return item
    total = 1
    for t, axis in item:
        d = t.signature[axis]
        if d < 0:
            return -1
        total *= d
    return total


def reshape_to(ctx: EmitContext, x: Tensor, items: Sequence, out: Tensor | None = None,
               suffix: str = "reshape") -> Tensor:
    """RESHAPE ``x`` to dims given as static sizes or products of other tensors' dims; with
    more than one unknown dim the target is computed at run time (SHAPE / GATHER / CONCAT)."""
    sig = [_static(item, None) for item in items]
    if sum(d < 0 for d in sig) <= 1:
        return reshape(ctx, x, sig, out, suffix)
    last_unknown = max(i for i, d in enumerate(sig) if d < 0)
    pieces = []
    shapes: dict[int, Tensor] = {}
    for i, (item, d) in enumerate(zip(items, sig)):
        if d >= 0 or i == last_unknown:
            pieces.append(int32_const(ctx, [d if d >= 0 else -1], f"{suffix}/dim{i}"))
            continue
        parts = []
        for t, axis in item:
            if id(t) not in shapes:
                shapes[id(t)] = ctx.emit1("SHAPE", [t], ctx.temp(f"{suffix}/shape", DType.INT32, (t.rank,)),
                                          out_type=int(DType.INT32))
            parts.append(ctx.emit1("GATHER", [shapes[id(t)], int32_const(ctx, [axis], f"{suffix}/axis{i}")],
                                   ctx.temp(f"{suffix}/dim{i}", DType.INT32, (1,)), axis=0, batch_dims=0))
        value = parts[0]
        for p in parts[1:]:
            value = ctx.emit1("MUL", [value, p], ctx.temp(f"{suffix}/dim{i}", DType.INT32, (1,)))
        pieces.append(value)
    shape = ctx.emit1("CONCATENATION", pieces, ctx.temp(f"{suffix}/target", DType.INT32, (len(items),)),
                      axis=0, fused_activation_function=0)
    if out is None:
        out = ctx.temp(suffix, x.dtype, sig)
    return ctx.emit1("RESHAPE", [x, shape], out)


def transpose(ctx: EmitContext, x: Tensor, perm: Sequence[int], out: Tensor | None = None,
              suffix: str = "transpose") -> Tensor:
    """TRANSPOSE ``x`` by a constant permutation (folds for constants)."""
    perm = [int(p) for p in perm]
    if perm == list(range(len(perm))) and out is None:
        return x
    sig = tuple(x.signature)
    if out is None:
        out = ctx.temp(suffix, x.dtype, [sig[p] for p in perm])
    p = ctx.constant(np.asarray(perm, np.int32), DType.INT32, f"{ctx.name}/{suffix}/perm")
    return ctx.emit1("TRANSPOSE", [x, p], out)


def cast(ctx: EmitContext, x: Tensor, dtype: DType, suffix: str = "cast") -> Tensor:
    if x.dtype == dtype:
        return x
    if x.is_constant:
        return ctx.constant(np.asarray(x.data).astype(dtype.numpy), dtype, f"{ctx.name}/{suffix}")
    return ctx.emit1("CAST", [x], ctx.temp(suffix, dtype, x.signature))


def like(ctx: EmitContext, op_type: str, *ins: Tensor, dtype: DType | None = None, sig=None, **options) -> Tensor:
    """``op_type`` on ``ins`` into a new tensor with the signature of the first non-constant
    input (or ``sig``) and the type of the first value input (or ``dtype``)."""
    if sig is None:
        sig = next((t.signature for t in ins if not t.is_constant), ins[0].signature)
    if dtype is None:  # (DType.FLOAT32 is 0)
        dtype = ins[1 if op_type in ("SELECT", "SELECT_V2") else 0].dtype
    return ctx.emit1(op_type, list(ins), ctx.temp(op_type.lower(), dtype, sig), **options)


def f32(ctx: EmitContext, value) -> Tensor:
    """A float32 constant (a scalar or an array)."""
    return ctx.constant(np.asarray(value, np.float32), DType.FLOAT32)


def scalar(ctx: EmitContext, value, dtype: DType) -> Tensor:
    """A scalar constant of ``dtype``."""
    return ctx.constant(np.asarray(value, dtype.numpy), dtype)


def int32_const(ctx: EmitContext, value, suffix: str) -> Tensor:
    return ctx.constant(np.asarray(value, np.int32), DType.INT32, f"{ctx.name}/{suffix}")


def as_int32(ctx: EmitContext, i: int, suffix: str = "i32") -> Tensor:
    """Input ``i`` as int32 (TFLite wants int32 axes / shapes; TF allows int64)."""
    t = ctx.input(i)
    return cast(ctx, t, DType.INT32, suffix) if t.dtype == DType.INT64 else t


def normalize_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis
