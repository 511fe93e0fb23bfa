"""Custom ops: a TF op kiln cannot legalise travels as CUSTOM with its attributes.

As TensorFlow's converter does, the op's attributes become a FlexBuffer map in
``custom_options``: types as LiteRT tensor type numbers, shapes as int lists, strings, numbers,
booleans and lists of those. A Python kernel registered under the TF op type runs it.
"""

from __future__ import annotations

from typing import Any

from flatbuffers import flexbuffers

from ..errors import ConversionError


def _plain(kind: str, v) -> Any:
    from .tfutil import attr_text, to_dtype

    if kind == "s":
        return attr_text(v)
    if kind in ("i", "f", "b"):
        return v
    if kind == "type":  # as TF's converter writes it: the LiteRT tensor type number
        try:
            return int(to_dtype(v))
        except (ConversionError, TypeError):  # a TF-only type (qint8, ...) or an enum number TF
            return int(v)                     # does not know (as_dtype: TypeError): keep TF's enum
    if kind == "shape":
        return [] if v.unknown_rank else [int(d.size) for d in v.dim]
    if kind == "func":
        return v.name
    return None


def attr_to_flex(value) -> Any:
    kind = value.WhichOneof("value")
    if kind == "list":
        lst = value.list
        for f in ("s", "i", "f", "b", "type", "shape", "func"):
            items = getattr(lst, f)
            if len(items):
                return [_plain(f, x) for x in items]
        return []
    if kind is None or kind in ("tensor", "placeholder"):
        return None
    return _plain(kind, getattr(value, kind))


def encode_attrs(op) -> bytes:
    """FlexBuffer map of a TF op's (public) attributes."""
    attrs = {}
    for key, value in sorted(op.node_def.attr.items()):
        if key.startswith("_"):
            continue
        plain = attr_to_flex(value)
        if plain is not None:
            attrs[key] = plain
    return bytes(flexbuffers.Dumps(attrs))
