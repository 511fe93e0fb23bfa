"""Shape and data-movement ops: reshape, transpose, concat, slices, gathers, padding ..."""

from __future__ import annotations

import numpy as np

from ...errors import ConversionError
from ...ops import takes_type
from ...schema import DType, MirrorPadMode
from ..context import EmitContext
from ..tfutil import tf
from .common import as_int32, emitter_table, int32_const, normalize_axis, reshape, scalar, shape_const

EMITTERS, emits = emitter_table()


@emits("Identity", "Snapshot", "StopGradient", "PreventGradient", "CheckNumerics", "EnsureShape",
       "Enter", "Exit", "DebugIdentity", "DebugIdentityV2", "DebugIdentityV3")
def emit_identity(ctx: EmitContext):
    return ctx.value(0)


@emits("IdentityN")
def emit_identity_n(ctx: EmitContext):
    return [ctx.value(i) for i in range(ctx.num_inputs)]


@emits("NoOp", "Assert", "Print", "PrintV2")
def emit_nothing(ctx: EmitContext):
    if ctx.op.outputs:
        return [ctx.value(0)] if ctx.num_inputs else None
    return None


@emits("Const")
def emit_const(ctx: EmitContext):
    value = tf().make_ndarray(ctx.op.get_attr("value"))
    dtype = ctx.out_dtype(0)
    if dtype == DType.STRING:
        raise ctx.fail("string constants are not supported")
    return ctx.constant(value, dtype, ctx.name)


@emits("PlaceholderWithDefault")
def emit_placeholder_with_default(ctx: EmitContext):
    return ctx.value(0)


@emits("Placeholder")
def emit_placeholder(ctx: EmitContext):
    raise ConversionError(f"placeholder {ctx.op.name!r} is not bound to a function input")


def _target_signature(ctx: EmitContext) -> list[int] | None:
    """The output shape of a reshape-like op as constants (-1 for at most one unknown dim)."""
    sig = ctx.out_signature(0)
    if sig is not None and sum(d < 0 for d in sig) <= 1:
        return list(sig)
    return None


@emits("Reshape")
def emit_reshape(ctx: EmitContext):
    x = ctx.input(0)
    target = _target_signature(ctx)
    if target is not None:
        return reshape(ctx, x, target, ctx.out(0))
    return ctx.emit1("RESHAPE", [x, as_int32(ctx, 1, "shape")])


@emits("Squeeze")
def emit_squeeze(ctx: EmitContext):
    x = ctx.input(0)
    target = _target_signature(ctx)
    if target is not None:
        return reshape(ctx, x, target, ctx.out(0))
    return ctx.emit1("SQUEEZE", [x], squeeze_dims=tuple(int(d) for d in ctx.attr("squeeze_dims")))


@emits("ExpandDims")
def emit_expand_dims(ctx: EmitContext):
    x = ctx.input(0)
    axis = as_int32(ctx, 1, "axis")
    if x.is_constant:
        target = _target_signature(ctx)
        if target is not None:
            return reshape(ctx, x, target, ctx.out(0))
    return ctx.emit1("EXPAND_DIMS", [x, axis])


@emits("Transpose")
def emit_transpose(ctx: EmitContext):
    x = ctx.input(0)
    perm = as_int32(ctx, 1, "perm")
    if perm.is_constant and list(perm.data) == list(range(len(perm.data))):
        return x
    return ctx.emit1("TRANSPOSE", [x, perm])


@emits("ConcatV2", "Concat")
def emit_concat(ctx: EmitContext):
    if ctx.type == "Concat":
        axis_i, values = 0, list(range(1, ctx.num_inputs))
    else:
        axis_i, values = ctx.num_inputs - 1, list(range(ctx.num_inputs - 1))
    axis = int(ctx.require_const(axis_i, "concat axis"))
    ins = [ctx.input(i) for i in values]
    if len(ins) == 1:
        return ins[0]
    rank = len(ctx.out_signature(0) or ins[0].signature)
    return ctx.emit1("CONCATENATION", ins, axis=normalize_axis(axis, rank), fused_activation_function=0)


