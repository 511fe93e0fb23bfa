"""16x8 quantization (kiln.quant.quantize mode "int16x8") against TF 2.21's.

Where TF's 16x8 model is right, kiln's equals it: same ops, activation scales, int8 weights
and int64 biases, bit-identical outputs in LiteRT's reference kernels. Deliberate
differences: kiln writes the op versions op_version.cc gives int16 operands (TF writes the
int8 ones), and gives every op its own bias, where TF quantizes a bias shared by two layers
with the first layer's scale (a silently wrong model).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import kiln
from kiln import ops
from kiln.quant import quantize
from kiln.quant.static import QuantizationError
from kiln.schema import DType
from tests.converter import zoo
from tests.harness import feed
from tests.quant.zoo_models import builtin_ref

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

#: 16x8 with float fallback (TF refuses the transformer's NEG in integer-only 16x8).
INT16_OPS = [tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8, tf.lite.OpsSet.TFLITE_BUILTINS]


def _data(shape, count, seed):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, shape).astype(np.float32) for _ in range(count)]


def _tf_16x8(model, data) -> bytes:
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = lambda: ([d] for d in data)
    conv.target_spec.supported_ops = INT16_OPS
    return conv.convert()


@functools.lru_cache(maxsize=None)
def _case(name: str):
    model = zoo.BUILDERS[name]().obj
    shape = (1,) + tuple(model.inputs[0].shape[1:])
    data = _data(shape, 16, 0)
    float_model = tf.lite.TFLiteConverter.from_keras_model(model).convert()
    ours = quantize(float_model, "int16x8", representative_dataset=lambda: ([d] for d in data), progress=False)
    return float_model, _tf_16x8(model, data), ours, _data(shape, 6, 1)


def _run(model: bytes, x: np.ndarray, ref: bool = True) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    kind = OpResolverType.BUILTIN_REF if ref else OpResolverType.AUTO
    interp = Interpreter(model_content=model, experimental_op_resolver_type=kind)
    interp.allocate_tensors()
    detail = interp.get_input_details()[0]
    if detail["dtype"] == np.int16:
        scale = detail["quantization"][0]
        x = np.clip(np.round(x / scale), -32768, 32767).astype(np.int16)
    interp.set_tensor(detail["index"], x)
    interp.invoke()
    out = interp.get_output_details()[0]
    y = interp.get_tensor(out["index"])
    return y.astype(np.float32) * out["quantization"][0] if y.dtype == np.int16 else y


@pytest.mark.parametrize("name", ["k3_cnn"])
def test_equals_tf_16x8_but_for_the_op_versions(name):
    _, tf_model, ours, tests = _case(name)
    mine, theirs = kiln.read_model(ours).main, kiln.read_model(tf_model).main
    assert [op.op_type for op in mine.operators] == [op.op_type for op in theirs.operators]
    for a, b in zip(mine.operators, theirs.operators):
        assert a.version == ops.get(a.op_type).version(a)
        for u, v in zip(list(a.inputs) + list(a.outputs), list(b.inputs) + list(b.outputs)):
            if u is None or u.quantization is None or u.quantization.scale.size == 0:
                continue
            assert u.dtype == v.dtype, (a.op_type, u.name)
            np.testing.assert_array_equal(u.quantization.scale, v.quantization.scale)
            np.testing.assert_array_equal(u.quantization.zero_point, 0)
            if u.is_constant:
                np.testing.assert_array_equal(u.data, v.data)   # int8 weights, int64 biases
    versions = {(op.op_type, op.version) for op in mine.operators}
    tf_versions = {(op.op_type, op.version) for op in theirs.operators}
    if name == "k3_cnn":   # op_version.cc's int16 rules vs TF's int8 versions (measured)
        assert {("CONV_2D", 1), ("SOFTMAX", 3), ("MAX_POOL_2D", 3)} <= versions
        assert {("CONV_2D", 3), ("SOFTMAX", 2), ("MAX_POOL_2D", 2)} <= tf_versions
    for x in tests:
        np.testing.assert_array_equal(_run(ours, x), _run(tf_model, x))


def test_int16_io_and_integer_only():
    float_model, _, _, tests = _case("k3_cnn")
    data = _data((1, 16, 16, 3), 4, 2)
    q = quantize(float_model, "int16x8", representative_dataset=data, integer_only=True,
                 inference_input_type="int16", inference_output_type="int16", progress=False)
    m = kiln.read_model(q).main
    assert m.inputs[0].dtype.name == "INT16" and m.outputs[0].dtype.name == "INT16"
    assert not {"QUANTIZE", "DEQUANTIZE"} & {op.op_type for op in m.operators}
    assert m.outputs[0].quantization.scale[0] == np.float32(1 / 32768)      # SOFTMAX's fixed range
    want = _run(float_model, tests[0], ref=False)
    assert np.abs(_run(q, tests[0]) - want).max() < 2e-3
    with pytest.raises(QuantizationError, match="inference_input_type must be one of"):
        quantize(float_model, "int16x8", representative_dataset=data, inference_input_type="int8")


def _hard_swish_model():
    x = keras.Input((6,), batch_size=1)
    h = keras.layers.Dense(8)(x)
    y = keras.layers.Dense(3)(keras.layers.Activation("hard_swish")(h))
    m = keras.Model(x, y)
    zoo.randomize(m)
    return tf.lite.TFLiteConverter.from_keras_model(m).convert()


def test_ops_without_int16_kernel_stay_float_or_are_listed():
    float_model = _hard_swish_model()
    data = _data((1, 6), 8, 3)
    q = quantize(float_model, "int16x8", representative_dataset=data, progress=False)
    types = [(op.op_type, op.outputs[0].dtype.name) for op in kiln.read_model(q).main.operators]
    assert ("HARD_SWISH", "FLOAT32") in types and ("FULLY_CONNECTED", "INT16") in types
    for x in _data((1, 6), 4, 4):
        assert np.abs(_run(q, x) - _run(float_model, x, ref=False)).max() < 1e-2
    with pytest.raises(QuantizationError, match=r"HARD_SWISH .*no int16 kernel"):
        quantize(float_model, "int16x8", representative_dataset=data, integer_only=True, progress=False)


def _shared_bias_model():
    """A Conv2D and a DepthwiseConv2D with equal float biases: TF's float conversion stores
    the bias once, and TF's 16x8 quantizer gives it the first layer's scale."""
    x = keras.Input((8, 8, 4), batch_size=1)
    conv = keras.layers.Conv2D(4, 3, padding="same")
    dw = keras.layers.DepthwiseConv2D(3, padding="same")
    y = keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(dw(conv(x))))
    m = keras.Model(x, y)
    zoo.randomize(m)
    bias = np.asarray([0.3, -0.2, 0.25, 0.1], np.float32)
    conv.bias.assign(bias)
    dw.bias.assign(bias)
    dw.kernel.assign(dw.kernel.numpy() * 20)   # another weight scale
    return m


def test_a_shared_bias_gets_each_consumers_scale_where_tf_reuses_the_first():
    m = _shared_bias_model()
    float_model = tf.lite.TFLiteConverter.from_keras_model(m).convert()
    shared = [op.inputs[2] for op in kiln.read_model(float_model).main.operators if op.op_type.endswith("CONV_2D")]
    assert shared[0].data is not None and np.array_equal(shared[0].data, shared[1].data)
    data = _data((1, 8, 8, 4), 16, 5)
    ours = quantize(float_model, "int16x8", representative_dataset=data, progress=False)
    convs = [op for op in kiln.read_model(ours).main.operators if op.op_type.endswith("CONV_2D")]
    for op in convs:
        want = np.float32(op.inputs[0].quantization.scale[0]) * op.inputs[1].quantization.scale
        np.testing.assert_array_equal(op.inputs[2].quantization.scale, want.astype(np.float32))
    theirs = _tf_16x8(m, data)
    tests = _data((1, 8, 8, 4), 6, 6)
    err = lambda q: max(np.abs(_run(q, x) - _run(float_model, x, ref=False)).max() for x in tests)  # noqa: E731
    assert 10 * err(ours) < err(theirs)


@pytest.mark.slow
def test_transformer_runs_where_tfs_16x8_model_cannot():
    """TF's 16x8 quantizes SQUARED_DIFFERENCE (layer norm) to int16, which LiteRT 2.3 has no
    kernel for (measured); kiln keeps it float."""
    float_model, tf_model, ours, tests = _case("k3_transformer")
    kept = {op.op_type for op in kiln.read_model(ours).main.operators if op.outputs[0].dtype.name == "FLOAT32"}
    assert {"SQUARED_DIFFERENCE", "NEG"} <= kept
    with pytest.raises(RuntimeError, match="SquaredDifference only supports"):
        _run(tf_model, tests[0])
    err = [np.abs(_run(ours, x) - _run(float_model, x, ref=False)) for x in tests]
    assert np.mean(err) < 2e-3 and np.max(err) < 2e-2


def test_int4_weights_extension_runs_on_litert_int8_x_int4_kernels():
    """kiln's ``int4`` mode: int8 activations, int4 per-channel weights on FULLY_CONNECTED
    (v10) and CONV_2D (v7). LiteRT unpacks kiln's int4 buffers to the same values: the model
    with those values stored as int8 gives bit-identical outputs."""
    float_model, _, _, tests = _case("k3_cnn")
    data = _data((1, 16, 16, 3), 8, 7)
    q = quantize(float_model, "int4", representative_dataset=data, progress=False)
    int8 = quantize(float_model, "int8", representative_dataset=data, progress=False)
    m = kiln.read_model(q)
    weights = [op.inputs[1] for op in m.main.operators if op.op_type in ("CONV_2D", "FULLY_CONNECTED")]
    assert {w.dtype.name for w in weights} == {"INT4"} and all(np.abs(w.data).max() <= 7 for w in weights)
    assert {(op.op_type, op.version) for op in m.main.operators} >= {("CONV_2D", 7), ("FULLY_CONNECTED", 10)}
    assert len(q) < len(int8)
    for w in weights:
        w.dtype = DType.INT8
    for op in m.main.operators:
        op.version = ops.get(op.op_type).version(op)
    as_int8 = kiln.write_model(m)
    for x in tests[:3]:
        np.testing.assert_array_equal(_run(q, x), _run(as_int8, x))
        assert np.abs(_run(q, x) - _run(float_model, x, ref=False)).max() < 0.3   # int4: 16x int8's step


@pytest.mark.parametrize("mode", ["int8", "int16x8"])
def test_requantizing_rules_cover_every_input(mode):
    """MAXIMUM / MINIMUM requantize both inputs to the output's parameters (input 0's would
    clip a wider input 1: error 1.1 in int8 before), including an input already turned
    integer by its producer; PADV2's pad value is quantized too (LiteRT refuses a float one)."""
    c = tf.constant(np.random.default_rng(0).normal(size=(1, 8, 8, 4)).astype(np.float32))
    spec = tf.TensorSpec([1, 8, 8, 4], tf.float32)

    def fn(a):
        wide = tf.maximum(a, a * c) + tf.minimum(a, c)
        return tf.pad(wide, [[0, 0], [1, 1], [1, 1], [0, 0]], constant_values=0.5)

    concrete = tf.function(fn, input_signature=[spec]).get_concrete_function()
    float_model = tf.lite.TFLiteConverter.from_concrete_functions([concrete]).convert()
    data = _data((1, 8, 8, 4), 8, 8)
    q = quantize(float_model, mode, representative_dataset=data, progress=False)
    assert {"MAXIMUM", "MINIMUM", "PADV2"} <= {op.op_type for op in kiln.read_model(q).main.operators}
    step = 0.05 if mode == "int8" else 1e-3
    for x in data[:3]:
        assert np.abs(_run(q, x) - _run(float_model, x, ref=False)).max() < step


