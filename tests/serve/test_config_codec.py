"""TF Serving's config files and JSON tensor forms, without a server."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kiln.serve import config
from kiln.serve.status import InvalidArgument
from kiln.serve.tensors import COLUMNAR, ROW, TensorSpec, format_response, parse_request

MODEL_CONFIG = """
model_config_list {
  config {
    name: "resnet"
    base_path: "/models/resnet"
    model_platform: "tensorflow"
    model_version_policy { specific { versions: 3 versions: 5 } }
    version_labels { key: "stable" value: 3 }
    version_labels { key: "canary" value: 5 }
  }
  config { name: "tiny" base_path: "/models/tiny" model_version_policy { latest { num_versions: 2 } } }
}
"""

BATCHING = """
max_batch_size { value: 32 }
batch_timeout_micros { value: 5000 }
max_enqueued_batches { value: 100 }
num_batch_threads { value: 4 }
allowed_batch_sizes: 8
allowed_batch_sizes: 16
allowed_batch_sizes: 32
pad_variable_length_inputs: true
"""


def test_texts_parse_like_tf_servings_own_messages(tmp_path):
    """Wire-identical with tensorflow-serving-api's classes (same names and field numbers)."""
    official = pytest.importorskip("tensorflow_serving.config.model_server_config_pb2")
    from google.protobuf import text_format

    ours = config.parse_text(MODEL_CONFIG, "ModelServerConfig", "test")
    theirs = text_format.Parse(MODEL_CONFIG, official.ModelServerConfig())
    assert ours.SerializeToString(deterministic=True) == theirs.SerializeToString(deterministic=True)

    path = tmp_path / "models.config"
    path.write_text(MODEL_CONFIG)
    resnet, tiny = config.read_model_config(path)
    assert (resnet.name, resnet.base_path, resnet.labels) == ("resnet", "/models/resnet", {"stable": 3, "canary": 5})
    assert resnet.policy.choose([1, 3, 4, 5]) == [3, 5]
    assert tiny.policy.choose([1, 2, 7]) == [2, 7]
    assert config.VersionPolicy().choose([4, 10, 9]) == [10]

    path.write_text(BATCHING)
    opts = config.read_batching_parameters(path)
    assert (opts.max_batch_size, opts.batch_timeout_micros, opts.max_enqueued_batches, opts.num_batch_threads,
            opts.allowed_batch_sizes, opts.pad_variable_length_inputs) == (32, 5000, 100, 4, (8, 16, 32), True)
    assert [opts.padded_size(n) for n in (1, 8, 9, 32)] == [8, 8, 16, 32]


@pytest.mark.parametrize("text, message", [
    ("max_batch_size: 4", "line 1"),
    ("max_batch_size { value: 4 } allowed_batch_sizes: 2", "final entry in allowed_batch_sizes"),
    ("no_such_field { value: 1 }", "no_such_field"),
])
def test_bad_batching_files_name_the_file_and_the_problem(tmp_path, text, message):
    path = tmp_path / "b.config"
    path.write_text(text)
    with pytest.raises(config.ConfigError, match=message) as info:
        config.read_batching_parameters(path)
    assert str(path) in str(info.value)


def test_bad_model_configs_are_refused(tmp_path):
    path = tmp_path / "m.config"
    for text, message in [('model_config_list { config { base_path: "/x" } }', "has no name"),
                          ('model_config_list { config { name: "a" } }', "base_path is empty"),
                          ('model_config_list { config { name: "a" base_path: "/a" } '
                           'config { name: "a" base_path: "/b" } }', "appears twice"),
                          ('model_config_list { config { name: "a" base_path: "/a" model_platform: "onnx" } }',
                           "model_platform"),
                          ("", "holds no models")]:
        path.write_text(text)
        with pytest.raises(config.ConfigError, match=message):
            config.read_model_config(path)
    with pytest.raises(config.ConfigError, match="cannot read"):
        config.read_model_config(tmp_path / "missing.config")


F32 = np.dtype(np.float32)


