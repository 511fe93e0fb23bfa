"""TF Serving's gRPC API, called with ``tensorflow-serving-api``'s own stubs: answers equal REST's."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from .conftest import Server, batching_file, free_port, rows

grpc = pytest.importorskip("grpc")
apis = pytest.importorskip("tensorflow_serving.apis.predict_pb2")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

import tensorflow as tf  # noqa: E402
from google.protobuf import json_format  # noqa: E402
from tensorflow_serving.apis import (  # noqa: E402
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)


def test_the_messages_are_wire_identical_with_tf_servings():
    from kiln.serve import grpc_api

    ours = grpc_api.messages()
    left_out = {"resource_handle_val", "variant_val", "float8_val", "predict_streamed_options", "client_id",
                "request_options", "coo_sparse", "composite_tensor"}  # not served; skipped as unknown fields
    seen = set()

    def compare(theirs, mine):
        if theirs.full_name in seen:
            return
        seen.add(theirs.full_name)
        assert theirs.full_name == mine.full_name
        fields = {f.name: f for f in mine.fields}
        for f in theirs.fields:
            if f.name in left_out:
                continue
            g = fields[f.name]
            assert (f.number, f.is_repeated) == (g.number, g.is_repeated), (theirs.full_name, f.name)
            # enums travel as varints: int32 on our side
            assert f.type == g.type or (f.type == f.TYPE_ENUM and g.type == g.TYPE_INT32), (theirs.full_name, f.name)
            if f.message_type is not None:
                compare(f.message_type, g.message_type)

    for cls in (predict_pb2.PredictRequest, predict_pb2.PredictResponse, get_model_metadata_pb2.GetModelMetadataRequest,
                get_model_metadata_pb2.GetModelMetadataResponse, get_model_metadata_pb2.SignatureDefMap,
                get_model_status_pb2.GetModelStatusRequest, get_model_status_pb2.GetModelStatusResponse):
        compare(cls.DESCRIPTOR, ours[cls.DESCRIPTOR.name].DESCRIPTOR)


@pytest.fixture(scope="module")
def both(models, tmp_path_factory):
    """One server answering REST and gRPC for a .tflite, a SavedModel and a strings model, batched."""
    folder = tmp_path_factory.mktemp("grpc")
    config = folder / "models.config"
    config.write_text("model_config_list {\n" + "".join(
        f'  config {{ name: "{name}" base_path: "{models[key]}" }}\n'
        for name, key in (("two_tfl", "two_tfl"), ("two_sm", "two_sm"), ("strings", "strings"))) + "}\n")
    port = free_port()
    server = Server("--model_config_file", str(config), "--port", str(port),
                    "--batching_parameters_file", batching_file(folder, max_batch_size=16, batch_timeout_micros=20000,
                                                                num_batch_threads=1))
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield server, channel
    channel.close()
    server.stop()


def _predict(channel, model, **inputs):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    for name, value in inputs.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
    return prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)


@pytest.mark.parametrize("model", ["two_tfl", "two_sm"])
def test_predict_equals_rest(both, model):
    server, channel = both
    a, b = rows(3), rows(3, 2, seed=1)
    response = _predict(channel, model, a=a, b=b)
    got = {k: tf.make_ndarray(v) for k, v in response.outputs.items()}
    rest = server.predict(model, {"inputs": {"a": a.tolist(), "b": b.tolist()}}).json()["outputs"]
    assert sorted(got) == sorted(rest) == ["doubled", "scores"]
    for name in got:
        np.testing.assert_array_equal(got[name], np.array(rest[name], np.float32))
    assert response.model_spec.name == model and response.model_spec.version.value == 1
    assert response.model_spec.signature_name == "serving_default"


def test_strings_travel_as_bytes(both):
    server, channel = both
    text = np.array([b"caf\xc3\xa9", b"\x00\xff"], dtype=object)
    response = _predict(channel, "strings", text=text)
    assert list(tf.make_ndarray(response.outputs["echo_bytes"])) == list(text)
    assert list(tf.make_ndarray(response.outputs["length"])) == [5, 2]


@pytest.mark.parametrize("model", ["two_tfl", "two_sm"])
def test_metadata_and_status_equal_rest(both, model):
    server, channel = both
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = model
    response = prediction_service_pb2_grpc.PredictionServiceStub(channel).GetModelMetadata(request, timeout=30)
    defs = get_model_metadata_pb2.SignatureDefMap()
    assert response.metadata["signature_def"].Unpack(defs)
    rest = server.get(f"/v1/models/{model}/metadata").json()["metadata"]["signature_def"]
    assert json_format.MessageToDict(defs, preserving_proto_field_name=True) == json_format.MessageToDict(
        json_format.ParseDict(rest, get_model_metadata_pb2.SignatureDefMap()), preserving_proto_field_name=True)
    status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
        get_model_status_pb2.GetModelStatusRequest(model_spec={"name": model}), timeout=30)
    rest = server.get(f"/v1/models/{model}").json()["model_version_status"]
    assert [(s.version, get_model_status_pb2.ModelVersionStatus.State.Name(s.state)) for s in
            status.model_version_status] == [(int(s["version"]), s["state"]) for s in rest]


def test_errors_carry_tf_servings_codes(both):
    server, channel = both
    cases = [
        (lambda: _predict(channel, "nope", a=rows(1), b=rows(1, 2)), grpc.StatusCode.NOT_FOUND, "Latest(nope)"),
        (lambda: _predict(channel, "two_tfl", a=rows(1).astype(np.float64), b=rows(1, 2)),
         grpc.StatusCode.INVALID_ARGUMENT, "to be float but double is provided"),
        (lambda: _predict(channel, "two_tfl", a=rows(1)), grpc.StatusCode.INVALID_ARGUMENT, "Missing inputs: b"),
        (lambda: _predict(channel, "two_tfl", a=rows(1, 3), b=rows(1, 2)), grpc.StatusCode.INVALID_ARGUMENT,
         "expected shape [-1,4]"),
        (lambda: _predict(channel, "two_tfl", a=rows(2), b=rows(3, 2)), grpc.StatusCode.INVALID_ARGUMENT,
         "equal 0th-dimension size"),
    ]
    for call, code, text in cases:
        with pytest.raises(grpc.RpcError) as info:
            call()
        assert info.value.code() == code and text in info.value.details(), info.value.details()
    raw = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")  # bytes that are no PredictRequest
    with pytest.raises(grpc.RpcError) as info:
        raw(b"\xff\xff\xff", timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    huge = predict_pb2.PredictRequest()
    huge.model_spec.name = "two_tfl"
    huge.inputs["a"].dtype = 1
    huge.inputs["a"].tensor_shape.dim.add(size=1 << 40)
    huge.inputs["a"].float_val.append(1.0)  # one value fills the tensor: 4 TB if nothing checked
    with pytest.raises(grpc.RpcError) as info:
        prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(huge, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "larger than the limit" in info.value.details()
    assert server.get("/healthz").status_code == 200


def test_grpc_and_rest_share_the_batcher_and_the_metrics(both):
    server, channel = both
    calls0 = server.metric("kiln_serve_backend_calls_total", model="two_tfl")
    count0 = server.metric("kiln_serve_requests_total", model="two_tfl", code="200")
    a, b = rows(16), rows(16, 2, seed=3)
    results = [None] * 16

    def ask(i):
        if i % 2:
            results[i] = tf.make_ndarray(_predict(channel, "two_tfl", a=a[i:i + 1], b=b[i:i + 1]).outputs["scores"])
        else:
            body = {"instances": [{"a": a[i].tolist(), "b": b[i].tolist()}]}
            results[i] = np.array([server.predict("two_tfl", body).json()["predictions"][0]["scores"]], np.float32)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    want = tf.make_ndarray(_predict(channel, "two_tfl", a=a, b=b).outputs["scores"])
    np.testing.assert_array_equal(np.concatenate(results), want)
    assert server.metric("kiln_serve_backend_calls_total", model="two_tfl") - calls0 < 16
    assert server.metric("kiln_serve_requests_total", model="two_tfl", code="200") - count0 == 17


def test_an_answer_slower_than_a_tenth_of_a_second_is_waited_for(models, tmp_path):
    """A gRPC call waits for its answer up to its deadline, however long the batch takes to fill
    (a slow answer was once taken for a passed deadline)."""
    port = free_port()
    server = Server("--model_base_path", str(models["two_sm"]), "--model_name", "two", "--port", str(port),
                    "--batching_parameters_file", batching_file(tmp_path, max_batch_size=8, batch_timeout_micros=400000,
                                                                num_batch_threads=1))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            a, b = rows(2), rows(2, 2, seed=1)
            response = _predict(channel, "two", a=a, b=b)  # waits ~0.4 s for a batch that stays partial
            rest = server.predict("two", {"inputs": {"a": a.tolist(), "b": b.tolist()}}).json()["outputs"]
            np.testing.assert_array_equal(tf.make_ndarray(response.outputs["scores"]), np.float32(rest["scores"]))
            request = predict_pb2.PredictRequest()
            request.model_spec.name = "two"
            request.inputs["a"].CopyFrom(tf.make_tensor_proto(a))
            request.inputs["b"].CopyFrom(tf.make_tensor_proto(b))
            with pytest.raises(grpc.RpcError) as info:  # the client's own deadline, sooner than the batch
                prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=0.2)
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        server.stop()


def test_unbatched_predict_equals_rest(models, tmp_path):
    """Without batching a request runs on the calling thread (or the pool for large ones): gRPC
    answers it as REST does, errors included."""
    config = tmp_path / "models.config"
    config.write_text("model_config_list {\n" + "".join(
        f'  config {{ name: "{name}" base_path: "{models[name]}" }}\n' for name in ("two_tfl", "embed_tfl")) + "}\n")
    port = free_port()
    server = Server("--model_config_file", str(config), "--port", str(port))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            a, b = rows(3), rows(3, 2, seed=1)
            got = _predict(channel, "two_tfl", a=a, b=b)
            rest = server.predict("two_tfl", {"inputs": {"a": a.tolist(), "b": b.tolist()}}).json()["outputs"]
            for name in ("scores", "doubled"):
                np.testing.assert_array_equal(tf.make_ndarray(got.outputs[name]), np.float32(rest[name]))
            ids = np.int32([[1, 2], [49, 0]])
            got = tf.make_ndarray(_predict(channel, "embed_tfl", ids=ids).outputs["vec"])
            rest = server.predict("embed_tfl", {"inputs": {"ids": ids.tolist()}}).json()["outputs"]
            np.testing.assert_array_equal(got, np.float32(rest))
            with pytest.raises(grpc.RpcError) as info:
                _predict(channel, "embed_tfl", ids=np.int32([[1, 77]]))
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "'ids'" in info.value.details()
    finally:
        server.stop()