def _dense_model(activation):
    x = keras.Input((6,), batch_size=1)
    h = keras.layers.Dense(8, activation=activation)(x)
    m = keras.Model(x, keras.layers.Dense(3, activation=activation)(h))
    zoo.randomize(m)
    return m


def _tanh_cnn():
    x = keras.Input((8, 8, 3), batch_size=1)
    h = keras.layers.Conv2D(4, 3, activation="tanh")(x)
    h = keras.layers.Activation("sigmoid")(keras.layers.DepthwiseConv2D(3)(h))
    m = keras.Model(x, keras.layers.Dense(5, activation="softmax")(keras.layers.Flatten()(h)))
    zoo.randomize(m)
    return m


def _reference_run(model: bytes, x: np.ndarray) -> np.ndarray:
    return feed(builtin_ref(model), [x])[0]


def _kiln_run(model: bytes, x: np.ndarray) -> np.ndarray:
    return feed(kiln.Interpreter(model_content=model), [x])[0]


_FIXED_Q15 = {"LOGISTIC", "TANH", "SOFTMAX"}


@pytest.mark.parametrize("build", [lambda: _dense_model("sigmoid"), lambda: _dense_model("tanh"), _tanh_cnn],
                         ids=["dense_sigmoid", "dense_tanh", "cnn_tanh_sigmoid_softmax"])
