"""``kiln infer-convert``: the original's command line, exit codes and messages."""

import subprocess
import sys
from pathlib import Path

import pytest

tf = pytest.importorskip("tensorflow")

from kiln.cli import main  # noqa: E402

from . import models  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return models.save_toy(tmp_path_factory.mktemp("cli") / "toy")


def test_options_string_prints_the_report(toy, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["infer-convert", "--input_model_dir", toy, "--output_model_dir", str(out),
               "--converter_options_string", 'tpu_functions { function_alias: "tpu_func" }'])
    printed = capsys.readouterr().out
    assert rc == 0 and "-------- Conversion Report --------" in printed and "[CPU cost]" in printed
    assert (out / "saved_model.pb").is_file()


def test_options_file(toy, tmp_path, capsys):
    opts = tmp_path / "options.pbtxt"
    opts.write_text('accelerator_functions {\n  function_alias: "tpu_func"\n}\n'
                    "batch_options { max_batch_size: 8 allowed_batch_sizes: 2 allowed_batch_sizes: 4 "
                    "allowed_batch_sizes: 8 batch_timeout_micros: 100 }\n")
    out = tmp_path / "out"
    assert main(["infer-convert", "--input_model_dir", toy, "--output_model_dir", str(out),
                 "--converter_options_file", str(opts)]) == 0
    assert "XLA cost of the model" in capsys.readouterr().out


@pytest.mark.parametrize("extra, message", [
    (["--converter_options_string", "tpu_functions {\n  nope: 1 }"], "line 2, column 3"),
    (["--converter_options_file", "/no/such/file"], "--converter_options_file: cannot read"),
    (["--converter_options_string", 'tpu_functions { function_alias: "x" }'], "function_alias 'x' does not exist"),
])
def test_errors_exit_non_zero_with_a_message(toy, tmp_path, capsys, extra, message):
    out = tmp_path / "out"
    rc = main(["infer-convert", "--input_model_dir", toy, "--output_model_dir", str(out)] + extra)
    err = capsys.readouterr().err
    assert rc == 1 and err.startswith("kiln infer-convert: error: ") and message in err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_kiln_cli_stays_tensorflow_free():
    code = "import sys, kiln.cli; kiln.cli.build_parser(); assert 'tensorflow' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT)})
