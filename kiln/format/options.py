"""Builtin-options codec: flatbuffer options tables <-> plain dicts.

The field list of every options table is read once from the `tflite` bindings themselves
(their ``Add<Field>`` builder functions), so kiln round-trips every field the schema has —
also fields no op record mentions — and can never drift from the schema's slot layout.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from dataclasses import dataclass

import numpy as np

_VECTOR_TYPE = re.compile(
    r"def (\w+)AsNumpy\(self\):(?:(?!\bdef ).)*?GetVectorAsNumpy\(flatbuffers\.number_types\.(\w+)Flags", re.S
)

_NP_FLAGS = {
    "Int8": np.int8, "Uint8": np.uint8, "Int16": np.int16, "Uint16": np.uint16, "Int32": np.int32,
    "Uint32": np.uint32, "Int64": np.int64, "Uint64": np.uint64, "Float32": np.float32,
    "Float64": np.float64, "Bool": np.bool_,
}
_STRING = re.compile(r"def (\w+)\(self\):(?:(?!\bdef ).)*?self\._tab\.String\(", re.S)
#: Marker "element type" of string fields (VarHandleOptions.container, ...).
STRING = np.dtype("O")
_BUILDER_PREPEND = {
    np.dtype(np.int8): "PrependInt8", np.dtype(np.uint8): "PrependUint8",
    np.dtype(np.int16): "PrependInt16", np.dtype(np.uint16): "PrependUint16",
    np.dtype(np.int32): "PrependInt32", np.dtype(np.uint32): "PrependUint32",
    np.dtype(np.int64): "PrependInt64", np.dtype(np.uint64): "PrependUint64",
    np.dtype(np.float32): "PrependFloat32", np.dtype(np.float64): "PrependFloat64",
    np.dtype(np.bool_): "PrependBool",
}


def snake(camel: str) -> str:
    """"DilationWFactor" -> "dilation_w_factor"."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", camel).lower()


@dataclass(frozen=True)
class Field:
    name: str          # snake_case, the IR's key
    camel: str         # accessor name in the bindings
    vector: np.dtype | None  # element type for vector fields (STRING for strings), None for scalars


@dataclass(frozen=True)
class TableLayout:
    table: str
    module: object
    fields: tuple[Field, ...]


@functools.lru_cache(maxsize=None)
def layout(table: str) -> TableLayout:
    """Field layout of options table ``table`` (e.g. "Conv2DOptions"), from the bindings."""
    module = importlib.import_module(f"tflite.{table}")
    source = inspect.getsource(module)
    vector_types = {m.group(1): np.dtype(_NP_FLAGS[m.group(2)]) for m in _VECTOR_TYPE.finditer(source)}
    vector_types.update({m.group(1): STRING for m in _STRING.finditer(source)})
    fields = []
    for m in re.finditer(rf"def {table}Add(\w+)\(builder, \w+\):\s*\n\s*builder\.Prepend(\w+)Slot\(", source):
        camel, kind = m.group(1), m.group(2)
        if kind == "UOffsetTRelative":
            if camel not in vector_types:
                continue  # nested tables / strings: no builtin options table uses them
            fields.append(Field(snake(camel), camel, vector_types[camel]))
        else:
            fields.append(Field(snake(camel), camel, None))
    return TableLayout(table, module, tuple(fields))


@functools.lru_cache(maxsize=None)
def _empty_table(table: str) -> tuple[bytes, int]:
    import flatbuffers

    lay = layout(table)
    b = flatbuffers.Builder(0)
    getattr(lay.module, f"{table}Start")(b)
    b.Finish(getattr(lay.module, f"{table}End")(b))
    buf = bytes(b.Output())
    return buf, flatbuffers.encode.Get(flatbuffers.packer.uoffset, buf, 0)


def schema_defaults(table: str) -> dict:
    """{field: default} of options table ``table``: what the bindings read from an empty table."""
    buf, pos = _empty_table(table)
    return decode(table, buf, pos)


def decode(table: str, buf, pos: int) -> dict:
    """Read the options table at ``pos`` of ``buf`` into a dict {field: value}."""
    lay = layout(table)
    obj = getattr(lay.module, table)()
    obj.Init(buf, pos)
    out = {}
    for f in lay.fields:
        if f.vector is STRING:
            raw = getattr(obj, f.camel)()
            out[f.name] = raw.decode("utf-8", "replace") if raw is not None else ""
        elif f.vector is not None:
            arr = getattr(obj, f.camel + "AsNumpy")()
            out[f.name] = tuple(arr.tolist()) if isinstance(arr, np.ndarray) else ()
        else:
            out[f.name] = getattr(obj, f.camel)()
    return out


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
