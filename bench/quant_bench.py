"""Post-training quantization benchmark: kiln vs TensorFlow's converter, side by side.

For each model and mode, TF's float conversion is quantized by kiln (`kiln.quant.quantize`)
and, from the same Keras model, by TF's converter; both run in LiteRT on the same held-out
inputs. Printed: size ÷ float size, and max / mean absolute error against the float model,
for kiln and TF; then, on kiln's and on TF's quantized model, the latency of kiln's interpreter
and of LiteRT side by side (interleaved, median of 30; "before": kiln with its compiled delegate
alone, integer and hybrid nodes on their reference kernels, the anchor of what the quantized
delegate gains) and whether kiln's output is bit-identical
to LiteRT's reference kernels ("-" where kiln's runtime cannot run the model). Modes: dynamic
range, float16, int8 (full integer, float I/O), int16x8 (TF with float fallback), int4 (kiln's
int4-weight extension; no TF column). The LSTM models (T=12, batch 1) run the integer modes only;
the Keras 3 one is converted by kiln (TF's converter segfaults calibrating it, so TF is not run:
"-"). "fails": TF refused, or LiteRT cannot run TF's model.

    python bench/quant_bench.py [MODEL ...]      (default: cnn mlp mobilenet transformer lstm_tfk lstm_k3 bilstm_k3)
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
MODES = ("dynamic", "float16", "int8", "int16x8", "int4")
LSTM_MODES = ("int8", "int16x8")


def _tf_keras_lstm():
    import tf_keras

    tf_keras.utils.set_random_seed(0)
    L = tf_keras.layers
    return tf_keras.Sequential([L.InputLayer((12, 8), batch_size=1), L.LSTM(32), L.Dense(4)])


def _keras3_lstm():
    import keras

    keras.utils.set_random_seed(0)
    x = keras.Input((12, 8), batch_size=1)
    return keras.Model(x, keras.layers.Dense(4)(keras.layers.LSTM(32)(x)))


def _keras3_bilstm():
    import keras

    keras.utils.set_random_seed(0)
    L = keras.layers
    x = keras.Input((12, 8), batch_size=1)
    return keras.Model(x, L.Dense(4)(L.LSTM(8)(L.Bidirectional(L.LSTM(16, return_sequences=True))(x))))


#: name -> (builder, modes, whether TF's converter may be run on it)
EXTRA = {"lstm_tfk": (_tf_keras_lstm, LSTM_MODES, True), "lstm_k3": (_keras3_lstm, LSTM_MODES, False),
         "bilstm_k3": (_keras3_bilstm, LSTM_MODES, False)}


def _litert(model: bytes, x: np.ndarray) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=model)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


def _runtime_side_by_side(model: bytes, x: np.ndarray, runs: int = 30):
    """(kiln ms, LiteRT ms, kiln == BUILTIN_REF, before ms) on ``model``: median invoke times
    of kiln's default interpreter (its NumPy delegate), LiteRT's default one (XNNPACK) and kiln
    with the delegate's float chains alone (the default before the integer chains), interleaved; None
    when kiln cannot run it, exactness None when BUILTIN_REF cannot."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    import kiln
    from kiln.delegates import NumpyDelegate

    interps = {"kiln": kiln.Interpreter(model_content=model), "litert": Interpreter(model_content=model),
               "before": kiln.Interpreter(model_content=model, experimental_delegates=[NumpyDelegate(types=[None])],
                                          experimental_op_resolver_type=kiln.OpResolverType.BUILTIN_REF)}
    try:
        interps["ref"] = Interpreter(model_content=model, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    except ValueError as exc:   # int4 DEPTHWISE_CONV_2D (v7): only LiteRT's optimized resolvers have it
        print(f"  BUILTIN_REF cannot run it: {str(exc).splitlines()[0]}")
    try:   # kiln refuses a node it has no kernel for at allocate_tensors, as LiteRT's Prepare
        for interp in interps.values():
            interp.allocate_tensors()
            interp.set_tensor(interp.get_input_details()[0]["index"], x)
        interps["kiln"].invoke()
    except kiln.KilnError as exc:
        print(f"  kiln cannot run it: {exc}")
        return None
    exact = None
    if "ref" in interps:
        interps["ref"].invoke()
        outputs = [interps[k].get_tensor(interps[k].get_output_details()[0]["index"]) for k in ("kiln", "ref")]
        exact = bool(np.array_equal(*outputs))
    times = {"kiln": [], "litert": [], "before": []}
    for _ in range(runs):
        for name in times:
            start = time.perf_counter()
            interps[name].invoke()
            times[name].append(time.perf_counter() - start)
    return (1e3 * float(np.median(times["kiln"])), 1e3 * float(np.median(times["litert"])), exact,
            1e3 * float(np.median(times["before"])))


def _shown(side) -> str:
    if side is None:
        return f"{'-':>8} {'-':>8} {'-':>6} {'-':>4} {'-':>6}"
    kiln_ms, litert_ms, exact, before_ms = side
    shown = "-" if exact is None else "yes" if exact else "no"
    return f"{kiln_ms:>8.2f} {litert_ms:>8.2f} {kiln_ms / litert_ms:>5.1f}x {shown:>4} {before_ms / litert_ms:>5.1f}x"


def _tf_quantized(keras_model, mode: str, data):
    import tensorflow as tf

    conv = tf.lite.TFLiteConverter.from_keras_model(keras_model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    if mode == "float16":
        conv.target_spec.supported_types = [tf.float16]
    if mode in ("int8", "int16x8"):
        conv.representative_dataset = lambda: ([d] for d in data)
    if mode == "int16x8":
        conv.target_spec.supported_ops = [tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8,
                                          tf.lite.OpsSet.TFLITE_BUILTINS]
    try:
        with contextlib.redirect_stdout(io.StringIO()):   # Keras' export prints its signature
            return conv.convert()
    except Exception:  # noqa: BLE001 - TF refuses (16x8 LSTM): reported as "fails"
        return None


def _errors(model: bytes | None, held_out, reference):
    """(max, mean) |error| in LiteRT, or None where there is no model or LiteRT cannot run it."""
    if model is None:
        return None
    try:
        diffs = [np.abs(_litert(model, x) - r) for x, r in zip(held_out, reference)]
    except RuntimeError:
        return None
    return max(float(d.max()) for d in diffs), float(np.mean([d.mean() for d in diffs]))


def main(names: list[str]) -> int:
    import tensorflow as tf

    import kiln
    from kiln.quant import quantize

    names = names or ["cnn", "mlp", "mobilenet", "transformer", "lstm_tfk", "lstm_k3", "bilstm_k3"]
    runtime = f"{'kiln ms':>8} {'LiteRT':>8} {'ratio':>6} {'=ref':>4} {'before':>6}"
    header = (f"{'model':<12} {'mode':<8} {'kiln size':>9} {'tf size':>8} {'kiln max err':>12} {'tf max err':>10} "
              f"{'kiln mean':>10} {'tf mean':>9} {'kiln s':>7} | {runtime} | {runtime}")
    groups = ("runtime on kiln's model", "runtime on TF's model")
    print(" " * header.index("|") + f"| {groups[0]:<{len(runtime)}} | {groups[1]}")
    print(header)
    print("-" * len(header))
    for name in names:
        builder, modes, tf_may_run = EXTRA.get(name, (lambda: zoo.BUILDERS[MODELS[name]]().obj, MODES, True))
        keras_model = builder()
        rng = np.random.default_rng(0)
        shape = (1,) + tuple(keras_model.inputs[0].shape[1:])
        calibration = [rng.uniform(-1, 1, shape).astype(np.float32) for _ in range(32)]
        held_out = [rng.uniform(-1, 1, shape).astype(np.float32) for _ in range(32)]
        with contextlib.redirect_stdout(io.StringIO()):
            converter = tf.lite.TFLiteConverter if tf_may_run else kiln.TFLiteConverter
            float_model = converter.from_keras_model(keras_model).convert()
        reference = [_litert(float_model, x) for x in held_out]
        for mode in modes:
            start = time.perf_counter()
            ours = quantize(float_model, mode, representative_dataset=lambda: ([d] for d in calibration),
                            progress=False)
            seconds = time.perf_counter() - start
            tf_has_it = tf_may_run and mode != "int4"   # int4 weights: kiln's extension
            theirs = _tf_quantized(keras_model, mode, calibration) if tf_has_it else None
            mine, tf_errs = _errors(ours, held_out, reference), _errors(theirs, held_out, reference)
            tf_cell = "-" if not tf_has_it else "fails"
            tf_size = f"{len(theirs) / len(float_model):.2f}" if theirs is not None else tf_cell
            tf_max, tf_mean = (f"{tf_errs[0]:.2e}", f"{tf_errs[1]:.2e}") if tf_errs else (tf_cell, tf_cell)
            x = held_out[0].astype(np.float32)
            sides = [_shown(_runtime_side_by_side(model, x) if model is not None and errs is not None else None)
                     for model, errs in ((ours, mine), (theirs, tf_errs))]
            print(f"{name:<12} {mode:<8} {len(ours) / len(float_model):>9.2f} {tf_size:>8} "
                  f"{mine[0]:>12.2e} {tf_max:>10} {mine[1]:>10.2e} {tf_mean:>9} {seconds:>7.2f} "
                  f"| {sides[0]} | {sides[1]}")
    print("\nsize = bytes / float model bytes; errors = |LiteRT(quantized) - LiteRT(float)| on 32 held-out inputs.")
    print("kiln ms / LiteRT: median invoke of kiln's NumPy interpreter (default: its compiled and quantized")
    print("delegates) and of LiteRT (default resolver, XNNPACK) on the same quantized model, interleaved;")
    print("ratio = kiln / LiteRT; before = kiln with the compiled delegate only (the default before the quantized")
    print("delegate: integer and hybrid nodes on their reference kernels) / LiteRT, timed in the same run;")
    print("=ref: kiln's output equals LiteRT's reference kernels (BUILTIN_REF) bit for bit (float and hybrid")
    print("models differ by float rounding: 'no').")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
