"""The quantization denylist: the converter takes it (kiln's extension of TF's converter),
`kiln.quantize` checks it, and a denylist `QuantizationDebugger.suggest_denylist` found gives
the converter the same model `kiln.quantize` gives."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import kiln
from kiln.format import read_model
from kiln.quant.debug.debugger import QuantizationDebugger

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

SHAPE = (1, 8, 8, 3)


@functools.lru_cache(maxsize=None)
def _model():
    """One Keras model for every conversion: a denylist names the tensors of its conversions."""
    keras.utils.set_random_seed(1)
    return keras.Sequential([
        keras.Input(SHAPE[1:], batch_size=1, name="x"),
        keras.layers.Conv2D(6, 3, activation="relu", name="conv"),
        keras.layers.Flatten(name="flat"),
        keras.layers.Dense(5, name="logits"), keras.layers.Softmax(name="probs")])


def _samples():
    rng = np.random.default_rng(0)
    return [rng.uniform(-1, 1, SHAPE).astype(np.float32) for _ in range(6)]


def _converter(**attrs):
    converter = kiln.TFLiteConverter.from_keras_model(_model())
    converter.optimizations = [kiln.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([s] for s in _samples())
    for name, value in attrs.items():
        setattr(converter, name, value)
    return converter


@functools.lru_cache(maxsize=None)
def _float_model() -> bytes:
    return kiln.TFLiteConverter.from_keras_model(_model()).convert()


def _float_ops(model: bytes) -> list[str]:
    """Op types that compute in float32 (their first output is float)."""
    return [op.op_type for op in read_model(model).main.operators
            if op.outputs[0].dtype.name == "FLOAT32" and op.op_type not in ("DEQUANTIZE",)]


def test_converter_denylist_keeps_an_op_type_float():
    plain = _converter().convert()
    assert "SOFTMAX" not in _float_ops(plain)
    converter = _converter(denylist=["SOFTMAX"])
    kept = converter.convert()
    assert _float_ops(kept) == ["SOFTMAX"]
    assert any("SOFTMAX" in line and "denylisted" in line for line in converter.report.quantization["kept_float"])


def test_converter_denylist_names_a_tensor_of_the_float_conversion():
    conv = next(op for op in read_model(_float_model()).main.operators if op.op_type == "CONV_2D")
    kept = _converter(denylist=[conv.outputs[0].name]).convert()
    assert _float_ops(kept) == ["CONV_2D"]


def test_a_suggested_denylist_gives_the_converter_what_kiln_quantize_gives():
    float_model, data = _float_model(), _samples()
    int8 = kiln.quantize(float_model, "int8", representative_dataset=data, progress=False)
    debugger = QuantizationDebugger(float_model, int8, data)
    found = debugger.suggest_denylist(debugger.model_error() / 2)
    assert found.reached and found.denylist
    from_converter = read_model(_converter(denylist=found.denylist).convert())
    from_quantize = read_model(kiln.quantize(float_model, "int8", representative_dataset=data,
                                             denylist=found.denylist, progress=False))
    assert [op.op_type for op in from_converter.main.operators] == \
        [op.op_type for op in from_quantize.main.operators]
    for a, b in zip(from_converter.main.operators, from_quantize.main.operators):
        qa, qb = a.outputs[0].quantization, b.outputs[0].quantization
        assert (qa is None) == (qb is None)
        if qa is not None:
            np.testing.assert_array_equal(qa.scale, qb.scale)
            np.testing.assert_array_equal(qa.zero_point, qb.zero_point)


@pytest.mark.parametrize("denylist, message", [
    (["SOFTMAXX"], "did you mean 'SOFTMAX'"),
    (["no_such_tensor"], "neither an op type nor an op's output tensor"),
    ("SOFTMAX", "write ['SOFTMAX']"),
])
def test_kiln_quantize_refuses_a_denylist_that_matches_nothing(denylist, message):
    with pytest.raises(kiln.KilnError, match=None) as info:
        kiln.quantize(_float_model(), "dynamic", denylist=denylist)
    assert message in str(info.value)


def test_a_builtin_op_type_the_model_lacks_is_allowed():
    kiln.quantize(_float_model(), "dynamic", denylist=["LSTM"])


def test_float16_takes_no_denylist():
    with pytest.raises(kiln.KilnError, match="float16"):
        kiln.quantize(_float_model(), "float16", denylist=["SOFTMAX"])


def test_converter_denylist_errors():
    converter = kiln.TFLiteConverter.from_keras_model(_model())
    converter.denylist = ["SOFTMAX"]
    with pytest.raises(kiln.ConversionError, match="no quantization was asked for"):
        converter.convert()
    converter = _converter(denylist="SOFTMAX")
    with pytest.raises(kiln.ConversionError, match="list of op types or tensor names"):
        converter.convert()
