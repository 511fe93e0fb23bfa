"""Composite functions (``_implements``): fused through kiln.fusion's registry, or inlined with
the reason in the conversion report."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import kiln  # noqa: E402
from kiln.fusion.registry import NotFusable, register_fusion, unregister_fusion  # noqa: E402
from tests.converter import zoo  # noqa: E402


@pytest.fixture(scope="module")
def tf():
    return zoo._tf()


def _model(tf, name):
    @tf.function(experimental_implements=name)
    def composite(x, w):
        return x * w + 1.0

    w = tf.Variable([2.0, 3.0, 4.0])

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
    def f(x):
        return tf.nn.relu(composite(x, w.read_value()))

    return f.get_concrete_function(), w


def _double_fusion(call):
    sg = call.subgraph
    x, w = call.inputs
    assert w.is_constant, "read-only variables reach fusions as constants"
    out = sg.add_tensor("fused_out", x.dtype, x.shape, shape_signature=x.shape_signature)
    one = sg.add_constant("one", np.float32(1.0))
    tmp = sg.add_tensor("fused_mul", x.dtype, x.shape, shape_signature=x.shape_signature)
    sg.add_operator("MUL", [x, w], [tmp])
    sg.add_operator("ADD", [tmp, one], [out])
    call.notes.append(f"{call.label}: fused into MUL + ADD")
    return [out]


def _run(data, x):
    from ai_edge_litert.interpreter import Interpreter

    return Interpreter(model_content=data).get_signature_runner()(x=x)["output_0"]


def test_registered_fusion_is_used(tf):
    fn, w = _model(tf, "kiln_test_affine")
    register_fusion("kiln_test_affine", _double_fusion)
    try:
        c = kiln.TFLiteConverter.from_concrete_functions([fn])
        data = c.convert()
    finally:
        unregister_fusion("kiln_test_affine")
    assert any("fused into MUL + ADD" in line for line in c.report.fused)
    x = np.array([[1, -1, 0.5]], np.float32)
    np.testing.assert_allclose(_run(data, x), np.maximum(x * [2, 3, 4] + 1, 0), rtol=1e-6)


def test_not_fusable_is_inlined_with_the_reason(tf):
    fn, _ = _model(tf, "kiln_test_refuse")

    def refuse(call):
        raise NotFusable(f"{call.label}: not fused: the test says no")

    register_fusion("kiln_test_refuse", refuse)
    try:
        c = kiln.TFLiteConverter.from_concrete_functions([fn])
        data = c.convert()
    finally:
        unregister_fusion("kiln_test_refuse")
    assert any("the test says no" in line for line in c.report.not_fused)
    assert c.report.fused == []
    x = np.array([[1, -1, 0.5], [0, 2, -3]], np.float32)
    np.testing.assert_allclose(_run(data, x), np.maximum(x * [2, 3, 4] + 1, 0), rtol=1e-6)
    assert "not fused" in c.report.summary()


def test_unknown_composite_is_inlined_and_noted(tf):
    fn, _ = _model(tf, "kiln_test_nobody_fuses_this")
    c = kiln.TFLiteConverter.from_concrete_functions([fn])
    data = c.convert()
    assert any("kiln_test_nobody_fuses_this" in line for line in c.report.not_fused)
    x = np.array([[1, 2, 3]], np.float32)
    np.testing.assert_allclose(_run(data, x), x * [2, 3, 4] + 1, rtol=1e-6)


def test_tf_keras_lstm_is_fused():
    """tf_keras' LSTM carries api_implements='lstm_<uuid>': one fused sequence op."""
    import tf_keras

    m = tf_keras.Sequential([tf_keras.layers.InputLayer((5, 3), name="seq"), tf_keras.layers.LSTM(4, name="lstm")])
    zoo.randomize(m)
    c = kiln.TFLiteConverter.from_keras_model(m)
    data = c.convert()
    ops = {op.name for _, _, op in kiln.read_model(data).operators()}
    assert "UNIDIRECTIONAL_SEQUENCE_LSTM" in ops and "WHILE" not in ops
    assert c.report.fused
    x = np.random.default_rng(0).standard_normal((2, 5, 3)).astype(np.float32)
    from ai_edge_litert.interpreter import Interpreter

    out = Interpreter(model_content=data).get_signature_runner()(seq=x)["lstm"]
    np.testing.assert_allclose(out, m(x).numpy(), rtol=1e-5, atol=1e-5)
