"""Weight-only modes on TF's float conversions, against TF's own quantized conversions: the
same int8 weights and scales (dynamic range), the same float16 constants, the same ops at
the versions TF writes, and the same outputs in LiteRT."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import kiln
from kiln.quant import quantize
from tests.converter import zoo
from tests.harness import assert_close

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")


def _hybrid_model():
    """Every op with a hybrid kernel, with weights above and below the 1024 threshold."""
    rng = np.random.default_rng(0)
    L = keras.layers
    x = keras.Input((8, 8, 16))
    h = L.Conv2D(16, 3, padding="same")(x)
    h = L.DepthwiseConv2D(3, depth_multiplier=8)(h)
    h = L.Conv2DTranspose(8, 3)(h)
    h = L.Conv2D(4, 1)(h)                                   # 32 weights: stays float
    y = L.Dense(10)(L.Dense(64, activation="relu")(L.Flatten()(h)))
    m = keras.Model(x, y)
    for v in m.weights:
        v.assign(rng.uniform(-0.5, 0.5, v.shape).astype(np.float32))
    return m


def _tf_models(model, **quant):
    plain = tf.lite.TFLiteConverter.from_keras_model(model).convert()
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    for key, value in quant.items():
        setattr(conv.target_spec, key, value)
    return plain, conv.convert()


@functools.lru_cache(maxsize=None)
def _model(name):
    return MODELS[name]()


MODELS = {"hybrid_ops": _hybrid_model,
          "k3_cnn": lambda: zoo.BUILDERS["k3_cnn"]().obj,
          "k3_transformer": lambda: zoo.BUILDERS["k3_transformer"]().obj}


def _ops_by_type(model: bytes) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for _, _, op in kiln.read_model(model).operators():
        out.setdefault(op.name, []).append(op.version)
    return out


def _run_litert(model: bytes, x: np.ndarray) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=model)
    inp = interp.get_input_details()[0]
    interp.resize_tensor_input(inp["index"], x.shape)
    interp.allocate_tensors()
    interp.set_tensor(inp["index"], x)
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


def _same_ops_as_tf(ours: bytes, theirs: bytes) -> None:
    """Same op types and counts; TF writes one operator code per builtin at the highest
    version any of its ops needs, kiln each op at its own lowest: the maxima agree."""
    mine, tfs = _ops_by_type(ours), _ops_by_type(theirs)
    assert {k: len(v) for k, v in mine.items()} == {k: len(v) for k, v in tfs.items()}
    assert {k: max(v) for k, v in mine.items()} == {k: max(v) for k, v in tfs.items()}


@pytest.mark.parametrize("name", list(MODELS))
def test_dynamic_range_equals_tf(name):
    model = _model(name)
    float_model, tf_model = _tf_models(model)
    ours = quantize(float_model, "dynamic")
    _same_ops_as_tf(ours, tf_model)
    theirs = {t.name: t for t in kiln.read_model(tf_model).main.tensors if t.dtype.name == "INT8"}
    mine = {t.name: t for t in kiln.read_model(ours).main.tensors if t.dtype.name == "INT8"}
    assert set(mine) == set(theirs)
    assert mine or name in ("k3_cnn", "k3_transformer")   # these have no weights ≥ 1024
    for key, t in theirs.items():
        np.testing.assert_array_equal(mine[key].data, t.data, err_msg=key)
        np.testing.assert_array_equal(mine[key].quantization.scale, t.quantization.scale, err_msg=key)
        assert mine[key].quantization.quantized_dimension == t.quantization.quantized_dimension
    x = np.random.default_rng(1).uniform(-1, 1, (2,) + tuple(model.inputs[0].shape[1:])).astype(np.float32)
    np.testing.assert_allclose(_run_litert(ours, x), _run_litert(tf_model, x), rtol=0, atol=1e-6)
    assert len(ours) <= len(tf_model) * 1.01


@pytest.mark.parametrize("name", list(MODELS))
def test_float16_equals_tf(name):
    model = _model(name)
    float_model, tf_model = _tf_models(model, supported_types=[tf.float16])
    ours = quantize(float_model, "float16")
    _same_ops_as_tf(ours, tf_model)
    halves = sorted(t.data.tobytes() for t in kiln.read_model(ours).main.tensors if t.dtype.name == "FLOAT16")
    assert halves == sorted(t.data.tobytes() for t in kiln.read_model(tf_model).main.tensors
                            if t.dtype.name == "FLOAT16")
    x = np.random.default_rng(2).uniform(-1, 1, (1,) + tuple(model.inputs[0].shape[1:])).astype(np.float32)
    np.testing.assert_allclose(_run_litert(ours, x), _run_litert(tf_model, x), rtol=0, atol=1e-6)
    got = kiln.Interpreter(model_content=ours).get_signature_runner()
    (name_in,) = got.get_input_details()
    (out,) = got(**{name_in: x}).values()
    assert_close(out, _run_litert(tf_model, x), rtol=1e-5, what=f"{name}: kiln vs LiteRT")


def test_denylist_and_threshold_keep_weights_float():
    float_model, _ = _tf_models(_hybrid_model())
    ours = kiln.read_model(quantize(float_model, "dynamic", denylist=["FULLY_CONNECTED"]))
    assert all(op.inputs[1].dtype.name == "FLOAT32" for op in ours.main.operators if op.op_type == "FULLY_CONNECTED")
    everything = kiln.read_model(quantize(float_model, "dynamic", min_elements=1))
    assert all(op.inputs[1].dtype.name == "INT8" for op in everything.main.operators
               if op.op_type in ("CONV_2D", "FULLY_CONNECTED"))


def test_bad_arguments_are_kiln_errors():
    with pytest.raises(kiln.KilnError, match="unknown mode"):
        quantize(b"", "int3")
    with pytest.raises(kiln.KilnError):
        quantize(b"not a model", "dynamic")
    with pytest.raises(kiln.KilnError, match="'int16x8' needs a representative_dataset"):
        quantize(tf.lite.TFLiteConverter.from_keras_model(_hybrid_model()).convert(), "int16x8")


@pytest.mark.parametrize("lib", ["keras3", "tf_keras"])
def test_dynamic_range_quantizes_fused_lstms_where_tf_leaves_them_float(lib):
    """TF 2.21's default quantizer keeps a fused LSTM float (size ratio 1.00, measured);
    kiln gives it int8 weights for LiteRT's hybrid kernel (versions 3)."""
    import tf_keras

    rng = np.random.default_rng(4)
    if lib == "keras3":
        L = keras.layers
        m = keras.Sequential([keras.Input((12, 8), batch_size=1), L.LSTM(32, return_sequences=True),
                              L.Bidirectional(L.LSTM(16)), L.Dense(4)])
    else:
        L = tf_keras.layers
        m = tf_keras.Sequential([L.InputLayer((12, 8), batch_size=1), L.LSTM(64), L.Dense(4)])
    m.set_weights([rng.uniform(-0.3, 0.3, w.shape).astype(np.float32) for w in m.get_weights()])
    float_model = kiln.TFLiteConverter.from_keras_model(m).convert()
    ours = quantize(float_model, "dynamic")
    lstms = [op for op in kiln.read_model(ours).main.operators if op.op_type.endswith("SEQUENCE_LSTM")]
    assert lstms and all(op.version == 3 for op in lstms)
    assert len(ours) < 0.45 * len(float_model)
    x = rng.normal(size=(1, 12, 8)).astype(np.float32)
    want = np.asarray(m(x))
    assert np.abs(_run_litert(ours, x) - want).max() < 1e-2 * max(1.0, np.abs(want).max())
    if lib == "tf_keras":
        _, tf_model = _tf_models(m)
        assert len(tf_model) > 0.95 * len(float_model)   # TF: the LSTM stays float


