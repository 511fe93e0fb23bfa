"""kiln.quant.params reproduces TensorFlow 2.21's int8 parameters exactly: activation scales
and zero points from calibration ranges, per-channel weights, int32 biases (including the
bias-range adjustment of a zero-weight channel)."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.quant import params

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")


@pytest.fixture(scope="module")
def converted():
    """A Conv2D(relu) → DepthwiseConv2D → Dense model (one all-zero Dense output channel),
    TF's float and int8 conversions, the calibration samples and the Keras weights."""
    import kiln

    rng = np.random.default_rng(0)
    x = keras.Input((8, 8, 3))
    conv = keras.layers.Conv2D(5, 3, activation="relu")
    dw = keras.layers.DepthwiseConv2D(3)
    dense = keras.layers.Dense(7)
    m = keras.Model(x, dense(keras.layers.Flatten()(dw(conv(x)))))
    for w in m.weights:
        w.assign(rng.uniform(-0.5, 0.5, w.shape).astype(np.float32))
    kernel = dense.kernel.numpy()
    kernel[:, 3] = 0.0
    dense.kernel.assign(kernel)
    samples = [rng.uniform(-1, 1.5, (1, 8, 8, 3)).astype(np.float32) for _ in range(16)]
    conv_q = tf.lite.TFLiteConverter.from_keras_model(m)
    conv_q.optimizations = [tf.lite.Optimize.DEFAULT]
    conv_q.representative_dataset = lambda: ([s] for s in samples)
    int8 = kiln.read_model(conv_q.convert())
    float_model = tf.lite.TFLiteConverter.from_keras_model(m).convert()
    return dict(int8=int8, float_model=float_model, samples=samples, conv=conv, dw=dw, dense=dense)


def _calibrated_ranges(float_model: bytes, samples) -> dict[str, tuple[float, float]]:
    """Running min/max of every float tensor over all samples, as TF's calibrator keeps them."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    # Without delegates: XNNPACK keeps a partition's intermediates to itself.
    interp = Interpreter(model_content=float_model, experimental_preserve_all_tensors=True,
                         experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    interp.allocate_tensors()
    ranges: dict[str, tuple[float, float]] = {}
    for s in samples:
        interp.set_tensor(interp.get_input_details()[0]["index"], s)
        interp.invoke()
        for d in interp.get_tensor_details():
            if d["dtype"] != np.float32:
                continue
            try:
                v = interp.get_tensor(d["index"])
            except ValueError:
                continue
            if v.size == 0:
                continue
            lo, hi = ranges.get(d["name"], (np.inf, -np.inf))
            ranges[d["name"]] = (min(lo, float(v.min())), max(hi, float(v.max())))
    return ranges


def _tensor(model, name_start: str):
    (t,) = [t for t in model.subgraphs[0].tensors if t.name.startswith(name_start) and t.quantization]
    return t


def test_activation_params_equal_tf(converted):
    """Equal given equal ranges. A calibrated range is a float kernel's output, and TF's
    calibrator's kernels and LiteRT 2.3's (builtin, reference) differ in the last bit on
    some tensors, so a scale may differ by an ulp there: that is the only tolerance."""
    import kiln

    ranges = _calibrated_ranges(converted["float_model"], converted["samples"])
    float_outputs = {op.op_type: op.outputs[0].name   # one op of each type in this model
                     for op in kiln.read_model(converted["float_model"]).subgraphs[0].operators}
    sg = converted["int8"].subgraphs[0]
    checked = 0
    for op in sg.operators:
        if op.op_type == "QUANTIZE":
            name = op.inputs[0].name
        elif op.op_type in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"):
            name = float_outputs[op.op_type]
        else:
            continue
        t = op.outputs[0]
        got = params.activation_int8(*ranges[name])
        if op.op_type == "QUANTIZE":   # the model input: the same floats in both runs
            assert got.scale[0] == t.quantization.scale[0], name
        else:  # float kernels differ in the last bit between TF's calibrator and LiteRT 2.3
            np.testing.assert_allclose(got.scale, t.quantization.scale, rtol=3e-7, err_msg=name)
        assert got.zero_point[0] == t.quantization.zero_point[0], name
        checked += 1
    assert checked == 4


def test_weights_and_biases_equal_tf(converted):
    sg = converted["int8"].subgraphs[0]
    layers = {"CONV_2D": converted["conv"], "DEPTHWISE_CONV_2D": converted["dw"],
              "FULLY_CONNECTED": converted["dense"]}
    for op in sg.operators:
        if op.op_type not in layers:
            continue
        layer = layers[op.op_type]
        kernel = layer.kernel.numpy()
        if op.op_type == "CONV_2D":
            w, axis = kernel.transpose(3, 0, 1, 2), 0           # HWIO → OHWI
        elif op.op_type == "DEPTHWISE_CONV_2D":
            w, axis = kernel.reshape((1,) + kernel.shape[:2] + (-1,)), 3
        else:
            w, axis = kernel.T, 0
        x, wt, bt = op.inputs
        qw, wa, qb, ba = params.weights_and_bias(w, axis, layer.bias.numpy(), x.quantization.scale[0])
        np.testing.assert_array_equal(qw, wt.data, err_msg=op.op_type)
        np.testing.assert_array_equal(wa.scale, wt.quantization.scale, err_msg=op.op_type)
        assert wt.quantization.quantized_dimension == axis
        np.testing.assert_array_equal(qb, bt.data, err_msg=op.op_type)
        np.testing.assert_array_equal(ba.scale, bt.quantization.scale, err_msg=op.op_type)
    fc = next(op for op in sg.operators if op.op_type == "FULLY_CONNECTED")
    assert fc.inputs[1].quantization.scale[3] < 1e-6   # the adjusted zero channel was compared


@pytest.mark.parametrize("lo,hi,scale,zp", [
    (-0.5, 1.5, 2 / 255, -64),         # round(−128 + 63.75)
    (0.0, 6.0, 6 / 255, -128),         # RELU6-like: zero at the bottom
    (0.25, 0.5, 0.5 / 255, -128),      # a positive range is widened to contain 0
    (0.0, 0.0, 2e-6 / 255, 0),         # an empty range is widened by ±1e-6
])
def test_activation_rule(lo, hi, scale, zp):
    a = params.activation_int8(lo, hi)
    assert a.scale[0] == pytest.approx(scale, rel=1e-6)
    assert a.zero_point[0] == zp


def test_int16_activations_are_symmetric():
    a = params.activation_int16(-1.0, 0.5)
    assert a.zero_point[0] == 0 and a.scale[0] == pytest.approx(1 / 32767, rel=1e-6)
