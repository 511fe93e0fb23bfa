"""Models the quantization tests share: the converter zoo's Keras models with their
calibration and held-out data and their conversions (TF's float model, TF's and kiln's
quantized ones), and the sequence-LSTM tests' inputs and TF's own int8 LSTMs.

Builds are cached per process (one pytest session or xdist worker): the Keras models, TF's
float conversions and the quantized models of a (model, mode, seed, sample count) are made
once however many test files ask, so files checking the same models share TF's calibrations
(the suite's slowest steps). Data is drawn afresh each call: cheap, and no test can change
another's arrays."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from tests.converter import zoo

#: TF's converter settings per mode: "dynamic" (weights only, hybrid kernels), "float16"
#: weights, full-integer "int8" (float I/O), "int8io" / "uint8io" (integer I/O) and "int16x8".
TF_MODES = ("int8", "int8io", "uint8io", "int16x8", "dynamic", "float16")


def _heads():
    """Pooling, concatenation and the three bounded outputs (softmax, logistic, tanh)."""
    import keras

    L = keras.layers
    x = keras.Input((8, 8, 3))
    a = L.MaxPooling2D()(L.Conv2D(4, 3, padding="same", activation="relu")(x))
    b = L.AveragePooling2D(2)(L.Conv2D(4, 1)(x))
    y = L.Flatten()(L.Concatenate()([a, b]))
    m = keras.Model(x, L.Concatenate()([L.Dense(3, activation=f)(y) for f in ("softmax", "sigmoid", "tanh")]))
    zoo.randomize(m)
    return m


#: Models beside the zoo's (whose builders return a `zoo.Source`), name -> Keras model.
EXTRA = {"heads": _heads}


@contextlib.contextmanager
def quiet():
    """TF's converter prints to stdout and to file descriptor 2: both silenced."""
    with contextlib.redirect_stdout(io.StringIO()), zoo._silent_fd2():
        yield


@functools.lru_cache(maxsize=None)
def keras_model(name: str):
    """The zoo's (or `EXTRA`'s) Keras model ``name``, built once (its weights are seeded)."""
    return EXTRA[name]() if name in EXTRA else zoo.BUILDERS[name]().obj


def data(name: str, seed: int, calibration: int, held_out: int = 0) -> tuple[list, list]:
    """``calibration`` then ``held_out`` batch-1 inputs to model ``name``, uniform in [-1, 1),
    drawn in that order from one generator seeded ``seed``."""
    rng = np.random.default_rng(seed)
    shape = (1,) + tuple(keras_model(name).inputs[0].shape[1:])
    draw = lambda n: [rng.uniform(-1, 1, shape).astype(np.float32) for _ in range(n)]  # noqa: E731
    first = draw(calibration)
    return first, draw(held_out)


@functools.lru_cache(maxsize=None)
def tf_float(name: str) -> bytes:
    """TF's float .tflite of model ``name``."""
    import tensorflow as tf

    with quiet():
        return tf.lite.TFLiteConverter.from_keras_model(keras_model(name)).convert()


def tf_quantize(keras_obj, mode: str, calibration) -> bytes:
    """TF's converter's ``mode`` (one of `TF_MODES`) quantization of a Keras model; TF's
    exceptions pass through."""
    import tensorflow as tf

    if mode not in TF_MODES:   # else a typo would quietly make a dynamic-range model
        raise ValueError(f"tf_quantize: unknown mode {mode!r}; one of {TF_MODES}")
    conv = tf.lite.TFLiteConverter.from_keras_model(keras_obj)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    if mode == "float16":
        conv.target_spec.supported_types = [tf.float16]
    if mode in ("int8", "int8io", "uint8io", "int16x8"):
        conv.representative_dataset = lambda: ([d] for d in calibration)
    if mode == "int16x8":
        conv.target_spec.supported_ops = [tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]
    if mode in ("int8io", "uint8io"):
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        conv.inference_input_type = conv.inference_output_type = tf.int8 if mode == "int8io" else tf.uint8
    with quiet():
        return conv.convert()


def kiln_quantize(float_model: bytes, mode: str, calibration, **options) -> bytes:
    """``kiln.quantize`` of a float .tflite with ``calibration`` as its representative data."""
    import kiln

    return kiln.quantize(float_model, mode, progress=False,
                         representative_dataset=lambda: ([d] for d in calibration), **options)


