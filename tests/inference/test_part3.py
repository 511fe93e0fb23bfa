"""Part 3 (#26): warm-up that cannot hurt the model, batching that cannot change results, the model kept whole."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from kiln.errors import KilnError  # noqa: E402
from kiln.inference import convert, effects, savedmodel  # noqa: E402

from . import models  # noqa: E402

F32 = "\nbfloat16_optimization: DISABLED\nio_shape_optimization: DISABLED\n"
BF16, FLOAT = 14, 1


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("part3")


@pytest.fixture(scope="module")
def running_mean(root):
    return models.save_running_mean(root / "running_mean")


def _load(path):
    return tf.saved_model.load(str(path))


def _call(loaded, key, **feeds):
    return {k: v.numpy() for k, v in loaded.signatures[key](**{n: tf.constant(v) for n, v in feeds.items()}).items()}


# -- side effects -------------------------------------------------------------------------------

def test_state_changes_are_found_through_calls(running_mean):
    model = savedmodel.read(running_mean)
    found = effects.signature_effects(model)
    assert sorted(found) == ["serving_default", "set_w"]  # `state` only reads
    assert all(e.op == "AssignVariableOp" for e in found["set_w"])
    assert "on variable" in str(found["serving_default"][0]) and "body" in found["serving_default"][0].function


def test_bfloat16_keeps_a_state_update_in_float32(root, running_mean):
    """The running mean is computed from the matmul: the whole update stays float32, so the state
    after ten calls equals the float32 model's (it drifted by bfloat16 rounding per call before)."""
    out = root / "running_mean_bf16"
    report = convert(running_mean, str(out), 'tpu_functions { function_alias: "body" } '
                     "io_shape_optimization: DISABLED skip_accuracy_check: true")
    assert any("compute a state update" in c for s in report.stages for c in s.changes)
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    before, after = _load(running_mean), _load(out)
    for _ in range(10):
        want, got = _call(before, "serving_default", x=x), _call(after, "serving_default", x=x)
    np.testing.assert_allclose(_call(after, "state")["mean"], _call(before, "state")["mean"], rtol=1e-6)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-2, atol=1e-2)  # the output itself is bfloat16's
