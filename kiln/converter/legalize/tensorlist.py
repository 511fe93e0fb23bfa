"""TensorList ops (tf.TensorArray, tf.while_loop accumulators) lowered to plain tensors.

A list becomes one tensor ``[num_elements, *element_shape]``: Reserve preallocates it,
FromTensor is the tensor itself, GetItem is a GATHER, SetItem a DYNAMIC_UPDATE_SLICE at
``[index, 0, ...]``, Stack the tensor; an EmptyTensorList starts with no element and grows by a
CONCATENATION per PushBack, Resize is a SLICE or a PAD, ConcatV2 a RESHAPE. When the element
shape has unknown dims (a dynamic batch), the list is preallocated with 1 there and broadcast
to the item's shape on write.
"""

from __future__ import annotations

import numpy as np

from ...schema import DType
from ..context import EmitContext
from ..tfutil import to_dtype
from ..values import TensorListValue
from .common import as_int32, emitter_table, int32_const, like, reshape, reshape_to

EMITTERS, emits = emitter_table()


def _list(ctx: EmitContext, i: int = 0) -> TensorListValue:
    v = ctx.value(i)
    if not isinstance(v, TensorListValue):
        raise ctx.fail("the TensorList does not come from an op kiln can lower")
    return v


def _element_signature(ctx: EmitContext, i: int) -> tuple[int, ...]:
    shape = ctx.const(i)
    if shape is not None:
        shape = np.asarray(shape)
        if shape.ndim == 1:
            return tuple(int(d) for d in shape)
    # Unknown element shape (a TensorArray without element_shape): learn it from the uses.
    inferred = infer_element_signature(ctx.op.outputs[0])
    if inferred is None:
        raise ctx.fail("TensorList with an unknown element rank cannot be lowered "
                       "(give the TensorArray an element_shape)")
    return inferred


def _merge(a, b):
    if a is None:
        return b
    if b is None or len(a) != len(b):
        return a
    return tuple(x if x >= 0 else y for x, y in zip(a, b))


def infer_element_signature(list_tensor, depth: int = 0):
    """The element shape of a TensorList from what is written to / read from / stacked out of
    it, following it through While loops (TF's static shapes, -1 for unknown dims)."""
    from ..tfutil import function_graph, shape_signature

    if depth > 8:
        return None
    found = None
    for consumer in list_tensor.consumers():
        t = consumer.type
        if t in ("TensorListSetItem", "TensorListPushBack") and consumer.inputs[0].name == list_tensor.name:
            found = _merge(found, shape_signature(consumer.inputs[-1].shape))
            found = _merge(found, infer_element_signature(consumer.outputs[0], depth + 1))
        elif t == "TensorListGetItem":
            found = _merge(found, shape_signature(consumer.outputs[0].shape))
        elif t == "TensorListStack":
            sig = shape_signature(consumer.outputs[0].shape)
            found = _merge(found, sig[1:] if sig else None)
        elif t in ("While", "StatelessWhile"):
            k = [i for i, x in enumerate(consumer.inputs) if x.name == list_tensor.name]
            body = function_graph(list_tensor.graph, consumer.get_attr("body").name)
            for i in k:
                found = _merge(found, infer_element_signature(body.inputs[i], depth + 1))
                found = _merge(found, infer_element_signature(consumer.outputs[i], depth + 1))
        elif t in ("Identity", "IdentityN"):
            for out in consumer.outputs:
                found = _merge(found, infer_element_signature(out, depth + 1))
    return found


@emits("EmptyTensorList")
def emit_empty_list(ctx: EmitContext):
    """No element yet (a size-0 dim where the element's is unknown)."""
    elem, dtype = _element_signature(ctx, 0), to_dtype(ctx.attr("element_dtype"))
    empty = np.zeros((0, *(max(d, 0) for d in elem)), dtype.numpy)
    return TensorListValue(ctx.constant(empty, dtype, f"{ctx.name}/empty"), dtype, elem)


