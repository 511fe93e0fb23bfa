"""README.md as a newcomer meets it: every ```bash / ```python block is run here as written (in a
scratch directory that holds the files a block names: `saved_model_dir`, `model.tflite`, ...) or
listed in `NOT_RUN` with the reason, the inline `examples/beam_pipeline.py` command is run as
written, and the CLI list's one-line helps, flags and choices are the commands' own.

TF Serving's default ports are held by the session (conftest.py), so the serving walk-through
appends ports of its own to `kiln serve` (argparse: the last --port wins) and points the clients
at them; that is the only change made to a block.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kiln.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()

QUICK_START = "import numpy as np, keras, kiln\n"
CUSTOM_OP = "import numpy as np, tensorflow as tf, kiln\n"
CONVERTING = "import kiln\n\nconverter = kiln.TFLiteConverter.from_saved_model"
QUANTIZING = "import numpy as np                                          # `converter` as above\n"
XLA = 'import kiln\n\ninterp = kiln.Interpreter(model_path="model.tflite", experimental_delegates=[kiln.XlaDelegate()])'
INFER_CONVERT = "kiln infer-convert --input_model_dir model --output_model_dir model_xla"
BEAM = "import apache_beam as beam\n"
SERVE = "mkdir -p models/cnn/1 && kiln convert saved_model_dir -o models/cnn/1/model.tflite\n"
CURL = "curl -s localhost:8501/v1/models/cnn "
GRPC = "import grpc, numpy as np, tensorflow as tf\n"

#: The start of each fenced block -> the test that runs it.
RUN = {
    QUICK_START: "test_quick_start",
    CUSTOM_OP: "test_custom_op_snippet_runs_and_survives_a_resize",
    CONVERTING: "test_converting_then_quantizing_snippets",
    QUANTIZING: "test_converting_then_quantizing_snippets",
    XLA: "test_xla_snippet",
    INFER_CONVERT: "test_infer_convert_command",
    BEAM: "test_beam_snippet",
    SERVE: "test_serving_walk_through",
    CURL: "test_serving_walk_through",
    GRPC: "test_serving_walk_through",
}
#: The start of each fenced block no test runs -> why.
NOT_RUN = {
    "make demo   # creates .venv":
        "make install builds a venv (the install's one-TensorFlow rule: tests/test_packaging.py); make test / "
        "make test-slow are CI itself (.ci/run); what make demo then runs, python -m kiln.demo, is test_demo_runs",
}


def _blocks() -> list[tuple[str, str]]:
    """(language, code) of every fenced ```bash / ```python block."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(bash|python)\n(.*?)^```", README, re.S | re.M)]


def _block(start: str) -> str:
    (code,) = [code for _, code in _blocks() if code.startswith(start)]
    return code


def test_every_block_is_run_or_excused():
    tests = {name for name in globals() if name.startswith("test_")}
    starts = list(RUN) + list(NOT_RUN)
    for language, code in _blocks():
        keys = [k for k in starts if code.startswith(k)]
        assert keys, f"README's ```{language} block starting {code.splitlines()[0]!r} is neither run nor excused here"
        assert len(keys) == 1, keys
        assert keys[0] in NOT_RUN or RUN[keys[0]] in tests, (keys[0], RUN.get(keys[0]))
    for start in starts:   # and each names one block
        assert sum(code.startswith(start) for _, code in _blocks()) == 1, start