@emits("Pack")
def emit_pack(ctx: EmitContext):
    """PACK; where it takes no such type (bool), each value's axis added and a CONCATENATION, as TF."""
    ins = ctx.inputs()
    sig = ctx.out_signature(0)
    axis = normalize_axis(int(ctx.attr("axis")), len(sig))
    if takes_type("PACK", ins[0].dtype):
        return ctx.emit1("PACK", ins, values_count=len(ins), axis=axis)
    rows = [ctx.emit1("EXPAND_DIMS", [x, int32_const(ctx, axis, "axis")], ctx.temp("value", x.dtype, (
        *sig[:axis], 1, *sig[axis + 1:]))) for x in ins]
    return ctx.emit1("CONCATENATION", rows, axis=axis, fused_activation_function=0)


@emits("Unpack")
def emit_unpack(ctx: EmitContext):
    x = ctx.input(0)
    num = int(ctx.attr("num"))
    outs = [ctx.out(i) for i in range(num)]
    return ctx.emit("UNPACK", [x], outs, num=num, axis=normalize_axis(int(ctx.attr("axis")), x.rank))


@emits("Split")
def emit_split(ctx: EmitContext):
    axis, x = as_int32(ctx, 0, "axis"), ctx.input(1)
    n = int(ctx.attr("num_split"))
    if n == 1:
        return [x]
    return ctx.emit("SPLIT", [axis, x], [ctx.out(i) for i in range(n)], num_splits=n)


@emits("SplitV")
def emit_split_v(ctx: EmitContext):
    x, sizes, axis = ctx.input(0), as_int32(ctx, 1, "size_splits"), as_int32(ctx, 2, "axis")
    n = int(ctx.attr("num_split"))
    if n == 1:
        return [x]
    return ctx.emit("SPLIT_V", [x, sizes, axis], [ctx.out(i) for i in range(n)], num_splits=n)


@emits("Slice")
def emit_slice(ctx: EmitContext):
    return ctx.emit1("SLICE", [ctx.input(0), as_int32(ctx, 1, "begin"), as_int32(ctx, 2, "size")])


def _bits(mask: int, n: int) -> list[bool]:
    return [bool(mask >> i & 1) for i in range(n)]


@emits("StridedSlice")
def emit_strided_slice(ctx: EmitContext):
    x = ctx.input(0)
    begin, end, strides = (as_int32(ctx, i, n) for i, n in ((1, "begin"), (2, "end"), (3, "strides")))
    masks = {k: int(ctx.attr(k)) for k in ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask",
                                            "shrink_axis_mask")}
    if _is_identity_slice(ctx, begin, end, strides, masks):
        return x
    if (masks["ellipsis_mask"] or masks["new_axis_mask"]) and all(t.is_constant for t in (begin, end, strides)):
        dense = _dense_slice(ctx, x.rank, begin.data, end.data, strides.data, masks)
        if dense is not None:
            return dense
    return ctx.emit1("STRIDED_SLICE", [x, begin, end, strides], offset=False, **masks)


def _is_identity_slice(ctx: EmitContext, begin, end, strides, masks) -> bool:
    """A slice that keeps every element in place (``tf.signal.frame`` slices a signal to the
    length its frames use, often all of it): TF's converter folds it away, and so does kiln."""
    if masks["ellipsis_mask"] or masks["new_axis_mask"] or masks["shrink_axis_mask"]:
        return False
    if not all(t.is_constant for t in (begin, end, strides)):
        return False
    in_sig, out_sig = ctx.in_signature(0), ctx.out_signature(0)
    if out_sig is None or len(in_sig) != len(out_sig) or len(begin.data) != len(in_sig):
        return False
    bm, em = _bits(masks["begin_mask"], len(in_sig)), _bits(masks["end_mask"], len(in_sig))
    for d, (b, s, size, out) in enumerate(zip(begin.data, strides.data, in_sig, out_sig)):
        if s != 1:
            return False
        if size >= 0 and out == size:
            continue  # a stride-1 slice as long as its axis covers all of it
        if not ((bm[d] or b == 0) and em[d]):
            return False
    return True


