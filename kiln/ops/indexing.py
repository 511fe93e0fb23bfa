"""Op family: indexing (slices, gathers, scatters, lookups, one-hot, unique, where).

Like the shape family, these kernels pick elements by position and never compute on them,
so they run on the raw storage of any element type, quantized tensors included (each
kernel is also its record's quantized kernel). The exception is EMBEDDING_LOOKUP's hybrid
form (an int8/uint8 table with a float output), which dequantizes rows as LiteRT does.

Out-of-range indices are errors, never clamped or wrapped: LiteRT rejects negative GATHER /
GATHER_ND / SCATTER_ND indices and out-of-bounds lookups, and so does kiln.
"""

from __future__ import annotations

import numpy as np

from ..errors import OpError
from ..schema import DType
from .record import (HYBRID, UNLISTED, KernelCall, OpDef, OptionsSpec, input_dtype, input_rank, on_codes,
                     on_numpy, takes)
from .shape import dense, int_scalar, int_values, norm_axis
from .traits import same

_POSITION_TYPES = (np.dtype(np.int16), np.dtype(np.int32), np.dtype(np.int64))


def _check_positions(arr: np.ndarray, op: str, what: str = "indices") -> None:
    if arr.dtype not in _POSITION_TYPES:
        raise OpError(f"{op}: {what} of type {arr.dtype} are not supported (int16, int32, int64)")


def _check_bounds(idx: np.ndarray, size: int, op: str, what: str) -> None:
    """Every index must lie in [0, size): LiteRT fails the node otherwise."""
    if idx.size == 0:
        return
    lo, hi = int(idx.min()), int(idx.max())
    if lo < 0:
        raise OpError(f"{op}: {what} {lo} is negative (LiteRT does not accept negative indices)")
    if hi >= size:
        raise OpError(f"{op}: {what} {hi} is out of bounds for a dimension of size {size}")


# -- SLICE ------------------------------------------------------------------------------------

def _slice(call: KernelCall, x: np.ndarray, begin: np.ndarray, size: np.ndarray):
    b = int_values(begin, "SLICE", "begin")
    s = int_values(size, "SLICE", "size")
    if len(b) != x.ndim or len(s) != x.ndim:
        raise OpError(f"SLICE: begin {b} and size {s} need {x.ndim} entries for input {list(x.shape)}")
    index = []
    for d, (start, n, dim) in enumerate(zip(b, s, x.shape)):
        if n == -1:
            n = dim - start
        if start < 0 or n < 0 or start + n > dim:
            raise OpError(f"SLICE: begin {b} / size {s} do not fit input shape {list(x.shape)} (axis {d})")
        index.append(slice(start, start + n))
    return dense(x[tuple(index)])


def _slice_version(op) -> int:
    t = input_dtype(op, 0)
    if t == DType.FLOAT16:
        return 8
    if t == DType.INT4:
        return 7
    if t == DType.UINT32:
        return 6
    if input_rank(op, 0) > 4:
        return 5
    return {DType.INT16: 4, DType.STRING: 3, DType.INT8: 2}.get(t, 1)


# -- STRIDED_SLICE ------------------------------------------------------------------------------

def _bit(mask: int, i: int) -> bool:
    return bool((mask >> i) & 1)


def _effective_spec(opts, rank: int, n: int):
    """Expand ellipsis and new axes into one (kind, spec index) entry per output-side axis.

    Mirrors LiteRT's BuildStridedSliceParams: kind is "full" (ellipsis or trailing axis
    not covered by the spec), "new" (new_axis_mask) or "spec" (uses begin/end/strides
    entry ``spec index``).
    """
    ellipsis, new_axis = opts.ellipsis_mask, opts.new_axis_mask
    num_add = sum(1 for i in range(n) if not _bit(ellipsis, i) and _bit(new_axis, i))
    eff = rank + num_add
    kinds: list[str] = []
    shift: list[int] = []  # how many extra axes the ellipsis added before this one
    expanded = 0
    i = 0
    while i < eff:
        if _bit(ellipsis, i):
            end = max(i + 1, min(i + 1 + num_add + rank - n, eff))
            expanded = end - i - 1
            kinds.extend(["ellipsis"] * (end - i))
            shift.extend([0] * (end - i))
            i = end
            continue
        kinds.append("new" if _bit(new_axis, i - expanded) else "")
        shift.append(expanded)
        i += 1
    entries = []
    for i, kind in enumerate(kinds):
        if kind == "ellipsis":
            entries.append(("full", -1))
        elif kind == "new":
            entries.append(("new", -1))
        elif i >= n + expanded:
            entries.append(("full", -1))
        else:
            entries.append(("spec", i - shift[i]))
    return entries


