"""``kiln infer-convert``: the original's command line, exit codes and messages."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
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


@pytest.fixture(scope="module")
def parses_strings(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_strings")
    path = models.save_parses_strings(root / "csv")
    data = root / "csv.npz"
    np.savez(data, text=models.csv_rows(12).astype(bytes))
    return path, data


def test_unmeasured_stage_warns_loudly_and_exits_3(parses_strings, tmp_path, capsys):
    """Generated inputs (empty strings) do not parse: bfloat16 cannot be measured, so the CLI says so
    and exits 3; with real inputs it is measured (0); with --skip_accuracy_check it is skipped (0)."""
    path, data = parses_strings
    base = ["infer-convert", "--input_model_dir", path, "--converter_options_string",
            'tpu_functions { function_alias: "body" } io_shape_optimization: DISABLED']
    assert main(base + ["--output_model_dir", str(tmp_path / "a")]) == 3
    out, err = capsys.readouterr()
    assert "WARNING: applied without a measured error" in out
    assert err.startswith("kiln infer-convert: WARNING: the error of these stages was NOT measured")
    assert "bfloat16 on signature 'serving_default'" in err and "--evaluation_data" in err
    assert (tmp_path / "a" / "saved_model.pb").is_file()  # written: the warning is about trust, not failure
    assert main(base + ["--output_model_dir", str(tmp_path / "b"), "--evaluation_data", str(data)]) == 0
    out, err = capsys.readouterr()
    assert "rows of evaluation data" in out and "WARNING" not in err
    assert main(base + ["--output_model_dir", str(tmp_path / "new" / "parent" / "c"), "--skip_accuracy_check"]) == 0
    out, err = capsys.readouterr()
    assert "Accuracy check: skipped (skip_accuracy_check)" in out and err == ""
    assert (tmp_path / "new" / "parent" / "c" / "saved_model.pb").is_file()


def test_evaluation_data_names_signatures(toy, tmp_path, capsys):
    rc = main(["infer-convert", "--input_model_dir", toy, "--output_model_dir", str(tmp_path / "o"),
               "--evaluation_data", "nope=x.npz", "--evaluation_data", "other=y.npz"])
    assert rc == 1 and "evaluation_data: ['nope', 'other'] are not signatures of the model" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_cli_prints_only_the_report(toy, tmp_path):
    """No TensorFlow log lines, deprecation notices or progress bars: stderr stays empty."""
    out = tmp_path / "quiet"
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run([sys.executable, "-m", "kiln", "infer-convert", "--input_model_dir", toy,
                             "--output_model_dir", str(out), "--converter_options_string",
                             'tpu_functions { function_alias: "tpu_func" }'],
                            cwd=ROOT, env=dict(env, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "" and result.stdout.startswith("-------- Conversion Report --------")
