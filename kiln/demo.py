"""kiln's built-in example: convert a Keras model made in code, run it, compare with TensorFlow.

Run with ``python -m kiln.demo`` (needs the ``tf`` extra). It builds a small image classifier
and an LSTM sequence model, converts both with kiln's converter, runs them in kiln's
Interpreter (and in ai-edge-litert when installed) and prints how closely they agree.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np


def _models():
    import keras

    cnn = keras.Sequential([
        keras.Input((32, 32, 3), name="image"),
        keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.DepthwiseConv2D(3, padding="same"),
        keras.layers.BatchNormalization(),
        keras.layers.ReLU(6.0),
        keras.layers.MaxPooling2D(),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10, activation="softmax"),
    ], name="tiny_cnn")
    lstm = keras.Sequential([
        keras.Input((12, 6), name="sequence"),
        keras.layers.LSTM(16, return_sequences=True),
        keras.layers.LSTM(8),
        keras.layers.Dense(3),
    ], name="stacked_lstm")
    return [(cnn, (1, 32, 32, 3)), (lstm, (1, 12, 6))]


def _run_litert(content: bytes, x: np.ndarray):
    try:
        from ai_edge_litert.interpreter import Interpreter as LiteRT
    except ImportError:
        return None
    it = LiteRT(model_content=content)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


def main() -> int:
    from .converter.tfutil import import_tensorflow_quietly

    import_tensorflow_quietly()   # TensorFlow's C++ start-up log stays off the demo's output
    import kiln

    rng = np.random.default_rng(0)
    out_dir = tempfile.mkdtemp(prefix="kiln-demo-")
    ok = True
    for model, shape in _models():
        x = rng.standard_normal(shape).astype(np.float32)
        expected = np.asarray(model(x))

        start = time.perf_counter()
        converter = kiln.TFLiteConverter.from_keras_model(model)
        content = converter.convert()
        seconds = time.perf_counter() - start
        path = os.path.join(out_dir, f"{model.name}.tflite")
        with open(path, "wb") as f:
            f.write(content)

        interp = kiln.Interpreter(model_content=content)
        interp.allocate_tensors()
        interp.set_tensor(interp.get_input_details()[0]["index"], x)
        interp.invoke()
        got = interp.get_tensor(interp.get_output_details()[0]["index"])

        ops = [op.name for _, _, op in kiln.read_model(content).operators()]
        err = float(np.max(np.abs(got - expected)) / max(1e-12, float(np.max(np.abs(expected)))))
        print(f"\n== {model.name}: converted in {seconds:.2f} s -> {path} ({len(content)} bytes)")
        print(f"   ops: {', '.join(ops)}")
        print(f"   kiln vs TensorFlow: max error {err:.2e} (relative to output scale)")
        litert = _run_litert(content, x)
        if litert is not None:
            lerr = float(np.max(np.abs(litert - expected)) / max(1e-12, float(np.max(np.abs(expected)))))
            print(f"   LiteRT vs TensorFlow: max error {lerr:.2e}")
            ok &= lerr <= 1e-5
        print(f"   output[0,:5] = {np.round(got.reshape(got.shape[0], -1)[0, :5], 5)}")
        ok &= err <= 1e-5
    print("\nall outputs agree with TensorFlow" if ok else "\nMISMATCH: see above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
