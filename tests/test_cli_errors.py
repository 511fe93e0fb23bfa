"""The kiln command as a stranger meets it, run as a subprocess on real files: every subcommand
walked with a missing file, a directory, an unwritable path and a bad value for each numeric
flag (one ``kiln CMD: error: ...`` line, no traceback, no TensorFlow imported), Ctrl-C, the
files quantize / convert / run write, serve's port, the backend run / benchmark report, and
TensorFlow's start-up log kept off convert and infer-convert.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.cli import build_parser
from kiln.cli_checks import NUMBERS
from kiln.format import write_model
from kiln.ir import Model, Signature
from kiln.schema import Activation, DType
from tests.format.hostile import small_model

REPO = Path(__file__).resolve().parents[1]


def _env(**changes) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def kiln_cmd(*argv, timeout=120, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kiln", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, env=_env(**env), cwd=REPO)


def assert_one_line_error(result, command: str, fragment: str = "", code: int | None = None) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0, result
    if code is not None:
        assert result.returncode == code, result
    assert "Traceback" not in result.stderr, result.stderr
    assert len(lines) == 1 and lines[0].startswith(f"kiln {command}: error: "), result.stderr
    assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def _unwritable_dir() -> str:
    """A directory no one can create files in, root included (/sys), or skip."""
    try:
        with tempfile.TemporaryFile(dir="/sys"):
            pass
    except OSError:
        return "/sys/kiln-walker"
    pytest.skip("no unwritable directory on this machine")


def _fc_model(n: int = 48) -> bytes:
    """x[1, n] -> FULLY_CONNECTED(n x n) -> RELU -> FULLY_CONNECTED -> y: big enough to quantize."""
    rng = np.random.default_rng(0)
    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", DType.FLOAT32, (1, n))
    w1 = sg.add_constant("w1", rng.standard_normal((n, n)).astype(np.float32))
    b1 = sg.add_constant("b1", rng.standard_normal(n).astype(np.float32))
    h = sg.add_tensor("h", DType.FLOAT32, (1, n))
    w2 = sg.add_constant("w2", rng.standard_normal((n, n)).astype(np.float32))
    b2 = sg.add_constant("b2", np.zeros(n, np.float32))
    y = sg.add_tensor("y", DType.FLOAT32, (1, n))
    sg.inputs, sg.outputs = [x], [y]
    sg.add_operator("FULLY_CONNECTED", [x, w1, b1], [h], options={"fused_activation_function": Activation.RELU})
    sg.add_operator("FULLY_CONNECTED", [h, w2, b2], [y])
    model.metadata["min_runtime_version"] = b"1.5.0".ljust(16, b"\0")
    model.signatures.append(Signature("serving_default", sg, {"x": x}, {"y": y}))
    return write_model(model)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli_errors")
    f = {"dir": d / "adir", "file": d / "afile.txt", "missing": d / "missing" / "nothing.tflite",
         "model": d / "m.tflite", "fc": d / "fc.tflite", "data": d / "calib.npz", "fc_data": d / "fc_calib.npz",
         "saved_model": d / "sm", "versions": d / "versions", "unwritable": _unwritable_dir(), "root": d}
    f["dir"].mkdir()
    (d / "out").mkdir()
    (f["dir"] / "something").write_text("x")
    f["file"].write_text("not a model")
    f["model"].write_bytes(small_model())
    f["fc"].write_bytes(_fc_model())
    rng = np.random.default_rng(1)
    np.savez(f["data"], x=rng.standard_normal((4, 4)).astype(np.float32))
    np.savez(f["fc_data"], x=rng.standard_normal((16, 48)).astype(np.float32))
    f["saved_model"].mkdir()
    (f["saved_model"] / "saved_model.pb").write_bytes(b"")  # enough for the checks made before TensorFlow
    (f["versions"] / "1").mkdir(parents=True)
    (f["versions"] / "1" / "model.tflite").write_bytes(small_model())
    return f


# -- the walker ------------------------------------------------------------------------------

def _subcommands() -> dict:
    parser = build_parser(with_convert=True)
    (sub,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    return dict(sub.choices)


def _numeric_flags() -> list[tuple[str, str, str, type]]:
    """(subcommand, dest, option, type) of every int / float option."""
    out = []
    for name, p in _subcommands().items():
        for action in p._actions:
            if action.type in (int, float) and action.option_strings:
                out.append((name, action.dest, action.option_strings[-1], action.type))
    return out


def _path_cases(f) -> list[tuple[str, list, str]]:
    """(subcommand, argv, what the error says) for missing files, directories and unwritable paths."""
    m, d, fl, miss, un = f["model"], f["dir"], f["file"], f["missing"], f["unwritable"]
    out = f["root"] / "out"
    return [
        ("inspect", ["inspect", miss], "no such file"),
        ("inspect", ["inspect", d], "is a directory, not a file"),
        ("run", ["run", miss], "no such file"),
        ("run", ["run", d], "is a directory"),
        ("run", ["run", m, "--output-dir", fl], "is a file, not a directory"),
        ("run", ["run", m, "--output-dir", f"{un}/outputs"], "cannot create files in '/sys'"),
        ("run", ["run", m, "--input", f"x={miss}"], "--input x: cannot read"),
        ("benchmark", ["benchmark", miss], "no such file"),
        ("benchmark", ["benchmark", d], "is a directory"),
        ("inspect", ["inspect", fl], f"{fl}: The model is not a valid Flatbuffer"),   # a file that is no model:
        ("run", ["run", fl], f"{fl}: The model is not a valid Flatbuffer"),
        ("benchmark", ["benchmark", fl], f"{fl}: The model is not a valid Flatbuffer"),  # named in the error
        ("quantize", ["quantize", miss], "no such file"),
        ("quantize", ["quantize", d], "is a directory"),
        ("quantize", ["quantize", m, "-o", d], "--output"),
        ("quantize", ["quantize", m, "-o", f"{un}/q.tflite"], "cannot create files in '/sys'"),
        ("quantize", ["quantize", m, "-o", fl / "q.tflite"], "is a file, so nothing can be created under it"),
        ("quantize", ["quantize", m, "-o", out / "q.tflite", "--mode", "int8", "--data", miss], "--data"),
        ("quantize", ["quantize", m, "-o", out / "q.tflite", "--mode", "int8", "--data", d], "is a directory"),
        ("quantize", ["quantize", m, "-o", out / "q.tflite", "--mode", "int8", "--data", f["data"],
                      "--debug", f"{un}/r.html"], "--debug"),
        ("xla-export", ["xla-export", miss], "no such file"),
        ("xla-export", ["xla-export", d], "is a directory"),
        ("xla-export", ["xla-export", fl], f"{fl}: The model is not a valid Flatbuffer"),
        ("xla-export", ["xla-export", m, "--output", f"{un}/m.xla"], "cannot create files in '/sys'"),
        ("convert", ["convert", miss], "no such file or directory"),
        ("convert", ["convert", d], "not a SavedModel"),
        ("convert", ["convert", fl], "cannot tell what"),
        ("convert", ["convert", f["saved_model"], "-o", d], "is a directory; give a file path"),
        ("convert", ["convert", f["saved_model"], "-o", f"{un}/m.tflite"], "cannot create files in '/sys'"),
        ("convert", ["convert", f["saved_model"], "-o", out / "c.tflite", "--report-json", fl / "r.json"],
         "--report-json"),
        ("convert", ["convert", f["saved_model"], "-o", out / "c.tflite", "--report-json", d], "is a directory"),
        ("infer-convert", ["infer-convert", "--input_model_dir", miss, "--output_model_dir", out / "ic"],
         "no such directory"),
        ("infer-convert", ["infer-convert", "--input_model_dir", fl, "--output_model_dir", out / "ic"], "is a file"),
        ("infer-convert", ["infer-convert", "--input_model_dir", d, "--output_model_dir", out / "ic"],
         "is not a SavedModel"),
        ("infer-convert", ["infer-convert", "--input_model_dir", f["saved_model"], "--output_model_dir", d],
         "already exists and is not empty"),
        ("infer-convert", ["infer-convert", "--input_model_dir", f["saved_model"], "--output_model_dir",
                           f"{Path(un).parent}/kiln-ic"], "cannot create files in '/sys'"),
        ("infer-convert", ["infer-convert", "--input_model_dir", f["saved_model"], "--output_model_dir", out / "ic",
                           "--converter_options_file", miss], "no such file"),
        ("serve", ["serve", "--model_config_file", miss], "no such file"),
        ("serve", ["serve", "--model_config_file", d], "is a directory"),
        ("serve", ["serve", "--model_base_path", fl], "is a file, not a directory of versions"),
        ("serve", ["serve", "--model_base_path", f["versions"], "--batching_parameters_file", miss], "no such file"),
        ("serve", ["serve", "--model_base_path", f["versions"], "--monitoring_config_file", d], "is a directory"),
    ]


def _numeric_cases(f) -> list[tuple[str, list, str]]:
    base = {"run": ["run", f["model"]], "benchmark": ["benchmark", f["model"]],
            "quantize": ["quantize", f["model"], "-o", f["root"] / "out" / "q.tflite", "--mode", "int8",
                         "--data", f["data"], "--debug", f["root"] / "out" / "r.html"],
            "serve": ["serve", "--model_base_path", f["versions"]]}
    cases = []
    for command, dest, option, kind in _numeric_flags():
        assert (command, dest) in NUMBERS, f"kiln {command} {option} has no range in kiln.cli_checks.NUMBERS"
        assert command in base, f"the walker has no command line for kiln {command}"
        low, high = NUMBERS[command, dest]
        args = base[command]
        cases.append((command, [*args, option, "abc"], f"argument {option}: invalid {kind.__name__} value: 'abc'"))
        if low is not None:
            below = low - 1 if kind is int else low - 0.5
            cases.append((command, [*args, option, str(below)], f"{option} must be"))
        if high is not None:
            cases.append((command, [*args, option, str(high + 1)], f"must be from {low:g} to {high:g}"))
        if kind is float:
            cases.append((command, [*args, option, "nan"], f"{option} must be a finite number"))
    return cases


_DRIVER = textwrap.dedent("""
    import contextlib, io, json, sys, traceback
    from kiln.cli import main

    results = []
    for argv in json.load(sys.stdin):
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code
            except BaseException:
                traceback.print_exc()
                code = "escaped"
        results.append({"code": code, "stderr": err.getvalue()})
    print(json.dumps({"results": results, "tensorflow": "tensorflow" in sys.modules,
                      "converter_api": "kiln.converter.api" in sys.modules}))
