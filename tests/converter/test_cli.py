"""``kiln convert``: SavedModel directories and Keras files to .tflite, with a summary."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import kiln  # noqa: E402
from kiln.cli import main  # noqa: E402
from tests.converter import zoo  # noqa: E402


@pytest.fixture(scope="module")
def keras_file(tmp_path_factory):
    import keras

    m = keras.Sequential([keras.Input((4,), name="x"), keras.layers.Dense(3, activation="relu")])
    zoo.randomize(m)
    path = tmp_path_factory.mktemp("cli") / "dense.keras"
    m.save(path)
    return path, m


def test_convert_keras_file(keras_file, tmp_path, capsys):
    path, model = keras_file
    out = tmp_path / "dense.tflite"
    assert main(["convert", str(path), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"wrote {out}" in text and "FULLY_CONNECTED" in text and "size" in text
    x = np.ones((2, 4), np.float32)
    got = kiln.Interpreter(model_path=str(out)).get_signature_runner()(x=x)["output_0"]
    np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-5, atol=1e-6)


def test_convert_saved_model_default_output(tmp_path, capsys):
    src = zoo.sm_variables()
    assert main(["convert", src.obj, "--signature-keys", "step,read", "--quiet"]) == 0
    assert capsys.readouterr().out == ""
    out = src.obj.rstrip("/") + ".tflite"
    sigs = kiln.Interpreter(model_path=out).get_signature_list()
    assert set(sigs) == {"step", "read"}


def test_convert_h5_with_tf_keras(tmp_path):
    import tf_keras

    m = tf_keras.Sequential([tf_keras.layers.InputLayer((3,)), tf_keras.layers.Dense(2, name="out")])
    path = tmp_path / "legacy.h5"
    m.save(path)
    assert main(["convert", str(path), "--quiet"]) == 0
    assert (tmp_path / "legacy.tflite").exists()


@pytest.mark.parametrize("target, message", [
    ("missing.keras", "no such file or directory"),
    ("notes.txt", "cannot tell what"),
])
def test_convert_errors(tmp_path, capsys, target, message):
    path = tmp_path / target
    if target.endswith(".txt"):
        path.write_text("hello")
    assert main(["convert", str(path)]) == 1
    assert message in capsys.readouterr().err


def test_directory_that_is_not_a_saved_model(tmp_path, capsys):
    assert main(["convert", str(tmp_path)]) == 1
    assert "not a SavedModel" in capsys.readouterr().err
