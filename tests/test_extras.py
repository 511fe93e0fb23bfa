"""Every optional extra missing costs one line naming its pip command, exit status 2, no traceback:
each command and option that needs one is run in a subprocess whose imports of the extra's modules
fail as they do when it is not installed (a meta-path finder ahead of the real ones), and the
Python API raises a `MissingExtraError` (a KilnError and an ImportError) saying the same.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import socket
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from kiln.extras import EXTRAS, MissingExtraError, from_import_error, require
from tests.format.hostile import small_model

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "beam_pipeline.py")

#: Runs argv[2:] (``-m module ...``, ``-c code`` or a script) with the top-level modules in argv[1]
#: (comma-separated) not importable: their finder raises ModuleNotFoundError as a missing one does.
_BLOCKED = textwrap.dedent("""
    import runpy, sys

    class Missing:
        def __init__(self, names):
            self.names = set(names)

        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in self.names:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Missing(sys.argv[1].split(",")))
    what, rest = sys.argv[2], sys.argv[3:]
    if what == "-m":
        sys.argv = rest
        runpy.run_module(rest[0], run_name="__main__", alter_sys=True)
    elif what == "-c":
        sys.argv = ["-c", *rest[1:]]
        exec(rest[0])
    else:
        sys.argv = [what, *rest]
        runpy.run_path(what, run_name="__main__")
