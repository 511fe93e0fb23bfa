"""The backend table shape: (op, operand types) -> implementation with one check; refused for
ops without a record, for unknown keys and for a second registration; verdicts as Decisions."""

from __future__ import annotations

import pytest

from kiln import KilnError, ops
from kiln.ir import Model
from kiln.ops.backends import FLOAT, BackendTable, BackendTableError
from kiln.rules import Decision
from kiln.schema import DType


def test_registration_needs_an_op_record():
    table = BackendTable("test lowerings")
    with pytest.raises(BackendTableError, match=r"test lowerings: 'CONV_2X' has no op record"):
        table.register("CONV_2X", object())
    assert "CONV_2X" not in table


def test_registration_needs_a_known_operand_types_key():
    table = BackendTable("test lowerings")
    with pytest.raises(BackendTableError, match=r"'int32' is not an operand-types key"):
        table.register("ADD", object(), types=("int32",))
    assert len(table) == 0


def test_second_registration_of_a_key_needs_override():
    table = BackendTable("test lowerings")
    first, second, integer = object(), object(), object()
    table.register("CONV_2D", first)
    table.register("CONV_2D", integer, types=("int8", "int16"))   # other keys: no clash
    with pytest.raises(BackendTableError, match="CONV_2D with float operands is registered already"):
        table.register("CONV_2D", second)
    assert table["CONV_2D", FLOAT] is first and table["CONV_2D", "int16"] is integer
    table.register("CONV_2D", second, override=True)
    assert table["CONV_2D", FLOAT] is second and table.ops() == ["CONV_2D"]
    assert table.types_of("CONV_2D") == {FLOAT, "int8", "int16"}


def test_lookup_of_an_unregistered_key_names_the_table():
    table = BackendTable("test lowerings")
    table.register("ADD", 1)
    assert table.get("ADD", "int8") is None and ("ADD", "int8") not in table and "ADD" in table
    with pytest.raises(KilnError, match="test lowerings: nothing registered for ADD with int8 operands"):
        table["ADD", "int8"]


def test_a_table_filled_while_the_records_load_is_checked_on_first_use(monkeypatch):
    """Op families may import a backend that owns a table before kiln.ops has its registry."""
    import kiln.ops

    table = BackendTable("test lowerings")
    registry = kiln.ops.OPS
    monkeypatch.delattr(kiln.ops, "OPS")
    table.register("CONV_2D", 1)
    table.register("CONV_2X", 2)
    monkeypatch.setattr(kiln.ops, "OPS", registry, raising=False)
    with pytest.raises(BackendTableError, match="'CONV_2X' has no op record"):
        "CONV_2D" in table
    assert table.ops() == ["CONV_2D"]


def _add_node(dtype: DType, quantized: bool):
    import numpy as np

    from kiln.ir.quant import QuantParams

    sg = Model().add_subgraph("main")
    q = QuantParams(np.array([0.5], np.float32), np.array([0], np.int64)) if quantized else None
    a, b, y = (sg.add_tensor(n, dtype, (2,), quantization=q) for n in "aby")
    return sg.add_operator("ADD", [a, b], [y])


def test_a_node_is_decided_by_its_op_and_operand_types():
    table = BackendTable("test backend")
    table.register("ADD", "float add", check=lambda op: "no broadcasting" if op.inputs[0].shape != (2,) else None)
    table.register("ADD", "int8 add", types=("int8",), check=lambda op: "odd zero point")
    float_add, int8_add, int16_add = (_add_node(DType.FLOAT32, False), _add_node(DType.INT8, True),
                                      _add_node(DType.INT16, True))
    assert table.entry_for(float_add).value == "float add" and table.why_not(float_add) is None
    assert table.decide(float_add) == Decision("backend", "ADD", "test backend", True, "")
    assert table.why_not(int8_add) == "odd zero point"
    assert table.why_not(int16_add) == "test backend runs ADD with float, int8 operands, not int16 ones"
    verdict = table.decide(int16_add, "node 0 (ADD)")
    assert not verdict.fired and str(verdict) == ("node 0 (ADD): not run by test backend: test backend runs ADD "
                                                  "with float, int8 operands, not int16 ones")


def test_the_reference_kernels_are_a_table_of_the_same_shape():
    conv = ops.require("CONV_2D")
    assert ops.REFERENCE["CONV_2D", FLOAT] is conv.kernel
    assert ops.REFERENCE.types_of("CONV_2D") == {FLOAT, *conv.quantized}
    assert all(ops.REFERENCE[name, key] is kernel
               for name, record in ops.OPS.items() for key, kernel in record.quantized.items())