def test_logistic_tanh_softmax_in_16x8_as_tf_and_bit_exact_in_kilns_runtime(build):
    """LOGISTIC / TANH / SOFTMAX quantize to int16 with output 1/32768, 0 in kiln's 16x8 as in
    TF's; the other activation scales equal TF's within 2 float32 ulps (the float kernels
    calibration runs differ in the last bit: measured 1 ulp on the CNN); versions are
    op_version.cc's int16 ones (TF writes int8 ones). kiln's Interpreter equals LiteRT's
    BUILTIN_REF bit for bit on kiln's and TF's models, float and int16 I/O."""
    m = build()
    shape = (1,) + tuple(m.inputs[0].shape[1:])
    data = _data(shape, 16, 0)
    float_model = tf.lite.TFLiteConverter.from_keras_model(m).convert()
    ours = quantize(float_model, "int16x8", representative_dataset=data, progress=False)
    theirs = _tf_16x8(m, data)
    mine, tfs = kiln.read_model(ours).main, kiln.read_model(theirs).main
    assert [op.op_type for op in mine.operators] == [op.op_type for op in tfs.operators]
    fixed = [op for op in mine.operators if op.op_type in _FIXED_Q15]
    assert fixed and all(op.version == 3 for op in fixed)
    for a, b in zip(mine.operators, tfs.operators):
        if a.op_type in _FIXED_Q15:
            assert b.version == 2 and a.inputs[0].dtype == b.inputs[0].dtype == DType.INT16
            for t in (a.outputs[0], b.outputs[0]):
                assert t.dtype == DType.INT16 and t.quantization.scale[0] == np.float32(1 / 32768)
                assert t.quantization.zero_point[0] == 0
        for u, v in zip(a.outputs, b.outputs):
            if u.dtype == DType.INT16:
                np.testing.assert_array_max_ulp(u.quantization.scale, v.quantization.scale, maxulp=2)
    int16_io = quantize(float_model, "int16x8", representative_dataset=data, integer_only=True,
                        inference_input_type="int16", inference_output_type="int16", progress=False)
    for model in (ours, theirs, int16_io):
        for x in _data(shape, 4, 1):
            if model is int16_io:
                s = kiln.read_model(int16_io).main.inputs[0].quantization.scale[0]
                x = np.clip(np.round(x / s), -32768, 32767).astype(np.int16)
            want = _reference_run(model, x)
            got = _kiln_run(model, x)
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)