@emits("TensorListReserve")
def emit_reserve(ctx: EmitContext):
    elem = _element_signature(ctx, 0)
    dtype = to_dtype(ctx.attr("element_dtype"))
    n = ctx.const(1)
    static_elem = [1 if d < 0 else d for d in elem]
    zero = ctx.constant(np.zeros((), dtype.numpy), dtype, f"{ctx.name}/zero")
    if n is not None:
        count = int(n)
        shape = ctx.constant(np.asarray([count, *static_elem], np.int32), DType.INT32, f"{ctx.name}/shape")
        sig = (count, *elem)
    else:
        n_t = ctx.input(1)
        n1 = ctx.emit1("RESHAPE", [n_t, ctx.constant(np.asarray([1], np.int32), DType.INT32)],
                       ctx.temp("count", DType.INT32, (1,)))
        rest = ctx.constant(np.asarray(static_elem, np.int32), DType.INT32, f"{ctx.name}/element_shape")
        shape = ctx.emit1("CONCATENATION", [n1, rest], ctx.temp("shape", DType.INT32, (1 + len(elem),)),
                          axis=0, fused_activation_function=0)
        sig = (-1, *elem)
    t = ctx.emit1("FILL", [shape, zero], ctx.temp("list", dtype, sig))
    return TensorListValue(t, dtype, elem)


@emits("TensorListFromTensor")
def emit_from_tensor(ctx: EmitContext):
    t = ctx.input(0)
    return TensorListValue(t, t.dtype, tuple(t.signature[1:]))


@emits("TensorListGetItem")
def emit_get_item(ctx: EmitContext):
    lst = _list(ctx)
    index = ctx.input(1)
    return ctx.emit1("GATHER", [lst.tensor, index], axis=0, batch_dims=0)


@emits("TensorListSetItem")
def emit_set_item(ctx: EmitContext):
    lst = _list(ctx)
    index, item = ctx.input(1), ctx.input(2)
    if bool(ctx.attr("resize_if_index_out_of_bounds", False)):
        raise ctx.fail("resize_if_index_out_of_bounds is not supported")
    rank = len(lst.element_signature)
    axis0 = ctx.constant(np.asarray(0, np.int32), DType.INT32, f"{ctx.name}/axis")
    update = ctx.emit1("EXPAND_DIMS", [item, axis0], ctx.temp("update", item.dtype, (1, *item.signature)))
    if lst.signature and lst.signature[0] == 1:
        # A one-element list (Keras' RNN keeps only the last output that way): the write
        # replaces it whole, whatever the element's dynamic dims — no broadcast, no update.
        return TensorListValue(update, lst.element_dtype, lst.element_signature)
    base = lst.tensor
    if lst.dynamic_elements:
        # Allocated with 1 where the element size was unknown: broadcast to the real size.
        sig = lst.signature
        s1 = ctx.emit1("SHAPE", [base], ctx.temp("list_shape", DType.INT32, (rank + 1,)), out_type=int(DType.INT32))
        s2 = ctx.emit1("SHAPE", [update], ctx.temp("item_shape", DType.INT32, (rank + 1,)), out_type=int(DType.INT32))
        shape = ctx.emit1("MAXIMUM", [s1, s2], ctx.temp("shape", DType.INT32, (rank + 1,)))
        base = ctx.emit1("BROADCAST_TO", [base, shape], ctx.temp("broadcast", base.dtype, sig))
    idx = index if index.dtype == DType.INT32 else ctx.emit1("CAST", [index], ctx.temp("index", DType.INT32, ()))
    zeros = [ctx.constant(np.asarray(0, np.int32), DType.INT32, f"{ctx.name}/zero") for _ in range(rank)]
    start = ctx.emit1("PACK", [idx, *zeros], ctx.temp("start", DType.INT32, (rank + 1,)),
                      values_count=rank + 1, axis=0)
    out = ctx.temp("list", base.dtype, lst.signature)
    new = ctx.emit1("DYNAMIC_UPDATE_SLICE", [base, update, start], out)
    return TensorListValue(new, lst.element_dtype, lst.element_signature)


@emits("TensorListPushBack")
def emit_push_back(ctx: EmitContext):
    """The item as a one-element list onto an empty one, else CONCATENATED to it, as TF writes
    it. A list that grows inside a loop or branch changes its shape there: refused, as by TF."""
    lst, item = _list(ctx), ctx.input(1)
    if any(lst.tensor is t for t in ctx.sg.inputs):
        raise ctx.fail("a list that grows inside a loop or branch cannot be lowered (TF's converter refuses it too)")
    row = like(ctx, "EXPAND_DIMS", item, int32_const(ctx, 0, "axis"), sig=(1, *item.signature))
    n = lst.tensor.signature[0]
    if n != 0:
        row = _joined(ctx, lst.tensor, row)
    return TensorListValue(row, lst.element_dtype, lst.element_signature)


