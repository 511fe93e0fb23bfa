"""Op family: segment reductions (SEGMENT_SUM, UNSORTED_SEGMENT_SUM / PROD / MAX / MIN).

Semantics of LiteRT's segment_sum.cc and unsorted_segment.cc, which are stricter or
different from TensorFlow's in places:

* Data is float32 or int32, segment ids int32 (num_segments int32, a scalar or [1]).
* SEGMENT_SUM wants 1-D ids that start at 0 and grow by 0 or 1 (TF allows gaps); the output
  has ``last id + 1`` rows.
* UNSORTED_SEGMENT_* take ids of any shape that is a prefix of the data's shape; negative
  ids are skipped; rows no id names keep the reduction's identity (0, 1, the type's lowest
  for MAX, its largest for MIN — not +-inf).
* Rows are combined in id order, one at a time, so float sums round exactly as LiteRT's;
  integer sums and products wrap. MAX / MIN keep the running value when the data is NaN
  (``std::max`` semantics), so a NaN never reaches the output.

Kernels use NumPy's unbuffered ``ufunc.at`` (vectorised, applied in index order) on flat
element indices, which NumPy runs an order of magnitude faster than row indices.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import OpError
from .record import KernelCall, OpDef, reject_quantized, takes

_DATA_TYPES = (np.dtype(np.float32), np.dtype(np.int32))


def _check_types(call: KernelCall, data: np.ndarray, *ints: tuple[str, np.ndarray]) -> None:
    reject_quantized(call)
    if data.dtype not in _DATA_TYPES:
        raise OpError(f"{call.op.name}: data of type {data.dtype} is not supported "
                      "(float32 or int32)")
    for what, arr in ints:
        if arr.dtype != np.int32:
            raise OpError(f"{call.op.name}: {what} must be int32, got {arr.dtype}")


def _scatter(combine: np.ufunc, out: np.ndarray, ids: np.ndarray, rows: np.ndarray) -> None:
    """out[ids[k]] = combine(out[ids[k]], rows[k]) for k in order; ``out`` is C-contiguous."""
    width = rows[0].size if len(rows) else 0
    if not width or not out.size:
        return
    flat = (ids.astype(np.intp)[:, None] * width + np.arange(width, dtype=np.intp)).reshape(-1)
    with np.errstate(over="ignore", invalid="ignore"):
        combine.at(out.reshape(-1), flat, rows.reshape(-1))


def _zero_signs_of_first(out: np.ndarray, ids: np.ndarray, rows: np.ndarray) -> None:
    """Give zero results the sign of their segment's first zero.

    std::max / std::min replace the running value only when strictly better, so of equal
    values (0.0 and -0.0) the first stays; NumPy's maximum / minimum may keep the last.
    """
    flat_out = out.reshape(-1)
    if not (flat_out == 0).any():
        return
    width = rows[0].size
    values = rows.reshape(-1)
    at = np.flatnonzero(values == 0)
    if not at.size:
        return
    where = ids.astype(np.intp)[at // width] * width + at % width
    where, first = np.unique(where, return_index=True)  # first zero of each output element
    hit = flat_out[where] == 0
    flat_out[where[hit]] = values[at[first[hit]]]


# -- SEGMENT_SUM ----------------------------------------------------------------------------------

def _sorted_ids(call: KernelCall, data: np.ndarray, ids: np.ndarray) -> int:
    """Number of segments; raises unless ids run 0, then up by 0 or 1 (LiteRT's rule)."""
    if data.ndim < 1:
        raise OpError("SEGMENT_SUM: data must have at least one dimension")
    if ids.ndim != 1 or ids.size != data.shape[0]:
        raise OpError(f"SEGMENT_SUM: segment_ids {list(ids.shape)} must be a vector as long as "
                      f"the data's first dimension {data.shape[0]}")
    if ids.size == 0:
        return 0
    steps = np.diff(ids.astype(np.int64))
    if ids[0] != 0 or np.any((steps != 0) & (steps != 1)):
        raise OpError("SEGMENT_SUM: segment_ids must start at 0 and increase by 0 or 1 "
                      f"(LiteRT allows no gaps), got {ids.tolist()[:16]}")
    return int(ids[-1]) + 1


def _segment_sum(call: KernelCall, data, segment_ids):
    _check_types(call, data, ("segment_ids", segment_ids))
    count = _sorted_ids(call, data, segment_ids)
    out = np.zeros((count,) + data.shape[1:], data.dtype)
    _scatter(np.add, out, segment_ids, data)
    return out


# -- UNSORTED_SEGMENT_* ---------------------------------------------------------------------------

def _num_segments(call: KernelCall, num_segments: np.ndarray) -> int:
    if num_segments.shape not in ((), (1,)):
        raise OpError(f"{call.op.name}: num_segments must be a scalar or a 1-element vector, "
                      f"got shape {list(num_segments.shape)}")
    count = int(num_segments.reshape(-1)[0])
    if count < 0:
        raise OpError(f"{call.op.name}: num_segments must not be negative, got {count}")
    return count


def _unsorted(identity: Callable[[np.dtype], object], combine: np.ufunc, *,
              nan_ignored: bool = False):
    """Kernel of one unsorted segment reduction; rows start at ``identity(dtype)``.

    ``nan_ignored``: a NaN operand leaves the running value as it is (std::max / std::min);
    it is replaced by the identity so that NumPy's faster maximum / minimum do the same.
    """

    def kernel(call: KernelCall, data, segment_ids, num_segments):
        _check_types(call, data, ("segment_ids", segment_ids), ("num_segments", num_segments))
        count = _num_segments(call, num_segments)
        rank = segment_ids.ndim
        if rank > data.ndim or segment_ids.shape != data.shape[:rank]:
            raise OpError(f"{call.op.name}: segment_ids shape {list(segment_ids.shape)} must be "
                          f"a prefix of the data shape {list(data.shape)}")
        ids = segment_ids.reshape(-1)
        if ids.size and int(ids.max()) >= count:
            raise OpError(f"{call.op.name}: segment id {int(ids.max())} is out of range for "
                          f"{count} segments")
        row = data.shape[rank:]
        out = np.full((count,) + row, identity(data.dtype), data.dtype)
        if out.size and ids.size:
            keep = ids >= 0
            rows = data.reshape((ids.size,) + row)
            if not keep.all():
                ids, rows = ids[keep], rows[keep]
            if nan_ignored and rows.dtype.kind == "f":
                nan = np.isnan(rows)
                if nan.any():
                    rows = np.where(nan, out.dtype.type(identity(data.dtype)), rows)
            _scatter(combine, out, ids, rows)
            if nan_ignored and rows.dtype.kind == "f":
                _zero_signs_of_first(out, ids, rows)
        return out

    return kernel


def _limits(dtype: np.dtype):
    return np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)