""")


def run_without(modules: str, *argv, cwd=ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run([sys.executable, "-c", _BLOCKED, modules, *map(str, argv)], capture_output=True,
                          text=True, timeout=120, env=env, cwd=cwd)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("extras")
    (d / "m.tflite").write_bytes(small_model())
    (d / "versions" / "1").mkdir(parents=True)
    (d / "versions" / "1" / "model.tflite").write_bytes(small_model())
    (d / "sm").mkdir()
    (d / "sm" / "saved_model.pb").write_bytes(b"")    # enough for the checks made before TensorFlow
    (d / "m.keras").write_bytes(b"PK")
    return d


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


SERVE = ["-m", "kiln", "serve", "--model_base_path", "D/versions"]
REST_ONLY, GRPC_ONLY = ["--port", "0", "--rest_api_port", "REST"], ["--rest_api_port", "0", "--port", "GRPC"]
#: (blocked modules, argv (D: the files' directory; REST / GRPC: free ports), the error line's start, the extra)
CASES = {
    "convert keras": ("tensorflow", ["-m", "kiln", "convert", "D/m.keras", "-o", "D/o.tflite"],
                      "kiln convert: error: ", "tf"),
    "convert saved model": ("tensorflow", ["-m", "kiln", "convert", "D/sm", "-o", "D/o.tflite"],
                            "kiln convert: error: ", "tf"),
    "infer-convert": ("tensorflow", ["-m", "kiln", "infer-convert", "--input_model_dir", "D/sm", "--output_model_dir",
                                     "D/ic"], "kiln infer-convert: error: ", "tf"),
    "run xla": ("jax", ["-m", "kiln", "run", "D/m.tflite", "--delegate", "xla"], "kiln run: error: --delegate xla ",
                "xla"),
    "benchmark xla": ("jax", ["-m", "kiln", "benchmark", "D/m.tflite", "--delegate", "xla"],
                      "kiln benchmark: error: --delegate xla ", "xla"),
    "serve httptools": ("httptools", [*SERVE, *REST_ONLY], "kiln serve: error: ", "serve"),
    "serve prometheus": ("prometheus_client", [*SERVE, *REST_ONLY], "kiln serve: error: ", "serve"),
    "serve h2": ("h2", [*SERVE, *GRPC_ONLY], "kiln serve: error: ", "serve"),
    "serve protobuf": ("google", [*SERVE, *GRPC_ONLY], "kiln serve: error: ", "serve"),   # gRPC's messages
    "serve backend xla": ("jax", [*SERVE, *REST_ONLY, "--backend", "xla"], "kiln serve: error: --backend xla ", "xla"),
    "serve backend tf": ("tensorflow", [*SERVE, *REST_ONLY, "--backend", "tf"], "kiln serve: error: --backend tf ",
                         "tf"),
    "beam example": ("apache_beam", [EXAMPLE, "--output", "D/pred"], "examples/beam_pipeline.py: error: ", "beam"),
    "beam example converting": ("tensorflow", [EXAMPLE, "--output", "D/pred"], "examples/beam_pipeline.py: error: ",
                                "tf"),
    "beam example on xla": ("jax", [EXAMPLE, "--model", "D/m.tflite", "--backend", "xla", "--output", "D/pred"],
                            "examples/beam_pipeline.py: error: --backend xla ", "xla"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_missing_extra_is_one_line_naming_the_pip_command(files, case):
    blocked, argv, prefix, extra = CASES[case]
    ports = {"REST": _free_port(), "GRPC": _free_port()}
    argv = [ports.get(a, a.replace("D/", f"{files}/", 1) if a.startswith("D/") else a) for a in argv]
    result = run_without(blocked, *argv)
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith(prefix)]
    assert line.endswith(f"pip install 'kiln[{extra}]'"), line
    if not argv[0].endswith(".py"):   # Beam logs warnings of its own on import
        assert result.stderr.strip() == line, result.stderr


def test_the_converter_api_without_tensorflow():
    """Keras 3 on JAX imports without TensorFlow; converting its model asks for the tf extra."""
    pytest.importorskip("jax")
    code = textwrap.dedent("""
        import os
        os.environ["KERAS_BACKEND"] = "jax"
        import keras, kiln
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        try:
            kiln.TFLiteConverter.from_keras_model(model).convert()
        except kiln.KilnError as exc:
            assert isinstance(exc, ImportError), type(exc).__mro__
            print(exc)
    """)
    result = run_without("tensorflow", "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("needs the 'tf' extra (no module named 'tensorflow'): pip install 'kiln[tf]'")


def test_the_inference_converter_api_without_tensorflow(files):
    code = textwrap.dedent(f"""
        import kiln, kiln.inference
        try:
            kiln.inference.convert({str(files / "sm")!r}, {str(files / "ic_api")!r})
        except ImportError as exc:
            assert isinstance(exc, kiln.KilnError), type(exc).__mro__
            print(exc)
    """)
    result = run_without("tensorflow", "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ("kiln.inference.convert needs the 'tf' extra (no module named 'tensorflow'): "
                             "pip install 'kiln[tf]'\n")


def test_require_and_from_import_error():
    require("tf", "x", modules=("json",))    # present: nothing to say
    with pytest.raises(MissingExtraError, match=r"^--delegate xla needs the 'xla' extra \(no module named "
                                                r"'no_such_module_kiln'\): pip install 'kiln\[xla\]'$"):
        require("xla", "--delegate xla", modules=("no_such_module_kiln",))
    assert "kiln[serve]" in str(from_import_error(ModuleNotFoundError("x", name="google"), ""))
    assert "kiln[xla]" in str(from_import_error(ModuleNotFoundError("x", name="jax.numpy"), ""))
    assert from_import_error(ModuleNotFoundError("x", name="jaxtyping"), "") is None
    assert from_import_error(ModuleNotFoundError("x", name="numpy"), "") is None


def test_every_extra_is_known_with_modules_it_installs():
    """kiln.extras.EXTRAS names each runtime extra of pyproject.toml, and each module it lists
    comes from a distribution that extra installs (read from the installed metadata)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(EXTRAS) == set(project) - {"test"}
    providers = importlib.metadata.packages_distributions()
    for extra, modules in EXTRAS.items():
        wanted = {_name(req) for req in project[extra]}
        for dist in list(wanted):   # and what they install (jax[cpu] brings jaxlib)
            try:
                wanted |= {_name(req) for req in importlib.metadata.requires(dist) or ()}
            except importlib.metadata.PackageNotFoundError:
                pass
        for module in modules:
            top = module.split(".")[0]
            if top not in providers:
                continue   # not installed here: nothing to compare with
            dists = {d.lower().replace("_", "-") for d in providers[top]}
            assert dists & wanted, (extra, module, dists, wanted)


def _name(requirement: str) -> str:
    return re.split(r"[\s\[;=<>!~]", requirement, maxsplit=1)[0].lower().replace("_", "-")
