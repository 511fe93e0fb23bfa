"""Op family: shape and data movement (reshape, transpose, concat, split, pad, tile ...).

These ops move elements without computing on them, so LiteRT runs them on the raw storage
of any element type: integer-quantized tensors pass through unchanged (their scale and zero
point ride along on the tensors). Each kernel therefore also serves as the op's quantized
kernel; the two places where LiteRT does look at quantization are handled explicitly:
CONCATENATION requantizes uint8 inputs whose scale differs from the output's, and PAD
fills with the output's zero point.

Shape and parameter errors are reported as ``OpError`` naming the op and the offending
value, in the spirit of LiteRT's Prepare() checks.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import OpError
from ..schema import DType, MirrorPadMode
from ..kernels import elementwise as elementwise_kernels
from .record import (
    FIXED_SIZE,
    UNLISTED,
    KernelCall,
    OpDef,
    OptionsSpec,
    apply_activation,
    input_dtype,
    input_rank,
    on_codes,
    on_numpy,
    output_dtype,
    takes,
)
from .traits import requantize, same

# -- helpers shared with indexing.py ---------------------------------------------------------

_INDEX_KINDS = "iu"


def int_values(arr: np.ndarray | None, op: str, what: str) -> list[int]:
    """The elements of an integer operand (shape, axis, perm ...) as Python ints."""
    if arr is None:
        raise OpError(f"{op}: the {what} operand is missing")
    a = np.asarray(arr)
    if a.dtype.kind not in _INDEX_KINDS:
        raise OpError(f"{op}: {what} must be an integer tensor, got {a.dtype}")
    return a.reshape(-1).tolist()


def int_scalar(arr: np.ndarray | None, op: str, what: str) -> int:
    """A one-element integer operand (an axis, a depth ...) as a Python int."""
    values = int_values(arr, op, what)
    if len(values) != 1:
        raise OpError(f"{op}: {what} must hold exactly one value, got {len(values)}")
    return values[0]


def dense(a) -> np.ndarray:
    """A C-contiguous ndarray (0-d stays 0-d, unlike np.ascontiguousarray)."""
    a = np.asarray(a)
    return a if a.flags.c_contiguous else a.copy(order="C")


def norm_axis(axis: int, rank: int, op: str, what: str = "axis") -> int:
    """Map a possibly negative axis into [0, rank), or raise."""
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < rank:
        raise OpError(f"{op}: {what} {axis} is out of range for a rank-{rank} input")
    return a


def node_outputs(call: KernelCall) -> int | None:
    """How many outputs the node declares (None when the kernel runs outside a model)."""
    n = len(call.op.outputs) if call.op is not None else 0
    return n or None


def _qparams(call: KernelCall, i: int, output: bool = False):
    """(scale, zero_point) of a per-tensor quantized operand, else None."""
    tensors = call.op.outputs if output else call.op.inputs
    t = tensors[i] if i < len(tensors) else None
    q = None if t is None else t.quantization
    if q is None or q.scale.size == 0:
        return None
    return float(q.scale[0]), int(q.zero_point[0]) if q.zero_point.size else 0


def _first_input_version(table: dict[DType, int], default: int = 1):
    def rule(op) -> int:
        return table.get(input_dtype(op, 0), default)
    return rule


# -- RESHAPE / SQUEEZE / EXPAND_DIMS -----------------------------------------------------------

def resolve_reshape(in_shape: Sequence[int], new_shape: Sequence[int], op: str = "RESHAPE"):
    """LiteRT's reshape contract: at most one -1, other dims >= 0, equal element counts.

    A -1 takes input elements / other output dims, counting only non-zero dims, so that
    reshaping an empty tensor still works (LiteRT's reshape_utils.h).
    """
    out = [int(d) for d in new_shape]
    stretch = [i for i, d in enumerate(out) if d == -1]
    if len(stretch) > 1:
        raise OpError(f"{op}: new shape {out} has more than one -1 dimension")
    if any(d < -1 for d in out):
        raise OpError(f"{op}: new shape {out} contains a negative dimension")
    n_in = int(np.prod(in_shape, dtype=np.int64))
    if stretch:
        nonzero_in = int(np.prod([d for d in in_shape if d != 0], dtype=np.int64))
        rest = [d for i, d in enumerate(out) if i != stretch[0]]
        nonzero_out = int(np.prod([d for d in rest if d != 0], dtype=np.int64))
        if n_in == 0 and int(np.prod(rest, dtype=np.int64)) != 0:
            out[stretch[0]] = 0
        else:
            out[stretch[0]] = nonzero_in // nonzero_out
    n_out = int(np.prod(out, dtype=np.int64))
    if n_out != n_in:
        raise OpError(
            f"{op}: cannot reshape {list(in_shape)} ({n_in} elements) into {list(new_shape)} "
            f"({n_out} elements)"
        )
    return tuple(out)


def _reshape_target(call: KernelCall, shape: np.ndarray | None) -> list[int]:
    """New shape: the 2nd input when it is an int32 vector (as LiteRT), else options."""
    if shape is not None and shape.ndim == 1 and shape.dtype == np.int32:
        return int_values(shape, "RESHAPE", "shape")
    params = list(call.opts.new_shape or ())
    if params == [0]:  # legacy converters wrote [0] for a scalar result
        params = []
    if not params and shape is not None and shape.ndim == 1 and shape.dtype.kind in "iu":
        return int_values(shape, "RESHAPE", "shape")  # int64 vector: kiln also accepts it
    return params


def _reshape(call: KernelCall, x: np.ndarray, shape: np.ndarray | None = None):
    return x.reshape(resolve_reshape(x.shape, _reshape_target(call, shape)))


def _squeeze(call: KernelCall, x: np.ndarray):
    dims = list(call.opts.squeeze_dims or ())
    if not dims:
        return x.reshape([d for d in x.shape if d != 1])
    drop = {norm_axis(d, x.ndim, "SQUEEZE", "squeeze dim") for d in dims}
    for d in sorted(drop):
        if x.shape[d] != 1:
            raise OpError(f"SQUEEZE: dimension {d} of input shape {list(x.shape)} is not 1")
    return x.reshape([n for i, n in enumerate(x.shape) if i not in drop])


def _expand_dims(call: KernelCall, x: np.ndarray, axis: np.ndarray):
    a = int_scalar(axis, "EXPAND_DIMS", "axis")
    pos = a + x.ndim + 1 if a < 0 else a
    if not 0 <= pos <= x.ndim:
        raise OpError(f"EXPAND_DIMS: axis {a} is out of range for a rank-{x.ndim} input")
    return x.reshape(x.shape[:pos] + (1,) + x.shape[pos:])


# -- TRANSPOSE ------------------------------------------------------------------------------

def _transpose(call: KernelCall, x: np.ndarray, perm: np.ndarray):
    return dense(np.transpose(x, transpose_perm(x, perm)))


def transpose_perm(x: np.ndarray, perm: np.ndarray) -> list[int]:
    p = int_values(perm, "TRANSPOSE", "perm")
    if len(p) != x.ndim:
        raise OpError(f"TRANSPOSE: perm {p} has {len(p)} entries for a rank-{x.ndim} input")
    p = [norm_axis(v, x.ndim, "TRANSPOSE", "perm entry") for v in p]
    if sorted(p) != list(range(x.ndim)):
        raise OpError(f"TRANSPOSE: perm {p} is not a permutation of 0..{x.ndim - 1}")
    return p


def _transpose_version(op) -> int:
    t, rank = input_dtype(op, 0), input_rank(op, 0)
    if t == DType.FLOAT16:
        return 9
    if rank > 6 or t == DType.BFLOAT16:
        return 8
    if t == DType.INT4:
        return 7
    if rank > 5:
        return 6
    if t == DType.INT16:
        return 5
    if rank > 4:
        return 4
    return {DType.BOOL: 3, DType.INT8: 2}.get(t, 1)


# -- CONCATENATION / PACK / UNPACK -----------------------------------------------------------

def _requantize_u8(q: np.ndarray, src: tuple[float, int], dst: tuple[float, int]) -> np.ndarray:
    """LiteRT's ConcatenationWithScaling for one uint8 input: rescale into the output's grid."""
    scale = np.float32(src[0]) * np.float32(1.0 / np.float32(dst[0]))
    bias = np.float32(-src[1]) * scale
    v = q.astype(np.float32) * scale + bias
    v = np.trunc(v + np.copysign(np.float32(0.5), v))  # std::round: half away from zero
    return np.clip(v.astype(np.int32) + dst[1], 0, 255).astype(np.uint8)


def _concat_quantized(call: KernelCall, xs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Bring quantized inputs onto the output's scale where LiteRT does (uint8 only)."""
    out_q = _qparams(call, 0, output=True)
    if out_q is None:
        return list(xs)
    res = []
    for i, x in enumerate(xs):
        q = _qparams(call, i)
        if q is None or q == out_q:
            res.append(x)
        elif x.dtype == np.uint8:
            res.append(_requantize_u8(x, q, out_q))
        elif x.dtype == np.int8:
            raise OpError(
                f"CONCATENATION: int8 input {i} has scale/zero point {q} but the output has "
                f"{out_q}; LiteRT requires them equal"
            )
        else:
            res.append(x)  # int16: LiteRT copies the raw values
    return res


def _concatenation(call: KernelCall, *xs: np.ndarray):
    if not xs:
        raise OpError("CONCATENATION: needs at least one input")
    rank = xs[0].ndim
    if any(x.ndim != rank for x in xs):
        raise OpError(f"CONCATENATION: inputs have different ranks {[x.ndim for x in xs]}")
    if any(x.dtype != xs[0].dtype for x in xs):
        raise OpError(f"CONCATENATION: inputs have different types {[str(x.dtype) for x in xs]}")
    xs = _concat_quantized(call, xs)
    if rank == 0:  # LiteRT stacks scalars into a vector
        if call.opts.axis not in (0, -1):
            raise OpError(f"CONCATENATION: axis {call.opts.axis} is invalid for scalar inputs")
        out = np.stack(xs)
    else:
        axis = norm_axis(call.opts.axis, rank, "CONCATENATION")
        for i, x in enumerate(xs):
            if x.shape[:axis] + x.shape[axis + 1:] != xs[0].shape[:axis] + xs[0].shape[axis + 1:]:
                raise OpError(
                    f"CONCATENATION: input {i} shape {list(x.shape)} does not match input 0 "
                    f"shape {list(xs[0].shape)} outside axis {axis}"
                )
        out = np.concatenate(xs, axis=axis)
    act = call.opts.fused_activation_function
    if act:
        if out.dtype.kind != "f":
            raise OpError("CONCATENATION: a fused activation needs float inputs")
        # LiteRT itself rejects a fused activation here; kiln applies it (TF semantics).
        out = apply_activation(out, act)
    return out


def _concat_version(op) -> int:
    table = {DType.FLOAT16: 6, DType.INT4: 5, DType.UINT32: 4, DType.INT16: 3, DType.INT8: 2}
    return table.get(input_dtype(op, 0), 1)


def _pack(call: KernelCall, *xs: np.ndarray):
    if not xs:
        raise OpError("PACK: needs at least one input")
    n = call.opts.values_count
    if n and n != len(xs):
        raise OpError(f"PACK: values_count is {n} but the node has {len(xs)} inputs")
    if any(x.shape != xs[0].shape for x in xs):
        raise OpError(f"PACK: inputs have different shapes {[list(x.shape) for x in xs]}")
    axis = norm_axis(call.opts.axis, xs[0].ndim + 1, "PACK")
    return np.stack(xs, axis=axis)


def _pack_version(op) -> int:
    t = input_dtype(op, 0)
    if t == DType.INT8:
        return 2
    if t == DType.INT16 and output_dtype(op, 0) == DType.INT16:
        return 3
    return 4 if t == DType.UINT32 else 1


def _unpack(call: KernelCall, x: np.ndarray):
    if x.ndim == 0:
        raise OpError("UNPACK: input must have rank >= 1")
    axis = norm_axis(call.opts.axis, x.ndim, "UNPACK")
    n = x.shape[axis]
    if call.opts.num and call.opts.num != n:
        raise OpError(f"UNPACK: num is {call.opts.num} but axis {axis} has size {n}")
    moved = np.moveaxis(x, axis, 0)
    return tuple(dense(moved[i]) for i in range(n))


def _unpack_version(op) -> int:
    t = input_dtype(op, 0)
    if t in (DType.INT8, DType.UINT8):
        return 2
    if t == DType.BOOL:
        return 3
    if t == DType.INT16 and output_dtype(op, 0) == DType.INT16:
        return 4
    return 5 if t in (DType.FLOAT16, DType.BFLOAT16) else 1


# -- SPLIT / SPLIT_V ----------------------------------------------------------------------

def _split_at(x: np.ndarray, axis: int, sizes: Sequence[int]):
    parts = np.split(x, np.cumsum(sizes)[:-1], axis=axis)
    return tuple(dense(p) for p in parts)


def _split(call: KernelCall, axis: np.ndarray, x: np.ndarray):
    """SPLIT takes the axis as input 0 and the value as input 1 (TF's operand order)."""
    a = norm_axis(int_scalar(axis, "SPLIT", "axis"), x.ndim, "SPLIT")
    declared = node_outputs(call)
    n = call.opts.num_splits or declared or 0
    if declared is not None and declared != n:
        raise OpError(f"SPLIT: num_splits is {n} but the node has {declared} outputs")
    if n <= 0 or x.shape[a] % n:
        raise OpError(f"SPLIT: dimension {a} of size {x.shape[a]} does not split into {n} equal parts")
    return _split_at(x, a, [x.shape[a] // n] * n)


def _split_version(op) -> int:
    return {DType.INT16: 4, DType.INT32: 3, DType.INT8: 2}.get(input_dtype(op, 1), 1)


def _split_v(call: KernelCall, x: np.ndarray, size_splits: np.ndarray, axis: np.ndarray):
    a = norm_axis(int_scalar(axis, "SPLIT_V", "axis"), x.ndim, "SPLIT_V")
    sizes = int_values(size_splits, "SPLIT_V", "size_splits")
    declared = node_outputs(call)
    if declared is not None and len(sizes) != declared:
        raise OpError(f"SPLIT_V: {len(sizes)} size_splits for {declared} outputs")
    unknown = [i for i, s in enumerate(sizes) if s == -1]
    if len(unknown) > 1:
        raise OpError(f"SPLIT_V: size_splits {sizes} contains more than one -1")
    if any(s < -1 for s in sizes):
        raise OpError(f"SPLIT_V: size_splits {sizes} contains a negative size")
    known = sum(s for s in sizes if s != -1)
    if unknown:
        if known > x.shape[a]:
            raise OpError(f"SPLIT_V: size_splits {sizes} add up to more than dimension {a} ({x.shape[a]})")
        sizes[unknown[0]] = x.shape[a] - known
    elif known != x.shape[a]:
        raise OpError(f"SPLIT_V: size_splits {sizes} must add up to dimension {a} ({x.shape[a]})")
    return _split_at(x, a, sizes)


# -- TILE / BROADCAST_TO / SHAPE / FILL / RANGE -----------------------------------------------

def _tile(call: KernelCall, x: np.ndarray, multiples: np.ndarray):
    m = int_values(multiples, "TILE", "multiples")
    if len(m) != x.ndim:
        raise OpError(f"TILE: {len(m)} multiples for a rank-{x.ndim} input")
    if any(v < 0 for v in m):
        raise OpError(f"TILE: multiples {m} must be non-negative")
    return np.tile(x, m) if x.ndim else x.copy()


def _broadcast_to(call: KernelCall, x: np.ndarray, shape: np.ndarray):
    target = int_values(shape, "BROADCAST_TO", "shape")
    if len(target) < x.ndim:
        raise OpError(f"BROADCAST_TO: target shape {target} has lower rank than input {list(x.shape)}")
    try:
        out = np.broadcast_to(x, target)
    except ValueError:
        raise OpError(f"BROADCAST_TO: input shape {list(x.shape)} cannot broadcast to {target}") from None
    return dense(out)


def _broadcast_to_version(op) -> int:
    return 3 if input_dtype(op, 0) in (DType.INT8, DType.INT16) else 2


def _broadcast_args(call: KernelCall, s0: np.ndarray, s1: np.ndarray):
    """The shape two shapes broadcast to (as TF's BroadcastArgs, emitted for dynamic shapes)."""
    if s0.dtype != s1.dtype or s0.dtype not in (np.int32, np.int64):
        raise OpError(f"BROADCAST_ARGS: shapes must both be int32 or int64, got {s0.dtype} and {s1.dtype}")
    if s0.ndim != 1 or s1.ndim != 1:
        raise OpError("BROADCAST_ARGS: both shapes must be vectors")
    a, b = s0.tolist(), s1.tolist()
    n = max(len(a), len(b))
    a, b = [1] * (n - len(a)) + a, [1] * (n - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            raise OpError(f"BROADCAST_ARGS: shapes {s0.tolist()} and {s1.tolist()} are incompatible")
        out.append(y if x == 1 else x)
    return np.asarray(out, dtype=s0.dtype)


def _shape(call: KernelCall, x: np.ndarray):
    """Output type: the output tensor's, as LiteRT reads it (else options.out_type)."""
    dt = call.out_dtypes[0] if call.out_dtypes else None
    if dt not in (np.dtype(np.int32), np.dtype(np.int64)):
        dt = np.dtype(np.int64) if call.opts.out_type == DType.INT64 else np.dtype(np.int32)
    return np.asarray(x.shape, dtype=dt)


def fill(xp, call: KernelCall, dims, value):
    """FILL over array namespace ``xp`` (NumPy here, jax.numpy in kiln.xla; dims are static)."""
    shape = int_values(dims, "FILL", "dims")
    if any(d < 0 for d in shape):
        raise OpError(f"FILL: dims {shape} must be non-negative")
    if np.size(value) != 1:
        raise OpError(f"FILL: value must be a scalar, got shape {list(np.shape(value))}")
    return xp.full(shape, xp.asarray(value).reshape(()), dtype=value.dtype)


def _fill_version(op) -> int:
    t = input_dtype(op, 1)
    if t == DType.FLOAT16:
        return 4
    if t in (DType.INT8, DType.INT16):
        return 3
    return 2 if t in (DType.BOOL, DType.STRING) else 1


def _range(call: KernelCall, start: np.ndarray, limit: np.ndarray, delta: np.ndarray):
    if not (start.dtype == limit.dtype == delta.dtype):
        raise OpError(f"RANGE: start/limit/delta types differ ({start.dtype}, {limit.dtype}, {delta.dtype})")
    if start.dtype not in (np.float32, np.int32, np.int64):
        raise OpError(f"RANGE: type {start.dtype} is not supported (float32, int32, int64)")
    if any(np.ndim(v) != 0 for v in (start, limit, delta)):
        raise OpError("RANGE: start, limit and delta must be scalars")
    s, lim, d = start[()], limit[()], delta[()]
    if d == 0:
        raise OpError("RANGE: delta must not be zero")
    if not ((s >= lim and d < 0) or (s <= lim and d > 0)):
        raise OpError(f"RANGE: delta {d} does not move start {s} towards limit {lim}")
    if start.dtype.kind == "f":
        n = int(np.ceil(np.abs((lim - s) / d)))
        # LiteRT accumulates value += delta in float32; cumsum does the same sequentially.
        steps = np.full(n, d, dtype=np.float32)
        if n:
            steps[0] = s
        out = np.cumsum(steps, dtype=np.float32)
    else:
        span, step = abs(int(lim) - int(s)), abs(int(d))
        n = (span + step - 1) // step
        out = (int(s) + np.arange(n, dtype=np.int64) * int(d)).astype(start.dtype)
    return out


def _range_version(op) -> int:
    return 2 if input_dtype(op, 0) == DType.INT64 else 1


# -- PAD / PADV2 / MIRROR_PAD ----------------------------------------------------------------

def _paddings(x: np.ndarray, paddings: np.ndarray, op: str) -> list[tuple[int, int]]:
    p = np.asarray(paddings)
    if p.dtype.kind not in _INDEX_KINDS:
        raise OpError(f"{op}: paddings must be an integer tensor, got {p.dtype}")
    if p.ndim != 2 or p.shape != (x.ndim, 2):
        raise OpError(f"{op}: paddings must have shape [{x.ndim}, 2], got {list(p.shape)}")
    pairs = [(int(a), int(b)) for a, b in p.tolist()]
    if any(a < 0 or b < 0 for a, b in pairs):
        raise OpError(f"{op}: paddings {pairs} must be non-negative")
    return pairs


def _pad_fill(x: np.ndarray, pairs, value) -> np.ndarray:
    out = np.full([d + a + b for d, (a, b) in zip(x.shape, pairs)], value, dtype=x.dtype)
    out[tuple(slice(a, a + d) for d, (a, _) in zip(x.shape, pairs))] = x
    return out


def _pad(call: KernelCall, x: np.ndarray, paddings: np.ndarray):
    pairs = _paddings(x, paddings, "PAD")
    q = _qparams(call, 0, output=True)
    value = q[1] if q is not None and x.dtype.kind in "iu" else 0  # quantized zero is the zero point
    return _pad_fill(x, pairs, value)


def _padv2(call: KernelCall, x: np.ndarray, paddings: np.ndarray, constant: np.ndarray | None = None):
    """PAD with an explicit fill value (input 2); without one it is plain PAD."""
    if constant is None:
        return _pad(call, x, paddings)
    pairs = _paddings(x, paddings, "PADV2")
    if constant.size != 1:
        raise OpError(f"PADV2: constant_values must hold one value, got {constant.size}")
    if constant.dtype != x.dtype:
        raise OpError(f"PADV2: constant_values type {constant.dtype} differs from input type {x.dtype}")
    q_out, q_c = _qparams(call, 0, output=True), _qparams(call, 2)
    if q_out is not None and x.dtype.kind in "iu" and q_c is not None and q_c != q_out:
        raise OpError(f"PADV2: constant_values quantization {q_c} must equal the output's {q_out}")
    return _pad_fill(x, pairs, constant.reshape(()))


def _pad_version(op) -> int:
    t = input_dtype(op, 0)
    if t == DType.BOOL:
        return 5
    if input_rank(op, 0) > 4:
        return 4
    return {DType.INT16: 3, DType.INT8: 2}.get(t, 1)


def _mirror_pad(call: KernelCall, x: np.ndarray, paddings: np.ndarray):
    pairs = _paddings(x, paddings, "MIRROR_PAD")
    mode = call.opts.mode
    if mode not in (MirrorPadMode.REFLECT, MirrorPadMode.SYMMETRIC):
        raise OpError(f"MIRROR_PAD: unknown mode {mode}")
    offset = 1 if mode == MirrorPadMode.REFLECT else 0
    for d, (a, b) in zip(x.shape, pairs):
        if max(a, b) > d - offset:
            raise OpError(
                f"MIRROR_PAD: paddings {pairs} exceed input size {d} minus the mode offset {offset}"
            )
    if x.ndim == 0:
        return x.copy()
    return np.pad(x, pairs, mode="reflect" if offset else "symmetric")


# -- REVERSE_V2 / REVERSE_SEQUENCE ------------------------------------------------------------

def _reverse_v2(call: KernelCall, x: np.ndarray, axis: np.ndarray):
    axes = tuple(sorted({norm_axis(a, x.ndim, "REVERSE_V2") for a in int_values(axis, "REVERSE_V2", "axis")}))
    return dense(np.flip(x, axes)) if axes else x.copy()


def _reverse_v2_version(op) -> int:
    return {DType.INT8: 3, DType.BOOL: 2}.get(input_dtype(op, 0), 1)


def _reverse_sequence(call: KernelCall, x: np.ndarray, seq_lengths: np.ndarray):
    seq_dim, batch_dim = call.opts.seq_dim, call.opts.batch_dim
    for name, d in (("seq_dim", seq_dim), ("batch_dim", batch_dim)):
        if not 0 <= d < x.ndim:
            raise OpError(f"REVERSE_SEQUENCE: {name} {d} is out of range for a rank-{x.ndim} input")
    if seq_dim == batch_dim:
        raise OpError("REVERSE_SEQUENCE: seq_dim and batch_dim must differ")
    lengths = np.asarray(int_values(seq_lengths, "REVERSE_SEQUENCE", "seq_lengths"), np.int64)
    if seq_lengths.ndim != 1 or lengths.size != x.shape[batch_dim]:
        raise OpError(
            f"REVERSE_SEQUENCE: seq_lengths must be a vector of {x.shape[batch_dim]} lengths, "
            f"got shape {list(seq_lengths.shape)}"
        )
    if np.any(lengths < 0) or np.any(lengths > x.shape[seq_dim]):
        raise OpError(f"REVERSE_SEQUENCE: seq_lengths {lengths.tolist()} must lie in [0, {x.shape[seq_dim]}]")
    t = np.arange(x.shape[seq_dim])[None, :]
    n = lengths[:, None]
    src = np.where(t < n, n - 1 - t, t)  # [batch, seq]: which step each output step reads
    moved = np.moveaxis(x, (batch_dim, seq_dim), (0, 1))
    gathered = np.take_along_axis(moved, src.reshape(src.shape + (1,) * (x.ndim - 2)), axis=1)
    return dense(np.moveaxis(gathered, (0, 1), (batch_dim, seq_dim)))


def _bitcast(call: KernelCall, x: np.ndarray):
    """The bytes of ``x`` read as the output type: a wider input gains a last dim of the size
    ratio, a narrower one loses a last dim that must equal it (LiteRT's shape rule)."""
    out = np.dtype(call.out_dtypes[0])
    wide, narrow = x.itemsize, out.itemsize
    shape = x.shape + (wide // narrow,) if wide > narrow else x.shape
    if wide < narrow:
        if x.ndim == 0 or x.shape[-1] != narrow // wide:
            raise OpError(f"BITCAST: {x.dtype} to {out} needs a last dimension of {narrow // wide}, "
                          f"got shape {list(x.shape)}")
        shape = x.shape[:-1]
    return np.ascontiguousarray(x).reshape(-1).view(out).reshape(shape).copy()


# -- records -------------------------------------------------------------------------------

def _movement(name: str, kernel, **kw) -> OpDef:
    """A record whose kernel moves raw values, so it serves quantized tensors too."""
    kw.setdefault("quantized", on_codes(kernel))
    return OpDef(name, kernel, **kw)


OPS = (
    _movement("RESHAPE", _reshape, options=OptionsSpec("ReshapeOptions", {"new_shape": ()}),
              runtime_versions=("1.5.0",),
              quantization=same(),
              reshapes=True),
    _movement("SQUEEZE", _squeeze, options=OptionsSpec("SqueezeOptions", {"squeeze_dims": ()}),
              version=_first_input_version({DType.STRING: 2}), max_version=2,
              runtime_versions=("1.6.0", "2.5.0"),
              quantization=same(),
              reshapes=True),
    _movement("EXPAND_DIMS", _expand_dims, options=OptionsSpec("ExpandDimsOptions"),
              runtime_versions=("1.10.0",),
              quantization=same(),
              reshapes=True),
    _movement("TRANSPOSE", _transpose, options=OptionsSpec("TransposeOptions"),
              version=_transpose_version, max_version=9,
              runtime_versions=("1.6.0", "1.14.0", "1.15.0", "2.3.0", "2.4.0", "2.12.0", "2.14.4",
                                "2.22.0", UNLISTED),
                                quantization=same(), types=takes(FIXED_SIZE)),
    _movement("CONCATENATION", _concatenation,
              options=OptionsSpec("ConcatenationOptions", {"axis": 0, "fused_activation_function": 0}),
              version=_concat_version, max_version=7,
              quantized={**on_codes(_concatenation), **elementwise_kernels.CONCATENATION},
              runtime_versions=("1.5.0", "1.14.0", "2.3.0", "2.14.0", "2.21.0", UNLISTED, UNLISTED),
              quantization=requantize(), types=takes("bool float16 float32 int8 uint8 int16 int32 uint32 int64")),
    _movement("PACK", _pack, options=OptionsSpec("PackOptions", {"values_count": 0, "axis": 0}),
              version=_pack_version, max_version=5, quantized={**on_codes(_pack), **elementwise_kernels.PACK},
              runtime_versions=("1.11.0", "1.14.0", "2.3.0", "2.13.0", UNLISTED),
              quantization=requantize(), types=takes("float32 int8 uint8 int16 int32 uint32 int64")),
    _movement("UNPACK", _unpack, options=OptionsSpec("UnpackOptions", {"num": 0, "axis": 0}),
              version=_unpack_version, max_version=6,
              runtime_versions=("1.11.0", "1.14.0", "2.2.0", "2.3.0", "2.22.0", UNLISTED),
              types=takes("bool float16 float32 int8 uint8 int16 int32")),
    _movement("SPLIT", _split, options=OptionsSpec("SplitOptions", {"num_splits": 0}),
              version=_split_version, max_version=5,
              runtime_versions=("1.5.0", "1.14.0", "1.14.0", "2.3.0", UNLISTED),
              quantization=same(1), types=takes("float16 float32 int8 uint8 int16 int32 int64"), typed_operand=1),
    _movement("SPLIT_V", _split_v, options=OptionsSpec("SplitVOptions", {"num_splits": 0}),
              version=_first_input_version({DType.INT8: 2}), max_version=3,
              runtime_versions=("1.13.1", "2.3.0", UNLISTED),
              quantization=same(), types=takes("float32 int8 uint8 int16 int32 int64")),
    _movement("TILE", _tile, options=OptionsSpec("TileOptions"),
              version=_first_input_version({DType.INT8: 3, DType.STRING: 2}), max_version=3,
              runtime_versions=("1.10.1", "2.2.0", "2.8.0"),
              quantization=same()),
    _movement("BROADCAST_TO", _broadcast_to, options=OptionsSpec("BroadcastToOptions"),
              version=_broadcast_to_version, max_version=4,
              runtime_versions=(UNLISTED, "2.5.0", "2.5.0", UNLISTED),
              quantization=same(), types=takes(FIXED_SIZE)),
    OpDef("BROADCAST_ARGS", _broadcast_args,
          runtime_versions=("2.6.0",)),
    _movement("SHAPE", _shape, options=OptionsSpec("ShapeOptions", {"out_type": 0}),
              runtime_versions=("1.10.0",),
              reads_shape_only=True),
    _movement("FILL", on_numpy(fill), options=OptionsSpec("FillOptions"), version=_fill_version,
              max_version=5,
              runtime_versions=("1.13.0", "2.3.0", "2.5.0", "2.12.0", UNLISTED)),
    OpDef("RANGE", _range, options=OptionsSpec("RangeOptions"), version=_range_version,
          max_version=2,
          runtime_versions=("1.13.0", "2.14.0"), types=takes("float32 int32 int64")),
    _movement("PAD", _pad, options=OptionsSpec("PadOptions"), version=_pad_version, max_version=6,
              runtime_versions=("1.5.0", "1.14.0", "2.4.0", "2.6.0", "2.20.0", UNLISTED),
              quantization=same(), types=takes("bool float16 float32 int8 uint8 int16 int32 int64")),
    _movement("PADV2", _padv2, options=OptionsSpec("PadV2Options"), version=_pad_version,
              max_version=6,
              runtime_versions=("1.9.0", "1.14.0", "2.4.0", "2.6.0", "2.20.0", UNLISTED),
              quantization=same(0, 2),  # the pad value too: LiteRT wants its type
              types=takes("bool float16 float32 int8 uint8 int16 int32 int64")),
    _movement("MIRROR_PAD", _mirror_pad, options=OptionsSpec("MirrorPadOptions", {"mode": 0}),
              version=_first_input_version({DType.INT16: 3, DType.INT8: 2}), max_version=3,
              runtime_versions=("1.13.1", "2.3.0", "2.12.0"), types=takes(FIXED_SIZE)),
    _movement("REVERSE_V2", _reverse_v2, options=OptionsSpec("ReverseV2Options"),
              version=_reverse_v2_version, max_version=4,
              runtime_versions=("1.14.0", "2.2.0", "2.5.0", UNLISTED),
              quantization=same(), types=takes("bool float16 float32 int8 uint8 int16 int32 int64")),
    OpDef("BITCAST", _bitcast, runtime_versions=("2.13.0",)),
    _movement("REVERSE_SEQUENCE", _reverse_sequence,
              options=OptionsSpec("ReverseSequenceOptions", {"seq_dim": 0, "batch_dim": 0}),
              runtime_versions=("1.14.0",), types=takes("float32 uint8 int16 int32 int64")),
)
