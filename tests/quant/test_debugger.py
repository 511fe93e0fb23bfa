"""kiln.QuantizationDebugger on models built in code: metrics against a hand computation,
the op with the broken range found, suggest_denylist meeting its target, robust matching
(renamed tensors, TensorFlow's int8 and 16x8 models), hybrid / float16 / weight-only models,
CSV and HTML, errors.

Integer models run through kiln's runtime and LiteRT's reference kernels (``runner``): the
kiln case is skipped while kiln's Interpreter cannot execute int8 ops yet.
"""

from __future__ import annotations

import csv
import functools
import io

import numpy as np
import pytest

import kiln
from kiln.format import read_model, write_model
from kiln.quant.calibrate import DatasetError, Range, calibrate
from kiln.quant.debug.match import MismatchError
from kiln.quant.debug.debugger import QuantizationDebugger, detect_mode
from kiln.quant.static import quantize_int8

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
litert = pytest.importorskip("ai_edge_litert.interpreter")

SHAPE = (1, 12, 12, 3)


def _cnn(dense_activation: str = "relu", batch: int | None = 1):
    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input(SHAPE[1:], batch_size=batch, name="x"),
        keras.layers.Conv2D(8, 3, activation="relu", name="conv2d"),
        keras.layers.DepthwiseConv2D(3, activation="relu", bias_initializer="ones", name="dw"),
        keras.layers.MaxPooling2D(name="pool"), keras.layers.Flatten(name="flat"),
        keras.layers.Dense(16, activation=dense_activation, name="dense"),
        keras.layers.Dense(5, name="logits"), keras.layers.Softmax(name="probs")])


@functools.lru_cache(maxsize=None)
def cnn() -> tuple[bytes, bytes, list[np.ndarray]]:
    """(float model, kiln's int8 model, 8 samples)."""
    float_model = kiln.TFLiteConverter.from_keras_model(_cnn()).convert()
    rng = np.random.default_rng(0)
    data = [rng.uniform(-1, 1, SHAPE).astype(np.float32) for _ in range(8)]
    return float_model, kiln.quantize(float_model, "int8", representative_dataset=data, progress=False), data


@functools.lru_cache(maxsize=None)
def broken_cnn() -> bytes:
    """The int8 CNN with its first convolution calibrated to a twentieth of its range."""
    float_model, _, data = cnn()
    model = read_model(float_model)
    ranges = calibrate(model, data, progress=False)
    conv = next(op.outputs[0] for op in model.main.operators if op.op_type == "CONV_2D")
    r = ranges[id(conv)]
    ranges[id(conv)] = Range(r.min / 20, r.max / 20)
    quantize_int8(model, data, ranges=ranges, progress=False)
    return write_model(model)


@functools.lru_cache(maxsize=None)
def _kiln_runs_int8() -> bool:
    interp = kiln.Interpreter(model_content=cnn()[1])
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], cnn()[2][0])
    try:
        interp.invoke()
    except kiln.OpError as exc:
        if "not implemented" in str(exc):
            return False
        raise
    return True


@pytest.fixture(params=["kiln", "litert"])
def runner(request):
    if request.param == "kiln" and not _kiln_runs_int8():
        pytest.skip("kiln's Interpreter cannot run int8 ops yet")
    return request.param


def _interpreter(runner: str, model: bytes):
    if runner == "kiln":
        return kiln.Interpreter(model_content=model, experimental_preserve_all_tensors=True)
    return litert.Interpreter(model_content=model, experimental_preserve_all_tensors=True,
                              experimental_op_resolver_type=litert.OpResolverType.BUILTIN_REF)


def _all_tensors(runner: str, model: bytes, x: np.ndarray) -> dict[str, tuple[np.ndarray, tuple]]:
    """name -> (value, (scale, zero point)) after one invoke, read through the interpreter's API."""
    interp = _interpreter(runner, model)
    interp.allocate_tensors()
    d = interp.get_input_details()[0]
    scale, zero = d["quantization"]
    interp.set_tensor(d["index"], x if not scale else np.clip(np.round(x / scale) + zero, -128, 127).astype(np.int8))
    interp.invoke()
    return {t["name"]: (interp.get_tensor(t["index"]), t["quantization"]) for t in interp.get_tensor_details()
            if t["shape"].size and t["name"]}


