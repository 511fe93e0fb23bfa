"""Builtin-options codec: flatbuffer options tables <-> plain dicts.

The field list of every options table is read once from the `tflite` bindings themselves
(`kiln.schema.options_layout`), so kiln round-trips every field the schema has — also fields
no op record mentions — and can never drift from the schema's slot layout.
"""

from __future__ import annotations

import numpy as np

from ..schema import STRING, decode_options as decode, options_layout as layout

_BUILDER_PREPEND = {
    np.dtype(np.int8): "PrependInt8", np.dtype(np.uint8): "PrependUint8",
    np.dtype(np.int16): "PrependInt16", np.dtype(np.uint16): "PrependUint16",
    np.dtype(np.int32): "PrependInt32", np.dtype(np.uint32): "PrependUint32",
    np.dtype(np.int64): "PrependInt64", np.dtype(np.uint64): "PrependUint64",
    np.dtype(np.float32): "PrependFloat32", np.dtype(np.float64): "PrependFloat64",
    np.dtype(np.bool_): "PrependBool",
}


def encode(builder, table: str, values: dict) -> int:
    """Write ``values`` as options table ``table``; unknown keys are an error (typo guard)."""
    lay = layout(table)
    known = {f.name for f in lay.fields}
    unknown = set(values) - known
    if unknown:
        raise KeyError(f"{table} has no field(s) {sorted(unknown)}; fields are {sorted(known)}")
    vectors = {}
    for f in lay.fields:
        if f.vector is STRING and values.get(f.name):
            vectors[f.name] = builder.CreateString(str(values[f.name]))
        elif f.vector is not None and values.get(f.name):
            items = np.asarray(values[f.name], dtype=f.vector).ravel()
            getattr(lay.module, f"{table}Start{f.camel}Vector")(builder, len(items))
            prepend = getattr(builder, _BUILDER_PREPEND[f.vector])
            for v in reversed(items.tolist()):
                prepend(v)
            vectors[f.name] = builder.EndVector()
    getattr(lay.module, f"{table}Start")(builder)
    for f in lay.fields:
        if f.name not in values:
            continue
        if f.vector is not None:
            if f.name in vectors:
                getattr(lay.module, f"{table}Add{f.camel}")(builder, vectors[f.name])
            continue
        value = values[f.name]
        if isinstance(value, (np.generic,)):
            value = value.item()
        getattr(lay.module, f"{table}Add{f.camel}")(builder, value)
    return getattr(lay.module, f"{table}End")(builder)
