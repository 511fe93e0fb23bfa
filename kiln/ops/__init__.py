"""Operator records, one module per op family; `get(name)` finds an op's record.

Families are listed here explicitly (no registration by import side effect): adding an op
means adding its record to its family's ``OPS`` tuple.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Sequence

import numpy as np

from ..errors import OpError
from . import (
    activations,
    control_flow,
    conv3d,
    elementwise,
    image,
    indexing,
    lstm,
    misc,
    nn,
    reduce,
    segment,
    shape,
    variables,
)
from .record import KernelCall, OpDef, OptionsSpec, apply_activation

_FAMILIES = (
    elementwise, activations, reduce, nn, image, shape, indexing, control_flow, variables, lstm,
    conv3d, segment, misc,
)


def _collect() -> dict[str, OpDef]:
    table: dict[str, OpDef] = {}
    for family in _FAMILIES:
        for record in family.OPS:
            if record.name in table:
                raise RuntimeError(f"op {record.name} defined twice ({family.__name__})")
            table[record.name] = record
    return table


#: Every builtin op kiln knows, by schema name.
OPS: dict[str, OpDef] = _collect()

#: Options table name -> spec (several ops share a table, e.g. ADD/SUB share none but
#: LESS/GREATER have their own; the codec only needs field names and defaults).
OPTIONS_BY_TABLE: dict[str, OptionsSpec] = {
    r.options.table: r.options for r in OPS.values() if r.options is not None
}


def get(name: str) -> OpDef | None:
    """The record of builtin op ``name`` ("CONV_2D"), or None if kiln does not know it."""
    return OPS.get(name)


def require(name: str) -> OpDef:
    record = OPS.get(name)
    if record is None:
        raise OpError(f"kiln has no definition of builtin operator {name}")
    return record


__all__ = [
    "KernelCall", "OPS", "OPTIONS_BY_TABLE", "OpDef", "OptionsSpec", "apply_activation", "get",
    "require",
]
