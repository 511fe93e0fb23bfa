"""Facts every op record must declare: runtime versions for every version it can produce."""

from __future__ import annotations

import re

import pytest

from kiln import ops
from kiln.format.runtime_version import model_runtime_version
from kiln.errors import ModelError
from kiln.ir import Model
from kiln.ops.record import UNLISTED
from kiln.schema import DType

RECORDS = sorted(ops.OPS.values(), key=lambda r: r.name)
_DTYPES = (DType.FLOAT32, DType.FLOAT16, DType.INT4, DType.INT8, DType.UINT8, DType.INT16, DType.INT32,
           DType.INT64, DType.UINT32, DType.BOOL, DType.STRING, DType.COMPLEX64)


def _versions_produced(record) -> set[int]:
    """Versions the record's rule picks over a sweep of operand counts and element types."""
    produced = set()
    for n_in in (1, 2, 3):
        for din in _DTYPES:
            for dout in _DTYPES:
                sg = Model().add_subgraph("sweep")
                ins = [sg.add_tensor(f"in{k}", din, (1, 2, 3, 4)) for k in range(n_in)]
                op = sg.add_operator(record.name, ins, [sg.add_tensor("out", dout, (1, 2, 3, 4))])
                try:
                    produced.add(int(record.version(op)))
                except (IndexError, TypeError, AttributeError):
                    continue  # the rule needs operands this sweep does not build
    return produced


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.name)
def test_every_version_up_to_max_has_a_runtime_version(record):
    assert len(record.runtime_versions) >= record.max_version, (
        f"{record.name} implements versions 1..{record.max_version} but lists runtime versions for "
        f"1..{len(record.runtime_versions)}")
    for entry in record.runtime_versions:
        assert entry == UNLISTED or re.fullmatch(r"\d+\.\d+\.\d+", entry), entry


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.name)
def test_every_version_the_rule_produces_has_a_runtime_version(record):
    for version in _versions_produced(record):
        record.runtime_version(version)  # raises when the row is missing


def test_a_missing_runtime_version_row_is_a_model_error():
    m = Model()
    sg = m.add_subgraph("main")
    sg.add_operator("ADD", [], [], version=1)
    sg.add_operator("ADD", [], [], version=len(ops.require("ADD").runtime_versions) + 1)
    with pytest.raises(ModelError, match=r"operator 1: ADD version 7 has no runtime version"):
        model_runtime_version(m)


def test_an_unlisted_version_leaves_the_minimum_like_tf():
    m = Model()
    sg = m.add_subgraph("main")
    sg.add_operator("BROADCAST_TO", [], [], version=1)  # LiteRT never lists version 1
    sg.add_operator("RESHAPE", [], [], version=1)
    assert model_runtime_version(m) == "1.5.0"


def test_records_no_longer_carry_an_unread_quantized_kernel_slot():
    assert not hasattr(ops.require("ADD"), "quantized_kernel")


# -- facts passes read from the records ------------------------------------------------------

@pytest.mark.parametrize("record", [r for r in RECORDS if r.options is not None], ids=lambda r: r.name)
def test_subgraph_fields_are_the_tables_subgraph_fields(record):
    fields = [f for f in record.option_defaults if f == "subgraph" or f.endswith("_subgraph_index")]
    assert sorted(record.subgraph_fields) == sorted(fields)


def test_fused_activation_hosts_have_the_option():
    hosts = [r.name for r in RECORDS if r.fused_activation_host]
    assert set(hosts) == {"ADD", "SUB", "MUL", "DIV", "CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED",
                          "AVERAGE_POOL_2D", "MAX_POOL_2D"}
    assert all("fused_activation_function" in ops.require(h).option_defaults for h in hosts)


def test_purity_comes_from_the_records():
    assert ops.is_pure("ADD") and not ops.is_pure("READ_VARIABLE") and not ops.is_pure("WHILE")
    assert ops.has_side_effects("ASSIGN_VARIABLE") and not ops.has_side_effects("WHILE")
    assert ops.has_side_effects("CUSTOM") and not ops.is_pure("SVDF")  # unknown: kept, never folded


def test_subgraphs_named_by_an_op_without_a_record_are_kept():
    """A StableHLO op read from a file names its comparator subgraph; pruning must keep it."""
    from kiln.passes.dce import prune_subgraphs

    m = Model()
    main = m.add_subgraph("main")
    m.add_subgraph("unused")
    m.add_subgraph("comparator")
    main.add_operator("STABLEHLO_SORT", [], [], options={"comparator_subgraph_index": 2})
    assert prune_subgraphs(m)
    assert [sg.name for sg in m.subgraphs] == ["main", "comparator"]
    assert main.operators[0].options["comparator_subgraph_index"] == 1


def test_the_types_records_state_are_element_types_of_an_operand():
    """`OpDef.types` (what the converter and the LiteRT delegate check) names element types, and
    `typed_operand` an input position the op has (by its named operands where it names them)."""
    names = {t.name.lower() for t in DType}
    stated = [r for r in RECORDS if r.types]
    assert len(stated) > 60
    for record in stated:
        assert record.types <= names, (record.name, sorted(record.types - names))
        assert not record.operands or record.typed_operand < len(record.operands), record.name