def test_metrics_equal_a_hand_computed_dequantize_and_compare(runner):
    float_model, quantized, data = cnn()
    debugger = QuantizationDebugger(float_model, quantized, data, runner=runner)
    row = next(r for r in debugger.tensors if r.op == "DEPTHWISE_CONV_2D")
    diffs, refs = [], []
    for x in data:
        ref = _all_tensors(runner, float_model, x)[row.float_tensor][0]
        q, (scale, zero) = _all_tensors(runner, quantized, x)[row.tensor]
        assert q.dtype == np.int8 and (scale, zero) == pytest.approx((row.scale, row.zero_point))
        diffs.append((q.astype(np.float64) - zero) * scale - ref)
        refs.append(ref)
    diff, ref = np.concatenate([d.ravel() for d in diffs]), np.concatenate([r.ravel() for r in refs]).astype(float)
    rmse = np.sqrt(np.mean(diff ** 2))
    assert row.cumulative.rmse == pytest.approx(rmse, rel=1e-9)
    assert row.cumulative.max_abs_error == pytest.approx(np.abs(diff).max(), rel=1e-9)
    assert row.cumulative.mean_error == pytest.approx(diff.mean(), rel=1e-6, abs=1e-12)
    assert row.cumulative.relative_error == pytest.approx(rmse / np.sqrt(np.mean(ref ** 2)), rel=1e-9)
    assert row.rmse_over_scale == pytest.approx(rmse / row.scale)
    assert row.elements == 8 * 8 * 8 and row.cumulative.count == 8 * row.elements


def test_layer_wise_error_is_what_each_op_adds(runner):
    float_model, quantized, data = cnn()
    debugger = QuantizationDebugger(float_model, quantized, data, runner=runner)
    by_op = {r.op: r for r in debugger.tensors}
    assert [r.op for r in debugger.tensors] == ["QUANTIZE", "CONV_2D", "DEPTHWISE_CONV_2D", "MAX_POOL_2D",
                                                "FULLY_CONNECTED", "FULLY_CONNECTED", "SOFTMAX"]
    # The input's QUANTIZE adds its rounding: round half away from zero, by hand.
    q = by_op["QUANTIZE"]
    x = np.concatenate([d.ravel() for d in data]).astype(np.float64)
    v = x / np.float32(q.scale)
    rounded = np.clip(np.sign(v) * np.floor(np.abs(v) + 0.5) + q.zero_point, -128, 127)
    assert q.layer.rmse == pytest.approx(np.sqrt(np.mean(((rounded - q.zero_point) * q.scale - x) ** 2)), rel=1e-6)
    # MAX_POOL of int8 values with one scale is exact: it adds no error of its own, while
    # the error it carries from upstream (cumulative) is that of its input.
    pool = by_op["MAX_POOL_2D"]
    assert pool.layer.max_abs_error < 1e-6 < pool.cumulative.max_abs_error
    for r in debugger.tensors:
        assert r.layer is not None and r.note == ""
        assert 0 < r.layer.rmse < 1.5 * r.scale or r.op == "MAX_POOL_2D"   # about a rounding step
    out = debugger.outputs[0]
    assert out.top1_agreement is not None and 0.5 <= out.top1_agreement <= 1
    assert out.errors.max_abs_error == debugger.model_error() < 1 / 256   # within one output step
    assert debugger.unmatched == [] and debugger.matching.float_only == []


def test_the_op_with_a_broken_range_is_named(runner):
    float_model, _, data = cnn()
    debugger = QuantizationDebugger(float_model, broken_cnn(), data, runner=runner)
    worst = debugger.worst_ops(2)
    conv = next(op.outputs[0].name for op in read_model(float_model).main.operators if op.op_type == "CONV_2D")
    assert worst[0].op == "CONV_2D" and worst[0].tensor == conv
    assert worst[0].layer.relative_error > 10 * worst[1].layer.relative_error
    # Downstream ops inherit the damage (cumulative) but do not add it (layer-wise).
    dw = next(r for r in debugger.tensors if r.op == "DEPTHWISE_CONV_2D")
    assert dw.cumulative.relative_error > 10 * dw.layer.relative_error
    assert f"adds the most error: CONV_2D '{worst[0].tensor}'" in debugger.table()