def _clamp(v: int, lo: int, hi: int) -> int:
    return hi if v > hi else lo if v < lo else v


def _axis_range(start: int, stop: int, stride: int, dim: int, bmask: bool, emask: bool,
                shrink: bool, offset: bool):
    """(start, stop) of one axis as LiteRT's StartForAxis / EndForAxis compute them."""
    if start < 0:
        start += dim
    start = _clamp(start, 0, dim) if stride > 0 else _clamp(start, -1, dim - 1)
    if bmask:
        start = 0 if stride > 0 else dim - 1
    if shrink:
        return start, (start if start >= dim else start + 1)
    end = stop + start if offset else stop
    if end < 0:
        end += dim
    end = _clamp(end, 0, dim) if stride > 0 else _clamp(end, -1, dim - 1)
    if emask:
        end = dim if stride > 0 else -1
    return start, end


def _steps(length: int, stride: int) -> int:
    """Number of elements a half-open run of ``length`` visits with ``stride`` (LiteRT's rule)."""
    if (length < 0) != (stride < 0):
        return 0
    if stride < 0:
        return int((length + 1) / stride) + 1  # C division truncates toward zero
    return 0 if length == 0 else (length - 1) // stride + 1


def _py_slice(start: int, end: int, stride: int) -> slice:
    """A Python slice for a C-style loop start; start += stride while not past end."""
    if stride < 0:
        if start < 0:
            return slice(0, 0)
        return slice(start, None if end < 0 else end, stride)
    return slice(start, end, stride)


def _strided_slice(call: KernelCall, x: np.ndarray, begin: np.ndarray, end: np.ndarray,
                   strides: np.ndarray):
    eff_shape, index, out_shape = strided_slice_plan(call.opts, x, begin, end, strides)
    out = x.reshape(eff_shape)[index]
    return dense(out).reshape(out_shape)


def strided_slice_plan(o, x: np.ndarray, begin, end, strides):
    """(shape to view x as, index into that view, output shape) of a strided slice."""
    b = int_values(begin, "STRIDED_SLICE", "begin")
    e = int_values(end, "STRIDED_SLICE", "end")
    st = int_values(strides, "STRIDED_SLICE", "strides")
    if not len(b) == len(e) == len(st):
        raise OpError(f"STRIDED_SLICE: begin {b}, end {e} and strides {st} differ in length")
    if len(b) > 31:
        raise OpError("STRIDED_SLICE: at most 31 indices are supported")
    entries = _effective_spec(o, x.ndim, len(b))
    eff_shape, index, out_shape = [], [], []
    src_axis = 0
    for kind, k in entries:
        if kind == "new":
            eff_shape.append(1)
            index.append(slice(None))
            out_shape.append(1)
            continue
        dim = x.shape[src_axis]
        src_axis += 1
        eff_shape.append(dim)
        if kind == "full":
            index.append(slice(None))
            out_shape.append(dim)
            continue
        stride = st[k]
        if stride == 0:
            raise OpError("STRIDED_SLICE: stride value has to be non-zero")
        shrink = _bit(o.shrink_axis_mask, k)
        start, stop = _axis_range(b[k], e[k], stride, dim, _bit(o.begin_mask, k),
                                  _bit(o.end_mask, k), shrink, bool(o.offset))
        if shrink:
            if not 0 <= start < dim:
                raise OpError(f"STRIDED_SLICE: shrink index {b[k]} is out of range for axis of size {dim}")
            index.append(start)
            continue
        sl = _py_slice(start, stop, stride)
        n = len(range(dim)[sl])
        if o.offset and n != _steps(e[k], stride):
            raise OpError(
                f"STRIDED_SLICE: offset slice of length {e[k]} from {start} runs past the end "
                f"of an axis of size {dim}"
            )
        index.append(sl)
        out_shape.append(n)
    if src_axis != x.ndim:
        raise OpError(f"STRIDED_SLICE: the slice spec does not cover input shape {list(x.shape)}")
    return eff_shape, tuple(index), out_shape


