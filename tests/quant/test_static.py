"""Full-integer int8 quantization (kiln.quant.quantize mode "int8") against TF 2.21's.

Where TF's calibration is right, kiln's model equals TF's: same ops and versions, same
parameters, weights and biases, bit-identical outputs in LiteRT (CNN, MLP, MobileNetV2).
TF 2.21's calibrator logs an op's inputs after the op ran, and LiteRT runs some ops in place,
so an input's range absorbs its consumer's output (a ReLU conv output recorded with a
negative minimum, from the BatchNorm MUL after it; MobileNetV2's residual ADDs): there
kiln's parameters differ — they are the tensors' own ranges — and its error against the
float model is compared instead.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import kiln
from kiln.quant import quantize
from kiln.quant.calibrate import DatasetError
from kiln.quant.static import QuantizationError
from tests.converter import zoo

tf = pytest.importorskip("tensorflow")


@functools.lru_cache(maxsize=None)
def _case(name: str):
    model = zoo.BUILDERS[name]().obj
    rng = np.random.default_rng(0)
    shape = (1,) + tuple(model.inputs[0].shape[1:])
    data = [rng.uniform(-1, 1, shape).astype(np.float32) for _ in range(16)]
    float_model = tf.lite.TFLiteConverter.from_keras_model(model).convert()
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = lambda: ([d] for d in data)
    tf_model = conv.convert()
    ours = quantize(float_model, "int8", representative_dataset=lambda: ([d] for d in data), progress=False)
    tests = [rng.uniform(-1, 1, shape).astype(np.float32) for _ in range(8)]
    return float_model, tf_model, ours, tests


def _run(model: bytes, x: np.ndarray, ref: bool = False) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    kind = OpResolverType.BUILTIN_REF if ref else OpResolverType.AUTO
    interp = Interpreter(model_content=model, experimental_op_resolver_type=kind)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


def _ops(model: bytes):
    return [(op.op_type, op.version) for op in kiln.read_model(model).main.operators]


@pytest.mark.parametrize("name", ["k3_cnn", "k3_mlp"])
def test_equals_tf_where_tf_calibrates_right(name):
    _, tf_model, ours, tests = _case(name)
    assert _ops(ours) == _ops(tf_model)
    mine, theirs = kiln.read_model(ours).main, kiln.read_model(tf_model).main
    ulp_apart = off_by_one = 0
    for a, b in zip(mine.operators, theirs.operators):
        x_same = not a.inputs or a.inputs[0] is None or a.inputs[0].quantization is None or \
            np.array_equal(a.inputs[0].quantization.scale, b.inputs[0].quantization.scale)
        ulp_apart += not x_same
        for u, v in zip(list(a.inputs) + list(a.outputs), list(b.inputs) + list(b.outputs)):
            if u is None or u.quantization is None or u.quantization.scale.size == 0:
                continue
            # Calibrated ranges come from float kernels that differ in the last bit between
            # TF's calibrator and kiln: a scale may be an ulp apart, and an int32 bias
            # (scale = input scale × weight scale) then one unit apart.
            np.testing.assert_allclose(u.quantization.scale, v.quantization.scale, rtol=3e-7)
            np.testing.assert_array_equal(u.quantization.zero_point, v.quantization.zero_point)
            if u.is_constant and u.dtype.name == "INT8":
                np.testing.assert_array_equal(u.data, v.data)
            elif u.is_constant:  # TF's int8 path folds BatchNorm apart from its float
                # conversion: a few folded float biases differ by an ulp there.
                diff = np.abs(u.data.astype(np.int64) - v.data)
                assert diff.max() <= 1 and (x_same or name != "k3_mlp")
                off_by_one += int(np.count_nonzero(diff))
    out_scale = float(mine.operators[-1].inputs[0].quantization.scale[0])
    for x in tests:
        got, want = _run(ours, x, ref=True), _run(tf_model, x, ref=True)
        if ulp_apart or off_by_one:
            assert np.abs(got - want).max() <= out_scale * 1.001
        else:
            np.testing.assert_array_equal(got, want)
    assert len(ours) <= len(tf_model)


@pytest.mark.parametrize("name", ["k3_separable", "k3_transformer", pytest.param("k3_mobilenet_v2", marks=pytest.mark.slow)])
def test_error_no_worse_than_tf_where_tf_calibration_is_polluted(name):
    float_model, tf_model, ours, tests = _case(name)
    assert [t for t, _ in _ops(ours)] == [t for t, _ in _ops(tf_model)]
    mine = np.mean([np.abs(_run(ours, x) - _run(float_model, x)).mean() for x in tests])
    theirs = np.mean([np.abs(_run(tf_model, x) - _run(float_model, x)).mean() for x in tests])
    assert mine <= theirs * 1.05, (mine, theirs)


def test_integer_only_lists_the_float_ops_and_io_types():
    float_model, _, _, _ = _case("k3_cnn")
    data = lambda: (np.random.default_rng(i).uniform(-1, 1, (1, 16, 16, 3)).astype(np.float32) for i in range(4))
    m = kiln.read_model(quantize(float_model, "int8", representative_dataset=data, integer_only=True,
                                 inference_input_type="int8", inference_output_type="int8", progress=False))
    assert m.main.inputs[0].dtype.name == "INT8" and m.main.outputs[0].dtype.name == "INT8"
    assert "QUANTIZE" not in [op.op_type for op in m.main.operators]
    u = kiln.read_model(quantize(float_model, "int8", representative_dataset=data, inference_input_type="uint8",
                                 inference_output_type="uint8", progress=False))
    assert u.main.inputs[0].dtype.name == "UINT8" and u.main.outputs[0].dtype.name == "UINT8"
    x = np.random.default_rng(9).uniform(-1, 1, (1, 16, 16, 3)).astype(np.float32)
    q = u.main.inputs[0].quantization
    xq = np.clip(np.round(x / q.scale[0]) + q.zero_point[0], 0, 255).astype(np.uint8)
    assert _run(kiln.write_model(u), xq).dtype == np.uint8
    acts = tf.lite.TFLiteConverter.from_keras_model(zoo.BUILDERS["k3_activations"]().obj).convert()
    feats = lambda: (np.ones((1, 6), np.float32) * i for i in range(3))
    with pytest.raises(QuantizationError, match=r"DIV .*no int8 kernel"):
        quantize(acts, "int8", representative_dataset=feats, integer_only=True, progress=False)


def test_bad_datasets_name_the_input_and_sample():
    float_model, _, _, _ = _case("k3_mlp")
    good = np.zeros((1, 8), np.float32)
    with pytest.raises(DatasetError, match=r"sample 1, input .*NaN"):
        quantize(float_model, "int8", representative_dataset=[[good], [good * np.nan]], progress=False)
    with pytest.raises(DatasetError, match=r"sample 0, input .*shape \[1, 5\]"):
        quantize(float_model, "int8", representative_dataset=[[np.zeros((1, 5), np.float32)]], progress=False)
    with pytest.raises(DatasetError, match="no samples"):
        quantize(float_model, "int8", representative_dataset=[], progress=False)
    with pytest.raises(kiln.KilnError, match="needs a representative_dataset"):
        quantize(float_model, "int8")


def test_npz_dataset(tmp_path):
    float_model, _, _, _ = _case("k3_mlp")
    name = kiln.read_model(float_model).main.inputs[0].name
    path = tmp_path / "calib.npz"
    np.savez(path, **{name: np.random.default_rng(1).normal(size=(10, 8)).astype(np.float32)})
    m = kiln.read_model(quantize(float_model, "int8", representative_dataset=str(path), progress=False))
    assert any(op.op_type == "FULLY_CONNECTED" and op.version == 4 for op in m.main.operators)
