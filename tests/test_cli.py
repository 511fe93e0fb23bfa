"""The kiln command line: inspect, run, benchmark (and the convert hook), via kiln.cli.main."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import numpy as np
import pytest

import kiln
from kiln.cli import _sections, main, profile_table
from kiln.runtime.interpreter import ProfileEvent
from tests.format.hostile import patch, root, small_model, vector_pos, OPERATOR_INPUTS
from tests.runtime.conftest import litert
from tests.runtime.test_custom_ops import custom_model
from tests.runtime.zoo import zoo_path


@pytest.fixture(scope="module")
def mobilenet():
    return str(zoo_path("mobilenet"))


@pytest.fixture(scope="module")
def variables():
    return str(zoo_path("variables"))


def kiln_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# -- inspect ---------------------------------------------------------------------------------

def test_inspect(capsys, mobilenet):
    code, out, _ = kiln_cli(capsys, "inspect", mobilenet)
    assert code == 0
    model = kiln.read_model(mobilenet)
    version = model.metadata["min_runtime_version"].rstrip(b"\0").decode()
    assert f"minimum runtime version: {version}" in out
    assert "CONV_2D v1 x35" in out and "DEPTHWISE_CONV_2D v1 x17" in out
    assert "'serving_default' (subgraph 0)" in out
    (sig,) = model.signatures
    (in_name, x), (out_name, y) = *sig.inputs.items(), *sig.outputs.items()
    pos = model.main.tensor_index()
    assert f"input  '{in_name}' -> tensor {pos[id(x)]} float32 [1, 32, 32, 3]" in out
    assert f"output '{out_name}' -> tensor {pos[id(y)]} float32 [1, 10]" in out
    first = model.main.operators[0]
    assert re.search(rf"\n\s+0  CONV_2D\s+v1\s+\[{', '.join(str(pos[id(t)]) for t in first.inputs)}\] -> "
                     rf"\[{pos[id(first.outputs[0])]}\]\n", out)
    assert f"subgraph 0 'main': 67 operators, {len(model.main.tensors)} tensors" in out
    assert "tensors:" in out and "(const " in out


def test_inspect_sizes_add_up(capsys, mobilenet):
    data = open(mobilenet, "rb").read()
    sec = _sections(data)
    assert sec["constants"] + sec["tables"] + sec["metadata"] == len(data)
    consts = {id(t.data): t.data.nbytes for t in kiln.read_model(data).main.tensors if t.is_constant}
    assert sec["constants"] == sum(consts.values())  # no dedup in TF's files: one buffer per constant
    code, out, _ = kiln_cli(capsys, "inspect", mobilenet, "--summary")
    assert f"constants {sec['constants']:>,} B".replace(" ", "") in out.replace(" ", "")
    assert "operators:" not in out and "tensors:" not in out


def test_inspect_external_buffers_and_custom_ops(capsys, tmp_path):
    model = kiln.read_model(small_model())
    path = tmp_path / "ext.tflite"
    kiln.save_model(model, path, external_buffers=True)
    code, out, _ = kiln_cli(capsys, "inspect", path)
    assert code == 0
    assert re.search(r"constants\s+72 B", out)  # w 48 + b 12 + c 12 bytes, stored after the tables
    assert "minimum runtime version: 1.5.0" in out
    assert re.search(r"FULLY_CONNECTED\s+v1", out)
    custom = tmp_path / "custom.tflite"
    custom.write_bytes(custom_model("ScaleShift", {"scale": 2.0}))
    code, out, _ = kiln_cli(capsys, "inspect", custom)
    assert code == 0 and re.search(r"0  CUSTOM 'ScaleShift'\s+v1\s+\[0\] -> \[1\]", out)
    assert "minimum runtime version: (no min_runtime_version metadata)" in out


def test_inspect_hostile_file_reports_the_place(capsys, tmp_path):
    data = small_model()
    bad = patch(data, vector_pos(root(data).Subgraphs(0).Operators(0), OPERATOR_INPUTS, 1), "i", 99)
    path = tmp_path / "bad.tflite"
    path.write_bytes(bad)
    code, out, err = kiln_cli(capsys, "inspect", path)
    assert code == 1
    assert "kiln inspect: error:" in err and "subgraph 0, operator 0: input tensor 99 out of range" in err
    code, _, err = kiln_cli(capsys, "inspect", tmp_path / "missing.tflite")
    assert code == 1 and "missing.tflite': no such file" in err


# -- run -------------------------------------------------------------------------------------

def test_run_with_given_inputs_matches_litert(capsys, mobilenet, tmp_path):
    x = np.random.default_rng(3).standard_normal((1, 32, 32, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    runner = litert(mobilenet).get_signature_runner()
    (name,) = runner.get_input_details()
    code, out, _ = kiln_cli(capsys, "run", mobilenet, "--input", f"{name}={tmp_path / 'x.npy'}",
                            "--output-dir", tmp_path / "out")
    assert code == 0
    assert f"input '{name}' float32 [1, 32, 32, 3] (given)" in out
    assert "'output_0' float32 [1, 10]:" in out
    saved = np.load(tmp_path / "out" / "output_0.npy")
    expected = runner(**{name: x})["output_0"]
    np.testing.assert_allclose(saved, expected, rtol=0, atol=1e-4 * np.abs(expected).max())


def test_run_random_inputs_are_seeded(capsys, mobilenet, tmp_path):
    for seed, sub in ((0, "a"), (0, "b"), (1, "c")):
        assert kiln_cli(capsys, "run", mobilenet, "--seed", seed, "--output-dir", tmp_path / sub,
                        "--delegate", "compiled")[0] == 0
    a, b, c = (np.load(tmp_path / s / "output_0.npy") for s in "abc")
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_run_signature_and_errors(capsys, variables):
    code, out, _ = kiln_cli(capsys, "run", variables, "--signature", "read", "--show", "3")
    assert code == 0
    assert "signature 'read':" in out and "input 'scale' float32 [2, 3] (random)" in out
    assert "'scaled' float32 [2, 3]: [" in out and "... (6 values)" in out
    code, out, _ = kiln_cli(capsys, "run", variables)  # two signatures, none chosen: plain invoke()
    assert code == 0 and "invoke():" in out and "input 'accumulate_x:0' float32 [2, 3] (random)" in out
    code, _, err = kiln_cli(capsys, "run", variables, "--signature", "nope")
    assert code == 1 and "has no such signature" in err
    code, _, err = kiln_cli(capsys, "run", variables, "--signature", "read", "--input", "x=/nonexistent.npy")
    assert code == 1 and "--input x: cannot read" in err
    code, _, err = kiln_cli(capsys, "run", variables, "--signature", "read", "--input", "oops")
    assert code == 1 and "--input expects NAME=FILE.npy" in err


def test_run_model_without_signatures_by_tensor_name_or_index(capsys, tmp_path):
    model = kiln.read_model(small_model())
    model.signatures.clear()
    path = tmp_path / "nosig.tflite"
    kiln.save_model(model, path)
    np.save(tmp_path / "x.npy", np.array([[1, 2, 3, 4]], np.float32))
    for name in ("x", "0"):
        code, out, _ = kiln_cli(capsys, "run", path, "--input", f"{name}={tmp_path / 'x.npy'}",
                                "--output-dir", tmp_path)
        assert code == 0 and "invoke():" in out and "(given)" in out
        # relu(x @ w.T + b) + c, by hand
        w = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
        expected = np.maximum(np.array([[1, 2, 3, 4]], np.float32) @ w.T + [0.5, -0.5, 1.0], 0) + [1, 2, 3]
        np.testing.assert_allclose(np.load(tmp_path / "out.npy"), expected, rtol=1e-6)
    code, _, err = kiln_cli(capsys, "run", path, "--input", f"y={tmp_path / 'x.npy'}")
    assert code == 1 and "no input(s) ['y']" in err


# -- benchmark -------------------------------------------------------------------------------

def test_benchmark(capsys, mobilenet):
    code, out, _ = kiln_cli(capsys, "benchmark", mobilenet, "--runs", 3, "--warmup", 1, "--delegate", "reference")
    assert code == 0 and "subgraph 0: 67 nodes: reference kernels 67" in out
    assert "latency over 3 warm runs (1 warm-up), ms: mean" in out
    for stat in ("std", "min", "p50", "p90", "max"):
        assert f" {stat} " in out
    profile = out[out.index("per-op profile"):]
    rows = {line.split()[0]: line.split() for line in profile.splitlines() if line.startswith("  ")}
    assert rows["DEPTHWISE_CONV_2D"][1] == "17" and rows["CONV_2D"][1] == "35"
    assert abs(sum(float(r[3].rstrip("%")) for k, r in rows.items() if k != "op") - 100) < 0.5


def test_benchmark_with_delegate_and_signature(capsys, mobilenet, variables, kiln_default):
    # kiln_default: "--delegate compiled" (an old name for the default) names the NumPy delegate
    code, out, _ = kiln_cli(capsys, "benchmark", mobilenet, "--runs", 2, "--delegate", "compiled")
    assert code == 0 and "numpy delegate (67 nodes)" in out
    code, out, _ = kiln_cli(capsys, "benchmark", variables, "--runs", 2, "--signature", "accumulate",
                            "--no-profile")
    assert code == 0 and "signature 'accumulate'" in out and "per-op profile" not in out
    code, _, err = kiln_cli(capsys, "benchmark", mobilenet, "--runs", 0)
    assert code == 2 and "--runs must be at least 1, got 0" in err


def test_profile_table_per_subgraph():
    events = [ProfileEvent(0, 0, ("WHILE",), 0.004), ProfileEvent(1, 0, ("ADD",), 0.001),
              ProfileEvent(1, 0, ("ADD",), 0.001), ProfileEvent(0, 1, ("CONV_2D", "ADD"), 0.002, "compiled")]
    lines = profile_table(events, runs=2)
    assert lines[0] == "per-op profile, subgraph 0, averaged over 2 runs:"
    assert lines[2].split() == ["WHILE", "1", "2.000", "66.7%", "66.7%", "0.5"]
    assert lines[3].split()[:3] == ["compiled", "delegate", "(2"]
    assert "subgraph 1 (runs inside a control-flow op above)" in lines[4]
    assert lines[6].split() == ["ADD", "1", "1.000", "100.0%", "100.0%", "1.0"]


# -- convert and the entry point -------------------------------------------------------------

def test_convert_is_wired_to_the_converter(capsys):
    has_cli = importlib.util.find_spec("kiln.converter.cli") is not None
    if has_cli:
        with pytest.raises(SystemExit) as info:
            main(["convert", "--help"])
        assert info.value.code == 0
        assert "usage: kiln convert" in capsys.readouterr().out
    else:
        code, _, err = kiln_cli(capsys, "convert", "model_dir")
        assert code == 1 and "kiln.converter.cli is missing" in err


def test_python_dash_m_kiln(mobilenet):
    result = subprocess.run([sys.executable, "-m", "kiln", "inspect", mobilenet, "--summary"],
                            capture_output=True, text=True, check=True)
    assert "size by section:" in result.stdout
    result = subprocess.run([sys.executable, "-m", "kiln"], capture_output=True, text=True)
    assert result.returncode == 2 and "COMMAND" in result.stderr


@pytest.mark.skipif(importlib.util.find_spec("kiln.converter.cli") is None, reason="no kiln.converter.cli")
def test_convert_then_run(capsys, tmp_path):
    """kiln convert SAVED_MODEL -o M.tflite, then kiln run M.tflite agrees with TensorFlow."""
    import tensorflow as tf

    class Affine(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(np.arange(12, dtype=np.float32).reshape(4, 3) / 10)

        @tf.function(input_signature=[tf.TensorSpec([2, 4], tf.float32)])
        def __call__(self, x):
            return {"y": tf.nn.relu(tf.matmul(x, self.w) - 0.5)}

    module = Affine()
    tf.saved_model.save(module, str(tmp_path / "sm"), signatures=module.__call__.get_concrete_function())
    code, _, err = kiln_cli(capsys, "convert", tmp_path / "sm", "-o", tmp_path / "m.tflite")
    assert code == 0, err
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code, out, _ = kiln_cli(capsys, "run", tmp_path / "m.tflite", "--input", f"x={tmp_path / 'x.npy'}",
                            "--output-dir", tmp_path / "out")
    assert code == 0 and "'y' float32 [2, 3]" in out
    expected = module(x)["y"].numpy()
    np.testing.assert_allclose(np.load(tmp_path / "out" / "y.npy"), expected, rtol=0, atol=1e-6 * np.abs(expected).max())
