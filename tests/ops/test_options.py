"""Operator options are validated once, where they are written, and read with the schema default."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

from kiln import KilnError, ops
from kiln.format import read_model, write_model
from kiln.ir import Model, Operator
from kiln.ir.options import OptionError
from kiln.passes.pad import FusePadIntoConv
from kiln.schema import DType, Padding, options_defaults


def test_an_unknown_option_raises_at_construction():
    with pytest.raises(OptionError, match=r"MAX_POOL_2D has no option 'filter_widht'.*did you mean 'filter_width'"):
        Operator("MAX_POOL_2D", options={"filter_widht": 3})
    assert issubclass(OptionError, KilnError)


def test_unknown_options_are_refused_on_every_write():
    op = Operator("CONV_2D", options={"stride_w": 2})
    for write in (lambda: op.options.__setitem__("strides_h", 2), lambda: op.options.update(stride_hh=2),
                  lambda: op.options.setdefault("padd", 1), lambda: setattr(op, "options", {"paddin": 1})):
        with pytest.raises(OptionError, match="CONV_2D has no option"):
            write()
    assert dict(op.options) == {"stride_w": 2}


def test_an_op_without_options_takes_none():
    with pytest.raises(OptionError, match="RELU has no option 'alpha' .it takes no options."):
        Operator("RELU", options={"alpha": 0.5})


def test_missing_options_read_as_the_schema_default_and_are_not_stored():
    op = Operator("CONV_2D", options={"stride_w": 2})
    assert op.options["stride_w"] == 2
    assert op.options["dilation_h_factor"] == 1 and op.options["stride_h"] == 0  # the schema's defaults
    assert "stride_h" not in op.options and dict(op.options) == {"stride_w": 2}
    with pytest.raises(OptionError, match="did you mean 'stride_h'"):
        op.options["stride_hh"]


def test_custom_ops_and_ops_without_a_record_are_not_checked():
    assert dict(Operator("CUSTOM", options={"anything": 1}, custom_code="X").options) == {"anything": 1}
    assert dict(Operator("SVDF", options={"rank": 2}).options) == {"rank": 2}


@pytest.mark.parametrize("record", [r for r in ops.OPS.values() if r.options is not None], ids=lambda r: r.name)
def test_record_defaults_are_the_schema_defaults(record):
    schema = options_defaults(record.options.table)
    assert set(record.option_defaults) == set(schema)
    for name, value in record.options.defaults.items():
        assert value == schema[name], f"{record.name}.{name}: record says {value!r}, schema {schema[name]!r}"


def test_options_survive_copy_and_pickle_still_validated():
    op = Operator("ADD", options={"fused_activation_function": 1})
    for clone in (copy.copy(op.options), copy.deepcopy(op.options), pickle.loads(pickle.dumps(op.options))):
        assert clone == {"fused_activation_function": 1} and clone["pot_scale_int16"] is True
        with pytest.raises(OptionError):
            clone["fused_activation"] = 0


def test_the_file_round_trip_keeps_only_stored_options():
    model = Model()
    sg = model.add_subgraph("main")
    x, y = sg.add_tensor("x", DType.FLOAT32, (1, 4, 4, 1)), sg.add_tensor("y", DType.FLOAT32, (1, 2, 2, 1))
    sg.inputs, sg.outputs = [x], [y]
    sg.add_operator("MAX_POOL_2D", [x], [y], options={"filter_width": 2, "filter_height": 2, "stride_w": 2,
                                                      "stride_h": 2, "padding": int(Padding.VALID)})
    op = read_model(write_model(model)).main.operators[0]
    assert op.options["filter_width"] == 2 and op.options["fused_activation_function"] == 0


def _pad_then_conv(conv_options: dict) -> tuple[Model, Operator]:
    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", DType.FLOAT32, (1, 4, 4, 1))
    padded = sg.add_tensor("padded", DType.FLOAT32, (1, 6, 6, 1))
    pads = sg.add_constant("pads", np.array([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32))
    sg.add_operator("PAD", [x, pads], [padded])
    w = sg.add_constant("w", np.ones((1, 3, 3, 1), np.float32))
    y = sg.add_tensor("y", DType.FLOAT32, (1, 4, 4, 1))
    conv = sg.add_operator("CONV_2D", [padded, w, None], [y], options={"padding": int(Padding.VALID),
                                                                          **conv_options})
    sg.inputs, sg.outputs = [x], [y]
    return model, conv


def test_pad_fusion_reads_the_record_stride_default():
    """A conv without stride fields has stride 0 (the schema default, as the record says), not 1:
    the pass leaves it alone instead of assuming a stride."""
    model, conv = _pad_then_conv({})
    FusePadIntoConv().run(model)
    assert conv.options["padding"] == Padding.VALID and conv.inputs[0].name == "padded"
    model, conv = _pad_then_conv({"stride_w": 1, "stride_h": 1})
    FusePadIntoConv().run(model)
    assert conv.options["padding"] == Padding.SAME and conv.inputs[0].name == "x"


def test_get_answers_for_names_an_op_may_not_declare():
    assert Operator("ADD").options.get("fused_activation_function") == 0  # declared: the schema default
    assert Operator("RELU").options.get("fused_activation_function") is None  # not declared: no error
    assert Operator("RELU").options.get("fused_activation_function", 7) == 7
