"""Full-integer fused LSTMs (kiln.quant.lstm) run by LiteRT's integer kernel.

tf_keras: kiln's int8 LSTM has TF's layout and TF's int8 weights and biases. On 16
calibration samples TF writes a cell scale of 2^-16, finer than LiteRT's integer kernel
computes correctly: its error is ~100x kiln's (2^-15, the finest kiln writes). (With 64
samples TF's cell range reaches past 0.5 and both models are as accurate.) Keras 3: TF's
converter segfaults calibrating it (measured; never run here); kiln's converter quantizes
it, in int8 and in 16x8 (the LSTM int8 inside).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import kiln
from kiln.quant import quantize
from kiln.quant.static import QuantizationError
from tests.harness import feed
from tests.quant.zoo_models import builtin_ref

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
tf_keras = pytest.importorskip("tf_keras")

SHAPE = (1, 12, 8)


def _data(count, seed):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, SHAPE).astype(np.float32) for _ in range(count)]


def _run(model: bytes, x: np.ndarray) -> np.ndarray:
    return feed(builtin_ref(model), [x])[0]


def _lstm(model: bytes):
    return next(op for op in kiln.read_model(model).main.operators if op.op_type == "UNIDIRECTIONAL_SEQUENCE_LSTM")


def _check_layout(op):
    """What LiteRT's 8x8->16 kernel reads (unidirectional_sequence_lstm.cc)."""
    assert [op.inputs[i].dtype.name for i in range(1, 9)] == ["INT8"] * 8
    assert all(op.inputs[i].quantization.scale.size == 1 for i in range(1, 9))      # per tensor
    assert [op.inputs[i].dtype.name for i in range(12, 16)] == ["INT32"] * 4
    h, c, out = op.inputs[18], op.inputs[19], op.outputs[0]
    assert h.is_variable and h.dtype.name == "INT8" and h.quantization == out.quantization
    assert c.is_variable and c.dtype.name == "INT16" and c.quantization.zero_point[0] == 0
    assert np.log2(c.quantization.scale[0] * 32768) % 1 == 0                           # a power of two
    assert [t.dtype.name for t in op.intermediates] == ["FLOAT32"] * 4 + ["INT8"]
    assert op.intermediates[4].quantization == out.quantization


@functools.lru_cache(maxsize=None)
def _tf_keras_case():
    tf_keras.utils.set_random_seed(0)
    L = tf_keras.layers
    m = tf_keras.Sequential([L.InputLayer(SHAPE[1:], batch_size=1), L.LSTM(32), L.Dense(4)])
    data = _data(16, 0)
    float_model = tf.lite.TFLiteConverter.from_keras_model(m).convert()
    conv = tf.lite.TFLiteConverter.from_keras_model(m)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = lambda: ([d] for d in data)
    ours = quantize(float_model, "int8", representative_dataset=data, progress=False)
    return m, conv.convert(), ours


@pytest.mark.slow
def test_tf_keras_lstm_has_tfs_layout_and_weights_and_a_cell_scale_litert_computes():
    m, tf_model, ours = _tf_keras_case()
    mine, theirs = _lstm(ours), _lstm(tf_model)
    _check_layout(mine)
    assert mine.version == theirs.version == 1
    for i in list(range(1, 9)) + list(range(12, 16)):
        np.testing.assert_array_equal(mine.inputs[i].data, theirs.inputs[i].data)
        np.testing.assert_array_equal(mine.inputs[i].quantization.scale, theirs.inputs[i].quantization.scale)
    assert mine.inputs[19].quantization.scale[0] == 2 * theirs.inputs[19].quantization.scale[0]
    tests = _data(12, 1)
    want = [m(x).numpy() for x in tests]
    err = lambda q: np.asarray([np.abs(_run(q, x) - w).mean() for x, w in zip(tests, want)])  # noqa: E731
    assert 30 * err(ours).mean() < err(tf_model).mean()
    assert np.median(err(ours)) < 2e-3 and max(np.abs(w).max() for w in want) < 0.5