def test_weight_only_int8_runs_in_kiln_and_litert_with_dequantized_weights():
    """kiln's extension: int8 weights behind DEQUANTIZE (v5), float compute: outputs equal
    the float model run on the dequantized weights, in kiln and in LiteRT."""
    float_model, _ = _tf_models(_hybrid_model())
    ours = quantize(float_model, "weight_only")
    m = kiln.read_model(ours)
    deq = [op for op in m.main.operators if op.op_type == "DEQUANTIZE"]
    assert len(deq) == 4 and all(op.version == 5 for op in deq)
    assert all(op.inputs[1].dtype.name == "FLOAT32" for op in m.main.operators if op.op_type == "CONV_2D")
    assert len(ours) < 0.4 * len(float_model)
    x = np.random.default_rng(5).uniform(-1, 1, (2, 8, 8, 16)).astype(np.float32)
    runner = kiln.Interpreter(model_content=ours).get_signature_runner()
    (name,) = runner.get_input_details()
    (got,) = runner(**{name: x}).values()
    want = _run_litert(ours, x)
    assert_close(got, want, rtol=1e-5, what="kiln vs LiteRT")
    assert np.abs(want - _run_litert(float_model, x)).max() < 0.05 * np.abs(want).max()



def test_dynamic_range_transpose_convs_bit_exact_in_kilns_runtime():
    """Two hybrid TRANSPOSE_CONVs (SAME stride 2 with RELU, VALID stride 1; weights over the
    1024 threshold) from a Keras model: kiln's Interpreter gives LiteRT's BUILTIN_REF bits
    on a batch of two (float32 in and out: each batch entry quantized on its own)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    x_in = keras.Input((5, 5, 16))
    h = keras.layers.Conv2DTranspose(16, 3, strides=2, padding="same", activation="relu")(x_in)
    m = keras.Model(x_in, keras.layers.Conv2DTranspose(8, 3)(h))
    zoo.randomize(m)
    ours = quantize(tf.lite.TFLiteConverter.from_keras_model(m).convert(), "dynamic")
    assert [(op.op_type, op.inputs[1].dtype.name) for op in kiln.read_model(ours).main.operators
            if op.op_type == "TRANSPOSE_CONV"] == [("TRANSPOSE_CONV", "INT8")] * 2
    x = np.random.default_rng(3).uniform(-1, 1, (2, 5, 5, 16)).astype(np.float32)
    outs = []
    for interp in (Interpreter(model_content=ours, experimental_op_resolver_type=OpResolverType.BUILTIN_REF),
                   kiln.Interpreter(model_content=ours)):
        inp = interp.get_input_details()[0]
        interp.resize_tensor_input(inp["index"], x.shape)
        interp.allocate_tensors()
        interp.set_tensor(inp["index"], x)
        interp.invoke()
        outs.append(interp.get_tensor(interp.get_output_details()[0]["index"]))
    assert outs[0].shape == (2, 12, 12, 8)
    np.testing.assert_array_equal(outs[1], outs[0])
