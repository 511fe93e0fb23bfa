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


# -- the accuracy guard (item 6) -----------------------------------------------------------------

@pytest.fixture(scope="module")
def parses_strings(root):
    return models.save_parses_strings(root / "csv")


def test_guard_never_passes_silently_and_takes_real_inputs(root, parses_strings):
    from kiln.inference import AccuracyNotMeasuredWarning

    options = 'tpu_functions { function_alias: "body" } io_shape_optimization: DISABLED'
    with pytest.warns(AccuracyNotMeasuredWarning, match=r"bfloat16 on signature 'serving_default' \(the model "
                                                        r"before bfloat16 fails on generated inputs"):
        report = convert(parses_strings, str(root / "csv_generated"), options)
    assert report.unmeasured and report.to_dict()["unmeasured"][0]["stage"] == "bfloat16"
    # real inputs as an iterable of samples (the quantization dataset formats work too: see test_cli)
    samples = [{"text": models.csv_rows(2, seed)} for seed in range(6)]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", AccuracyNotMeasuredWarning)
        report = convert(parses_strings, str(root / "csv_real"), options, evaluation_data=samples)
    measured = report.accuracy["bfloat16"]["serving_default"]
    assert measured["source"] == "evaluation data" and measured["rows"] == 12
    assert 0 < measured["outputs"]["y"]["max_rel"] < 2e-2 and not report.unmeasured


def test_skipping_the_guard_measures_nothing_and_says_so(root, parses_strings):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = convert(parses_strings, str(root / "csv_skip"), 'tpu_functions { function_alias: "body" } '
                         "skip_accuracy_check: true")
    assert report.accuracy == {} and report.accuracy_skipped and not report.unmeasured
    assert "error vs float32: not measured (skip_accuracy_check)" in report.text
    assert "Accuracy check: skipped" in report.text


def test_report_columns_widen_for_large_costs():
    from kiln.inference.report import ConversionReport, FunctionEntry

    report = ConversionReport("in", "out", cpu_cost=1234)
    report.functions = [FunctionEntry("__inference_big_7", "alias", 123456789, 0, [], 1)]
    lines = report.text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("%"))
    assert lines[header] == "%         Cost       Name"
    assert lines[header + 3] == f"{100 * 123456789 / 123458023:<10.2f}123456789  __inference_big_7"
    assert len(lines[header - 1]) == len(lines[header + 1]) == len(lines[header + 4]) == 24 + 11