""")


def test_every_subcommand_walked_with_bad_paths_and_numbers(files):
    """One subprocess runs every case through kiln.cli.main: one error line each, no traceback,
    and no TensorFlow imported for any of them."""
    cases = _path_cases(files) + _numeric_cases(files)
    listed = set(re.findall(r"^    (\S+)", kiln_cmd("--help").stdout, re.M))
    assert listed == set(_subcommands()) and {c for c, _, _ in cases} == listed  # every subcommand walked
    with socket.socket() as busy:  # and serve on a port in use
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cases.append(("serve", ["serve", "--model_base_path", files["versions"], "--port", str(port)],
                      f"cannot listen on 127.0.0.1:{port}: Address already in use"))
        start = time.perf_counter()
        run = subprocess.run([sys.executable, "-c", _DRIVER], input=json.dumps([[str(a) for a in argv]
                                                                               for _, argv, _ in cases]),
                             capture_output=True, text=True, timeout=300, env=_env(), cwd=REPO)
        seconds = time.perf_counter() - start
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout.splitlines()[-1])
    for (command, argv, fragment), result in zip(cases, report["results"]):
        shown = f"kiln {' '.join(map(str, argv))}"
        assert result["code"] not in (0, None, "escaped"), (shown, result)
        lines = [line for line in result["stderr"].splitlines() if line.strip()]
        assert "Traceback" not in result["stderr"] and len(lines) == 1, (shown, result["stderr"])
        assert lines[0].startswith(f"kiln {command}: error: ") and fragment in lines[0], (shown, fragment, lines[0])
    assert not report["tensorflow"], "an argument error imported TensorFlow"
    assert seconds < 60, f"{len(cases)} argument errors took {seconds:.0f} s"


def test_argument_errors_as_a_real_command(files):
    """The same through ``python -m kiln``: exit 2 for a malformed command line, 1 for a bad path."""
    assert_one_line_error(kiln_cmd("benchmark", files["model"], "--runs", "0"), "benchmark",
                          "--runs must be at least 1, got 0", code=2)
    assert_one_line_error(kiln_cmd("run", files["model"], "--delegate", "gpu"), "run", "invalid choice: 'gpu'", code=2)
    assert_one_line_error(kiln_cmd("quantize", files["model"], "-o", files["dir"]), "quantize", "is a directory",
                          code=1)


def test_ctrl_c_prints_one_line_and_exits_130(files):
    proc = subprocess.Popen([sys.executable, "-m", "kiln", "benchmark", str(files["fc"]), "--runs", "10000000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=REPO,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert "delegate: default" in proc.stdout.readline()   # printed when the timed runs start
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err == "kiln benchmark: interrupted\n", err


# -- what the commands write -----------------------------------------------------------------

def test_quantize_makes_missing_parent_directories(files):
    out = files["root"] / "new" / "deeper" / "q.tflite"
    result = kiln_cmd("quantize", files["fc"], "-o", out, "--quiet")
    assert result.returncode == 0, result.stderr
    assert kiln.read_model(out).main.operators[0].op_type == "FULLY_CONNECTED"
    assert not list(out.parent.glob(".*tmp"))   # the temporary file was renamed into place


def test_convert_checks_its_outputs_before_converting(files):
    """A bad --report-json or -o fails before any conversion (the fake SavedModel would fail
    to load) and writes no model."""
    out = files["root"] / "conv" / "m.tflite"
    assert_one_line_error(kiln_cmd("convert", files["saved_model"], "-o", out, "--report-json", files["file"] / "r"),
                          "convert", "--report-json")
    assert not out.exists() and not out.parent.exists()


def test_run_output_dir_that_is_a_file(files):
    assert_one_line_error(kiln_cmd("run", files["model"], "--output-dir", files["file"]), "run",
                          "--output-dir")
    result = kiln_cmd("run", files["model"], "--output-dir", files["root"] / "outs" / "run")
    assert result.returncode == 0, result.stderr
    assert np.load(files["root"] / "outs" / "run" / "out.npy").shape == (1, 3)


def test_quantize_in_place_debugs_against_the_original_float_model(files, tmp_path):
    """-o SOURCE with --debug: the page compares the int8 model with the float one read before
    it was overwritten — the same errors as quantizing to another file."""
    def quantize(target):
        result = kiln_cmd("quantize", src, "-o", target, "--mode", "int8", "--data", files["fc_data"],
                          "--debug", tmp_path / "r.html")
        assert result.returncode == 0, result.stderr
        return result.stdout

    src = tmp_path / "fc.tflite"
    src.write_bytes(files["fc"].read_bytes())
    elsewhere = quantize(tmp_path / "q.tflite")
    in_place = quantize(src)
    error = re.search(r"output 'y': max \|error\| (\S+)", in_place)
    assert error and float(error.group(1)) > 0
    assert re.search(r"\(0\.[0-9]+ of ", in_place)              # smaller than the float model
    strip = lambda text: text.splitlines()[1:]                  # noqa: E731 (the first line names the file)
    assert strip(in_place) == strip(elsewhere)
    assert kiln.read_model(src).main.inputs[0].dtype.name == "FLOAT32"
    assert any(t.dtype.name == "INT8" for t in kiln.read_model(src).main.tensors)


def test_calibration_bar_shows_its_total_and_stays(files, tmp_path):
    result = kiln_cmd("quantize", files["fc"], "-o", tmp_path / "q.tflite", "--mode", "int8", "--data",
                      files["fc_data"])
    assert result.returncode == 0, result.stderr
    frames = result.stderr.split("\r")
    assert re.search(r"calibrating:\s+0%.*\| 0/16 \[00:00<\?", frames[0]), frames[0]   # total known, ETA pending
    assert re.search(r"calibrating: 100%.*\| 16/16 \[", frames[-1]) and frames[-1].endswith("\n")  # left on screen


# -- serve -----------------------------------------------------------------------------------

@pytest.mark.parametrize("flags, message", [
    (["--port", "99999"], "--port must be from 0 to 65535, got 99999"),
    (["--port", "-1"], "--port must be from 0 to 65535, got -1"),
    (["--rest_api_port", "65536"], "--rest_api_port must be from 0 to 65535, got 65536"),
    (["--port", "0", "--rest_api_port", "0"], "--port and --rest_api_port are both 0: there is nothing to serve on"),
    (["--port", "9000", "--rest_api_port", "9000"], "are both 9000: give them different ports"),
])
def test_serve_refuses_ports_out_of_range(files, flags, message):
    """TF Serving's ports: --port is gRPC and --rest_api_port REST, 0 turns either off."""
    result = kiln_cmd("serve", "--model_base_path", files["versions"], *flags, timeout=30)
    assert_one_line_error(result, "serve", message, code=2)
    assert "REST API on" not in result.stderr + result.stdout


