"""TF's float16 LSTM: its state variables are written by DEQUANTIZEs of float16 constants,
which LiteRT runs once (the first invoke), so the state carries from invoke to invoke until
`reset_all_variables` — and kiln's runtime does the same (it used to re-zero the state on
every invoke, issue #22)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir import Model, Operator
from kiln.schema import Activation, DType
from tests.ops import test_lstm as lstm_cases


def _runs(model: bytes, interpreter, x, invokes=4, reset_after=1):
    interp = interpreter(model)
    interp.allocate_tensors()
    outs = []
    for k in range(invokes):
        interp.set_tensor(interp.get_input_details()[0]["index"], x)
        interp.invoke()
        outs.append(interp.get_tensor(interp.get_output_details()[0]["index"]).copy())
        if k == reset_after:
            interp.reset_all_variables()
    return outs


def _lstm_with_float16_states(initial: float) -> bytes:
    """An LSTM whose two state variables are DEQUANTIZE outputs of float16 constants."""
    from tests.harness import Const

    rng = np.random.default_rng(2)
    operands, _ = lstm_cases._uni_lstm(rng, batch=1, time=4, n_input=3, n_cell=5)
    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", DType.FLOAT32, operands[0].shape)
    sg.inputs.append(x)
    ins = [x]
    for k, o in enumerate(operands[1:], start=1):
        if isinstance(o, Const):
            ins.append(sg.add_constant(f"w{k}", o.value))
        elif o is None:
            ins.append(None)
        else:   # a state operand: a variable written by DEQUANTIZE(float16 constant)
            half = sg.add_constant(f"state{k}_f16", np.full(o.value.shape, initial, np.float16))
            state = sg.add_tensor(f"state{k}", DType.FLOAT32, o.value.shape, is_variable=True)
            sg.add_operator(Operator("DEQUANTIZE"), [half], [state])
            ins.append(state)
    y = sg.add_tensor("y", DType.FLOAT32, (1, 4, 5))
    sg.outputs.append(y)
    sg.add_operator(Operator("UNIDIRECTIONAL_SEQUENCE_LSTM", options={
        "fused_activation_function": Activation.TANH}), ins, [y])
    for op in sg.operators:
        op.version = kiln.ops.require(op.op_type).version(op)
    return kiln.write_model(model)


@pytest.mark.parametrize("initial", [0.0, 0.25])
def test_state_behind_dequantize_carries_over_as_in_litert(initial):
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    model = _lstm_with_float16_states(initial)
    x = np.random.default_rng(3).uniform(-1, 1, (1, 4, 3)).astype(np.float32)
    want = _runs(model, lambda m: LiteRT(model_content=m), x)
    got = _runs(model, lambda m: kiln.Interpreter(model_content=m), x)
    assert not np.allclose(want[0], want[1])            # LiteRT carried the state
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-6)


def test_tf_float16_keras_lstm():
    tf = pytest.importorskip("tensorflow")
    tf_keras = pytest.importorskip("tf_keras")
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    tf_keras.utils.set_random_seed(0)
    L = tf_keras.layers
    m = tf_keras.Sequential([L.InputLayer((6, 5), batch_size=1), L.LSTM(12, return_sequences=True), L.Dense(3)])
    conv = tf.lite.TFLiteConverter.from_keras_model(m)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.target_spec.supported_types = [tf.float16]
    model = conv.convert()
    states = [t for t in kiln.read_model(model).main.tensors if t.is_variable]
    assert states and all(t.producer is not None and t.producer.op_type == "DEQUANTIZE" for t in states)
    x = np.random.default_rng(0).uniform(-1, 1, (1, 6, 5)).astype(np.float32)
    want = _runs(model, lambda b: LiteRT(model_content=b), x)
    got = _runs(model, lambda b: kiln.Interpreter(model_content=b), x)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5)
