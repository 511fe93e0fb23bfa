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

Two more tables:

    python bench/quant_bench.py calibration [ROUNDS]   int8 conversion of MobileNetV2 at 224 with 100 samples:
        kiln's converter vs TF's, interleaved (ROUNDS each, default 2), and calibration alone on
        each of kiln's calibration backends (kiln.quant.backends)
    python bench/quant_bench.py trained [MODEL ...]    models trained on scikit-learn's datasets
        (bench/trained_models.py): accuracy and SQNR of kiln's and TF's quantized models per mode
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


# -- calibration speed: MobileNetV2 at 224, 100 samples -------------------------------------------

def calibration(rounds: int = 2) -> int:
    """kiln's and TF's int8 conversions of MobileNetV2 (224x224, random weights) calibrated on
    the same 100 samples, timed interleaved; then calibration alone per backend."""
    import keras
    import tensorflow as tf

    import kiln
    from kiln.quant import backends
    from kiln.quant.calibrate import calibrate

    keras.utils.set_random_seed(0)
    model = keras.applications.MobileNetV2(weights=None, input_shape=(224, 224, 3))
    rng = np.random.default_rng(0)
    data = [rng.uniform(-1, 1, (1, 224, 224, 3)).astype(np.float32) for _ in range(100)]

    def with_kiln():
        conv = kiln.TFLiteConverter.from_keras_model(model)
        conv.optimizations = [kiln.Optimize.DEFAULT]
        conv.representative_dataset = lambda: ([d] for d in data)
        return conv.convert()

    def with_tf():
        conv = tf.lite.TFLiteConverter.from_keras_model(model)
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.representative_dataset = lambda: ([d] for d in data)
        with contextlib.redirect_stdout(io.StringIO()):
            return conv.convert()

    times: dict[str, list[float]] = {"kiln": [], "tf": []}
    for _ in range(rounds):
        for name, fn in (("tf", with_tf), ("kiln", with_kiln)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    kiln_s, tf_s = float(np.median(times["kiln"])), float(np.median(times["tf"]))
    print(f"int8 conversion, MobileNetV2 224x224, 100 samples ({rounds} interleaved rounds, median):")
    print(f"  TF's converter   {tf_s:7.1f} s   ({', '.join(f'{t:.1f}' for t in times['tf'])})")
    print(f"  kiln's converter {kiln_s:7.1f} s   ({', '.join(f'{t:.1f}' for t in times['kiln'])})   "
          f"= {kiln_s / tf_s:.2f}x TF's")
    float_model = kiln.read_model(kiln.TFLiteConverter.from_keras_model(model).convert())
    print("calibration alone (the same float model and samples):")
    for backend in ("tensorflow", "litert", "kiln"):
        runner_samples = data if backend != "kiln" else data[:10]   # kiln's interpreter: 10, scaled
        start = time.perf_counter()
        calibrate(float_model, [[d] for d in runner_samples], progress=False, backend=backend)
        seconds = (time.perf_counter() - start) * len(data) / len(runner_samples)
        note = " (10 samples timed, x10)" if backend == "kiln" else ""
        print(f"  {backend:<10} {seconds:7.1f} s{note}")
    print(f"  batch size for this model: {backends.batch_size([t for t in float_model.main.tensors if t.producer])}")
    return 0


# -- trained models: accuracy and SQNR per mode ----------------------------------------------------

TRAINED_MODES = (("dynamic", {}), ("float16", {}), ("int8", {}),
                 ("int8 int-only", {"integer_only": True, "inference_input_type": "int8",
                                    "inference_output_type": "int8"}),
                 ("int16x8", {}), ("weight_only", {}))


def _tf_trained(keras_model, mode: str, data):
    import tensorflow as tf

    conv = tf.lite.TFLiteConverter.from_keras_model(keras_model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    if mode == "float16":
        conv.target_spec.supported_types = [tf.float16]
    if mode.startswith("int"):
        conv.representative_dataset = lambda: ([d] for d in data)
    if mode == "int16x8":
        conv.target_spec.supported_ops = [tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8,
                                          tf.lite.OpsSet.TFLITE_BUILTINS]
    if mode == "int8 int-only":
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        conv.inference_input_type = conv.inference_output_type = tf.int8
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return conv.convert()
    except Exception as exc:  # noqa: BLE001 - TF refuses: reported
        return f"fails ({type(exc).__name__})"


def _predict(model: bytes, x: np.ndarray) -> np.ndarray:
    """Every row of ``x`` through LiteRT (default resolver), outputs as float."""
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=model)
    interp.allocate_tensors()
    d_in, d_out = interp.get_input_details()[0], interp.get_output_details()[0]
    out = []
    for row in x:
        interp.reset_all_variables()   # TF's LSTMs keep their state in variables: one sequence per row
        v = row[None]
        if d_in["dtype"] != np.float32:
            scale, zero = d_in["quantization"]
            v = np.clip(np.round(v / scale) + zero, -128, 127).astype(d_in["dtype"])
        interp.set_tensor(d_in["index"], v)
        interp.invoke()
        y = interp.get_tensor(d_out["index"])
        if y.dtype != np.float32:
            scale, zero = d_out["quantization"]
            y = (y.astype(np.float32) - zero) * scale
        out.append(y.reshape(-1))
    return np.stack(out)


def _sqnr(reference: np.ndarray, got: np.ndarray) -> float:
    noise = float(np.sum((got.astype(np.float64) - reference) ** 2))
    return float("inf") if noise == 0 else 10 * np.log10(float(np.sum(reference.astype(np.float64) ** 2)) / noise)


def trained(names: list[str]) -> int:
    import tensorflow as tf

    import kiln
    from bench import trained_models

    names = names or list(trained_models.MODELS)
    print(f"{'model':<24} {'mode':<14} {'kiln acc':>8} {'TF acc':>8} {'kiln SQNR':>10} {'TF SQNR':>10}")
    print("-" * 80)
    for name in names:
        t = trained_models.MODELS[name]()
        recurrent_k3 = t.keras3 and any(type(layer).__name__ in ("LSTM", "GRU") for layer in t.model.layers)
        with contextlib.redirect_stdout(io.StringIO()):
            converter = kiln.TFLiteConverter if recurrent_k3 else tf.lite.TFLiteConverter
            float_model = converter.from_keras_model(t.model).convert()
        reference = _predict(float_model, t.x_test)
        accuracy = float(np.mean(reference.argmax(-1) == t.y_test))
        print(f"{t.name:<24} {'float':<14} {accuracy:>8.1%}")
        for mode, options in TRAINED_MODES:
            kiln_mode = "int8" if mode == "int8 int-only" else mode
            try:
                ours = kiln.quantize(float_model, kiln_mode, representative_dataset=t.calibration, progress=False,
                                     **options)
                got = _predict(ours, t.x_test)
                mine = f"{np.mean(got.argmax(-1) == t.y_test):.1%}", f"{_sqnr(reference, got):.1f}"
            except kiln.KilnError as exc:
                mine = ("refuses", "")
                print(f"    kiln {mode}: {str(exc)[:120]}")
            if mode == "weight_only":
                theirs = "-"             # kiln's extension
            elif recurrent_k3 and mode.startswith("int"):
                theirs = "segfault"      # TF's converter crashes calibrating Keras 3 recurrent layers: not run
            else:
                theirs = _tf_trained(t.model, mode, t.calibration)
            if isinstance(theirs, bytes):
                try:
                    got = _predict(theirs, t.x_test)
                    tf_cells = f"{np.mean(got.argmax(-1) == t.y_test):.1%}", f"{_sqnr(reference, got):.1f}"
                except RuntimeError:
                    tf_cells = "LiteRT fails", ""
            else:
                tf_cells = theirs, ""
            print(f"{'':<24} {mode:<14} {mine[0]:>8} {tf_cells[0]:>8} {mine[1]:>10} {tf_cells[1]:>10}")
    print("\naccuracy on each dataset's held-out split, in LiteRT (default resolver); SQNR (dB) of the quantized")
    print("model's outputs against the float model's; kiln quantizes TF's float conversion (kiln's own for Keras 3")
    print("recurrent layers); segfault: TF's converter crashes calibrating them (not run); '-': kiln's extension.")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["calibration"]:
        sys.exit(calibration(*(int(a) for a in sys.argv[2:3])))
    if sys.argv[1:2] == ["trained"]:
        sys.exit(trained(sys.argv[2:]))
    sys.exit(main(sys.argv[1:]))