def _lowest(dtype: np.dtype):
    return _limits(dtype).min


def _largest(dtype: np.dtype):
    return _limits(dtype).max


# -- records --------------------------------------------------------------------------------------

# op_version.cc has no rule for these ops (always version 1); register.cc registers 1 only.
# Their options tables are empty and TF's converter writes none (options=None keeps it so).
OPS: tuple[OpDef, ...] = (
    OpDef("SEGMENT_SUM", _segment_sum,
          runtime_versions=("2.2.0",), types=takes("float32 int32")),
    OpDef("UNSORTED_SEGMENT_SUM", _unsorted(lambda dt: 0, np.add),
          runtime_versions=("2.10.0",), types=takes("float32 int32")),
    OpDef("UNSORTED_SEGMENT_PROD", _unsorted(lambda dt: 1, np.multiply),
          runtime_versions=("2.10.0",), types=takes("float32 int32")),
    OpDef("UNSORTED_SEGMENT_MAX", _unsorted(_lowest, np.maximum, nan_ignored=True),
          runtime_versions=("2.10.0",), types=takes("float32 int32")),
    OpDef("UNSORTED_SEGMENT_MIN", _unsorted(_largest, np.minimum, nan_ignored=True),
          runtime_versions=("2.11.0",), types=takes("float32 int32")),
)

__all__ = ["OPS"]