def _strided_slice_version(op) -> int:
    opts = op.options
    t = input_dtype(op, 0)
    if opts["offset"]:
        return 8
    if t == DType.UINT32:
        return 7
    if opts["ellipsis_mask"] or opts["new_axis_mask"]:
        return 6
    if t == DType.STRING:
        return 5
    if input_rank(op, 0) > 4:
        return 4
    return {DType.BOOL: 3, DType.INT8: 2}.get(t, 1)


# -- GATHER / GATHER_ND ---------------------------------------------------------------------------

def _gather(call: KernelCall, params: np.ndarray, indices: np.ndarray):
    _check_positions(indices, "GATHER")
    if params.ndim == 0:
        raise OpError("GATHER: params must have rank >= 1")
    axis = norm_axis(call.opts.axis, params.ndim, "GATHER")
    bd = call.opts.batch_dims
    if bd < 0:
        bd += indices.ndim
    if not (0 <= bd <= axis and bd < params.ndim and bd <= indices.ndim):
        raise OpError(
            f"GATHER: batch_dims {call.opts.batch_dims} is invalid for axis {axis}, params rank "
            f"{params.ndim} and indices rank {indices.ndim}"
        )
    if params.shape[:bd] != indices.shape[:bd]:
        raise OpError(
            f"GATHER: the first {bd} dims of params {list(params.shape)} and indices "
            f"{list(indices.shape)} must match"
        )
    _check_bounds(indices, params.shape[axis], "GATHER", "index")
    idx = indices.astype(np.intp, copy=False)
    if bd == 0:
        return np.asarray(np.take(params, idx, axis=axis))
    batch = int(np.prod(params.shape[:bd], dtype=np.int64))
    outer = int(np.prod(params.shape[bd:axis], dtype=np.int64))
    inner = params.shape[axis + 1:]
    p = params.reshape((batch, outer, params.shape[axis]) + inner)
    i = idx.reshape(batch, -1)
    g = p[np.arange(batch)[:, None, None], np.arange(outer)[None, :, None], i[:, None, :]]
    shape = params.shape[:axis] + indices.shape[bd:] + inner
    return g.reshape(shape)


def _gather_version(op) -> int:
    t = input_dtype(op, 0)
    if t == DType.INT4:
        return 7
    if input_dtype(op, 1) == DType.INT16:
        return 6
    if op.options["batch_dims"] != 0:
        return 5
    return {DType.INT16: 4, DType.BOOL: 3, DType.INT8: 2}.get(t, 1)


def _gather_nd(call: KernelCall, params: np.ndarray, indices: np.ndarray):
    _check_positions(indices, "GATHER_ND")
    if params.ndim < 1 or indices.ndim < 1:
        raise OpError("GATHER_ND: params and indices must both have rank >= 1")
    nd = indices.shape[-1]
    if nd > params.ndim:
        raise OpError(f"GATHER_ND: index depth {nd} exceeds params rank {params.ndim}")
    if params.size == 0 and indices.size != 0:
        raise OpError("GATHER_ND: cannot gather from an empty params tensor")
    for k in range(nd):
        _check_bounds(indices[..., k], params.shape[k], "GATHER_ND", f"index (component {k})")
    lead = indices.shape[:-1]
    if nd == 0:
        return dense(np.broadcast_to(params, lead + params.shape))
    idx = tuple(indices[..., k].astype(np.intp) for k in range(nd))
    return dense(params[idx])


