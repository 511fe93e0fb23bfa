"""Integer calibration samples for a float input are refused, naming the input, the sample
and the dtype — in `kiln.quantize`, the converter's ``representative_dataset``, ``kiln
quantize --data`` and the debugger — unless the caller opts in.

Un-normalised uint8 images fed to a model that takes [0, 1] floats calibrate every range
~255× too wide: the digits CNN drops from 96 % to 16 % without a word (issue #22). TF's
calibrator refuses them too."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import kiln
from kiln.cli import main
from kiln.ir import Model, Operator
from kiln.quant.calibrate import DatasetError
from kiln.schema import DType

RNG = np.random.default_rng(3)


@functools.lru_cache(maxsize=None)
def _float_model() -> bytes:
    """x [1, 8] -> FULLY_CONNECTED(4) -> y: a float model without TensorFlow."""
    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("pixels", DType.FLOAT32, (1, 8))
    w = sg.add_constant("w", RNG.standard_normal((4, 8)).astype(np.float32))
    y = sg.add_tensor("y", DType.FLOAT32, (1, 4))
    sg.inputs.append(x)
    sg.outputs.append(y)
    sg.add_operator(Operator("FULLY_CONNECTED"), [x, w, None], [y])
    return kiln.write_model(model)


def _images(n: int, dtype=np.uint8) -> list[np.ndarray]:
    return [RNG.integers(0, 256, (1, 8)).astype(dtype) for _ in range(n)]


@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.int64, np.bool_])
def test_kiln_quantize_names_input_sample_and_dtype(dtype):
    samples = [[x.astype(np.float32) / 255] for x in _images(3)] + [[_images(1, dtype)[0]]]
    with pytest.raises(DatasetError) as info:
        kiln.quantize(_float_model(), "int8", representative_dataset=samples, progress=False)
    message = str(info.value)
    assert "sample 3" in message and "'pixels'" in message and np.dtype(dtype).name in message
    assert "allow_integer_samples" in message and "float32" in message


@pytest.mark.parametrize("mode", ["int8", "int16x8", "int4"])
def test_opt_in_calibrates_on_the_values_as_given(mode):
    images = _images(6)
    opted = kiln.quantize(_float_model(), mode, representative_dataset=[[x] for x in images], progress=False,
                          allow_integer_samples=True)
    cast = kiln.quantize(_float_model(), mode, representative_dataset=[[x.astype(np.float32)] for x in images],
                         progress=False)
    assert opted == cast


def test_float64_samples_still_pass():
    """Only integer samples are refused: float64 arrays (NumPy's default) are cast as before."""
    samples = [[RNG.random((1, 8))] for _ in range(4)]
    assert kiln.quantize(_float_model(), "int8", representative_dataset=samples, progress=False)


def test_cli_refuses_integer_data_unless_asked(tmp_path, capsys):
    model = tmp_path / "m.tflite"
    model.write_bytes(_float_model())
    data = tmp_path / "raw.npz"
    np.savez(data, pixels=np.concatenate(_images(5)))
    assert main(["quantize", str(model), "--mode", "int8", "--data", str(data), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "sample 0" in err and "'pixels'" in err and "uint8" in err and "--allow-integer-samples" in err
    out = tmp_path / "q.tflite"
    assert main(["quantize", str(model), "-o", str(out), "--mode", "int8", "--data", str(data), "--quiet",
                 "--allow-integer-samples"]) == 0
    assert out.exists()


def test_debugger_refuses_integer_samples_unless_asked():
    float_model = _float_model()
    images = _images(4)
    quantized = kiln.quantize(float_model, "int8", progress=False,
                              representative_dataset=[[x.astype(np.float32) / 255] for x in images])
    with pytest.raises(DatasetError, match=r"sample 0, input 'pixels': dtype uint8"):
        kiln.QuantizationDebugger(float_model, quantized, [[x] for x in images])
    debugger = kiln.QuantizationDebugger(float_model, quantized, [[x] for x in images], allow_integer_samples=True)
    assert len(debugger.samples) == 4 and debugger.samples[0][0].dtype == np.float32


def test_converter_refuses_integer_samples_unless_asked():
    keras = pytest.importorskip("keras")
    pytest.importorskip("tensorflow")
    m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    images = _images(4)

    def converter(**attributes):
        conv = kiln.TFLiteConverter.from_keras_model(m)
        conv.optimizations = [kiln.Optimize.DEFAULT]
        conv.representative_dataset = lambda: ([x] for x in images)
        for name, value in attributes.items():
            setattr(conv, name, value)
        return conv

    with pytest.raises(DatasetError, match=r"sample 0, input .*dtype uint8"):
        converter().convert()
    model = kiln.read_model(converter(allow_integer_samples=True).convert())
    assert any(t.dtype == DType.INT8 for t in model.main.tensors)
