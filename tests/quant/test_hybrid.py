"""kiln's hybrid kernels (the weighted ops' hybrid formats, kiln.kernels.dense / .conv, on
kiln.kernels.hybrid's row quantization) against LiteRT's reference kernels (BUILTIN_REF), bit
for bit, on one-op hybrid models: int8 weights (per channel or per tensor), float activations."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import kiln
from kiln.ir import QuantParams
from kiln.kernels.windows import window_geometry
from kiln.quant import params
from tests.harness import Const, feed, single_op_model
from tests.quant.zoo_models import builtin_ref

RNG = np.random.default_rng(7)


def _ref(model: bytes, x: np.ndarray) -> np.ndarray:
    return feed(builtin_ref(model), [x])[0]


def _kiln(model: bytes, x: np.ndarray) -> np.ndarray:
    """kiln's reference kernel on the one-op model (its kernel family's hybrid format)."""
    return feed(kiln.Interpreter(model_content=model, experimental_op_resolver_type=kiln.OpResolverType.BUILTIN_REF),
                [x])[0]


def _weights(w: np.ndarray, axis: int | None):
    q, a = params.symmetric_weights(w, axis)
    return q, a.scale, Const(q, QuantParams(a.scale, np.zeros(a.scale.size), quantized_dimension=axis or 0))


@pytest.mark.parametrize("asymmetric", [True, False])
@pytest.mark.parametrize("per_channel", [True, False])
def test_fully_connected(asymmetric, per_channel):
    x = RNG.normal(0, 1.5, (64, 300)).astype(np.float32)
    x[2] = 0.0                       # a flat row: scale 1, zero point 0
    x[3] = np.abs(x[3])              # all positive: the zero point comes from the max side
    q, scale, wc = _weights(RNG.normal(0, 0.1, (40, 300)).astype(np.float32), 0 if per_channel else None)
    bias = RNG.normal(0, 0.5, 40).astype(np.float32)
    model = single_op_model("FULLY_CONNECTED", [x, wc, Const(bias)],
                            options={"asymmetric_quantize_inputs": asymmetric},
                            out_dtypes=[np.float32], out_shapes=[(64, 40)])
    np.testing.assert_array_equal(_kiln(model, x), _ref(model, x))


def test_fully_connected_all_zero_input_is_the_bias():
    x = np.zeros((2, 50), np.float32)
    q, scale, wc = _weights(RNG.normal(0, 0.1, (8, 50)).astype(np.float32), 0)
    bias = RNG.normal(0, 0.5, 8).astype(np.float32)
    model = single_op_model("FULLY_CONNECTED", [x, wc, Const(bias)], out_dtypes=[np.float32], out_shapes=[(2, 8)])
    np.testing.assert_array_equal(_kiln(model, x), _ref(model, x))


def _conv_case(op_type, x, w, multiplier, padding, stride, dilation):
    axis = 0 if op_type == "CONV_2D" else 3
    q, scale, wc = _weights(w, axis)
    bias = RNG.normal(0, 0.5, w.shape[0] if axis == 0 else w.shape[3]).astype(np.float32)
    opts = dict(padding=padding, stride_h=stride, stride_w=stride,
                dilation_h_factor=dilation, dilation_w_factor=dilation)
    if op_type == "DEPTHWISE_CONV_2D":
        opts["depth_multiplier"] = multiplier
    (oh, ow), pads = window_geometry(SimpleNamespace(**opts), x.shape[1:3], w.shape[1:3], (dilation, dilation))
    out_c = w.shape[0] if axis == 0 else w.shape[3]
    model = single_op_model(op_type, [x, wc, Const(bias)], options=opts,
                            out_dtypes=[np.float32], out_shapes=[(x.shape[0], oh, ow, out_c)])
    np.testing.assert_array_equal(_kiln(model, x), _ref(model, x))


@pytest.mark.parametrize("padding,stride,dilation", [(0, 1, 1), (1, 1, 1), (0, 2, 1), (1, 1, 2)])
def test_conv2d_per_channel(padding, stride, dilation):
    x = RNG.normal(0, 1, (6, 9, 9, 16)).astype(np.float32)
    x[1] = np.abs(x[1])
    _conv_case("CONV_2D", x, RNG.normal(0, 0.2, (8, 3, 3, 16)).astype(np.float32), 1, padding, stride, dilation)


@pytest.mark.parametrize("padding,stride,dilation,multiplier", [(0, 1, 1, 1), (1, 2, 1, 2), (0, 1, 2, 3)])
def test_depthwise_per_channel(padding, stride, dilation, multiplier):
    x = RNG.normal(0, 1, (6, 8, 8, 4)).astype(np.float32)
    _conv_case("DEPTHWISE_CONV_2D", x, RNG.normal(0, 0.2, (1, 3, 3, 4 * multiplier)).astype(np.float32),
               multiplier, padding, stride, dilation)


def test_dynamic_range_models_run_in_kiln_bit_exact_with_builtin_ref():
    """TF's dynamic-range conversion and kiln's of the same model: kiln's interpreter runs
    both (hybrid FULLY_CONNECTED, CONV_2D, DEPTHWISE_CONV_2D) exactly as LiteRT's reference
    kernels do."""
    tf = pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")
    import kiln
    from kiln.quant import quantize

    L = keras.layers
    x_in = keras.Input((8, 8, 16))
    h = L.Conv2D(16, 3, padding="same", activation="relu")(x_in)
    h = L.DepthwiseConv2D(3, depth_multiplier=8, strides=2)(h)
    m = keras.Model(x_in, L.Dense(10)(L.Dense(64, activation="relu")(L.Flatten()(h))))
    for v in m.weights:
        v.assign(RNG.uniform(-0.5, 0.5, v.shape).astype(np.float32))
    float_model = tf.lite.TFLiteConverter.from_keras_model(m).convert()
    conv = tf.lite.TFLiteConverter.from_keras_model(m)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    x = RNG.uniform(-1, 1, (1, 8, 8, 16)).astype(np.float32)
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    for model in (conv.convert(), quantize(float_model, "dynamic")):
        sg = kiln.read_model(model).main
        hybrid_outputs = [sg.tensors.index(op.outputs[0]) for op in sg.operators
                          if op.inputs[1:2] and op.inputs[1] is not None and op.inputs[1].dtype.name == "INT8"]
        assert len(hybrid_outputs) == 3
        runs = []
        for interp in (kiln.Interpreter(model_content=model, experimental_preserve_all_tensors=True),
                       Interpreter(model_content=model, experimental_preserve_all_tensors=True,
                                   experimental_op_resolver_type=OpResolverType.BUILTIN_REF)):
            interp.allocate_tensors()
            interp.set_tensor(interp.get_input_details()[0]["index"], x)
            interp.invoke()
            runs.append(interp)
        for i in hybrid_outputs:   # every hybrid op bit for bit (the float FC after them: close)
            np.testing.assert_array_equal(runs[0].get_tensor(i), runs[1].get_tensor(i))
        out = runs[1].get_output_details()[0]["index"]
        np.testing.assert_allclose(runs[0].get_tensor(out), runs[1].get_tensor(out), rtol=1e-5, atol=1e-5)
