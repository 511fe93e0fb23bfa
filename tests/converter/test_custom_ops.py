"""Unsupported TF ops: the error users know from TF's converter, or (allow_custom_ops) CUSTOM
ops with the TF attributes as a FlexBuffer map, runnable in kiln with a Python kernel."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest
from flatbuffers import flexbuffers

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import kiln  # noqa: E402
from kiln.errors import ConversionError  # noqa: E402
from tests.converter import zoo  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_sin.py"

PREFIX = ("Some of the operators in the model are not supported by the standard TensorFlow Lite runtime "
          "and are not recognized by TensorFlow.")


@pytest.fixture(scope="module")
def tf():
    return zoo._tf()


@pytest.fixture(scope="module")
def sin64(tf):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.float64, name="x")])
    def sin(x):
        return tf.sin(x, name="Sin")

    return sin.get_concrete_function()


@pytest.fixture(scope="module")
def mixed(tf):
    @tf.function(input_signature=[tf.TensorSpec([2, 3], tf.float32, name="x")])
    def f(x):
        return tf.math.atan(x) + tf.math.sinh(x) * 2.0 + tf.math.atan(x * 2.0) + tf.math.cumprod(x, axis=1, reverse=True)

    return f.get_concrete_function()


def _custom_ops(data: bytes) -> list:
    return [op for _, _, op in kiln.read_model(data).operators() if op.op_type == "CUSTOM"]


def test_unsupported_error_is_the_one_users_know(sin64):
    with pytest.raises(ConversionError) as info:
        kiln.TFLiteConverter.from_concrete_functions([sin64]).convert()
    message = str(info.value)
    assert message.startswith(PREFIX)
    assert "--allow_custom_ops" in message and "allow_custom_ops=True" in message
    assert message.endswith("Here is a list of operators for which you will need custom implementations: Sin.")


def test_every_unsupported_op_once_sorted(mixed):
    with pytest.raises(ConversionError) as info:
        kiln.TFLiteConverter.from_concrete_functions([mixed]).convert()
    message = str(info.value)
    assert message.endswith("for which you will need custom implementations: Atan, Cumprod, Sinh.")
    assert "Here is a list of builtin operators you are using: ADD, MUL." in message
    assert any("Atan" in d for d in info.value.details)


def test_custom_op_carries_tf_attributes_like_tf(tf, mixed):
    c = kiln.TFLiteConverter.from_concrete_functions([mixed])
    c.allow_custom_ops = True
    data = c.convert()
    ours = {(op.custom_code, bytes(op.custom_options)) for op in _custom_ops(data)}
    t = tf.lite.TFLiteConverter.from_concrete_functions([mixed])
    t.allow_custom_ops = True
    theirs = {(op.custom_code, bytes(op.custom_options)) for op in _custom_ops(t.convert())}
    assert {code for code, _ in ours} == {"Atan", "Sinh", "Cumprod"}
    assert {code: flexbuffers.Loads(opts) for code, opts in ours} == \
        {code: flexbuffers.Loads(opts) for code, opts in theirs}
    attrs = {code: flexbuffers.Loads(opts) for code, opts in ours}
    assert attrs["Cumprod"]["reverse"] is True and attrs["Cumprod"]["exclusive"] is False
    assert c.report.custom_ops == {"Atan": 2, "Sinh": 1, "Cumprod": 1}


def _load_sin_example():
    spec = importlib.util.spec_from_file_location("custom_sin_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_custom_sin_runs_with_a_python_kernel(sin64):
    c = kiln.TFLiteConverter.from_concrete_functions([sin64])
    c.allow_custom_ops = True
    data = c.convert()
    (op,) = _custom_ops(data)
    assert op.custom_code == "Sin"
    assert flexbuffers.Loads(bytes(op.custom_options)) == {"T": int(kiln.DType.FLOAT64)}
    example = _load_sin_example()
    interp = example.make_interpreter(data)
    x = np.linspace(-3, 3, 7)
    out = interp.get_signature_runner()(x=x)["output_0"]
    np.testing.assert_allclose(out, np.sin(x))
    # Without a registration kiln (like LiteRT) refuses the custom op.
    with pytest.raises(kiln.RegistrationError, match="Sin"):
        kiln.Interpreter(model_content=data).allocate_tensors()


def test_litert_reports_the_unresolved_custom_op(sin64):
    from ai_edge_litert.interpreter import Interpreter

    c = kiln.TFLiteConverter.from_concrete_functions([sin64])
    c.allow_custom_ops = True
    with pytest.raises(RuntimeError, match="Encountered unresolved custom op: Sin"):
        Interpreter(model_content=c.convert()).allocate_tensors()