@pytest.mark.parametrize("mode", ["int8", "int16x8"])
def test_prelu_quantized_runs_bit_exact_in_kilns_runtime(mode):
    """PRELU (Keras PReLU, shared spatial axes): int8 as TF writes it; in 16x8 (TF keeps it
    float) kiln quantizes it with int16 activations and an int8 alpha, the type LiteRT's
    int16 kernel reads (an int16 alpha would be misread silently). kiln's Interpreter equals
    BUILTIN_REF bit for bit."""
    x_in = keras.Input((4, 4, 8), batch_size=1)
    h = keras.layers.PReLU(shared_axes=[1, 2])(keras.layers.Conv2D(8, 1)(x_in))
    m = keras.Model(x_in, keras.layers.Dense(3)(h))
    zoo.randomize(m)
    float_model = tf.lite.TFLiteConverter.from_keras_model(m).convert()
    data = _data((1, 4, 4, 8), 16, 0)
    q = quantize(float_model, mode, representative_dataset=data, progress=False)
    (prelu,) = [op for op in kiln.read_model(q).main.operators if op.op_type == "PRELU"]
    act = DType.INT8 if mode == "int8" else DType.INT16
    assert (prelu.inputs[0].dtype, prelu.inputs[1].dtype, prelu.outputs[0].dtype) == (act, DType.INT8, act)
    for x in _data((1, 4, 4, 8), 3, 1):
        want = _reference_run(q, x)
        np.testing.assert_array_equal(_kiln_run(q, x), want)
        assert np.abs(want - _reference_run(float_model, x)).max() < (0.03 if mode == "int8" else 0.015)