def _max_error(model: bytes, float_model: bytes, data) -> float:
    worst = 0.0
    for x in data:
        ref = _all_tensors("litert", float_model, x)
        got = _all_tensors("litert", model, x)
        name = read_model(model).main.outputs[0].name
        worst = max(worst, float(np.abs(got[name][0] - ref[read_model(float_model).main.outputs[0].name][0]).max()))
    return worst


def test_suggest_denylist_reaches_the_target_with_no_op_to_spare(runner):
    float_model, quantized, data = cnn()
    debugger = QuantizationDebugger(float_model, quantized, data, runner=runner)
    target = debugger.model_error() / 2
    found = debugger.suggest_denylist(target)
    assert found.reached and found.denylist and found.error <= target
    # measured in LiteRT: the runner's own float kernels may round an output an ulp apart
    slack = 0.0 if runner == "litert" else 1e-6
    assert _max_error(found.model, float_model, data) == pytest.approx(found.error, rel=1e-6, abs=slack)
    floats = {t.name for t in read_model(found.model).main.tensors if t.dtype.name == "FLOAT32"}
    assert set(found.denylist) <= floats                      # kept float in the new model
    tried = {frozenset(names): error for names, error in found.trials}
    for name in found.denylist:                               # none of them can be left out
        assert tried[frozenset(found.denylist) - {name}] > target
    assert [op for op, _ in found.ops] and all(name in found.denylist for _, name in found.ops)
    one = debugger.suggest_denylist(1e-9, max_ops=1)
    assert not one.reached and len(one.denylist) == 1 and one.error > 1e-9


def test_pruning_keeps_exactly_what_the_target_needs():
    names = [f"op{i}" for i in range(11)]
    calls = []

    def good(kept):   # the target holds when op2 and op9 are float, or op4 alone
        calls.append(kept)
        return {"op2", "op9"} <= set(kept) or "op4" in kept

    assert QuantizationDebugger._prune(names, good) == ["op4"]
    assert len(calls) < len(names)   # halves first: fewer checks than dropping one op at a time
    assert QuantizationDebugger._prune([n for n in names if n != "op4"], good) == ["op2", "op9"]


@pytest.mark.parametrize("io", ["int8", "uint8"])
def test_integer_io_models_and_their_denylist(io):
    float_model, _, data = cnn()
    quantized = kiln.quantize(float_model, "int8", representative_dataset=data, inference_input_type=io,
                              inference_output_type=io, progress=False)
    debugger = QuantizationDebugger(float_model, quantized, data, runner="litert")
    assert debugger.unmatched == [] and debugger.model_error() < 1 / 256
    found = debugger.suggest_denylist(debugger.model_error() / 2)
    assert found.reached and found.denylist
    model = read_model(found.model).main
    assert [t.dtype.name for t in model.inputs + model.outputs] == [io.upper()] * 2   # the I/O types are kept
    # Keeping the first convolution float reads the uint8 input through its int8 copy.
    conv = next(r.denylist_name for r in debugger.tensors if r.op == "CONV_2D")
    first = kiln.quantize(float_model, "int8", representative_dataset=data, inference_input_type=io,
                          inference_output_type=io, denylist=[conv], progress=False)
    assert QuantizationDebugger(float_model, first, data, runner="litert").model_error() < 2 / 256   # runs


def test_matching_survives_renamed_tensors():
    float_model, quantized, data = cnn()
    model = read_model(quantized)
    for i, t in enumerate(model.main.tensors):
        if t not in model.main.inputs:
            t.name = f"t{i}"
    plain = QuantizationDebugger(float_model, quantized, data, runner="litert", layer_wise=False)
    renamed = QuantizationDebugger(float_model, write_model(model), data, runner="litert", layer_wise=False)
    assert renamed.unmatched == []
    assert [r.float_tensor for r in renamed.tensors] == [r.float_tensor for r in plain.tensors]
    assert [r.cumulative.rmse for r in renamed.tensors] == [r.cumulative.rmse for r in plain.tensors]