def _dense_slice(ctx: EmitContext, rank: int, begin, end, strides, masks):
    """Rewrite a slice with ellipsis / new axes as a plain slice plus a reshape, as TF's
    converter does (keeps STRIDED_SLICE at a low version)."""
    n = len(begin)
    ell, new = _bits(masks["ellipsis_mask"], n), _bits(masks["new_axis_mask"], n)
    bm, em, sm = (_bits(masks[k], n) for k in ("begin_mask", "end_mask", "shrink_axis_mask"))
    real = sum(1 for i in range(n) if not new[i] and not ell[i])
    b, e, s, obm, oem, osm = [], [], [], [], [], []
    for i in range(n):
        if ell[i]:
            for _ in range(rank - real):
                b.append(0), e.append(0), s.append(1), obm.append(True), oem.append(True), osm.append(False)
        elif new[i]:
            continue
        else:
            b.append(int(begin[i])), e.append(int(end[i])), s.append(int(strides[i]))
            obm.append(bm[i]), oem.append(em[i]), osm.append(sm[i])
    while len(b) < rank:
        b.append(0), e.append(0), s.append(1), obm.append(True), oem.append(True), osm.append(False)
    target = _target_signature(ctx)
    if target is None:
        return None

    def mask(bits):
        return sum(1 << i for i, v in enumerate(bits) if v)

    x = ctx.input(0)
    sliced_sig = []
    for d, (bb, ee, ss, mb, me, ms) in enumerate(zip(b, e, s, obm, oem, osm)):
        if ms:
            continue
        size = x.signature[d]
        if size < 0:
            sliced_sig.append(-1)
            continue
        sl = slice(None if mb else bb, None if me else ee, ss)
        sliced_sig.append(len(range(*sl.indices(size))))
    sliced = ctx.emit1(
        "STRIDED_SLICE", [x, int32_const(ctx, b, "begin"), int32_const(ctx, e, "end"), int32_const(ctx, s, "strides")],
        ctx.temp("slice", x.dtype, sliced_sig), begin_mask=mask(obm), end_mask=mask(oem), ellipsis_mask=0,
        new_axis_mask=0, shrink_axis_mask=mask(osm), offset=False)
    if tuple(sliced_sig) == tuple(target):
        return sliced
    return reshape(ctx, sliced, target, ctx.out(0))


@emits("GatherV2", "Gather")
def emit_gather(ctx: EmitContext):
    params, indices = ctx.input(0), ctx.input(1)
    if params.dtype == DType.STRING and params.rank != 1:
        raise ctx.fail("LiteRT's GATHER takes strings only from rank-1 params")
    axis = 0 if ctx.type == "Gather" else int(ctx.require_const(2, "gather axis"))
    batch_dims = int(ctx.attr("batch_dims", 0))
    return ctx.emit1("GATHER", [params, indices], axis=normalize_axis(axis, params.rank),
                     batch_dims=batch_dims)


@emits("GatherNd")
def emit_gather_nd(ctx: EmitContext):
    return ctx.emit1("GATHER_ND", [ctx.input(0), ctx.input(1)])


@emits("ScatterNd")
def emit_scatter_nd(ctx: EmitContext):
    return ctx.emit1("SCATTER_ND", [ctx.input(0), ctx.input(1), as_int32(ctx, 2, "shape")])


@emits("Pad", "PadV2", "MirrorPad")
def emit_pad(ctx: EmitContext):
    x = ctx.input(0)
    pads = as_int32(ctx, 1, "paddings")
    if pads.is_constant and not np.any(pads.data) and ctx.type != "MirrorPad":
        return x
    if ctx.type == "MirrorPad":
        mode = MirrorPadMode.REFLECT if ctx.attr("mode") == "REFLECT" else MirrorPadMode.SYMMETRIC
        return ctx.emit1("MIRROR_PAD", [x, pads], mode=int(mode))
    if ctx.type == "PadV2":
        value = ctx.const(2)
        if value is None or np.any(value != 0):
            return ctx.emit1("PADV2", [x, pads, ctx.input(2)])
    return ctx.emit1("PAD", [x, pads])


