"""``kiln quantize`` on a float .tflite: each mode, a .npz dataset keyed by input name,
clear errors with exit code 1."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.cli import main

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")


@pytest.fixture(scope="module")
def float_model(tmp_path_factory):
    m = keras.Sequential([keras.Input((40,), name="x"), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dense(3)])
    path = tmp_path_factory.mktemp("cli") / "mlp.tflite"
    path.write_bytes(kiln.TFLiteConverter.from_keras_model(m).convert())
    return path


@pytest.mark.parametrize("mode, dtype", [("dynamic", "INT8"), ("float16", "FLOAT16"), ("int8", "INT8"),
                                         ("int16x8", "INT16"), ("int4", "INT4")])
def test_each_mode_writes_a_quantized_model(float_model, tmp_path, capsys, mode, dtype):
    data = tmp_path / "calib.npz"
    np.savez(data, x=np.random.default_rng(0).normal(size=(16, 40)).astype(np.float32))
    out = tmp_path / f"out_{mode}.tflite"
    calibrated = ["--data", str(data)] if mode in ("int8", "int16x8", "int4") else []
    assert main(["quantize", str(float_model), "-o", str(out), "--mode", mode, *calibrated]) == 0
    assert f"mode {mode}" in capsys.readouterr().out
    model = kiln.read_model(out.read_bytes())
    assert dtype in {t.dtype.name for t in model.main.tensors}
    assert out.stat().st_size < float_model.stat().st_size


def test_errors_exit_1_with_a_message(float_model, tmp_path, capsys):
    assert main(["quantize", str(float_model), "--mode", "int8"]) == 2   # a malformed command line
    assert "needs --data" in capsys.readouterr().err
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.zeros((4, 7), np.float32))
    assert main(["quantize", str(float_model), "--mode", "int8", "--data", str(bad)]) == 1
    assert "does not fit the model's" in capsys.readouterr().err
    assert main(["quantize", str(tmp_path / "absent.tflite")]) == 1
    assert "error" in capsys.readouterr().err


def test_a_tfrecord_from_tensorflows_saver_calibrates_as_the_same_npz(float_model, tmp_path, capsys):
    """``--data`` takes the TFRecord TF's TfRecordRepresentativeDatasetSaver writes (read
    without TensorFlow by kiln.quant.datasets): same samples, same quantized model."""
    rows = np.random.default_rng(2).normal(size=(12, 40)).astype(np.float32)
    npz, record = tmp_path / "calib.npz", tmp_path / "calib.tfrecord"
    np.savez(npz, x=rows)
    tf.quantization.experimental.TfRecordRepresentativeDatasetSaver(
        path_map={"serving_default": str(record)}).save({"serving_default": [{"x": r[None]} for r in rows]})
    outs = []
    for data in (npz, record):
        out = tmp_path / f"{data.suffix[1:]}.tflite"
        assert main(["quantize", str(float_model), "-o", str(out), "--mode", "int8", "--data", str(data),
                     "--quiet"]) == 0
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    truncated = tmp_path / "cut.tfrecord"
    truncated.write_bytes(record.read_bytes()[:-7])
    assert main(["quantize", str(float_model), "--mode", "int8", "--data", str(truncated)]) == 1
    assert "cut.tfrecord" in capsys.readouterr().err
