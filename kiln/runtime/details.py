"""The tensor details dicts of the tf.lite.Interpreter API (get_input_details & co.)."""

from __future__ import annotations

import numpy as np

from ..schema import DType

#: numpy types LiteRT's details report where they differ from the element type.
_DETAIL_DTYPES = {DType.STRING: np.bytes_, DType.RESOURCE: np.object_, DType.VARIANT: np.object_}


def tensor_details(env, i: int, name: str | None = None) -> dict:
    """LiteRT's details of tensor ``i`` of subgraph environment ``env`` (its current shape)."""
    t = env.tensors[i]
    q = t.quantization
    scales = q.scale.astype(np.float32) if q is not None else np.zeros(0, np.float32)
    zps = q.zero_point.astype(np.int32) if q is not None else np.zeros(0, np.int32)
    value = env.values[i]
    shape = value.shape if value is not None and not t.is_constant else env.shapes[i]
    return {
        "name": t.name if name is None else name,
        "index": i,
        "shape": np.array(shape, dtype=np.int32),
        "shape_signature": np.array(t.signature, dtype=np.int32),
        "dtype": _DETAIL_DTYPES.get(t.dtype) or t.dtype.numpy.type,
        "quantization": (float(scales[0]), int(zps[0])) if len(scales) == 1 else (0.0, 0),
        "quantization_parameters": {
            "scales": scales,
            "zero_points": zps,
            "quantized_dimension": q.quantized_dimension if q is not None else 0,
            "block_size": 0,  # blockwise quantization: kiln reads no block sizes yet
        },
        "sparsity_parameters": {},
    }