@emits("Tile")
def emit_tile(ctx: EmitContext):
    m = ctx.const(1)
    if m is not None and np.all(m == 1):
        return ctx.input(0)
    return ctx.emit1("TILE", [ctx.input(0), as_int32(ctx, 1, "multiples")])


@emits("Fill")
def emit_fill(ctx: EmitContext):
    dims = as_int32(ctx, 0, "dims")
    if not dims.is_constant:
        target = _target_signature(ctx)
        if target is not None and all(d >= 0 for d in target):
            dims = shape_const(ctx, target, "dims")
    return ctx.emit1("FILL", [dims, ctx.input(1)])


@emits("BroadcastTo")
def emit_broadcast_to(ctx: EmitContext):
    x = ctx.input(0)
    sig = ctx.out_signature(0)
    if sig is not None and tuple(x.signature) == tuple(sig) and all(d >= 0 for d in sig):
        return x
    return ctx.emit1("BROADCAST_TO", [x, as_int32(ctx, 1, "shape")])


@emits("Shape", "ShapeN")
def emit_shape(ctx: EmitContext):
    results = []
    for i in range(ctx.num_inputs):
        dtype = ctx.out_dtype(i)
        static = ctx.in_signature(i)
        if all(d >= 0 for d in static):
            results.append(ctx.constant(np.asarray(static, dtype.numpy), dtype, f"{ctx.name}:{i}" if i else ctx.name))
        else:
            results.append(ctx.emit1("SHAPE", [ctx.input(i)], ctx.out(i), out_type=int(dtype)))
    return results


@emits("Size")
def emit_size(ctx: EmitContext):
    static = ctx.in_signature(0)
    dtype = ctx.out_dtype(0)
    if all(d >= 0 for d in static):
        return ctx.constant(np.asarray(int(np.prod(static)), dtype.numpy), dtype, ctx.name)
    shape = ctx.emit1("SHAPE", [ctx.input(0)], ctx.temp("shape", dtype, [len(static)]), out_type=int(dtype))
    axes = int32_const(ctx, [0], "axes")
    return ctx.emit1("REDUCE_PROD", [shape, axes], keep_dims=False)


@emits("Rank")
def emit_rank(ctx: EmitContext):
    return ctx.constant(np.asarray(ctx.in_rank(0), np.int32), DType.INT32, ctx.name)


@emits("Range")
def emit_range(ctx: EmitContext):
    return ctx.emit1("RANGE", ctx.inputs())


@emits("ReverseV2")
def emit_reverse(ctx: EmitContext):
    return ctx.emit1("REVERSE_V2", [ctx.input(0), as_int32(ctx, 1, "axis")])


@emits("TopKV2", "ApproxTopK")
def emit_topk(ctx: EmitContext):
    """TOPK_V2; ApproxTopK too when it takes the largest along the last axis (TF's conditions),
    then exact."""
    x = ctx.input(0)
    if ctx.type == "ApproxTopK":
        if not ctx.attr("is_max_k") or normalize_axis(ctx.attr("reduction_dimension"), x.rank) != x.rank - 1:
            raise ctx.fail("only the largest values along the last axis have a builtin (TOPK_V2)")
        k = int32_const(ctx, ctx.attr("k"), "k")
    else:
        k = as_int32(ctx, 1, "k")
    return ctx.emit("TOPK_V2", [x, k], [ctx.out(0), ctx.out(1)])


@emits("XlaDynamicUpdateSlice")
def emit_dynamic_update_slice(ctx: EmitContext):
    """Both clamp the start so that the update fits."""
    return ctx.emit1("DYNAMIC_UPDATE_SLICE", ctx.inputs())