def test_float_text_is_tf_servings():
    values = np.array([0.1, 2, 3e-5, 9e6, 1 / 3, np.nan, np.inf, -np.inf, -0.0], np.float32)
    assert format_response({"y": values}, COLUMNAR).decode() == (
        '{"outputs": [0.1, 2.0, 3e-05, 9e+06, 0.333333343, NaN, Infinity, -Infinity, -0.0]}')


def test_large_answers_are_written_in_pieces_that_join_up():
    rng = np.random.default_rng(0)
    outs = {"a": rng.standard_normal((9000, 3)).astype(np.float32), "b": np.arange(9000, dtype=np.int64)}
    rows = json.loads(format_response(outs, ROW))["predictions"]
    assert len(rows) == 9000 and rows[8999]["b"] == 8999
    np.testing.assert_array_equal(np.array([r["a"] for r in rows], np.float32), outs["a"])
    columns = json.loads(format_response(outs, COLUMNAR))["outputs"]
    np.testing.assert_array_equal(np.array(columns["a"], np.float32), outs["a"])
    assert columns["b"] == list(range(9000))


def test_row_and_columnar_response_shapes():
    outs = {"b": np.array([[1, 2], [3, 4]], np.int32), "a": np.array([True, False])}
    assert format_response(outs, ROW).decode() == '{"predictions": [{"a": true, "b": [1, 2]}, {"a": false, "b": [3, 4]}]}'
    assert format_response(outs, COLUMNAR).decode() == '{"outputs": {"a": [true, false], "b": [[1, 2], [3, 4]]}}'
    assert format_response({"s": np.array(7.5, np.float64)}, COLUMNAR).decode() == '{"outputs": 7.5}'
    with pytest.raises(InvalidArgument, match="inconsistent batch size: 1 expecting: 2"):
        format_response({"a": np.zeros(2), "b": np.zeros(1)}, ROW)


def test_request_type_rules():
    specs = {"i": TensorSpec("i", np.dtype(np.int8), (-1,)), "f": TensorSpec("f", F32, (-1,))}
    got, fmt = parse_request({"instances": [{"i": 1, "f": 1}, {"i": -2, "f": 0.5}]}, specs)
    assert fmt == ROW and got["i"].dtype == np.int8 and got["f"].tolist() == [1.0, 0.5]
    for body, message in [({"instances": [{"i": 1.5, "f": 1}]}, "Type: Number is not of expected type: DT_INT8"),
                          ({"instances": [{"i": 300, "f": 1}]}, "out of the range of DT_INT8"),
                          ({"instances": [[1]]}, "instances is a plain list"),
                          ({"instances": [{"i": 1, "f": 1}, [1]]}, "Expecting object but got list at item 1"),
                          ({"instances": [{"i": 1}]}, "keys must be equal to: f,i"),
                          ({"inputs": [1, 2]}, "inputs is a plain value/list")]:
        with pytest.raises(InvalidArgument, match=message.replace("(", r"\(").replace("[", r"\[")):
            parse_request(body, specs)
    with pytest.raises(InvalidArgument, match="Cannot convert JSON value: 16777217 to float32 without loss"):
        parse_request({"inputs": {"i": [1], "f": [16777217]}}, specs)
    assert parse_request({"inputs": {"i": [1], "f": [16777215, 2.5]}}, specs)[0]["f"][0] == 16777215
    with pytest.raises(InvalidArgument, match="JSON Value: null Type: Null is not of expected type: DT_FLOAT"):
        parse_request({"inputs": {"i": [1], "f": [1.0, None]}}, specs)
    strings = {"s": TensorSpec("s", np.dtype(object), (-1,))}
    for body, message in [({"inputs": [{"b64": "!!"}]}, "Unable to base64 decode"),
                          ({"inputs": [{"b64": "AA==", "x": 1}]}, "not formatted correctly for base64"),
                          ({"inputs": [1]}, "is not of expected type: DT_STRING"),
                          ({"inputs": [["a"], "b"]}, "ragged")]:
        with pytest.raises(InvalidArgument, match=message):
            parse_request(body, strings)