@functools.lru_cache(maxsize=None)
def tf_quantized(name: str, mode: str, seed: int, samples: int) -> bytes:
    """`tf_quantize` of model ``name`` calibrated on ``data(name, seed, samples)``, made once."""
    return tf_quantize(keras_model(name), mode, data(name, seed, samples)[0])


@functools.lru_cache(maxsize=None)
def kiln_quantized(name: str, mode: str, seed: int, samples: int) -> bytes:
    """`kiln_quantize` of TF's float model ``name`` on ``data(name, seed, samples)``, made once."""
    return kiln_quantize(tf_float(name), mode, data(name, seed, samples)[0])


def quantized(name: str, tf_modes, kiln_modes, held_out: int, seed: int = 3, samples: int = 8):
    """({("tf" or "kiln", mode): quantized model}, held-out inputs) of model ``name``: TF's
    ``tf_modes`` and kiln's ``kiln_modes`` calibrated on ``samples`` inputs of ``seed``, then
    ``held_out`` more inputs of the same generator."""
    models = {("tf", mode): tf_quantized(name, mode, seed, samples) for mode in tf_modes}
    models.update({("kiln", mode): kiln_quantized(name, mode, seed, samples) for mode in kiln_modes})
    return models, data(name, seed, samples, held_out)[1]


def invoke(interp, x) -> list[np.ndarray]:
    """Allocate, set the one input (quantized with its own parameters where it is integer),
    invoke, and return every output as stored."""
    interp.allocate_tensors()
    d = interp.get_input_details()[0]
    if d["dtype"] != np.float32:
        scale, zero_point = d["quantization"]
        info = np.iinfo(d["dtype"])
        x = np.clip(np.round(x / scale) + zero_point, info.min, info.max).astype(d["dtype"])
    interp.set_tensor(d["index"], x)
    interp.invoke()
    return [interp.get_tensor(o["index"]) for o in interp.get_output_details()]


def builtin_ref(model: bytes):
    """LiteRT's interpreter with its reference kernels (BUILTIN_REF) on ``model``."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    return Interpreter(model_content=model, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)


def compare_with_builtin_ref(model: bytes, inputs, exact: bool) -> None:
    """kiln's default Interpreter against LiteRT's BUILTIN_REF on each input: same dtypes and
    shapes; equal outputs (``exact``) or equal to float32 rounding of the outputs' magnitude."""
    import kiln

    ref, ours = builtin_ref(model), kiln.Interpreter(model_content=model)
    for x in inputs:
        for got, want in zip(invoke(ours, x), invoke(ref, x)):
            assert got.dtype == want.dtype and got.shape == want.shape
            if exact:
                np.testing.assert_array_equal(got, want)
            else:
                np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * max(1.0, float(np.abs(want).max())))


# -- sequence LSTMs ----------------------------------------------------------------------------------

#: The LSTM tests' (and TF's int8 LSTMs') time steps and features.
T, FEATURES = 6, 5


def lstm_inputs(count: int, seed: int, batch: int = 1, bound: float = 1.0) -> list[np.ndarray]:
    """``count`` float (batch, T, FEATURES) inputs, uniform in [-bound, bound)."""
    rng = np.random.default_rng(seed)
    return [rng.uniform(-bound, bound, (batch, T, FEATURES)).astype(np.float32) for _ in range(count)]


@functools.lru_cache(maxsize=None)
def tf_int8_lstms() -> dict[str, bytes]:
    """TF's int8 tf_keras LSTMs calibrated on 16 and on 64 samples ("calib16", "calib64"),
    made once per session by tests/quant/tf_int8_lstm_model.py in a subprocess (TF's
    converter can crash the process)."""
    root = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, "-m", "tests.quant.tf_int8_lstm_model", out], check=True, cwd=root,
                       env={**os.environ, "PYTHONPATH": str(root), "TF_CPP_MIN_LOG_LEVEL": "2"},
                       capture_output=True, timeout=300)
        return {name: (Path(out) / f"{name}.tflite").read_bytes() for name in ("calib16", "calib64")}