def _gather_nd_version(op) -> int:
    t = input_dtype(op, 0)
    if t == DType.BOOL:
        return 5
    if input_dtype(op, 1) == DType.INT16:
        return 4
    return {DType.INT16: 3, DType.STRING: 2}.get(t, 1)


# -- EMBEDDING_LOOKUP -----------------------------------------------------------------------------

def _embedding_lookup(call: KernelCall, ids: np.ndarray, table: np.ndarray):
    if ids.ndim != 1 or ids.dtype != np.int32:
        raise OpError(f"EMBEDDING_LOOKUP: ids must be an int32 vector, got {ids.dtype} {list(ids.shape)}")
    if table.ndim < 2:
        raise OpError(f"EMBEDDING_LOOKUP: the table must have rank >= 2, got {list(table.shape)}")
    rows = table.shape[0]
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= rows):
        bad = int(ids[(ids < 0) | (ids >= rows)][0])
        raise OpError(f"EMBEDDING_LOOKUP: index out of bounds. Got {bad}, and bounds are [0, {rows - 1}]")
    picked = table[ids]
    want = call.out_dtypes[0] if call.out_dtypes else picked.dtype
    q = call.op.inputs[1].quantization if len(call.op.inputs) > 1 else None
    hybrid = q is not None and q.scale.size > 0 and picked.dtype in (np.int8, np.uint8)
    if hybrid and want == np.float32:
        return _dequantize_rows(ids, picked, q)
    return picked


def _dequantize_rows(ids: np.ndarray, picked: np.ndarray, q) -> np.ndarray:
    """Hybrid lookup: an int8 (or uint8, read as int8 like LiteRT) table times its scale."""
    if np.any(q.zero_point != 0):
        raise OpError("EMBEDDING_LOOKUP: a hybrid table must have zero point 0")
    scale = q.scale.astype(np.float32)
    row_scale = scale[ids] if scale.size > 1 else np.full(ids.shape, scale[0], np.float32)
    values = picked.view(np.int8).astype(np.float32)
    return values * row_scale.reshape((-1,) + (1,) * (values.ndim - 1))


def _embedding_lookup_version(op) -> int:
    t = op.inputs[1] if len(op.inputs) > 1 else None
    if t is not None and t.dtype == DType.INT4:
        return 4
    if t is not None and t.quantization is not None and t.quantization.scale.size > 1:
        return 4
    return 1


# -- WHERE / SCATTER_ND / DYNAMIC_UPDATE_SLICE -------------------------------------------------

def _where(call: KernelCall, cond: np.ndarray, *rest: np.ndarray):
    if rest:
        raise OpError("WHERE: only the one-input form (coordinates of true elements) exists in LiteRT")
    if cond.ndim == 0:
        raise OpError("WHERE: the condition must have rank > 0")
    if cond.dtype.kind not in "biuf":
        raise OpError(f"WHERE: condition type {cond.dtype} is not supported")
    return np.argwhere(cond).astype(np.int64)


def _scatter_nd(call: KernelCall, indices: np.ndarray, updates: np.ndarray, shape: np.ndarray):
    if indices.dtype != np.int32 or shape.dtype != np.int32:
        raise OpError(f"SCATTER_ND: indices and shape must be int32, got {indices.dtype} and {shape.dtype}")
    out_shape = int_values(shape, "SCATTER_ND", "shape")
    if indices.ndim < 1 or updates.ndim < 1 or shape.ndim != 1:
        raise OpError("SCATTER_ND: indices and updates need rank >= 1 and shape must be a vector")
    outer = indices.ndim - 1
    nd = indices.shape[-1]
    if (updates.shape[:outer] != indices.shape[:outer]
            or list(updates.shape[outer:]) != out_shape[nd:]):
        raise OpError(
            f"SCATTER_ND: updates shape {list(updates.shape)} does not match indices "
            f"{list(indices.shape)} and output shape {out_shape}"
        )
    for k in range(nd):
        _check_bounds(indices[..., k], out_shape[k], "SCATTER_ND", f"index (component {k})")
    out = np.zeros(out_shape, dtype=updates.dtype)
    idx = tuple(indices[..., k].reshape(-1).astype(np.intp) for k in range(nd))
    flat_updates = updates.reshape((-1,) + updates.shape[outer:])
    if out.dtype == np.bool_:
        np.logical_or.at(out, idx, flat_updates)
    else:
        np.add.at(out, idx, flat_updates)  # duplicates accumulate in index order, like LiteRT
    return out