@emits("Empty")
def emit_empty(ctx: EmitContext):
    """Zeros (what init asks for, and a value as good as any without it), broadcast as TF writes it."""
    return ctx.emit1("BROADCAST_TO", [scalar(ctx, 0, ctx.out_dtype(0)), as_int32(ctx, 0, "shape")])


@emits("DynamicStitch")
def emit_dynamic_stitch(ctx: EmitContext):
    """merged[indices[i]] = data[i] for constant indices, later ones winning as in TensorFlow:
    the data's rows concatenated and one GATHER of those that land (TF's converter unpacks
    every row and packs them)."""
    n = ctx.num_inputs // 2
    indices = [ctx.const(i) for i in range(n)]
    if any(i is None for i in indices):
        raise ctx.fail("the indices must be constants (as TF's converter needs them)")
    source: dict[int, int] = {}
    for row, at in enumerate(np.concatenate([np.reshape(i, -1) for i in indices]).tolist()):
        source[at] = row
    if sorted(source) != list(range(len(source))):
        raise ctx.fail(f"indices {sorted(set(range(max(source, default=-1) + 1)) - set(source))} are missing")
    inner = ctx.input(n).signature[np.ndim(indices[0]):]
    rows = [ctx.input(n + k) if np.ndim(i) == 1 else reshape(ctx, ctx.input(n + k), (np.size(i), *inner))
            for k, i in enumerate(indices)]
    total = sum(np.size(i) for i in indices)
    if len(rows) > 1:
        rows = [ctx.emit1("CONCATENATION", rows, ctx.temp("rows", rows[0].dtype, (total, *inner)), axis=0,
                          fused_activation_function=0)]
    order = [source[k] for k in range(len(source))]
    if order == list(range(total)):
        return rows[0]
    return ctx.emit1("GATHER", [rows[0], int32_const(ctx, order, "rows")], axis=0, batch_dims=0)


@emits("InvertPermutation")
def emit_invert_permutation(ctx: EmitContext):
    """y[x[i]] = i: one SCATTER_ND of int32 indices (folded for a constant x)."""
    x = ctx.input(0)
    n = x.signature[0]
    if n < 0:
        raise ctx.fail("the permutation's length must be static (as TF's converter needs it)")
    where = reshape(ctx, as_int32(ctx, 0, "indices"), (n, 1), suffix="indices")
    positions = ctx.constant(np.arange(n, dtype=x.dtype.numpy), x.dtype)
    return ctx.emit1("SCATTER_ND", [where, positions, int32_const(ctx, [n], "shape")])


@emits("OneHot")
def emit_one_hot(ctx: EmitContext):
    indices, depth, on, off = ctx.inputs()
    return ctx.emit1("ONE_HOT", [indices, depth, on, off], axis=int(ctx.attr("axis")))


@emits("SpaceToBatchND")
def emit_space_to_batch(ctx: EmitContext):
    return ctx.emit1("SPACE_TO_BATCH_ND", [ctx.input(0), as_int32(ctx, 1, "block"), as_int32(ctx, 2, "paddings")])


@emits("BatchToSpaceND")
def emit_batch_to_space(ctx: EmitContext):
    return ctx.emit1("BATCH_TO_SPACE_ND", [ctx.input(0), as_int32(ctx, 1, "block"), as_int32(ctx, 2, "crops")])


@emits("SpaceToDepth", "DepthToSpace")
def emit_space_depth(ctx: EmitContext):
    if ctx.attr("data_format", "NHWC") != "NHWC":
        raise ctx.fail("only NHWC is supported")
    op_type = "SPACE_TO_DEPTH" if ctx.type == "SpaceToDepth" else "DEPTH_TO_SPACE"
    return ctx.emit1(op_type, [ctx.input(0)], block_size=int(ctx.attr("block_size")))


@emits("Where")
def emit_where(ctx: EmitContext):
    return ctx.emit1("WHERE", [ctx.input(0)])