def _bash(code: str, cwd: Path, timeout: float = 300, background: bool = False):
    """``code`` in bash with `kiln` the worktree's command (this interpreter, this kiln)."""
    prelude = f"set -euo pipefail\nkiln() {{ {shlex.quote(sys.executable)} -m kiln \"$@\"; }}\n"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    if background:
        return subprocess.Popen(["bash", "-c", prelude + code], cwd=cwd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
    result = subprocess.run(["bash", "-c", prelude + code], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _exec(code: str, scope: dict | None = None) -> dict:
    scope = {} if scope is None else scope
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - the README's own code
    return scope


# -- the blocks ----------------------------------------------------------------------------------

def test_quick_start(capsys):
    scope = _exec(_block(QUICK_START))
    printed = capsys.readouterr().out
    assert scope["interp"].get_output_details()[0]["shape"].tolist() == [1, 4]
    assert len(re.findall(r"\d\.\d+|\b0\.", printed)) == 4, printed


def test_custom_op_snippet_runs_and_survives_a_resize(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    interp = _exec(_block(CUSTOM_OP))["interp"]
    assert "'output_0': array([0." in capsys.readouterr().out
    for n in (4, 7, 2):  # sizes and resizes of the one input
        x = np.linspace(-2, 2, n)
        index = interp.get_input_details()[0]["index"]
        interp.resize_tensor_input(index, [n])
        interp.allocate_tensors()
        interp.set_tensor(index, x)
        interp.invoke()
        np.testing.assert_array_equal(interp.get_tensor(interp.get_output_details()[0]["index"]), np.sin(x))


def _mlp_saved_model(path: Path) -> None:
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,), name="x"), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(4)])
    model.export(str(path), verbose=False)


def test_converting_then_quantizing_snippets(tmp_path, monkeypatch, capsys):
    import kiln

    monkeypatch.chdir(tmp_path)
    _mlp_saved_model(tmp_path / "saved_model_dir")
    scope = _exec(_block(CONVERTING))
    Path("model.tflite").write_bytes(scope["tflite_bytes"])   # what the next block's last line reads
    np.savez("calib.npz", x=np.random.default_rng(0).random((20, 8)).astype(np.float32))
    _exec(_block(QUANTIZING), scope)
    assert "FULLY_CONNECTED" in capsys.readouterr().out
    for model in (kiln.read_model(scope["q"]), kiln.read_model("model_int8.tflite")):
        assert {op.op_type for op in model.main.operators} >= {"FULLY_CONNECTED"}
        fc = next(op for op in model.main.operators if op.op_type == "FULLY_CONNECTED")
        assert fc.inputs[1].dtype.name == "INT8"
    assert kiln.read_model(scope["q"]).main.inputs[0].dtype.name == "INT8"   # inference_input_type


def test_xla_snippet(tmp_path, monkeypatch):
    pytest.importorskip("jax")
    import kiln
    from tests.test_cli_errors import _fc_model

    monkeypatch.chdir(tmp_path)
    Path("model.tflite").write_bytes(_fc_model(8))
    scope = _exec(_block(XLA))
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(1, 8)
    reference = kiln.Interpreter(model_path="model.tflite").get_signature_runner()(x=x)["y"]
    np.testing.assert_allclose(np.asarray(scope["fn"](scope["params"], x)[0]), reference, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(scope["interp"].get_signature_runner()(x=x)["y"], reference, rtol=1e-5, atol=1e-5)


def test_beam_snippet(tmp_path, monkeypatch):
    pytest.importorskip("apache_beam")
    from tests.test_cli_errors import _fc_model

    monkeypatch.chdir(tmp_path)
    Path("model.tflite").write_bytes(_fc_model(8))
    _exec(_block(BEAM), {"rows": [np.full(8, i, np.float32) for i in range(3)]})


def test_beam_example_command_as_written(tmp_path):
    """The inline command (DirectRunner, a model kiln converts, random rows), its output under tmp_path."""
    pytest.importorskip("apache_beam")
    command = re.search(r"`(python examples/beam_pipeline\.py\s+--output /tmp/predictions)`", README).group(1)
    argv = shlex.split(command.replace("/tmp/predictions", str(tmp_path / "predictions")))
    result = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr
    lines = [line for f in tmp_path.glob("predictions-*.jsonl") for line in f.read_text().splitlines()]
    assert len(lines) == 100 and '"output_0": [' in lines[0]


def test_infer_convert_command(tmp_path):
    tf = pytest.importorskip("tensorflow")  # noqa: F841
    from tests.inference import models

    models.save_toy(tmp_path / "model")
    out = _bash(_block(INFER_CONVERT), tmp_path)
    assert "-------- Conversion Report --------" in out
    assert (tmp_path / "model_xla" / "saved_model.pb").is_file()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serving_walk_through(tmp_path):
    """Convert a 32x32x3 CNN SavedModel, serve it with batching, ask for its status and metadata,
    predict over REST with curl and over gRPC with TF Serving's own stubs."""
    pytest.importorskip("tensorflow_serving")
    if not shutil.which("curl"):
        pytest.skip("no curl on the PATH")
    import keras

    keras.utils.set_random_seed(0)
    keras.Sequential([keras.Input((32, 32, 3), name="input"), keras.layers.Conv2D(4, 3, activation="relu"),
                      keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)]).export(
        str(tmp_path / "saved_model_dir"), verbose=False)
    convert, serve = _block(SERVE).splitlines()
    _bash(convert, tmp_path)
    grpc_port, rest_port = _free_port(), _free_port()
    serve = serve.split(" #")[0]   # the line, without its comment, with ports of its own after the README's flags
    server = _bash(f"{serve} --port {grpc_port} --rest_api_port {rest_port}", tmp_path, background=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", rest_port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, server.stdout.read()
                time.sleep(0.2)
        curl = _block(CURL).replace("localhost:8501", f"localhost:{rest_port}")
        out = _bash(curl, tmp_path)
        assert '"state": "AVAILABLE"' in out and '"signature_def"' in out and '"predictions": [[' in out, out
        grpc_block = _block(GRPC).replace("127.0.0.1:8500",
                                                                                  f"127.0.0.1:{grpc_port}")
        scope = _exec(grpc_block)
        rest = np.array(json.loads(out[out.rindex('{"predictions"'):])["predictions"])
        (grpc_out,) = scope["stub"].Predict(scope["request"], timeout=10).outputs.values()
        np.testing.assert_allclose(scope["tf"].make_ndarray(grpc_out), rest, rtol=1e-5, atol=1e-6)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, 15)
        server.wait(60)