@pytest.mark.parametrize("busy_flag, other", [("--rest_api_port", ("--port", "0")),
                                              ("--port", ("--rest_api_port", "0")),
                                              ("--port", ()),  # both APIs on, one port busy
                                              ("--rest_api_port", ())])
def test_serve_on_a_busy_port_is_one_line(files, busy_flag, other):
    """Every port kiln serve would listen on is probed before start-up, gRPC's as well as REST's."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        if not other:  # the other API on a free port of its own
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                other = ("--port" if busy_flag == "--rest_api_port" else "--rest_api_port", str(s.getsockname()[1]))
        result = kiln_cmd("serve", "--model_base_path", files["versions"], busy_flag, port, *other, timeout=30)
    assert_one_line_error(result, "serve", f"cannot listen on 127.0.0.1:{port}: Address already in use", code=1)
    assert "REST API on" not in result.stderr + result.stdout


def test_serve_reports_a_missing_model_while_tf_servings_ports_are_taken(tf_serving_ports_held, tmp_path):
    """conftest.py holds 127.0.0.1:8500 and 8501 (kiln serve's defaults) for the session: the
    missing model is what kiln serve reports, its ports are checked last."""
    for port in tf_serving_ports_held:
        with socket.socket() as probe, pytest.raises(OSError):
            probe.bind(("127.0.0.1", port))
    missing = tmp_path / "MISSING"
    result = kiln_cmd("serve", "--model_base_path", missing, timeout=60)
    assert_one_line_error(result, "serve", f"base path '{missing}' is not a directory", code=1)
    bad = tmp_path / "batching.config"
    bad.write_text("max_batch_size { value: 0 }")
    (tmp_path / "m" / "1").mkdir(parents=True)
    result = kiln_cmd("serve", "--model_base_path", tmp_path / "m", "--batching_parameters_file", bad, timeout=60)
    assert_one_line_error(result, "serve", "max_batch_size must be >= 1", code=1)
    result = kiln_cmd("serve", "--model_base_path", tmp_path / "m", timeout=60)   # and then the port
    assert_one_line_error(result, "serve", "cannot listen on 127.0.0.1:8500: Address already in use", code=1)


# -- which backend ran -----------------------------------------------------------------------

def test_run_and_benchmark_default_to_the_interpreters_default(files):
    interp = kiln.Interpreter(model_path=str(files["fc"]))
    interp.allocate_tensors()
    names = ", ".join(d.name for d in interp._delegates)
    for argv in (["run", files["fc"]], ["benchmark", files["fc"], "--runs", "3"]):
        result = kiln_cmd(*argv)
        assert result.returncode == 0, result.stderr
        assert f"backend: delegates offered every node, in order: {names}\n" in result.stdout
        claimed = re.search(r"subgraph 0: 2 nodes: (.*)\n", result.stdout).group(1)
        assert "reference kernels" not in claimed, claimed   # the default delegates take both FCs
    result = kiln_cmd("benchmark", files["fc"], "--runs", "3", "--delegate", "reference", "-v")
    assert "in order: none\n" in result.stdout and "subgraph 0: 2 nodes: reference kernels 2" in result.stdout
    assert "    node    0 FULLY_CONNECTED v1: reference kernels\n" in result.stdout


def test_verbose_names_each_nodes_backend_and_why(files, tmp_path):
    """A node no delegate takes (a bfloat16 ADD: LiteRT takes no bfloat16 tensors, the compiled
    delegate float32 only) is listed with each delegate's reason."""
    model = Model()
    sg = model.add_subgraph("main")
    a = sg.add_tensor("a", DType.FLOAT32, (1, 4))
    a16 = sg.add_tensor("a16", DType.BFLOAT16, (1, 4))
    b = sg.add_constant("b", np.arange(4).reshape(1, 4).astype(DType.BFLOAT16.numpy))
    c16 = sg.add_tensor("c16", DType.BFLOAT16, (1, 4))
    c = sg.add_tensor("c", DType.FLOAT32, (1, 4))
    x = sg.add_tensor("x", DType.FLOAT32, (1, 4))
    y = sg.add_tensor("y", DType.FLOAT32, (1, 4))
    sg.inputs, sg.outputs = [a, x], [c, y]
    sg.add_operator("CAST", [a], [a16])
    sg.add_operator("ADD", [a16, b], [c16])
    sg.add_operator("CAST", [c16], [c])
    sg.add_operator("RELU", [x], [y])
    path = tmp_path / "mixed.tflite"
    path.write_bytes(write_model(model))
    result = kiln_cmd("run", path, "--verbose")
    assert result.returncode == 0, result.stderr
    node0 = re.search(r"    node    1 ADD v\d: reference kernels  \((.*)\)\n", result.stdout)
    assert node0 and "litert: " in node0.group(1), result.stdout
    assert re.search(r"    node    3 RELU v1: \w+ delegate\n", result.stdout), result.stdout


# -- TensorFlow's start-up log -----------------------------------------------------------------

def test_convert_prints_no_tensorflow_log(tmp_path):
    """As a user runs them (no TF_CPP_MIN_LOG_LEVEL set): stderr holds nothing at all."""
    script = textwrap.dedent(f"""
        import tensorflow as tf
        class M(tf.Module):
            @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
            def __call__(self, x):
                return {{"y": tf.nn.relu(x) * 2.0}}
        m = M()
        tf.saved_model.save(m, {str(tmp_path / 'sm')!r}, signatures=m.__call__.get_concrete_function())
    """)
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, env=_env())
    report = tmp_path / "reports" / "new" / "r.json"   # missing directories are made, as for -o
    result = kiln_cmd("convert", tmp_path / "sm", "-o", tmp_path / "out" / "m.tflite", "--report-json", report,
                      TF_CPP_MIN_LOG_LEVEL=None)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert kiln.read_model(tmp_path / "out" / "m.tflite").main.operators and json.loads(report.read_text())
    # infer-convert's: tests/inference/test_cli.py::test_cli_prints_only_the_report


# -- item 1 is the lead's: min_runtime_version after quantization ----------------------------------

def test_quantize_writes_the_min_runtime_version_of_its_ops(files, tmp_path):
    out = tmp_path / "q.tflite"
    assert kiln_cmd("quantize", files["fc"], "-o", out, "--mode", "int8", "--data", files["fc_data"],
                    "--quiet").returncode == 0
    from kiln.format.runtime_version import model_runtime_version

    model = kiln.read_model(out)
    version = model.metadata["min_runtime_version"].rstrip(b"\0").decode()
    assert version == model_runtime_version(model) != "1.5.0"  # int8 FULLY_CONNECTED needs a newer runtime