@emits("Unique")
def emit_unique(ctx: EmitContext):
    return ctx.emit("UNIQUE", [ctx.input(0)], [ctx.out(0), ctx.out(1)], idx_out_type=int(ctx.out_dtype(1)))


@emits("MatrixDiag", "MatrixDiagV2", "MatrixDiagV3")
def emit_matrix_diag(ctx: EmitContext):
    """MATRIX_DIAG: the main diagonal, TF's default sizes and a zero padding (legalize_tf.cc's
    conditions for V2 / V3)."""
    if ctx.type != "MatrixDiag":
        k, rows, cols, padding = (ctx.const(i) for i in range(1, 5))
        if any(v is None or np.any(v != want) for v, want in ((k, 0), (rows, -1), (cols, -1), (padding, 0))):
            raise ctx.fail("only the main diagonal (k = 0) with the default sizes and a zero padding has a builtin")
    return ctx.emit1("MATRIX_DIAG", [ctx.input(0)])


@emits("MatrixSetDiag", "MatrixSetDiagV2", "MatrixSetDiagV3")
def emit_matrix_set_diag(ctx: EmitContext):
    if ctx.type != "MatrixSetDiag":
        k = ctx.const(2)
        if k is None or np.any(k != 0):
            raise ctx.fail("only the main diagonal (k = 0) has a builtin")
    return ctx.emit1("MATRIX_SET_DIAG", [ctx.input(0), ctx.input(1)])


@emits("Bitcast")
def emit_bitcast(ctx: EmitContext):
    for dtype in (ctx.input(0).dtype, ctx.out_dtype(0)):
        if dtype in (DType.STRING, DType.RESOURCE, DType.VARIANT):
            raise ctx.fail(f"{dtype.name.lower()} has no fixed size to reinterpret")
    return ctx.emit1("BITCAST", [ctx.input(0)])


@emits("Roll")
def emit_roll(ctx: EmitContext):
    """tf.roll. A known shift along an axis of known length is SLICE + SLICE + CONCATENATION,
    as TF's converter writes it (other dims may be unknown); a shift computed at run time, or
    an axis of unknown length, which TF's converter refuses, is a GATHER of (i - shift) mod n
    (an int64 shift computed at run time is narrowed to int32 first)."""
    y, axes = ctx.input(0), ctx.require_const(2, "the roll axis")
    axes = [normalize_axis(int(a), y.rank) for a in np.reshape(axes, -1)]
    if any(not 0 <= a < y.rank for a in axes):
        raise ctx.fail(f"axis {np.reshape(ctx.const(2), -1).tolist()} is out of range for a rank-{y.rank} input")
    shifts = ctx.const(1)
    if shifts is None:
        shift = as_int32(ctx, 1, "shift")
        for k, axis in enumerate(axes):
            part = shift if shift.rank == 0 else ctx.emit1(
                "GATHER", [shift, int32_const(ctx, k, f"shift{k}")], ctx.temp("shift", DType.INT32, ()), axis=0,
                batch_dims=0)
            y = _roll_gather(ctx, y, axis, part)
        return y
    total: dict[int, int] = {}
    for axis, s in zip(axes, np.reshape(shifts, -1).tolist()):
        total[axis] = total.get(axis, 0) + int(s)
    for axis, s in total.items():
        n = y.signature[axis]
        if n < 0:
            y = _roll_gather(ctx, y, axis, int32_const(ctx, s, "shift"))
        elif n and s % n:
            s %= n
            pieces = [_slice_axis(ctx, y, axis, n - s, s), _slice_axis(ctx, y, axis, 0, n - s)]
            y = ctx.emit1("CONCATENATION", pieces, ctx.temp("roll", y.dtype, y.signature), axis=axis,
                          fused_activation_function=0)
    return y