def test_demo_runs():
    """What `make demo` runs after installing: two Keras models converted, run and compared."""
    pytest.importorskip("tensorflow")
    result = subprocess.run([sys.executable, "-m", "kiln.demo"], cwd=ROOT, capture_output=True, text=True,
                            timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    assert "all outputs agree with TensorFlow" in result.stdout


# -- the CLI list ----------------------------------------------------------------------------------

def _readme_cli_entries() -> dict[str, tuple[str, str]]:
    """subcommand -> (the help comment above it, its synopsis) from the README's CLI block."""
    section = README[README.index("## CLI\n"):]
    block = re.search(r"```\n(.*?)```", section, re.S).group(1)
    entries, comment, current = {}, None, None
    for line in block.splitlines():
        if line.startswith("# "):
            comment, current = line[2:], None
        elif line.startswith("kiln "):
            current = line.split()[1]
            entries[current] = (comment, line)
        elif line.startswith(" ") and current:
            entries[current] = (entries[current][0], entries[current][1] + " " + line.strip())
    return entries


def test_cli_list_matches_the_commands_help():
    parser = build_parser(with_convert=True)
    (sub,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    helps = {a.dest: a.help for a in sub._choices_actions}
    entries = _readme_cli_entries()
    assert set(entries) == set(sub.choices)
    for name, (comment, synopsis) in entries.items():
        assert comment == helps[name], f"README's line for kiln {name} differs from `kiln --help`"
        options = {opt: action for action in sub.choices[name]._actions for opt in action.option_strings}
        tokens = synopsis.replace("[", " ").replace("]", " ").split()
        for i, token in enumerate(tokens):
            if not token.startswith("-"):
                continue
            assert token in options, f"README: kiln {name} has no option {token}"
            action = options[token]
            following = tokens[i + 1] if i + 1 < len(tokens) else ""
            if following.startswith("{"):
                assert following.strip("{}").split(",") == list(action.choices), (name, token)
            elif action.metavar and re.fullmatch(r"[A-Z][A-Z_.=|A-Za-z]*", following):
                first = action.metavar.replace("[", " ").replace("]", " ").split()[0]   # "[SIGNATURE=]FILE"
                assert following == first, (name, token, following, action.metavar)


@pytest.mark.parametrize("needle", ["GiB", "minutes", "Chromium"])
def test_readme_states_install_size_suite_time_and_chromium(needle):
    section = README[README.index("## Two commands"):README.index("## Quick start")]
    assert needle in section
