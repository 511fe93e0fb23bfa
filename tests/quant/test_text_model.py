"""The most common text model — Keras 3 ``Embedding → LSTM → Dense`` — in every quantization
mode (issue #22: integer-only crashed on the Embedding's constant table): each quantizes, runs
in LiteRT and in kiln's Interpreter (bit for bit with LiteRT's reference kernels where the
model is integer), and its error against the float model is at most 1.5× the error of TF's
quantization of a tf_keras twin with the same weights, plus one output LSB (1/256)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import kiln

tf = pytest.importorskip("tensorflow")
pytestmark = pytest.mark.slow

VOCAB, STEPS, LSB = 300, 12, 1 / 256
MODES = {
    "int8": ({"mode": "int8"}, "int8"),
    "int8 integer-only": ({"mode": "int8", "integer_only": True, "inference_output_type": "int8"}, "int8io"),
    "uint8 integer-only": ({"mode": "int8", "integer_only": True, "inference_output_type": "uint8"}, "uint8io"),
    "int16x8": ({"mode": "int16x8"}, None),          # TF refuses a 16x8 LSTM
    "dynamic": ({"mode": "dynamic"}, "dynamic"),
    "weight_only": ({"mode": "weight_only"}, None),  # kiln's extension
    "float16": ({"mode": "float16"}, "float16"),
}


@functools.lru_cache(maxsize=None)
def _models():
    import keras
    import tf_keras

    keras.utils.set_random_seed(0)
    k3 = keras.Sequential([keras.Input((STEPS,), dtype="int32"), keras.layers.Embedding(VOCAB, 16),
                           keras.layers.LSTM(16), keras.layers.Dense(3, activation="softmax")])
    L = tf_keras.layers
    twin = tf_keras.Sequential([L.InputLayer((STEPS,), batch_size=1, dtype="int32"), L.Embedding(VOCAB, 16),
                                L.LSTM(16), L.Dense(3, activation="softmax")])
    twin.set_weights(k3.get_weights())
    rng = np.random.default_rng(1)
    calibration = [rng.integers(0, VOCAB, (1, STEPS)).astype(np.int32) for _ in range(32)]
    held_out = [rng.integers(0, VOCAB, (1, STEPS)).astype(np.int32) for _ in range(24)]
    return k3, twin, calibration, held_out


def _outputs(interp, inputs):
    interp.allocate_tensors()
    out = []
    for x in inputs:
        interp.reset_all_variables()   # TF's LSTM keeps its state in variables: one sequence each
        interp.set_tensor(interp.get_input_details()[0]["index"], x)
        interp.invoke()
        d = interp.get_output_details()[0]
        y = interp.get_tensor(d["index"])
        if y.dtype != np.float32:
            scale, zero = d["quantization"]
            y = (y.astype(np.float32) - zero) * scale
        out.append(y)
    return np.concatenate(out)


def _litert(model, kind="AUTO"):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    return Interpreter(model_content=model, experimental_op_resolver_type=getattr(OpResolverType, kind))


def _tf(twin, mode, calibration):
    conv = tf.lite.TFLiteConverter.from_keras_model(twin)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    if mode == "float16":
        conv.target_spec.supported_types = [tf.float16]
    if mode in ("int8", "int8io", "uint8io"):
        conv.representative_dataset = lambda: ([d] for d in calibration)
    if mode in ("int8io", "uint8io"):
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        conv.inference_output_type = tf.int8 if mode == "int8io" else tf.uint8
    return conv.convert()


@pytest.mark.parametrize("name", list(MODES))
def test_text_model_in_every_mode(name):
    k3, twin, calibration, held_out = _models()
    options, tf_mode = MODES[name]
    float_model = kiln.TFLiteConverter.from_keras_model(k3).convert()
    quantized = kiln.quantize(float_model, representative_dataset=[[c] for c in calibration], progress=False,
                              **options)
    reference = _outputs(_litert(float_model), held_out)
    in_litert = _outputs(_litert(quantized), held_out)
    in_kiln = _outputs(kiln.Interpreter(model_content=quantized), held_out)
    if name in ("int8", "int8 integer-only", "uint8 integer-only", "int16x8"):
        np.testing.assert_array_equal(in_kiln, _outputs(_litert(quantized, "BUILTIN_REF"), held_out))
        if "integer-only" in name:   # nothing float between the int32 tokens and the integer output
            ops = kiln.read_model(quantized).main.operators
            assert all(t.dtype.name != "FLOAT32" for op in ops for t in op.outputs if t is not None)
    else:
        np.testing.assert_allclose(in_kiln, in_litert, rtol=0, atol=1e-5)
    ours = float(np.abs(in_litert - reference).mean())
    if tf_mode is None:
        assert ours < 4 * LSB
        return
    tf_float = tf.lite.TFLiteConverter.from_keras_model(twin).convert()
    theirs = float(np.abs(_outputs(_litert(_tf(twin, tf_mode, calibration)), held_out) -
                         _outputs(_litert(tf_float), held_out)).mean())
    assert ours <= 1.5 * theirs + LSB, (ours, theirs)
