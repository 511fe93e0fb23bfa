"""Post-training quantization benchmark: kiln vs TensorFlow's converter, side by side.

For each model and mode, TF's float conversion is quantized by kiln (`kiln.quant.quantize`)
and, from the same Keras model, by TF's converter; both run in LiteRT on the same held-out
inputs. Printed: size ÷ float size, and max / mean absolute error against the float model,
for kiln and TF, and the latency of kiln's interpreter ÷ LiteRT's on kiln's quantized model (interleaved,
median of 30; "-" where kiln's runtime has no kernel yet: int8). Modes: dynamic range, float16,
int8 (full integer, float I/O).

    python bench/quant_bench.py [MODEL ...]      (default: cnn mlp mobilenet transformer)
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from tests.converter import zoo  # noqa: E402

MODELS = {"cnn": "k3_cnn", "mlp": "k3_mlp", "mobilenet": "k3_mobilenet_v2", "transformer": "k3_transformer",
          "separable": "k3_separable"}
MODES = ("dynamic", "float16", "int8")


def _litert(model: bytes, x: np.ndarray) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=model)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


def _latency_ratio(model: bytes, x: np.ndarray, runs: int = 30) -> float | None:
    """Median invoke time of kiln's interpreter ÷ LiteRT's on ``model`` (None: kiln cannot run it)."""
    from ai_edge_litert.interpreter import Interpreter

    import kiln

    interps = {"kiln": kiln.Interpreter(model_content=model), "litert": Interpreter(model_content=model)}
    for interp in interps.values():
        interp.allocate_tensors()
        interp.set_tensor(interp.get_input_details()[0]["index"], x)
    try:
        interps["kiln"].invoke()
    except kiln.KilnError:
        return None
    times = {name: [] for name in interps}
    for _ in range(runs):
        for name, interp in interps.items():
            start = time.perf_counter()
            interp.invoke()
            times[name].append(time.perf_counter() - start)
    return float(np.median(times["kiln"]) / np.median(times["litert"]))


def _tf_quantized(keras_model, mode: str, data):
    import tensorflow as tf

    conv = tf.lite.TFLiteConverter.from_keras_model(keras_model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    if mode == "float16":
        conv.target_spec.supported_types = [tf.float16]
    if mode == "int8":
        conv.representative_dataset = lambda: ([d] for d in data)
    with contextlib.redirect_stdout(io.StringIO()):   # Keras' export prints its signature
        return conv.convert()


def main(names: list[str]) -> int:
    import tensorflow as tf

    from kiln.quant import quantize

    names = names or ["cnn", "mlp", "mobilenet", "transformer"]
    header = (f"{'model':<12} {'mode':<8} {'kiln size':>9} {'tf size':>8} {'kiln max err':>12} {'tf max err':>10} "
              f"{'kiln mean':>10} {'tf mean':>9} {'kiln s':>7} {'kiln÷LiteRT':>11}")
    print(header)
    print("-" * len(header))
    for name in names:
        keras_model = zoo.BUILDERS[MODELS[name]]().obj
        rng = np.random.default_rng(0)
        shape = (1,) + tuple(keras_model.inputs[0].shape[1:])
        calibration = [rng.uniform(-1, 1, shape).astype(np.float32) for _ in range(32)]
        held_out = [rng.uniform(-1, 1, shape).astype(np.float32) for _ in range(32)]
        with contextlib.redirect_stdout(io.StringIO()):
            float_model = tf.lite.TFLiteConverter.from_keras_model(keras_model).convert()
        reference = [_litert(float_model, x) for x in held_out]
        for mode in MODES:
            start = time.perf_counter()
            ours = quantize(float_model, mode, representative_dataset=lambda: ([d] for d in calibration),
                            progress=False)
            seconds = time.perf_counter() - start
            theirs = _tf_quantized(keras_model, mode, calibration)
            errs = {}
            for label, model in (("kiln", ours), ("tf", theirs)):
                diffs = [np.abs(_litert(model, x) - r) for x, r in zip(held_out, reference)]
                errs[label] = (max(float(d.max()) for d in diffs), float(np.mean([d.mean() for d in diffs])))
            latency = _latency_ratio(ours, held_out[0])
            shown = "-" if latency is None else f"{latency:.1f}x"
            print(f"{name:<12} {mode:<8} {len(ours) / len(float_model):>9.2f} {len(theirs) / len(float_model):>8.2f} "
                  f"{errs['kiln'][0]:>12.2e} {errs['tf'][0]:>10.2e} {errs['kiln'][1]:>10.2e} {errs['tf'][1]:>9.2e} "
                  f"{seconds:>7.2f} {shown:>11}")
    print("\nsize = bytes / float model bytes; errors = |LiteRT(quantized) - LiteRT(float)| on 32 held-out inputs.")
    print("kiln÷LiteRT: kiln's NumPy interpreter against LiteRT (XNNPACK) on the same quantized model.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