def _slice_axis(ctx: EmitContext, x, axis: int, begin: int, size: int):
    begins, sizes = [0] * x.rank, [-1] * x.rank
    begins[axis], sizes[axis] = begin, size
    sig = list(x.signature)
    sig[axis] = size
    return ctx.emit1("SLICE", [x, int32_const(ctx, begins, "begin"), int32_const(ctx, sizes, "size")],
                     ctx.temp("slice", x.dtype, sig))


def _roll_gather(ctx: EmitContext, x, axis: int, shift):
    """x rolled by ``shift`` (an int32 scalar tensor) along ``axis``: GATHER of (i - shift) mod n."""
    n = x.signature[axis]
    if n >= 0:
        length, positions = int32_const(ctx, n, "n"), int32_const(ctx, np.arange(n), "positions")
    else:
        dims = ctx.emit1("SHAPE", [x], ctx.temp("shape", DType.INT32, (x.rank,)), out_type=int(DType.INT32))
        length = ctx.emit1("GATHER", [dims, int32_const(ctx, axis, "axis")], ctx.temp("n", DType.INT32, ()),
                           axis=0, batch_dims=0)
        positions = ctx.emit1("RANGE", [int32_const(ctx, 0, "zero"), length, int32_const(ctx, 1, "one")],
                              ctx.temp("positions", DType.INT32, (-1,)))
    back = ctx.emit1("SUB", [positions, shift], ctx.temp("back", DType.INT32, positions.signature))
    source = ctx.emit1("FLOOR_MOD", [back, length], ctx.temp("source", DType.INT32, positions.signature))
    return ctx.emit1("GATHER", [x, source], ctx.temp("roll", x.dtype, x.signature), axis=axis, batch_dims=0)


@emits("MatrixBandPart")
def emit_band_part(ctx: EmitContext):
    """band_part(x, lower, upper) as SELECT_V2 with a constant mask over the last two dims
    (Keras' causal attention mask)."""
    x = ctx.input(0)
    lower, upper = ctx.require_const(1, "num_lower"), ctx.require_const(2, "num_upper")
    m, n = x.signature[-2], x.signature[-1]
    if m < 0 or n < 0:
        raise ctx.fail("the last two dims must be static")
    i = np.arange(m)[:, None]
    j = np.arange(n)[None, :]
    mask = np.ones((m, n), bool)
    if int(lower) >= 0:
        mask &= (i - j) <= int(lower)
    if int(upper) >= 0:
        mask &= (j - i) <= int(upper)
    if mask.all():
        return x
    zero = ctx.constant(np.zeros((), x.dtype.numpy), x.dtype, f"{ctx.name}/zero")
    return ctx.emit1("SELECT_V2", [ctx.constant(mask, DType.BOOL, f"{ctx.name}/mask"), x, zero])


@emits("BroadcastArgs")
def emit_broadcast_args(ctx: EmitContext):
    return ctx.emit1("BROADCAST_ARGS", [ctx.input(0), ctx.input(1)])


@emits("ReverseSequence")
def emit_reverse_sequence(ctx: EmitContext):
    rank = ctx.in_rank(0)
    return ctx.emit1("REVERSE_SEQUENCE", [ctx.input(0), ctx.input(1)],
                     seq_dim=normalize_axis(int(ctx.attr("seq_dim")), rank),
                     batch_dim=normalize_axis(int(ctx.attr("batch_dim", 0)), rank))


@emits("SegmentSum")
def emit_segment_sum(ctx: EmitContext):
    return ctx.emit1("SEGMENT_SUM", [ctx.input(0), ctx.input(1)])


_UNSORTED = {"UnsortedSegmentSum": "UNSORTED_SEGMENT_SUM", "UnsortedSegmentProd": "UNSORTED_SEGMENT_PROD",
             "UnsortedSegmentMax": "UNSORTED_SEGMENT_MAX", "UnsortedSegmentMin": "UNSORTED_SEGMENT_MIN"}


@emits(*_UNSORTED)
def emit_unsorted_segment(ctx: EmitContext):
    return ctx.emit1(_UNSORTED[ctx.type], [ctx.input(0), ctx.input(1), as_int32(ctx, 2, "num_segments")])
