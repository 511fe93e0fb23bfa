"""Tools to make hostile .tflite files: a small valid model, and in-place field patches.

Patches locate a field through the `tflite` bindings (a table's vtable slot or a vector
element) and overwrite its bytes, so each hostile file differs from a valid one in exactly
the place a test names.
"""

from __future__ import annotations

import struct

import numpy as np
from tflite.Model import Model as FbModel

from kiln.format import write_model
from kiln.ir import Model, Signature
from kiln.schema import Activation, DType

# vtable slots (4 + 2 * field id) of the schema fields the tests patch
TENSOR_SHAPE, TENSOR_TYPE, TENSOR_BUFFER = 4, 6, 8
OPERATOR_OPCODE_INDEX, OPERATOR_INPUTS, OPERATOR_OUTPUTS = 4, 6, 8
SUBGRAPH_TENSORS, SUBGRAPH_INPUTS = 4, 6
OPCODE_VERSION, OPCODE_BUILTIN = 8, 10
BUFFER_OFFSET = 6
MODEL_BUFFERS = 12
METADATA_BUFFER = 6
TENSORMAP_INDEX = 6


def small_model() -> bytes:
    """x[1,4] -> FULLY_CONNECTED(w[3,4], b[3]) -> ADD(c[3]) -> out[1,3]: 6 tensors, 2 opcodes."""
    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", DType.FLOAT32, (1, 4))
    w = sg.add_constant("w", np.arange(12, dtype=np.float32).reshape(3, 4) / 10)
    b = sg.add_constant("b", np.array([0.5, -0.5, 1.0], np.float32))
    y = sg.add_tensor("y", DType.FLOAT32, (1, 3))
    c = sg.add_constant("c", np.array([1.0, 2.0, 3.0], np.float32))
    out = sg.add_tensor("out", DType.FLOAT32, (1, 3))
    sg.inputs, sg.outputs = [x], [out]
    sg.add_operator("FULLY_CONNECTED", [x, w, b], [y], options={"fused_activation_function": Activation.RELU})
    sg.add_operator("ADD", [y, c], [out])
    model.metadata["min_runtime_version"] = b"1.5.0".ljust(16, b"\0")
    model.signatures.append(Signature("serving_default", sg, {"x": x}, {"out": out}))
    return write_model(model)


def root(data) -> FbModel:
    return FbModel.GetRootAs(data, 0)


def field_pos(table, slot: int) -> int:
    """Absolute position of a scalar field (which must be present in the table)."""
    off = table._tab.Offset(slot)
    if not off:
        raise AssertionError(f"field at slot {slot} is absent (holds its default)")
    return table._tab.Pos + off


def vector_pos(table, slot: int, index: int, elem: int = 4) -> int:
    """Absolute position of element ``index`` of a vector field."""
    off = table._tab.Offset(slot)
    return table._tab.Vector(off) + index * elem


def vector_len_pos(table, slot: int) -> int:
    """Absolute position of a vector field's uint32 length prefix."""
    off = table._tab.Offset(slot)
    return table._tab.Vector(off) - 4


def patch(data: bytes, pos: int, fmt: str, value) -> bytes:
    buf = bytearray(data)
    struct.pack_into("<" + fmt, buf, pos, value)
    return bytes(buf)
