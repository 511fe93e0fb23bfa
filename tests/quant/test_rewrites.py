"""Integer-only quantization rewrites ops without an integer kernel into float-exact integer
equivalents (kiln.quant.rewrites): NEG as ``0 − x``, SQUARE as ``x · x``, and in 16x8
SQUARED_DIFFERENCE as ``(a − b)²`` — so a LayerNormalization transformer is integer-only with
no float op inside, where TF 2.21 leaves NEG float (tests/quant/test_conformance.py's
transformer cell); ops with no equivalent are still refused, by name."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir import Model, Operator
from kiln.quant.rewrites import integer_equivalents
from kiln.quant.static import QuantizationError
from kiln.schema import DType

RNG = np.random.default_rng(8)


def _model(op_type: str, operands: int = 1, extra: str | None = None) -> bytes:
    """x [, y] -> op_type -> (extra, e.g. TANH) -> out, float."""
    model = Model()
    sg = model.add_subgraph("main")
    ins = [sg.add_tensor(f"x{k}", DType.FLOAT32, (2, 6)) for k in range(operands)]
    sg.inputs.extend(ins)
    mid = sg.add_tensor("mid", DType.FLOAT32, (2, 6))
    sg.add_operator(Operator(op_type), ins, [mid])
    out = mid
    if extra is not None:
        out = sg.add_tensor("out", DType.FLOAT32, (2, 6))
        sg.add_operator(Operator(extra), [mid], [out])
    sg.outputs.append(out)
    for op in sg.operators:
        op.version = kiln.ops.require(op.op_type).version(op)
    return kiln.write_model(model)


def _samples(operands: int, n: int = 8):
    return [[RNG.standard_normal((2, 6)).astype(np.float32) for _ in range(operands)] for _ in range(n)]


def _run(model: bytes, feeds):
    interp = kiln.Interpreter(model_content=model)
    interp.allocate_tensors()
    for d, x in zip(interp.get_input_details(), feeds):
        interp.set_tensor(d["index"], x)
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


@pytest.mark.parametrize("op_type,operands,replacement,scheme", [
    ("NEG", 1, "SUB", "int8"), ("NEG", 1, "SUB", "int16"), ("SQUARE", 1, "MUL", "int8"),
    ("SQUARED_DIFFERENCE", 2, "MUL", "int16"),
])
def test_rewrite_is_float_exact(op_type, operands, replacement, scheme):
    float_model = _model(op_type, operands)
    ir = kiln.read_model(float_model)
    assert integer_equivalents(ir, scheme) == [(op_type, "mid")]
    types = [op.op_type for op in ir.main.operators]
    assert op_type not in types and replacement in types and ir.main.outputs[0].name == "mid"
    rewritten = kiln.write_model(ir)
    for feeds in _samples(operands, 4):
        np.testing.assert_array_equal(_run(rewritten, feeds), _run(float_model, feeds))


def test_squared_difference_keeps_its_int8_kernel():
    ir = kiln.read_model(_model("SQUARED_DIFFERENCE", 2))
    assert integer_equivalents(ir, "int8") == []


@pytest.mark.parametrize("mode,op_type,operands", [("int8", "NEG", 1), ("int8", "SQUARE", 1),
                                                   ("int16x8", "NEG", 1), ("int16x8", "SQUARED_DIFFERENCE", 2)])
def test_integer_only_has_no_float_op_and_runs_as_litert(mode, op_type, operands):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    samples = _samples(operands)
    io = {"inference_input_type": "int8", "inference_output_type": "int8"} if mode == "int8" else {}
    quantized = kiln.quantize(_model(op_type, operands, extra="TANH"), mode, representative_dataset=samples,
                              integer_only=True, progress=False, **io)
    ops = kiln.read_model(quantized).main.operators
    inside = [op.op_type for op in ops if op.op_type not in ("QUANTIZE", "DEQUANTIZE")]
    assert op_type not in inside
    assert all(t.dtype != DType.FLOAT32 for op in ops if op.op_type not in ("QUANTIZE", "DEQUANTIZE")
               for t in op.outputs if t is not None)
    ref = Interpreter(model_content=quantized, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    ours = kiln.Interpreter(model_content=quantized)
    for interp in (ref, ours):
        interp.allocate_tensors()
    for feeds in samples[:3]:
        outs = []
        for interp in (ref, ours):
            for d, x in zip(interp.get_input_details(), feeds):
                if d["dtype"] != np.float32:
                    scale, zero = d["quantization"]
                    x = np.clip(np.round(x / scale) + zero, -128, 127).astype(d["dtype"])
                interp.set_tensor(d["index"], x)
            interp.invoke()
            outs.append(interp.get_tensor(interp.get_output_details()[0]["index"]))
        np.testing.assert_array_equal(*outs)


def test_fallback_mode_keeps_tf_s_ops_and_denylist_keeps_neg():
    float_model = _model("NEG", extra="TANH")
    samples = _samples(1)
    kept = kiln.read_model(kiln.quantize(float_model, "int8", representative_dataset=samples, progress=False))
    assert "NEG" in [op.op_type for op in kept.main.operators]          # as TF: float between (DE)QUANTIZEs
    with pytest.raises(QuantizationError, match=r"would stay float: NEG 'mid'"):
        kiln.quantize(float_model, "int8", representative_dataset=samples, progress=False, integer_only=True,
                      denylist=["NEG"])


def test_ops_without_an_equivalent_are_still_refused():
    with pytest.raises(QuantizationError, match=r"integer-only quantization: 1 op\(s\) .* FLOOR 'mid'"):
        kiln.quantize(_model("FLOOR", extra="TANH"), "int8", representative_dataset=_samples(1), progress=False,
                      integer_only=True)
