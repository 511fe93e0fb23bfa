"""A newcomer's first mistakes with the kiln command, each answered by one line that says what is
wrong: truncated models, files of the wrong kind, dataset keys, options the rest of the command
line would ignore, re-quantizing, --version and the help's lists, where kiln quantize writes,
and which commands import TensorFlow (none of those a .tflite needs).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import tomllib
import zipfile

import numpy as np
import pytest

import kiln
from kiln.format import write_model
from kiln.ir import Model, Signature
from kiln.quant import MODES
from tests.test_cli_errors import REPO, _env, _fc_model, assert_one_line_error, kiln_cmd


def _named_model(n: int = 48) -> bytes:
    """_fc_model's x -> FC -> FC -> y, with TF-converter-style tensor names: its signature calls the
    input 'x', its tensor is 'serving_default_x:0'."""
    model = kiln.read_model(_fc_model(n))
    sg = model.main
    sg.inputs[0].name, sg.outputs[0].name = "serving_default_x:0", "StatefulPartitionedCall:0"
    model.signatures[:] = [Signature("serving_default", sg, {"x": sg.inputs[0]}, {"y": sg.outputs[0]})]
    return write_model(model)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("messages")
    rng = np.random.default_rng(0)
    f = {"root": d, "fc": d / "fc.tflite", "small": d / "small.tflite", "named": d / "named.tflite",
         "npz": d / "calib.npz", "npy": d / "calib.npy", "text": d / "rows.txt", "x": d / "x.npy"}
    f["fc"].write_bytes(_fc_model())
    f["small"].write_bytes(_fc_model(8))           # 64 weights: below dynamic range's 1024
    f["named"].write_bytes(_named_model())
    rows = rng.standard_normal((24, 48)).astype(np.float32)
    np.savez(f["npz"], x=rows)
    np.save(f["npy"], rows)
    np.save(f["x"], rows[:1])
    f["text"].write_text("0.1 0.2 0.3\n")
    data = f["fc"].read_bytes()
    f["cut"] = d / "cut.tflite"
    f["cut"].write_bytes(data[:len(data) // 2])
    return f


# -- item 6: messages that say what is wrong ------------------------------------------------------

@pytest.mark.parametrize("command", ["inspect", "run", "benchmark", "quantize"])
def test_a_truncated_model_is_called_truncated(files, command):
    size = files["cut"].stat().st_size
    line = assert_one_line_error(kiln_cmd(command, files["cut"], *(["-o", files["root"] / "o.tflite"] *
                                                                    (command == "quantize"))), command,
                                 f"{files['cut']}: the file is truncated: expected at least ", code=1)
    assert int(re.search(r"at least (\d+) bytes, it has (\d+)", line).group(1)) > size
    assert f"it has {size} " in line


def test_a_truncated_keras_file_is_called_truncated(files):
    """Keras itself calls it "File not found"; kiln says so before TensorFlow starts."""
    good = files["root"] / "good.keras"                 # a .keras file is a zip archive of these members
    with zipfile.ZipFile(good, "w") as archive:
        archive.writestr("config.json", "{}")
        archive.writestr("model.weights.h5", np.random.default_rng(0).bytes(4096))
    cut = files["root"] / "cut.keras"
    cut.write_bytes(good.read_bytes()[:good.stat().st_size // 2])
    result = kiln_cmd("convert", cut, "-o", files["root"] / "k.tflite")
    assert_one_line_error(result, "convert", "is not a readable .keras file: a .keras file is a zip archive, and this "
                                             "one has no zip directory (truncated or damaged", code=1)
    assert "File not found" not in result.stderr


@pytest.mark.parametrize("given, fragment", [("text", "not a .npy file"), ("npz", "an .npz archive")])
def test_run_input_that_is_no_npy_file(files, given, fragment):
    assert_one_line_error(kiln_cmd("run", files["fc"], "--input", f"x={files[given]}"), "run",
                          f"--input x '{files[given]}': {fragment}", code=1)


def test_quantize_reads_an_npy_for_a_single_input_model(files):
    """Calibrating on calib.npy gives the very model calib.npz (the same rows) gives."""
    out = {kind: files["root"] / f"q_{kind}.tflite" for kind in ("npy", "npz")}
    for kind, path in out.items():
        result = kiln_cmd("quantize", files["fc"], "-o", path, "--mode", "int8", "--data", files[kind], "--quiet")
        assert result.returncode == 0 and result.stderr == "", result.stderr
    assert out["npy"].read_bytes() == out["npz"].read_bytes()


def test_quantize_data_of_no_known_format_lists_the_formats(files):
    line = assert_one_line_error(kiln_cmd("quantize", files["fc"], "-o", files["root"] / "q.tflite", "--mode", "int8",
                                          "--data", files["text"]), "quantize", code=1)
    assert "kiln reads .npz (one array per input name), .npy" in line and "TFRecord" in line


def test_a_missing_dataset_input_is_named_as_the_signature_names_it(files):
    """The .npz has 'wrong'; the model's input is 'x' (its tensor 'serving_default_x:0'). No progress bar
    is drawn before the error: the one line is all of stderr."""
    wrong = files["root"] / "wrong.npz"
    np.savez(wrong, wrong=np.zeros((4, 48), np.float32))
    result = kiln_cmd("quantize", files["named"], "-o", files["root"] / "q.tflite", "--mode", "int8", "--data", wrong)
    line = assert_one_line_error(result, "quantize", "sample 0: no value for input(s) ['x'] (the model's inputs are "
                                                     "['x']; the sample has ['wrong'])", code=1)
    assert "serving_default_x:0" not in line and "calibrating" not in result.stderr
    renamed = files["root"] / "by_signature_name.npz"    # and the signature's name is what the .npz may use
    np.savez(renamed, x=np.random.default_rng(1).standard_normal((4, 48)).astype(np.float32))
    assert kiln_cmd("quantize", files["named"], "-o", files["root"] / "q.tflite", "--mode", "int8", "--data",
                    renamed, "--quiet").returncode == 0


# -- item 7: options the rest of the command line would ignore -------------------------------------

@pytest.mark.parametrize("argv, fragment", [
    (["--mode", "dynamic", "--input-type", "int8"], "--input-type int8: only the calibrated modes"),
    (["--mode", "weight_only", "--output-type", "int8"], "--output-type int8: only the calibrated modes"),
    (["--mode", "float16", "--integer-only"], "--integer-only: only the calibrated modes"),
    (["--mode", "dynamic", "--data", "NPZ"], "--data: only the calibrated modes (int8, int16x8, int4) take it; "
                                             "--mode dynamic keeps float"),
    (["--mode", "int8"], "--mode int8 needs --data"),
    (["--mode", "int8", "--data", "NPZ", "--debug-runner", "litert"], "--debug-runner needs --debug"),
    (["--allow-integer-samples"], "--allow-integer-samples needs --data"),
])
def test_quantize_refuses_options_it_would_ignore(files, argv, fragment):
    argv = [str(files["npz"]) if a == "NPZ" else a for a in argv]
    out = files["root"] / "ignored.tflite"
    assert_one_line_error(kiln_cmd("quantize", files["fc"], "-o", out, *argv), "quantize", fragment, code=2)
    assert not out.exists()


@pytest.mark.parametrize("flags", [["--signature-keys", "serving_default"], ["--tags", "serve"]])
def test_convert_refuses_savedmodel_options_for_a_keras_file(files, flags):
    keras_file = files["root"] / "any.keras"
    keras_file.write_bytes(b"PK")
    assert_one_line_error(kiln_cmd("convert", keras_file, *flags), "convert",
                          f"{flags[0]} pick from a SavedModel directory; '{keras_file}' is a Keras file", code=2)


def test_requantizing_is_refused_and_quantizing_nothing_warns(files):
    q = files["root"] / "q8.tflite"
    made = kiln_cmd("quantize", files["fc"], "-o", q, "--mode", "int8", "--data", files["npz"], "--quiet")
    assert made.returncode == 0, made.stderr
    assert_one_line_error(kiln_cmd("quantize", q, "-o", files["root"] / "qq.tflite"), "quantize",
                          f"{q} is quantized already (", code=1)
    result = kiln_cmd("quantize", files["small"], "-o", files["root"] / "small_q.tflite")
    assert result.returncode == 0, result.stderr
    assert "kept float: FULLY_CONNECTED" in result.stdout
    assert result.stderr == (f"kiln quantize: warning: --mode dynamic quantized nothing in {files['small']}: "
                             f"{files['root'] / 'small_q.tflite'} is the float model (the reasons above)\n")


def test_run_refuses_an_input_given_twice(files):
    assert_one_line_error(kiln_cmd("run", files["fc"], "--input", f"x={files['x']}", "--input", f"x={files['x']}"),
                          "run", "--input x is given twice", code=1)
    assert_one_line_error(kiln_cmd("run", files["named"], "--input", f"x={files['x']}", "--input", f"0={files['x']}"),
                          "run", "--input x and --input 0 name the same input", code=1)


# -- item 8: --version, the help's lists, the index --input offers ----------------------------------

def test_version_comes_from_the_package():
    result = kiln_cmd("--version")
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout == f"kiln {version} from {REPO / 'kiln'} (Python {sys.version.split()[0]})\n"
    assert kiln.__version__ == version


def test_help_lists_every_quantize_mode():
    top = " ".join(kiln_cmd("--help").stdout.split())
    assert f"quantize post-training quantization of a float .tflite ({', '.join(MODES)})" in top, top
    assert "{" + ",".join(MODES) + "}" in kiln_cmd("quantize", "--help").stdout


def test_run_takes_an_input_by_name_tensor_name_or_index(files):
    """The three names --input's help offers give the same outputs (the model has a signature, whose
    runner is what kiln run calls)."""
    outputs = []
    for name in ("x", "serving_default_x:0", "0"):
        out_dir = files["root"] / f"by_{name.replace(':', '_')}"
        result = kiln_cmd("run", files["named"], "--input", f"{name}={files['x']}", "--output-dir", out_dir)
        assert result.returncode == 0, result.stderr
        assert "input 'x' float32 [1, 48] (given)" in result.stdout
        outputs.append(np.load(out_dir / "y.npy"))
    assert all(np.array_equal(outputs[0], o) for o in outputs[1:])
    assert re.search(r"tensor\s+index", kiln_cmd("run", "--help").stdout)


# -- item 10: where kiln quantize writes; which commands import TensorFlow ----------------------------

def test_quantize_writes_to_the_current_directory_not_beside_the_input(files, tmp_path):
    version = tmp_path / "models" / "cnn" / "1"         # the README's serving layout
    version.mkdir(parents=True)
    (version / "model.tflite").write_bytes(files["fc"].read_bytes())
    work = tmp_path / "work"
    work.mkdir()
    result = subprocess.run([sys.executable, "-m", "kiln", "quantize", str(version / "model.tflite")], cwd=work,
                            capture_output=True, text=True, timeout=120, env=_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("model_dynamic.tflite: ")
    assert sorted(p.name for p in version.iterdir()) == ["model.tflite"]
    assert kiln.read_model(work / "model_dynamic.tflite").main.operators[0].inputs[1].dtype.name == "INT8"
    result = subprocess.run([sys.executable, "-m", "kiln", "quantize", "model.tflite"], cwd=version,
                            capture_output=True, text=True, timeout=120, env=_env())
    assert_one_line_error(result, "quantize", "looks like a served model's version directory", code=1)
    assert sorted(p.name for p in version.iterdir()) == ["model.tflite"]


_IMPORTS = textwrap.dedent("""
    import contextlib, io, json, sys
    from kiln.cli import main

    for argv in json.load(sys.stdin):
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code
        assert code == 0, (argv, code)
    print(json.dumps(sorted(m for m in ("tensorflow", "keras", "tf_keras", "jax") if m in sys.modules)))
""")


def test_tflite_commands_never_import_tensorflow(files, tmp_path):
    commands = [["--help"], ["inspect", files["fc"]], ["run", files["fc"]], ["benchmark", files["fc"], "--runs", "2"],
                ["quantize", files["fc"], "-o", tmp_path / "d.tflite"],
                ["quantize", files["fc"], "-o", tmp_path / "q.tflite", "--mode", "int8", "--data", files["npz"]]]
    for argv in commands:   # each in a process of its own: what one imports cannot hide behind another
        run = subprocess.run([sys.executable, "-c", _IMPORTS], input=json.dumps([[str(a) for a in argv]]),
                             capture_output=True, text=True, timeout=120, env=_env(), cwd=tmp_path)
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout) == [], (argv, run.stdout)
