"""Operator records, one module per op family; `get(name)` finds an op's record.

Families are listed here explicitly (no registration by import side effect): adding an op
means adding its record to its family's ``OPS`` tuple.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..errors import OpError
from ..ir import options as ir_options
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
    pool,
    quantize,
    random,
    reduce,
    rnn,
    segment,
    shape,
    variables,
)
from .backends import BackendTable, reference_table
from . import record as _record
from .record import KernelCall, OpDef, OptionsSpec, apply_activation

_FAMILIES = (
    elementwise, activations, reduce, nn, pool, image, shape, indexing, control_flow, variables, lstm, rnn,
    conv3d, segment, misc, quantize, random,
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

#: kiln's reference kernels as a backend table (kiln.ops.backends): what the interpreter runs
#: for each (op, operand types), beside the other backends' tables of the same shape.
REFERENCE: BackendTable = reference_table(OPS)

#: Options table name -> spec (several ops share a table, e.g. ADD/SUB share none but
#: LESS/GREATER have their own; the codec only needs field names and defaults).
OPTIONS_BY_TABLE: dict[str, OptionsSpec] = {
    r.options.table: r.options for r in OPS.values() if r.options is not None
}


def get(name: str) -> OpDef | None:
    """The record of builtin op ``name`` ("CONV_2D"), or None if kiln does not know it."""
    return OPS.get(name)


def states(op_type: str, fact: str) -> bool:
    """Whether builtin ``op_type``'s record states ``fact`` — one of its boolean facts
    ("reshapes", "reads_shape_only", "converts", "reduces", "resource", "calls_subgraphs") —
    so passes and backends ask the record instead of keeping op lists of their own. False for
    ops kiln has no record of."""
    record = OPS.get(op_type)
    return record is not None and bool(getattr(record, fact))


def has_side_effects(op_type: str) -> bool:
    """Whether running ``op_type`` does something its outputs do not show. Ops kiln has no
    record of (CUSTOM, CALL, builtins it does not know) are assumed to: what kiln does not
    know, it does not remove."""
    record = OPS.get(op_type)
    return record is None or record.side_effects


def is_pure(op_type: str) -> bool:
    """Whether ``op_type``'s outputs are a function of its inputs alone (safe to fold or
    merge): a known op without side effects, state or called subgraphs."""
    record = OPS.get(op_type)
    return record is not None and not (record.side_effects or record.stateful or record.subgraph_fields)


def unquantized_codes(op):
    """The int8 / uint8 / int16 operand of IR operator ``op`` that LiteRT's kernel would read as
    quantized though it has no quantization parameters (`kiln.ops.record.unquantized_codes`);
    None when there is none or kiln has no record of the op."""
    record = OPS.get(op.op_type)
    return None if record is None else _record.unquantized_codes(op, record)


def type_refusal(op):
    """Why LiteRT runs no node ``op`` of its operand type (`kiln.ops.record.type_refusal`);
    None when it does or kiln's record does not say."""
    record = OPS.get(op.op_type)
    return None if record is None else _record.type_refusal(op, record)


def takes_type(op_type: str, dtype) -> bool:
    """Whether LiteRT runs builtin ``op_type`` on ``dtype`` operands (its record's `OpDef.types`;
    True where the record does not say)."""
    record = OPS.get(op_type)
    return record is None or not record.types or dtype.name.lower() in record.types


def subgraph_fields(op) -> tuple[str, ...]:
    """Options fields of IR operator ``op`` that name a subgraph: its record's; for an op kiln
    has no record of (CALL, STABLEHLO_COMPOSITE read from a file), each stored field the schema
    names ``subgraph`` or ``*_subgraph_index``."""
    record = OPS.get(op.op_type)
    if record is not None:
        return record.subgraph_fields
    return tuple(k for k in op.options if k == "subgraph" or k.endswith("_subgraph_index"))


def declared_options(op_type: str) -> Mapping[str, Any] | None:
    """Every option ``op_type`` declares, with its schema default (empty for an op without
    options); None for ops kiln has no record of (CUSTOM, builtins it does not know), whose
    options it does not check."""
    record = OPS.get(op_type)
    return None if record is None else record.option_defaults


ir_options.use_declared_options(declared_options)


def infer_output_shapes(op) -> list[tuple[int, ...]]:
    """Output shapes of IR operator ``op`` from its inputs' static shapes.

    Uses the record's shape rule when it has one; otherwise evaluates the reference kernel on
    zero-filled inputs (constants keep their values, so shape/axis operands are honoured) —
    one mechanism that works for every op, as JAX's eval_shape does.
    """
    record = require(op.op_type)
    opts = record.make_options(op.options)
    if record.shape is not None:
        return [tuple(s) for s in record.shape(opts, [() if t is None else t.shape for t in op.inputs])]
    if record.kernel is None:
        raise OpError(f"{op.op_type} has neither a shape rule nor a kernel")
    args = []
    for t in op.inputs:
        if t is None:
            args.append(None)
        elif t.data is not None and not t.is_variable:
            args.append(np.asarray(t.data))
        else:
            args.append(np.zeros(t.shape, t.dtype.numpy))
    out_dtypes = [None if t is None else np.dtype(t.dtype.numpy) for t in op.outputs]
    result = record.kernel_for(op)(KernelCall(opts, op, out_dtypes), *args)
    if not isinstance(result, (tuple, list)):
        result = (result,)
    return [tuple(np.shape(r)) for r in result[:len(op.outputs)]]


def require(name: str) -> OpDef:
    record = OPS.get(name)
    if record is None:
        raise OpError(f"kiln has no definition of builtin operator {name}")
    return record


__all__ = [
    "BackendTable", "KernelCall", "OPS", "OPTIONS_BY_TABLE", "OpDef", "REFERENCE", "OptionsSpec", "apply_activation", "get",
    "declared_options", "has_side_effects", "infer_output_shapes", "is_pure", "require", "states",
    "subgraph_fields",
]