@functools.lru_cache(maxsize=None)
def _keras3_case():
    keras.utils.set_random_seed(0)
    x = keras.Input(SHAPE[1:], batch_size=1)
    m = keras.Model(x, keras.layers.Dense(4)(keras.layers.LSTM(32)(x)))
    data = _data(64, 0)
    conv = kiln.TFLiteConverter.from_keras_model(m)
    conv.optimizations = [kiln.Optimize.DEFAULT]
    conv.representative_dataset = lambda: ([d] for d in data)
    int8 = conv.convert()
    assert conv.report.quantization["mode"] == "int8" and not conv.report.quantization["kept_float"]
    return m, data, int8, kiln.TFLiteConverter.from_keras_model(m).convert()


@pytest.mark.parametrize("mode", ["int8", "int16x8"])
def test_keras3_lstm_quantized_by_kiln_runs_in_litert(mode):
    m, data, int8, float_model = _keras3_case()
    q = int8 if mode == "int8" else quantize(float_model, mode, representative_dataset=data, progress=False)
    _check_layout(_lstm(q))
    assert len(q) < 0.5 * len(float_model)
    tests = _data(12, 1)
    err = [np.abs(_run(q, x) - m(x).numpy()).max() for x in tests]
    assert np.max(err) < 1.5e-2, err      # TF's tf_keras LSTM int8: ~1e-2 on outputs <= 0.5


def test_lstms_the_integer_kernel_cannot_run_stay_float_or_are_listed():
    keras.utils.set_random_seed(1)
    x = keras.Input(SHAPE[1:], batch_size=1)
    m = keras.Model(x, keras.layers.Dense(4)(keras.layers.LSTM(8, activation="relu")(x)))
    float_model = kiln.TFLiteConverter.from_keras_model(m).convert()
    data = _data(4, 2)
    q = quantize(float_model, "int8", representative_dataset=data, progress=False)
    assert _lstm(q).outputs[0].dtype.name == "FLOAT32"
    assert np.abs(_run(q, data[0]) - m(data[0]).numpy()).max() < 2e-2
    with pytest.raises(QuantizationError, match="UNIDIRECTIONAL_SEQUENCE_LSTM .*tanh cells only"):
        quantize(float_model, "int8", representative_dataset=data, integer_only=True, progress=False)


def test_bidirectional_lstm_becomes_two_integer_lstms():
    """LiteRT's BIDIRECTIONAL_SEQUENCE_LSTM has no integer kernel: kiln splits it into a
    forward and a time-reversed UNIDIRECTIONAL_SEQUENCE_LSTM (REVERSE_V2 around the second)."""
    keras.utils.set_random_seed(2)
    L = keras.layers
    x = keras.Input(SHAPE[1:], batch_size=1)
    m = keras.Model(x, L.Dense(4)(L.LSTM(8)(L.Bidirectional(L.LSTM(16, return_sequences=True))(x))))
    float_model = kiln.TFLiteConverter.from_keras_model(m).convert()
    assert "BIDIRECTIONAL_SEQUENCE_LSTM" in {op.op_type for op in kiln.read_model(float_model).main.operators}
    data = _data(32, 3)
    for mode in ("int8", "int16x8"):
        q = quantize(float_model, mode, representative_dataset=data, progress=False)
        operators = kiln.read_model(q).main.operators
        lstms = [op for op in operators if op.op_type == "UNIDIRECTIONAL_SEQUENCE_LSTM"]
        assert len(lstms) == 3 and "BIDIRECTIONAL_SEQUENCE_LSTM" not in {op.op_type for op in operators}
        for op in lstms:
            _check_layout(op)
        assert all(op.outputs[0].dtype.name != "FLOAT32" for op in operators if op.op_type == "REVERSE_V2")
        err = [np.abs(_run(q, d) - m(d).numpy()).max() for d in _data(6, 4)]
        assert np.median(err) < 5e-3, (mode, err)   # (an input past the calibrated Dense range: ~3e-2)