def test_a_savedmodel_with_batch_function_is_not_batched_twice(models):
    from kiln.serve.batching import DirectExecutor
    from kiln.serve.models import ModelManager

    manager = ModelManager([config.ModelSpec("b", str(models["batched_sm"]))], batching=config.BatchingOptions())
    manager.poll_once()
    served = manager.acquire("b")
    try:
        assert served.loaded.has_batch_function
        assert isinstance(served.executor, DirectExecutor) and not served.batching
        job = served.executor.submit("serving_default", {"x": np.ones((1, 4), np.float32)}, 1e18)
        assert job.future.result(30)["y"].tolist() == [[3.0] * 4]
    finally:
        manager.release(served)
        manager.close()


def test_the_command_line_refuses_bad_setups_with_a_message(tmp_path, capsys):
    from kiln.cli import main

    bad = tmp_path / "b.config"
    bad.write_text("max_batch_size { value: 0 }")
    (tmp_path / "m" / "1").mkdir(parents=True)
    for argv, message in [(["serve"], "needs --model_base_path"),
                          (["serve", "--model_base_path", str(tmp_path / "none")], "is not a directory"),
                          (["serve", "--model_base_path", str(tmp_path / "m"), "--batching_parameters_file", str(bad)],
                           "max_batch_size must be >= 1"),
                          (["serve", "--model_base_path", "x", "--model_config_file", "y"], "not both")]:
        assert main(argv) == 1
        assert message in capsys.readouterr().err


def test_per_model_batching_parameters_come_from_the_version_directory(models, tmp_path):
    import shutil

    from kiln.serve.batching import BatchScheduler
    from kiln.serve.models import ModelManager

    for name, own in (("own", "max_batch_size { value: 4 } allowed_batch_sizes: 2 allowed_batch_sizes: 4"),
                      ("none", None)):
        (tmp_path / name / "1").mkdir(parents=True)
        shutil.copy(models["one_v1"], tmp_path / name / "1" / "model.tflite")
        if own:
            (tmp_path / name / "1" / "batching_params.pbtxt").write_text(own)
    manager = ModelManager([config.ModelSpec(n, str(tmp_path / n)) for n in ("own", "none")],
                           batching=config.BatchingOptions(num_batch_threads=1), per_model_batching=True)
    manager.poll_once()
    own, none = manager.acquire("own"), manager.acquire("none")
    try:
        assert isinstance(own.executor, BatchScheduler) and not none.batching
        assert (own.executor.options.max_batch_size, own.executor.options.allowed_batch_sizes,
                own.executor.options.num_batch_threads) == (4, (2, 4), 1)
    finally:
        manager.release(own)
        manager.release(none)
        manager.close()


def test_a_version_that_fails_to_load_is_reported_and_retried_when_it_changes(models, tmp_path):
    import os
    import shutil

    from kiln.serve.models import ModelManager

    (tmp_path / "m" / "1").mkdir(parents=True)
    broken = tmp_path / "m" / "1" / "model.tflite"
    broken.write_bytes(b"junk")
    manager = ModelManager([config.ModelSpec("m", str(tmp_path / "m"))])
    manager.poll_once()
    (status,) = manager.status("m")["model_version_status"]
    assert (status["state"], status["status"]["error_code"]) == ("END", "UNKNOWN")
    assert "not a valid Flatbuffer" in status["status"]["error_message"]
    assert "not a valid Flatbuffer" in manager.not_served()["m"]
    shutil.copy(models["one_v1"], broken)
    os.utime(broken, ns=(1, 10**18))  # a different mtime even on a coarse clock
    manager.poll_once()
    assert manager.status("m")["model_version_status"][0]["state"] == "AVAILABLE"
    assert manager.not_served() == {}
    manager.close()


def test_monitoring_config_sets_or_turns_off_the_metrics_route(tmp_path):
    path = tmp_path / "monitoring.config"
    for text, route in [('prometheus_config { enable: true path: "/metrics" }', "/metrics"),
                        ("prometheus_config { enable: true }", config.PROMETHEUS_PATH),
                        ("prometheus_config { enable: false }", None), ("", None)]:
        path.write_text(text)
        assert config.read_monitoring_config(path) == route
    path.write_text('prometheus_config { enable: true path: "/v1/metrics" }')
    with pytest.raises(config.ConfigError, match="must start with '/' and not be under /v1/"):
        config.read_monitoring_config(path)