_SPARSE_VALUE_TYPES = tuple(np.dtype(t) for t in (np.float32, np.int32, np.int64, np.int8, np.uint8))


def _sparse_to_dense(call: KernelCall, indices, output_shape, values, default):
    """A dense tensor of ``default`` with ``values`` at ``indices`` (a later index wins),
    with LiteRT's checks; an index outside the output is an error (LiteRT writes past it)."""
    op = "SPARSE_TO_DENSE"
    for arr, what in ((indices, "indices"), (output_shape, "output_shape")):
        if arr.dtype not in (np.int32, np.int64):
            raise OpError(f"{op}: {what} must be int32 or int64, got {arr.dtype}")
    shape = int_values(output_shape, op, "output_shape")
    if output_shape.ndim != 1 or len(shape) > 4 or any(d < 0 for d in shape):
        raise OpError(f"{op}: output_shape must be a vector of at most 4 sizes >= 0, got {shape}")
    if values.dtype not in _SPARSE_VALUE_TYPES or default.dtype != values.dtype or default.size != 1:
        raise OpError(f"{op}: values ({values.dtype}) and a one-element default ({default.dtype}, "
                      f"{default.size} elements) must share one of float32, int32, int64, int8, uint8")
    if indices.ndim > 2 or values.ndim > 1:
        raise OpError(f"{op}: indices must have rank <= 2 and values rank <= 1, got {indices.ndim} and {values.ndim}")
    points = indices.reshape(-1, 1) if indices.ndim < 2 else indices
    if points.shape[1] != len(shape) or (values.ndim == 1 and values.shape[0] != points.shape[0]):
        raise OpError(f"{op}: indices {list(indices.shape)}, values {list(values.shape)} and output shape "
                      f"{shape} do not agree")
    for k, size in enumerate(shape):
        _check_bounds(points[:, k], size, op, f"index (component {k})")
    out = np.full(shape, default.reshape(()), values.dtype)
    if points.shape[0]:
        flat = np.ravel_multi_index(tuple(points.T.astype(np.intp)), shape)
        _, last = np.unique(flat[::-1], return_index=True)  # the last write to each position wins
        keep = points.shape[0] - 1 - last
        out.reshape(-1)[flat[keep]] = np.broadcast_to(values, (points.shape[0],))[keep]
    return out


def _sparse_to_dense_version(op) -> int:
    t = input_dtype(op, 2)
    return 3 if t in (DType.INT8, DType.UINT8) else 2 if t == DType.INT64 else 1


def _dynamic_update_slice(call: KernelCall, operand: np.ndarray, update: np.ndarray,
                          start: np.ndarray):
    if start.dtype not in (np.int32, np.int64):
        raise OpError(f"DYNAMIC_UPDATE_SLICE: start indices must be int32 or int64, got {start.dtype}")
    s = int_values(start, "DYNAMIC_UPDATE_SLICE", "start_indices")
    if start.ndim != 1 or len(s) != operand.ndim or update.ndim != operand.ndim:
        raise OpError(
            f"DYNAMIC_UPDATE_SLICE: operand {list(operand.shape)}, update {list(update.shape)} and "
            f"{len(s)} start indices do not agree in rank"
        )
    if any(u > d for u, d in zip(update.shape, operand.shape)):
        raise OpError(f"DYNAMIC_UPDATE_SLICE: update {list(update.shape)} is larger than operand {list(operand.shape)}")
    if update.dtype != operand.dtype:
        raise OpError(f"DYNAMIC_UPDATE_SLICE: update type {update.dtype} differs from operand type {operand.dtype}")
    # Start indices are clamped so the update lies inside the operand (XLA semantics).
    s = [_clamp(v, 0, d - u) for v, d, u in zip(s, operand.shape, update.shape)]
    out = operand.copy()
    out[tuple(slice(v, v + u) for v, u in zip(s, update.shape))] = update
    return out


