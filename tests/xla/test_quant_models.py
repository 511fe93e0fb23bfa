"""The quantized zoo models — kiln's and TensorFlow's int8, int8 / uint8 I/O and 16x8
conversions — run fully claimed by XlaDelegate, bit for bit with LiteRT's BUILTIN_REF.

Every node must be claimed (one compiled program per model; the full-integer LSTMs are
tests/xla/test_quant_lstm.py's), and the integer outputs must equal BUILTIN_REF's exactly on
held-out inputs, invoke after invoke. TF cannot make a 16x8 transformer (no 16x8 NEG); kiln
can, and that model is here too."""

from __future__ import annotations

import contextlib
import functools
import io

import numpy as np
import pytest

pytest.importorskip("jax")
tf = pytest.importorskip("tensorflow")

import kiln  # noqa: E402
from kiln.xla import XlaDelegate  # noqa: E402
from tests.converter import zoo  # noqa: E402
from tests.quant.test_runtime_models import _feed, _tf_quantized  # noqa: E402

SMALL = ["k3_mlp", "k3_cnn", "tfk_cnn"]
LARGE = ["k3_transformer", "k3_separable", "k3_mobilenet_v2"]
TF_MODES = ("int8", "int8io", "uint8io", "int16x8")
KILN_MODES = ("int8", "int16x8")
#: (model, mode) TF's converter cannot make, and MobileNet's TF variants (its calibration in
#: TF dominates the time; kiln's own MobileNet models are here).
TF_SKIP = {("k3_transformer", "int16x8"), *(("k3_mobilenet_v2", mode) for mode in TF_MODES)}


@functools.lru_cache(maxsize=None)
def _models(name):
    keras_model = zoo.BUILDERS[name]().obj
    rng = np.random.default_rng(3)
    shape = (1,) + tuple(keras_model.inputs[0].shape[1:])
    calibration = [rng.uniform(-1, 1, shape).astype(np.float32) for _ in range(8)]
    held_out = [rng.uniform(-1, 1, shape).astype(np.float32) for _ in range(3)]
    with contextlib.redirect_stdout(io.StringIO()), zoo._silent_fd2():
        float_model = tf.lite.TFLiteConverter.from_keras_model(keras_model).convert()
    models = {("tf", mode): _tf_quantized(keras_model, mode, calibration)
              for mode in TF_MODES if (name, mode) not in TF_SKIP}
    for mode in KILN_MODES:
        models[("kiln", mode)] = kiln.quantize(float_model, mode, progress=False,
                                               representative_dataset=lambda: ([d] for d in calibration))
    return models, held_out


def _check(name):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    models, held_out = _models(name)
    for (maker, mode), model in models.items():
        what = f"{name}, {maker}'s {mode} model"
        delegate = XlaDelegate()
        ours = kiln.Interpreter(model_content=model, experimental_delegates=[delegate])
        ref = Interpreter(model_content=model, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
        ours.allocate_tensors()
        assert not delegate.rejected, f"{what}: nodes left to the reference kernels: {delegate.rejected}"
        assert len(delegate.kernels) == 1, f"{what}: {len(delegate.kernels)} partitions"
        for x in held_out:
            for got, want in zip(_feed(ours, x), _feed(ref, x)):
                assert got.dtype == want.dtype and got.shape == want.shape, what
                np.testing.assert_array_equal(got, want, err_msg=what)


@pytest.mark.parametrize("name", SMALL)
def test_small_quantized_models_fully_claimed_and_bit_exact(name):
    _check(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", LARGE)
def test_large_quantized_models_fully_claimed_and_bit_exact(name):
    _check(name)