def test_16x8_elementwise_model_bit_exact_in_kilns_runtime():
    """A 16x8 model with LEAKY_RELU, RESIZE_BILINEAR, ABS, TANH, EXP, RSQRT, SQRT, LOG,
    BATCH_MATMUL, LOGISTIC and FULLY_CONNECTED in int16 (kiln's quantizer): kiln's
    Interpreter gives BUILTIN_REF's bits; the float error stays within 1 % of the range."""
    w = tf.constant(np.random.default_rng(0).normal(size=(8, 8)).astype(np.float32) * 0.3)

    def fn(x):
        h = tf.image.resize(tf.nn.relu6(x * 3.0) + tf.nn.leaky_relu(x, 0.1), [7, 7], method="bilinear")
        g = tf.nn.gelu(h, approximate=True) + tf.exp(h * 0.5) + tf.abs(h)
        s = tf.math.rsqrt(tf.abs(g) + 1.0) + tf.sqrt(tf.abs(g)) + tf.math.log(tf.abs(g) + 0.5)
        m = tf.matmul(tf.reshape(s, [1, 49, 8]), tf.reshape(tf.tanh(g), [1, 49, 8]), transpose_b=True)
        return tf.sigmoid(m) + tf.nn.relu(tf.matmul(tf.reshape(s, [49, 8]), w))[None, :, :1]

    concrete = tf.function(fn, input_signature=[tf.TensorSpec([1, 4, 4, 8], tf.float32)]).get_concrete_function()
    float_model = tf.lite.TFLiteConverter.from_concrete_functions([concrete]).convert()
    data = _data((1, 4, 4, 8), 16, 0)
    q = quantize(float_model, "int16x8", representative_dataset=data, progress=False)
    int16_ops = {op.op_type for op in kiln.read_model(q).main.operators if op.outputs[0].dtype == DType.INT16}
    assert {"LEAKY_RELU", "RESIZE_BILINEAR", "ABS", "TANH", "EXP", "RSQRT", "SQRT", "LOG", "BATCH_MATMUL",
            "LOGISTIC"} <= int16_ops
    for x in data[:3]:
        want = _reference_run(q, x)
        np.testing.assert_array_equal(_kiln_run(q, x), want)
        ref = _reference_run(float_model, x)
        assert np.abs(want - ref).max() < 0.01 * np.abs(ref).max()


def test_a_dead_relu6_tensor_gets_a_scale_litert_accepts():
    """A tensor that calibrates to zeros (a dead channel group) would get scale ~3e-11, at which a
    fused RELU6's bound overflows int32 and LiteRT refuses the node (TF's 16x8 MobileNetV2
    with random weights: scale 3e-16, LiteRT cannot run it); kiln's floor keeps it runnable."""
    from ai_edge_litert.interpreter import Interpreter

    from kiln.ir import Model, Operator
    from kiln.quant.params import MIN_INT16_SCALE
    from kiln.schema import Activation, DType

    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", DType.FLOAT32, (1, 8))
    dead = sg.add_tensor("dead", DType.FLOAT32, (1, 4))
    y = sg.add_tensor("y", DType.FLOAT32, (1, 3))
    sg.inputs.append(x)
    sg.outputs.append(y)
    sg.add_operator(Operator("FULLY_CONNECTED", options={"fused_activation_function": Activation.RELU6}),
                    [x, sg.add_constant("w0", np.zeros((4, 8), np.float32)), None], [dead])
    sg.add_operator(Operator("FULLY_CONNECTED"), [dead, sg.add_constant("w1", np.ones((3, 4), np.float32)), None], [y])
    for op in sg.operators:
        op.version = kiln.ops.require(op.op_type).version(op)
    samples = [[np.random.default_rng(k).standard_normal((1, 8)).astype(np.float32)] for k in range(4)]
    quantized = kiln.quantize(kiln.write_model(model), "int16x8", representative_dataset=samples, progress=False)
    scales = [float(t.quantization.scale[0]) for t in kiln.read_model(quantized).main.tensors
              if t.name.startswith("dead") and t.quantization is not None]
    assert scales == [float(MIN_INT16_SCALE)]
    interp = Interpreter(model_content=quantized)
    interp.allocate_tensors()   # LiteRT's Prepare accepts the RELU6 bound
