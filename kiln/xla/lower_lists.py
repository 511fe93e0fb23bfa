"""TensorList writes as TensorFlow's converter spells them: SLICEs reassembled by a
CONCATENATION.

A ``TensorListSetItem`` in a loop body becomes the list up to the loop counter (a SLICE
whose size is the counter), the new item, and the list after it (a SLICE from the counter
to the end), concatenated back into a list of the file's static shape. XLA compiles static
shapes, so neither slice can be an array of its own: each stays a `Window` — the array and
its begin and size as run-time values — and the CONCATENATION (`assemble`) fills every
row of its static output from the piece that covers it, a masked gather. That is exact for
any begin and size: nothing assumes the pieces come from one list or an item in between.
A SLICE is lowered this way only when every reader is such a CONCATENATION (`window_check`);
a window that meets anything else while tracing fails the trace, and the delegate hands the
node back to the reference kernel.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..errors import OpError
from ..schema import Activation


class Window:
    """A SLICE of ``x`` whose extent is only known at run time: ``begin`` and ``size`` are
    int32 vectors (a size of -1: to the end), clamped into ``x`` as the reference kernel
    requires them to be."""

    __slots__ = ("x", "begin", "size")

    def __init__(self, x, begin, size):
        self.x, self.begin, self.size = x, begin, size

    @property
    def dtype(self):
        return self.x.dtype

    @property
    def ndim(self) -> int:
        return self.x.ndim

    def astype(self, dtype) -> "Window":
        return Window(self.x.astype(dtype), self.begin, self.size)


def window(x, begin, size) -> Window:
    x = jnp.asarray(x)
    begin, size = (jnp.asarray(v).astype(jnp.int32).reshape(-1) for v in (begin, size))
    if begin.shape != (x.ndim,) or size.shape != (x.ndim,):
        raise OpError(f"SLICE: begin {list(begin.shape)} and size {list(size.shape)} need {x.ndim} entries "
                      f"for input {list(x.shape)}")
    dims = jnp.asarray(x.shape, jnp.int32)
    begin = jnp.clip(begin, 0, dims)
    size = jnp.where(size < 0, dims - begin, jnp.minimum(size, dims - begin))
    return Window(x, begin, size)


def assemble(call, inputs) -> jnp.ndarray:
    """CONCATENATION of arrays and windows into the file's static output shape."""
    out_t = call.op.outputs[0]
    shape = tuple(out_t.signature)
    if -1 in shape:
        raise OpError(f"CONCATENATION of run-time slices needs a static output shape, the file has {list(shape)}")
    if getattr(call.opts, "fused_activation_function", Activation.NONE) != Activation.NONE:
        raise OpError("CONCATENATION of run-time slices with a fused activation is not lowered")
    rank = len(shape)
    axis = call.opts.axis % rank if rank and -rank <= call.opts.axis < rank else None
    if axis is None:
        raise OpError(f"CONCATENATION: axis {call.opts.axis} is out of range for rank {rank}")
    dtypes = {np.dtype(x.dtype) for x in inputs if x is not None}
    if len(dtypes) != 1:
        raise OpError(f"CONCATENATION: inputs have different types {sorted(map(str, dtypes))}")
    rows = jnp.arange(shape[axis], dtype=jnp.int32)
    along = [shape[axis] if a == axis else 1 for a in range(rank)]
    out = jnp.zeros(shape, dtypes.pop())
    offset = jnp.int32(0)
    for piece in inputs:
        if piece is None:
            continue
        if piece.ndim != rank:
            raise OpError(f"CONCATENATION: a piece of rank {piece.ndim} in an output of rank {rank}")
        if isinstance(piece, Window):
            x = piece.x
            if any(shape[a] > x.shape[a] for a in range(rank) if a != axis):
                raise OpError(f"CONCATENATION: a slice of {list(x.shape)} cannot span output {list(shape)}")
            starts = [jnp.int32(0) if a == axis else jnp.clip(piece.begin[a], 0, x.shape[a] - shape[a])
                      for a in range(rank)]
            source = lax.dynamic_slice(x, starts, [x.shape[a] if a == axis else shape[a] for a in range(rank)])
            length, first = piece.size[axis], piece.begin[axis]
        else:
            source = jnp.asarray(piece)
            if any(source.shape[a] != shape[a] for a in range(rank) if a != axis):
                raise OpError(f"CONCATENATION: piece {list(source.shape)} does not fit output {list(shape)}")
            length, first = jnp.int32(source.shape[axis]), jnp.int32(0)
        if source.shape[axis] == 0:
            offset = offset + length
            continue
        picked = jnp.take(source, jnp.clip(rows - offset + first, 0, source.shape[axis] - 1), axis=axis)
        covered = ((rows >= offset) & (rows < offset + length)).reshape(along)
        out = jnp.where(covered, picked, out)
        offset = offset + length
    return out


def window_check(op) -> str | None:
    """None when every reader of SLICE ``op``'s output is a CONCATENATION of static output
    shape (where a run-time window can go), else the reason it cannot be lowered."""
    out = op.outputs[0] if op.outputs else None
    sg = op.subgraph
    if out is None or (sg is not None and any(t is out for t in sg.outputs)):
        return "its slice has a run-time extent and leaves the subgraph"
    readers = out.user_ops
    for reader in readers:
        if reader.op_type != "CONCATENATION" or not reader.outputs or reader.outputs[0] is None \
                or -1 in reader.outputs[0].signature:
            return (f"its slice has a run-time extent and is read by {reader.name}; only a CONCATENATION "
                    "of static shape reassembles one")
    return None if readers else "its slice has a run-time extent and nothing reads it"
