"""The quantized zoo models — kiln's and TensorFlow's int8, int8 / uint8 I/O and 16x8
conversions — run fully claimed by XlaDelegate, bit for bit with LiteRT's BUILTIN_REF.

Every node must be claimed (one compiled program per model; the full-integer LSTMs are
tests/xla/test_quant_lstm.py's), and the integer outputs must equal BUILTIN_REF's exactly on
held-out inputs, invoke after invoke. TF cannot make a 16x8 transformer (no 16x8 NEG); kiln
can, and that model is here too."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("tensorflow")

import kiln  # noqa: E402
from kiln.xla import XlaDelegate  # noqa: E402
from tests.quant import zoo_models  # noqa: E402
from tests.quant.zoo_models import builtin_ref, invoke  # noqa: E402

SMALL = ["k3_mlp"]
LARGE = ["k3_cnn", "tfk_cnn", "k3_transformer", "k3_separable", "k3_mobilenet_v2"]
#: The smallest model in the fast lane (the one-op sweeps cover each kernel there), the others in the slow one.
MODELS = SMALL + [pytest.param(name, marks=pytest.mark.slow) for name in LARGE]
TF_MODES = ("int8", "int8io", "uint8io", "int16x8")
KILN_MODES = ("int8", "int16x8")
#: (model, mode) TF's converter cannot make, and MobileNet's TF variants (its calibration in
#: TF dominates the time; kiln's own MobileNet models are here).
TF_SKIP = {("k3_transformer", "int16x8"), *(("k3_mobilenet_v2", mode) for mode in TF_MODES)}


def _models(name):
    """({(maker, mode): quantized model}, 3 held-out inputs) of zoo model ``name``, calibrated
    on 8 samples of seed 3 (each model built once per session: tests/quant/zoo_models.py)."""
    return zoo_models.quantized(name, [m for m in TF_MODES if (name, m) not in TF_SKIP], KILN_MODES, held_out=3)


def _check(name):
    models, held_out = _models(name)
    for (maker, mode), model in models.items():
        what = f"{name}, {maker}'s {mode} model"
        delegate = XlaDelegate()
        ours = kiln.Interpreter(model_content=model, experimental_delegates=[delegate])
        ref = builtin_ref(model)
        ours.allocate_tensors()
        assert not delegate.rejected, f"{what}: nodes left to the reference kernels: {delegate.rejected}"
        assert len(delegate.kernels) == 1, f"{what}: {len(delegate.kernels)} partitions"
        for x in held_out:
            for got, want in zip(invoke(ours, x), invoke(ref, x)):
                assert got.dtype == want.dtype and got.shape == want.shape, what
                np.testing.assert_array_equal(got, want, err_msg=what)


@pytest.mark.parametrize("name", MODELS)
def test_quantized_models_fully_claimed_and_bit_exact(name):
    _check(name)