def test_ops_without_a_float_counterpart_are_listed():
    float_model, _, data = cnn()
    other = kiln.TFLiteConverter.from_keras_model(_cnn("tanh")).convert()
    quantized = kiln.quantize(other, "int8", representative_dataset=data, progress=False)
    debugger = QuantizationDebugger(float_model, quantized, data, runner="litert")
    assert ("TANH", next(t.name for t in read_model(quantized).main.tensors if t.name.endswith("Tanh")),
            "no float TANH with the same name or the same inputs") in debugger.unmatched
    assert [r.op for r in debugger.tensors][:4] == ["QUANTIZE", "CONV_2D", "DEPTHWISE_CONV_2D", "MAX_POOL_2D"]
    assert "not measured: TANH" in debugger.table()


@pytest.mark.parametrize("mode", ["int8", "16x8"])
def test_tensorflow_quantized_models(mode):
    """int8: TF's model against kiln's float conversion (TF adds a RESHAPE before the first
    FULLY_CONNECTED that kiln folds). 16x8: against TF's float conversion, with a dynamic batch:
    TF's Flatten computes its shape (SHAPE, STRIDED_SLICE, PACK), exact int32 arithmetic that
    is neither a row nor unmatched, and is fed as it is to the RESHAPE run alone."""
    _, _, data = cnn()
    model = _cnn() if mode == "int8" else _cnn(batch=None)
    if mode == "int8":
        float_model = cnn()[0]
    else:
        float_model = tf.lite.TFLiteConverter.from_keras_model(model).convert()
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = lambda: ([x] for x in data)
    if mode == "16x8":
        conv.target_spec.supported_ops = [tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]
    quantized = conv.convert()
    ops = {op.op_type for op in read_model(quantized).main.operators}
    assert "RESHAPE" in ops and ("PACK" in ops) == (mode == "16x8")
    debugger = QuantizationDebugger(float_model, quantized, data, runner="litert")
    assert debugger.unmatched == [] and debugger.matching.float_only == []
    computing = [r for r in debugger.tensors if r.op not in ("QUANTIZE", "RESHAPE")]
    assert [r.op for r in computing] == ["CONV_2D", "DEPTHWISE_CONV_2D", "MAX_POOL_2D", "FULLY_CONNECTED",
                                         "FULLY_CONNECTED", "SOFTMAX"]
    assert {r.dtype for r in computing} == {"INT8" if mode == "int8" else "INT16"}
    assert detect_mode(read_model(quantized)) == ("int8" if mode == "int8" else "int16x8")
    assert debugger.model_error() < 1 / 256
    assert all(r.layer is not None and r.note == "" for r in debugger.tensors)


@pytest.mark.parametrize("mode", ["dynamic", "float16", "weight_only"])
@pytest.mark.parametrize("engine", ["kiln", "litert"])
def test_models_with_float_activations(mode, engine):
    keras.utils.set_random_seed(1)
    mlp = keras.Sequential([keras.Input((40,), batch_size=1, name="x"), keras.layers.Dense(64, activation="relu"),
                            keras.layers.Dense(3)])
    float_model = kiln.TFLiteConverter.from_keras_model(mlp).convert()
    quantized = kiln.quantize(float_model, mode, progress=False)
    data = [np.random.default_rng(i).normal(size=(1, 40)).astype(np.float32) for i in range(6)]
    debugger = QuantizationDebugger(float_model, quantized, data, runner=engine)
    assert debugger.unmatched == [] and [r.op for r in debugger.tensors] == ["FULLY_CONNECTED"] * 2
    assert all(r.scale is None and r.dtype == "FLOAT32" for r in debugger.tensors)
    first = debugger.tensors[0]
    assert 0 < first.cumulative.rmse and 0 < first.layer.rmse <= first.cumulative.rmse * 1.0001
    assert 0 < debugger.model_error() < (1e-3 if mode == "float16" else 0.05)
    assert detect_mode(read_model(quantized)) == mode


@pytest.mark.parametrize("engine", ["kiln", "litert"])
def test_ops_calling_subgraphs_get_cumulative_errors_only(engine):
    from tests.converter import zoo

    float_model = kiln.TFLiteConverter.from_keras_model(zoo.BUILDERS["k3_gru_static"]().obj).convert()
    quantized = kiln.quantize(float_model, "float16", progress=False)
    shape = read_model(float_model).main.inputs[0].shape
    data = [np.random.default_rng(i).uniform(-1, 1, shape).astype(np.float32) for i in range(3)]
    debugger = QuantizationDebugger(float_model, quantized, data, runner=engine)
    loops = [r for r in debugger.tensors if r.op == "WHILE"]
    assert loops and all(r.layer is None and "calls other subgraphs" in r.note for r in loops)
    assert debugger.unmatched == [] and 0 < debugger.model_error() < 1e-3


