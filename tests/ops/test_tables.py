"""Open per-op tables: refused for ops without a record, and for a second registration."""

from __future__ import annotations

import pytest

from kiln import KilnError
from kiln.ops.tables import OpTable, OpTableError


def test_registration_needs_an_op_record():
    table = OpTable("test lowerings")
    with pytest.raises(OpTableError, match=r"test lowerings: 'CONV_2X' has no op record"):
        table.register("CONV_2X", object())
    assert "CONV_2X" not in table


def test_second_registration_needs_override():
    table = OpTable("test lowerings")
    first, second = object(), object()
    table.register("CONV_2D", first)
    with pytest.raises(OpTableError, match="CONV_2D is registered already"):
        table.register("CONV_2D", second)
    assert table["CONV_2D"] is first
    table.register("CONV_2D", second, override=True)
    assert table["CONV_2D"] is second and list(table) == ["CONV_2D"]


def test_lookup_of_an_unregistered_op_names_the_table():
    table = OpTable("test lowerings")
    assert table.get("ADD") is None
    with pytest.raises(KilnError, match="test lowerings: nothing registered for ADD"):
        table["ADD"]


def test_a_table_filled_while_the_records_load_is_checked_on_first_use(monkeypatch):
    """Op families may import a backend that owns a table before kiln.ops has its registry."""
    import kiln.ops

    table = OpTable("test lowerings")
    registry = kiln.ops.OPS
    monkeypatch.delattr(kiln.ops, "OPS")
    table.register("CONV_2D", 1)
    table.register("CONV_2X", 2)
    monkeypatch.setattr(kiln.ops, "OPS", registry, raising=False)
    with pytest.raises(OpTableError, match="'CONV_2X' has no op record"):
        "CONV_2D" in table
    assert list(table) == ["CONV_2D"]