def _dynamic_update_slice_version(op) -> int:
    t = input_dtype(op, 0)
    table = {DType.BFLOAT16: 6, DType.INT4: 5, DType.INT16: 4, DType.FLOAT16: 3}
    if t in table:
        return table[t]
    return 2 if input_dtype(op, 2) == DType.INT64 else 1


# -- ONE_HOT / UNIQUE -------------------------------------------------------------------------

def one_hot(xp, call: KernelCall, indices, depth, on, off):
    """ONE_HOT over array namespace ``xp`` (kiln.xla lowers it with ``depth`` static)."""
    if indices.dtype not in (np.int32, np.int64):
        raise OpError(f"ONE_HOT: indices must be int32 or int64, got {indices.dtype}")
    d = int_scalar(depth, "ONE_HOT", "depth")
    if d < 0:
        raise OpError(f"ONE_HOT: depth {d} must be non-negative")
    if on.size != 1 or off.size != 1 or on.dtype != off.dtype:
        raise OpError("ONE_HOT: on_value and off_value must be scalars of the same type")
    axis = indices.ndim if call.opts.axis == -1 else call.opts.axis
    if not 0 <= axis <= indices.ndim:
        raise OpError(f"ONE_HOT: axis {call.opts.axis} is out of range for rank-{indices.ndim} indices")
    hot = xp.expand_dims(indices, axis) == xp.arange(d).reshape([-1] + [1] * (indices.ndim - axis))
    return xp.where(hot, on.reshape(()), off.reshape(())).astype(on.dtype)