def test_csv_and_text_table(tmp_path):
    float_model, quantized, data = cnn()
    mean_abs = {"mean_abs": lambda ref, got: np.mean(np.abs(got - ref))}   # a user metric, as TF's debugger takes
    debugger = QuantizationDebugger(float_model, quantized, data, runner="litert", metrics=mean_abs)
    text = debugger.to_csv(tmp_path / "debug.csv")
    assert (tmp_path / "debug.csv").read_text() == text
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == len(debugger.tensors)
    first = rows[1]
    assert first["op_name"] == "CONV_2D" and float(first["rmse"]) == debugger.tensors[1].cumulative.rmse
    assert float(first["layer_relative_error"]) == debugger.tensors[1].layer.relative_error
    assert rows[0]["denylist_name"] == "" and first["denylist_name"] == debugger.tensors[1].float_tensor
    assert 0 < float(first["mean_abs"]) <= float(first["rmse"]) and float(first["layer_mean_abs"]) > 0
    assert debugger.outputs[0].errors.metrics["mean_abs"] <= debugger.outputs[0].errors.rmse
    table = debugger.table().splitlines()
    assert table[0].split()[:3] == ["#", "op", "tensor"] and len(table) >= 2 + len(rows) + 2
    assert "top-1 agreement" in debugger.table()


def test_html_is_self_contained(tmp_path):
    float_model, _, data = cnn()
    debugger = QuantizationDebugger(float_model, broken_cnn(), data, runner="litert")
    page = debugger.to_html(tmp_path / "debug.html")
    assert (tmp_path / "debug.html").read_text() == page
    assert page.count('class="bar layer"') == page.count('class="bar cumulative"') == len(debugger.tensors)
    assert "<script" not in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert 'id="worst"' in page and "CONV_2D" in page


def test_errors_are_kiln_errors(tmp_path):
    float_model, quantized, data = cnn()
    mlp = keras.Sequential([keras.Input((40,), batch_size=1), keras.layers.Dense(3)])
    other = kiln.TFLiteConverter.from_keras_model(mlp).convert()
    with pytest.raises(MismatchError, match="input 0: float .* vs quantized"):
        QuantizationDebugger(other, quantized, data)
    with pytest.raises(DatasetError, match="does not fit the model's"):
        QuantizationDebugger(float_model, quantized, [np.zeros((1, 5), np.float32)])
    with pytest.raises(DatasetError, match="no samples"):
        QuantizationDebugger(float_model, quantized, [])
    bad = data[0].copy()
    bad[0, 0, 0, 0] = np.nan
    with pytest.raises(DatasetError, match="NaN"):
        QuantizationDebugger(float_model, quantized, [bad])
    with pytest.raises(kiln.KilnError, match="unknown runner"):
        QuantizationDebugger(float_model, quantized, data, runner="tpu")
    with pytest.raises(kiln.KilnError, match="cannot read the float model"):
        QuantizationDebugger(tmp_path / "absent.tflite", quantized, data)
    with pytest.raises(kiln.ModelError):
        QuantizationDebugger(b"not a model", quantized, data)
    debugger = QuantizationDebugger(float_model, quantized, data, runner="litert", layer_wise=False)
    with pytest.raises(kiln.KilnError, match="unknown metric"):
        debugger.suggest_denylist(0.1, metric="accuracy")
    with pytest.raises(kiln.KilnError, match="target_error"):
        debugger.suggest_denylist(float("nan"))
    with pytest.raises(kiln.KilnError, match="target_error"):
        debugger.suggest_denylist("small")
    with pytest.raises(kiln.KilnError, match="metric 'bad' failed: ZeroDivisionError"):
        QuantizationDebugger(float_model, quantized, data, runner="litert", metrics={"bad": lambda f, q: 1 / 0}).tensors
    with pytest.raises(kiln.KilnError, match="not callables"):
        QuantizationDebugger(float_model, quantized, data, metrics={"bad": 3})
    with pytest.raises(kiln.KilnError, match="cannot write"):
        debugger.to_csv(tmp_path / "missing" / "x.csv")
