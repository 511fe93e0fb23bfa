"""Whole quantized models — made by kiln (`kiln.quantize`) and by TensorFlow's converter —
run in kiln's Interpreter and in LiteRT with its reference kernels (BUILTIN_REF).

Integer models (int8 or 16x8 inside; float, int8 or uint8 at the edges) must agree bit for bit,
in the default runtime (its quantized delegate) as with kiln's own BUILTIN_REF.
Hybrid, float16-weight and weight-only models run kiln's hybrid kernels (bit-exact per op,
tests/quant/test_dispatch.py) between float kernels, whose float32 sums are ordered
differently from LiteRT's reference loops, so those outputs agree to float rounding."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest

import kiln
from tests.converter import zoo

SMALL = ["k3_mlp", "k3_cnn", "tfk_cnn"]
LARGE = ["k3_mobilenet_v2", "k3_transformer", "k3_separable"]
TF_MODES = ("int8", "int8io", "uint8io", "int16x8", "dynamic", "float16")
KILN_MODES = ("int8", "int16x8", "dynamic", "float16", "weight_only")
#: Left out: TF cannot make the transformer 16x8 (no 16x8 NEG); the MLP's 16x8 TANH uses a
#: sigmoid table kiln does not reproduce (kiln refuses that node, tests/quant/test_dispatch.py).
#: MobileNet's float modes are left to the small models: its float kernels dominate the time;
#: its int8 / uint8 I/O variants to the transformer and separable (TF's calibration of
#: MobileNet dominates the suite's time).
#: The small models (not slow) skip the modes the large ones cover, to stay quick.
SKIP = {("k3_transformer", "int16x8"), ("k3_mlp", "int16x8"), ("k3_mobilenet_v2", "dynamic"),
        ("k3_mobilenet_v2", "float16"), ("k3_mobilenet_v2", "weight_only"),
        ("k3_mobilenet_v2", "int8io"), ("k3_mobilenet_v2", "uint8io"),
        *((name, mode) for name in SMALL for mode in ("int8io", "float16", "weight_only"))}
#: Of those, the ones only TF's converter is the reason for: kiln's 16x8 transformer and MLP run.
TF_ONLY = {("k3_transformer", "int16x8"), ("k3_mlp", "int16x8")}


def _tf_quantized(keras_model, mode, calibration) -> bytes:
    import tensorflow as tf

    conv = tf.lite.TFLiteConverter.from_keras_model(keras_model)
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
    with contextlib.redirect_stdout(io.StringIO()), zoo._silent_fd2():
        return conv.convert()


@pytest.fixture(scope="module")
def built():
    """name -> (float model, {(maker, mode): quantized model}, held-out inputs), built once."""
    import tensorflow as tf

    cache = {}

    def build(name):
        if name not in cache:
            keras_model = zoo.BUILDERS[name]().obj
            rng = np.random.default_rng(3)
            shape = (1,) + tuple(keras_model.inputs[0].shape[1:])
            calibration = [rng.uniform(-1, 1, shape).astype(np.float32) for _ in range(8)]
            held_out = [rng.uniform(-1, 1, shape).astype(np.float32) for _ in range(2)]
            with contextlib.redirect_stdout(io.StringIO()), zoo._silent_fd2():
                float_model = tf.lite.TFLiteConverter.from_keras_model(keras_model).convert()
            models = {("tf", mode): _tf_quantized(keras_model, mode, calibration)
                      for mode in TF_MODES if (name, mode) not in SKIP}
            for mode in KILN_MODES:
                if (name, mode) in SKIP - TF_ONLY:
                    continue
                models[("kiln", mode)] = kiln.quantize(float_model, mode, progress=False,
                                                       representative_dataset=lambda: ([d] for d in calibration))
            cache[name] = (models, held_out)
        return cache[name]

    return build


def _feed(interp, x):
    interp.allocate_tensors()
    d = interp.get_input_details()[0]
    if d["dtype"] != np.float32:   # integer I/O: the input quantized with its own params
        scale, zero_point = d["quantization"]
        info = np.iinfo(d["dtype"])
        x = np.clip(np.round(x / scale) + zero_point, info.min, info.max).astype(d["dtype"])
    interp.set_tensor(d["index"], x)
    interp.invoke()
    return [interp.get_tensor(o["index"]) for o in interp.get_output_details()]


def _compare(model: bytes, inputs, exact: bool):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    ref = Interpreter(model_content=model, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    ours = kiln.Interpreter(model_content=model)
    for x in inputs:
        for got, want in zip(_feed(ours, x), _feed(ref, x)):
            assert got.dtype == want.dtype and got.shape == want.shape
            if exact:
                np.testing.assert_array_equal(got, want)
            else:
                np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * max(1.0, float(np.abs(want).max())))


def _check(built, name):
    models, held_out = built(name)
    for (maker, mode), model in models.items():
        integer = mode.startswith("int") or mode == "uint8io"
        try:
            _compare(model, held_out, exact=integer)
        except AssertionError as exc:
            raise AssertionError(f"{name}, {maker}'s {mode} model: {exc}") from None


@pytest.mark.parametrize("name", SMALL)
def test_small_models_bit_exact_with_builtin_ref(built, name):
    _check(built, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", LARGE)
def test_large_models_bit_exact_with_builtin_ref(built, name):
    _check(built, name)


def _default_path_check(built, name):
    """The default Interpreter (its delegates: compiled for float nodes, quantized for integer
    and hybrid ones) and kiln's BUILTIN_REF agree bit for bit on every quantized model, invoke
    after invoke on fresh inputs; the quantized delegate dropped no lowering and lowered nodes
    of every integer model (the zoo's small dynamic-range models keep float weights), and
    every node it claimed ran a lowering, not its reference kernel."""
    from kiln.delegates import QuantizedDelegate

    models, held_out = built(name)
    for (maker, mode), model in models.items():
        default = kiln.Interpreter(model_content=model)
        ref = kiln.Interpreter(model_content=model, experimental_op_resolver_type=kiln.OpResolverType.BUILTIN_REF)
        rng = np.random.default_rng(11)
        for k in range(3):
            x = rng.uniform(-1.5, 1.5, held_out[0].shape).astype(np.float32)
            for got, want in zip(_feed(default, x), _feed(ref, x)):
                assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), f"{name}, {maker}'s {mode}, run {k}"
        (delegate,) = [d for d in default._delegates if isinstance(d, QuantizedDelegate)]
        assert delegate.fallbacks == {}, f"{name}, {maker}'s {mode}: {delegate.fallbacks}"
        assert delegate.lowered or mode not in ("int8", "int8io", "uint8io", "int16x8"), (name, maker, mode)
        unlowered = sorted({(i, op) for i, op, _ in delegate.claimed} - delegate.lowered)
        assert not unlowered, f"{name}, {maker}'s {mode}: claimed but not lowered: {unlowered}"


@pytest.mark.parametrize("name", SMALL)
def test_small_models_default_path_is_builtin_ref(built, name):
    _default_path_check(built, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", LARGE)
def test_large_models_default_path_is_builtin_ref(built, name):
    _default_path_check(built, name)