def _unique(call: KernelCall, x: np.ndarray):
    if x.ndim != 1:
        raise OpError(f"UNIQUE: input must be a vector, got shape {list(x.shape)}")
    if call.opts.idx_out_type not in (DType.INT32, DType.INT64):
        raise OpError(f"UNIQUE: idx_out_type must be INT32 or INT64, got {call.opts.idx_out_type}")
    idx_type = DType(call.opts.idx_out_type).numpy
    if x.size == 0:
        return x.copy(), np.zeros(0, idx_type)
    _, first, inverse = np.unique(x, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # unique values in order of first appearance
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return x[first[order]], rank[inverse.reshape(-1)].astype(idx_type)


# -- MATRIX_DIAG / MATRIX_SET_DIAG ----------------------------------------------------------

def _matrix_diag(call: KernelCall, diag: np.ndarray):
    if diag.ndim < 1:
        raise OpError("MATRIX_DIAG: input must have rank >= 1")
    n = diag.shape[-1]
    out = np.zeros(diag.shape + (n,), dtype=diag.dtype)
    i = np.arange(n)
    out[..., i, i] = diag
    return out


def _matrix_set_diag(call: KernelCall, x: np.ndarray, diag: np.ndarray):
    if x.ndim < 2:
        raise OpError("MATRIX_SET_DIAG: input must have rank >= 2")
    k = min(x.shape[-2:])
    if diag.shape != x.shape[:-2] + (k,):
        raise OpError(f"MATRIX_SET_DIAG: diagonal shape {list(diag.shape)} does not fit input {list(x.shape)}")
    out = x.copy()
    i = np.arange(k)
    out[..., i, i] = diag
    return out


# -- records -------------------------------------------------------------------------------

def _movement(name: str, kernel, **kw) -> OpDef:
    """A record whose kernel moves raw values, so it serves quantized tensors too."""
    kw.setdefault("quantized", on_codes(kernel))
    return OpDef(name, kernel, **kw)


OPS = (
    _movement("SLICE", _slice, options=OptionsSpec("SliceOptions"), version=_slice_version,
              max_version=8,
              runtime_versions=("1.14.0", "1.14.0", "1.14.0", "2.4.0", "2.5.0", "2.14.0", "2.21.0",
                                UNLISTED),
                                quantization=same()),
    _movement("STRIDED_SLICE", _strided_slice,
              options=OptionsSpec("StridedSliceOptions", {
                  "begin_mask": 0, "end_mask": 0, "ellipsis_mask": 0, "new_axis_mask": 0,
                  "shrink_axis_mask": 0, "offset": False,
              }),
              version=_strided_slice_version, max_version=8,
              runtime_versions=("1.6.0", "1.14.0", "2.1.0", "2.2.0", "2.5.0", "2.6.0", "2.14.0",
                                "2.14.0"),
                                quantization=same()),
    _movement("GATHER", _gather, options=OptionsSpec("GatherOptions", {"axis": 0, "batch_dims": 0}),
              version=_gather_version, max_version=8,
              runtime_versions=("1.6.0", "1.14.0", "1.15.0", "2.4.0", "2.5.0", "2.13.0", "2.15.0",
                                UNLISTED),
                                quantization=same(table=True),
                                types=takes("bool float16 float32 int8 uint8 int16 int32 int64 string")),
    _movement("GATHER_ND", _gather_nd, options=OptionsSpec("GatherNdOptions"),
              version=_gather_nd_version, max_version=6,
              runtime_versions=("1.14.0", "2.3.0", "2.5.0", "2.13.0", "2.16.0", UNLISTED),
              types=takes("bool float16 float32 int8 uint8 int16 int32 int64 string")),
    OpDef("EMBEDDING_LOOKUP", _embedding_lookup,
          version=_embedding_lookup_version, max_version=5,
          quantized={**on_codes(_embedding_lookup), HYBRID: _embedding_lookup},
          runtime_versions=("1.13.0", "1.14.0", "1.14.0", "2.18.0", "2.21.0")),
    _movement("WHERE", _where, options=OptionsSpec("WhereOptions"),
              version=lambda op: 1 if input_dtype(op, 0) == DType.BOOL else 2, max_version=2,
              runtime_versions=("1.14.0", "2.8.0")),
    _movement("SCATTER_ND", _scatter_nd, options=OptionsSpec("ScatterNdOptions"),
              runtime_versions=("2.1.0",), types=takes("bool float32 int8 uint8 int32 int64"), typed_operand=1),
    _movement("SPARSE_TO_DENSE", _sparse_to_dense, options=OptionsSpec("SparseToDenseOptions"),
              version=_sparse_to_dense_version, max_version=3,
              runtime_versions=("1.9.0", "1.14.0", "1.15.0")),
    _movement("DYNAMIC_UPDATE_SLICE", _dynamic_update_slice,
              options=OptionsSpec("DynamicUpdateSliceOptions"),
              version=_dynamic_update_slice_version, max_version=6,
              runtime_versions=("2.9.0", "2.17.0", "2.19.0", "2.20.0", "2.21.0", "2.22.0")),
    _movement("ONE_HOT", on_numpy(one_hot), options=OptionsSpec("OneHotOptions", {"axis": 0}),
              runtime_versions=("1.11.0",)),
    _movement("UNIQUE", _unique, options=OptionsSpec("UniqueOptions", {"idx_out_type": 2}),
              runtime_versions=("1.14.0",), types=takes("float32 int8 uint8 int16 int32 int64")),
    _movement("MATRIX_DIAG", _matrix_diag, options=OptionsSpec("MatrixDiagOptions"),
              runtime_versions=("1.14.0",)),
    _movement("MATRIX_SET_DIAG", _matrix_set_diag, options=OptionsSpec("MatrixSetDiagOptions"),
              runtime_versions=("1.14.0",)),
)