@emits("TensorListResize")
def emit_resize(ctx: EmitContext):
    """The first ``size`` elements (a SLICE), or the list followed by zero elements (a PAD);
    at run-time sizes, the list and ``size`` zero elements concatenated, then sliced (TF's
    converter writes an IF of both ways)."""
    lst, size = _list(ctx), ctx.const(1)
    t = lst.tensor
    n, rank, rest = t.signature[0], t.rank, t.signature[1:]
    if n < 0 or size is None:
        count = reshape(ctx, as_int32(ctx, 1, "size"), [1], suffix="count")
        dims = int32_const(ctx, rest, "element_shape") if min(rest, default=0) >= 0 else like(
            ctx, "SLICE", like(ctx, "SHAPE", t, dtype=DType.INT32, sig=(rank,), out_type=int(DType.INT32)),
            int32_const(ctx, [1], "begin"), int32_const(ctx, [rank - 1], "size"), sig=(rank - 1,))
        zeros = like(ctx, "FILL", _joined(ctx, count, dims), ctx.constant(np.zeros((), t.dtype.numpy), t.dtype),
                     dtype=t.dtype, sig=(-1, *rest))
        t = like(ctx, "SLICE", _joined(ctx, t, zeros), int32_const(ctx, [0] * rank, "begin"),
                 _joined(ctx, count, int32_const(ctx, [-1] * (rank - 1), "rest")), sig=(-1, *rest))
    elif int(size) < n:
        t = like(ctx, "SLICE", t, int32_const(ctx, [0] * rank, "begin"),
                 int32_const(ctx, [int(size)] + [-1] * (rank - 1), "size"), sig=(int(size), *rest))
    elif int(size) > n:
        t = like(ctx, "PAD", t, int32_const(ctx, [[0, int(size) - n]] + [[0, 0]] * (rank - 1), "paddings"),
                 sig=(int(size), *rest))
    return TensorListValue(t, lst.element_dtype, lst.element_signature)


def _joined(ctx: EmitContext, a, b):
    """a and b concatenated along axis 0."""
    sig = (-1 if min(a.signature[0], b.signature[0]) < 0 else a.signature[0] + b.signature[0], *a.signature[1:])
    return like(ctx, "CONCATENATION", a, b, sig=sig, axis=0, fused_activation_function=0)


@emits("TensorListConcatV2")
def emit_concat(ctx: EmitContext):
    """The elements joined along their first axis (a RESHAPE), and each one's length there."""
    t = _list(ctx).tensor
    sig = t.signature
    if t.rank < 2:
        raise ctx.fail("elements of rank 0 cannot be concatenated")
    joined = reshape_to(ctx, t, [[(t, 0), (t, 1)], *(d if d >= 0 else [(t, k)] for k, d in enumerate(sig) if k > 1)],
                        ctx.out(0))
    if sig[0] >= 0 and sig[1] >= 0:
        return [joined, ctx.constant(np.full(sig[0], sig[1], np.int64), DType.INT64)]
    dims = like(ctx, "SHAPE", t, dtype=DType.INT64, sig=(t.rank,), out_type=int(DType.INT64))
    length = like(ctx, "GATHER", dims, int32_const(ctx, 1, "axis"), sig=(), axis=0, batch_dims=0)
    count = like(ctx, "SLICE", dims, int32_const(ctx, [0], "begin"), int32_const(ctx, [1], "size"), sig=(1,))
    return [joined, like(ctx, "BROADCAST_TO", length, count, sig=(sig[0],))]


@emits("TensorListStack")
def emit_stack(ctx: EmitContext):
    return _list(ctx).tensor


@emits("TensorListGather")
def emit_gather(ctx: EmitContext):
    lst = _list(ctx)
    return ctx.emit1("GATHER", [lst.tensor, ctx.input(1)], axis=0, batch_dims=0)


@emits("TensorListLength")
def emit_length(ctx: EmitContext):
    lst = _list(ctx)
    n = lst.tensor.signature[0]
    if n >= 0:
        return ctx.constant(np.asarray(n, np.int32), DType.INT32, ctx.name)
    rank = lst.tensor.rank
    shape = ctx.emit1("SHAPE", [lst.tensor], ctx.temp("shape", DType.INT32, (rank,)), out_type=int(DType.INT32))
    zero = ctx.constant(np.asarray(0, np.int32), DType.INT32)
    return ctx.emit1("GATHER", [shape, zero], axis=0, batch_dims=0)


@emits("TensorListElementShape")
def emit_element_shape(ctx: EmitContext):
    lst = _list(ctx)
    if any(d < 0 for d in lst.element_signature):
        raise ctx.fail("the element shape is not static")
    dtype = ctx.out_dtype(0)
    return ctx.constant(np.asarray(lst.element_signature, dtype.numpy), dtype, ctx.name)
