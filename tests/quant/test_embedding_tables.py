"""Dynamic-range (and weight-only) quantization of lookup tables: an Embedding's GATHER table
of at least 1024 elements becomes int8 (symmetric, per tensor), GATHER runs on the codes
(version 2) and a DEQUANTIZE (version 2) restores the float rows — op for op what TF 2.21
writes, table bytes and scale included; kiln's runtime runs it as LiteRT does; tables kept
float are in the report with the reason (issue #22: a 205 MB table stayed float, unreported)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir import Model, Operator
from kiln.quant.api import quantize_model
from kiln.schema import DType


def _gather_model(vocab: int, dim: int) -> bytes:
    rng = np.random.default_rng(vocab)
    model = Model()
    sg = model.add_subgraph("main")
    ids = sg.add_tensor("ids", DType.INT32, (1, 5))
    table = sg.add_constant("table", rng.uniform(-0.05, 0.05, (vocab, dim)).astype(np.float32))
    rows = sg.add_tensor("rows", DType.FLOAT32, (1, 5, dim))
    sg.inputs.append(ids)
    sg.outputs.append(rows)
    sg.add_operator(Operator("GATHER", options={"axis": 0}), [table, ids], [rows])
    for op in sg.operators:
        op.version = kiln.ops.require(op.op_type).version(op)
    return kiln.write_model(model)


def _run(interp, ids):
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], ids)
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


@pytest.mark.parametrize("mode", ["dynamic", "weight_only"])
def test_table_becomes_int8_with_gather_on_codes(mode):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    float_model = _gather_model(300, 16)
    ir = kiln.read_model(float_model)
    report = quantize_model(ir, mode)
    ops = ir.main.operators
    assert [(op.op_type, op.version) for op in ops] == [("GATHER", 2), ("DEQUANTIZE", 2)]
    table = ops[0].inputs[0]
    original = kiln.read_model(float_model).main.operators[0].inputs[0].data
    assert table.dtype == DType.INT8 and table.quantization.scale.size == 1
    assert table.quantization.scale[0] == np.float32(np.abs(original).max() / 127)
    assert ops[0].outputs[0].quantization.scale[0] == table.quantization.scale[0]
    assert ("GATHER", "table") in report.quantized and not report.kept_float
    quantized = kiln.write_model(ir)
    assert len(quantized) < len(float_model) / 3
    ids = np.random.default_rng(0).integers(0, 300, (1, 5)).astype(np.int32)
    want = _run(Interpreter(model_content=quantized, experimental_op_resolver_type=OpResolverType.BUILTIN_REF), ids)
    np.testing.assert_array_equal(_run(kiln.Interpreter(model_content=quantized), ids), want)


def test_small_or_denylisted_tables_stay_float_with_the_reason():
    small = quantize_model(kiln.read_model(_gather_model(50, 8)), "dynamic")
    assert small.kept_float == [("GATHER", "rows", "400 table elements < 1024")]
    denied = quantize_model(kiln.read_model(_gather_model(300, 16)), "dynamic", denylist=["GATHER"])
    assert denied.kept_float == [("GATHER", "rows", "denylisted")]


def test_tf_keras_embedding_as_tf_writes_it():
    tf = pytest.importorskip("tensorflow")
    tf_keras = pytest.importorskip("tf_keras")
    tf_keras.utils.set_random_seed(0)
    L = tf_keras.layers
    m = tf_keras.Sequential([L.InputLayer((6,), batch_size=1, dtype="int32"), L.Embedding(400, 8), L.Flatten(),
                             L.Dense(3)])
    float_model = tf.lite.TFLiteConverter.from_keras_model(m).convert()
    conv = tf.lite.TFLiteConverter.from_keras_model(m)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    theirs = kiln.read_model(conv.convert()).main
    ours = kiln.read_model(kiln.quantize(float_model, "dynamic")).main
    assert [(op.op_type, op.version) for op in ours.operators] == [(op.op_type, op.version) for op in theirs.operators]
    a, b = (next(t for t in g.tensors if t.is_constant and t.data.size == 3200) for g in (ours, theirs))
    assert a.dtype == b.dtype == DType.INT8 and np.array_equal(a.data, b.data)
    assert np.array_equal(a.quantization.scale, b.quantization.scale)
