"""``embedding_lookup`` (and TensorFlow's older ``embedding_matmul``) -> one GATHER.

The composite's contract is TensorFlow's: two arguments, the table (params) then the ids,
one output ``tf.gather(params, ids)`` of shape ids.shape + params.shape[1:]. GATHER rather
than EMBEDDING_LOOKUP because it takes ids of any rank and int64 ids, as TensorFlow does.
"""

from __future__ import annotations

from ..schema import DType
from .helpers import FusionBuilder, note_fused, reject
from .registry import CompositeCall

_ID_TYPES = (DType.INT32, DType.INT64)


def fuse_embedding_lookup(call: CompositeCall) -> list:
    if len(call.inputs) != 2 or len(call.output_dtypes) != 1:
        raise reject(call, f"an embedding lookup takes (params, ids) and returns one tensor; "
                           f"this function has {len(call.inputs)} arguments and "
                           f"{len(call.output_dtypes)} results")
    params, ids = call.inputs
    if params.dtype in _ID_TYPES and ids.dtype not in _ID_TYPES:  # (ids, params) order
        params, ids = ids, params
    if ids.dtype not in _ID_TYPES:
        raise reject(call, f"embedding ids must be int32 or int64, got {ids.dtype.name}")
    if params.rank < 1:
        raise reject(call, "the embedding table must have at least one dimension")
    b = FusionBuilder(call)
    out = b.tensor("lookup", params.dtype, tuple(ids.signature) + tuple(params.signature[1:]))
    b.emit("GATHER", [params, ids], [out], {"axis": 0, "batch_dims": 0})
    note_fused(call, "GATHER")
    return [out]
