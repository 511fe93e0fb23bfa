"""Batching, overload, drain on SIGTERM, version swaps and bad input, against a real server."""

from __future__ import annotations

import json
import shutil
import threading
import time

import numpy as np

from .conftest import batching_file, concurrently, one_model_dir, rows


def test_concurrent_rows_are_batched_and_each_gets_its_own_answer(serve, models, reference, tmp_path):
    server = serve("--model_base_path", str(one_model_dir(tmp_path, models["one_v1"])), "--model_name", "one",
                   "--batching_parameters_file", batching_file(tmp_path, max_batch_size=8, batch_timeout_micros=100000,
                                                               num_batch_threads=1, allowed_batch_sizes=[2, 4, 8]))
    x = rows(24, seed=7)
    want = reference(models["one_sm1"], x=x)["y"]
    answers = concurrently(lambda i: server.predict("one", {"instances": [x[i].tolist()]}), range(24), 24)
    assert [a.status_code for a in answers] == [200] * 24
    got = np.array([a.json()["predictions"][0] for a in answers])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    calls = server.metric("kiln_serve_backend_calls_total", model="one", version="1")
    executed = server.metric("kiln_serve_batch_size_sum", model="one", version="1")
    padding = server.metric("kiln_serve_padding_rows_total", model="one", version="1")
    assert calls < 24, "24 single-row requests should share backend calls"
    assert executed - padding == 24  # every row ran exactly once
    assert server.metric("kiln_serve_requests_total", model="one", method="predict", code="200") == 24


def test_overload_is_refused_with_503_and_accepted_requests_are_answered_once(serve, models, reference, tmp_path):
    server = serve("--model_base_path", str(one_model_dir(tmp_path, models["slow"])), "--model_name", "one",
                   "--batching_parameters_file", batching_file(tmp_path, max_batch_size=2, max_enqueued_batches=2,
                                                               batch_timeout_micros=300000, num_batch_threads=1))
    n = 40  # ten times what the queue holds (2 batches of 2 rows), sent while the worker is busy
    x = rows(n, seed=11)
    want = reference(models["slow_sm"], x=x)["y"]
    answers = concurrently(lambda i: server.predict("one", {"instances": [x[i].tolist()]}), range(n), n)
    codes = [a.status_code for a in answers]
    assert set(codes) <= {200, 503}
    assert 0 < codes.count(503) and 0 < codes.count(200)
    for i, a in enumerate(answers):
        if a.status_code == 200:
            np.testing.assert_allclose(a.json()["predictions"][0], want[i], rtol=1e-5, atol=1e-6)
        else:
            assert "queue to which this task was submitted is full" in a.json()["error"]
    accepted = codes.count(200)
    executed = server.metric("kiln_serve_batch_size_sum", model="one", version="1")
    assert executed == accepted  # no padding here: every accepted row ran once, no refused row ran
    assert server.metric("kiln_serve_requests_total", model="one", code="503") == codes.count(503)
    assert server.metric("kiln_serve_rejected_total", model="one") == codes.count(503)


def test_sigterm_finishes_queued_requests_then_exits_0(serve, models, reference, tmp_path):
    server = serve("--model_base_path", str(one_model_dir(tmp_path, models["one_v1"])), "--model_name", "one",
                   "--batching_parameters_file", batching_file(tmp_path, max_batch_size=8, num_batch_threads=1,
                                                               batch_timeout_micros=1500000))
    x = rows(3, seed=5)
    answers = [None] * 3

    def ask(i):
        answers[i] = server.predict("one", {"instances": [x[i].tolist()]})

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for _ in range(200):  # wait until all three wait in the queue (the batch timeout is 1.5 s)
        if server.metric("kiln_serve_queue_depth", model="one") == 3:
            break
        time.sleep(0.01)
    assert server.metric("kiln_serve_queue_depth", model="one") == 3
    code, log = server.stop()
    for t in threads:
        t.join()
    assert code == 0, log
    assert [a.status_code for a in answers] == [200] * 3
    np.testing.assert_allclose(np.array([a.json()["predictions"][0] for a in answers]),
                               reference(models["one_sm1"], x=x)["y"], rtol=1e-5, atol=1e-6)
    assert "draining" in log and "stopped" in log


def test_a_new_version_on_disk_is_swapped_in_without_dropping_requests(serve, models, reference, tmp_path):
    base = one_model_dir(tmp_path, models["one_v1"])
    server = serve("--model_base_path", str(base), "--model_name", "one", "--file_system_poll_wait_seconds", "0.2",
                   "--enable_batching")
    x = rows(1, seed=2)
    v1, v2 = (reference(models[k], x=x)["y"] for k in ("one_sm1", "one_sm2"))
    codes, stop = [], threading.Event()

    def traffic():
        while not stop.is_set():
            codes.append(server.predict("one", {"instances": x.tolist()}).status_code)

    worker = threading.Thread(target=traffic)
    worker.start()
    try:
        staging = tmp_path / "incoming"
        staging.mkdir()
        shutil.copy(models["one_v2"], staging / "model.tflite")
        staging.rename(base / "2")  # appears complete, as TF Serving asks of writers
        for _ in range(300):
            states = {s["version"]: s["state"] for s in server.get("/v1/models/one").json()["model_version_status"]}
            if states.get("1") == "END" and states.get("2") == "AVAILABLE":
                break
            time.sleep(0.05)
        assert states == {"1": "END", "2": "AVAILABLE"}
    finally:
        stop.set()
        worker.join()
    assert codes and set(codes) == {200}
    np.testing.assert_allclose(server.predict("one", {"instances": x.tolist()}).json()["predictions"], v2,
                               rtol=1e-5, atol=1e-6)
    assert not np.allclose(v1, v2)
    assert server.predict("one", {"instances": x.tolist()}, "/versions/1").status_code == 404


BAD = [
    ("malformed JSON", b'{"instances": [[1, 2, 3, 4]', 400, "JSON Parse error"),
    ("empty body", b"", 400, "The document is empty"),
    ("not an object", b"[1, 2]", 400, "Is not object"),
    ("no inputs", b'{"signature_name": "serving_default"}', 400, "Missing 'inputs' or 'instances' key"),
    ("both keys", b'{"inputs": [[1, 2, 3, 4]], "instances": [[1, 2, 3, 4]]}', 400, "only one of 'inputs' or"),
    ("wrong dtype", b'{"instances": [[1, 2, "3", 4]]}', 400, "input 'x': JSON Value: \"3\" Type: String is not"),
    ("bool for float", b'{"instances": [[1, 2, true, 4]]}', 400, "input 'x'"),
    ("wrong shape", b'{"instances": [[1, 2, 3]]}', 400, "input 'x': expected shape [-1,4]"),
    ("wrong rank", b'{"inputs": [1, 2, 3, 4]}', 400, "input 'x': expected shape [-1,4]"),
    ("ragged instances", b'{"instances": [[1, 2, 3, 4], [1, 2, 3]]}', 400, "input 'x': Failed to process element: 1"),
    ("ragged inner", b'{"inputs": [[1, 2, 3, 4], [1, [2], 3, 4]]}', 400, "input 'x': the list is ragged"),
    ("unknown input", b'{"inputs": {"x": [[1, 2, 3, 4]], "z": [[1]]}}', 400, "unknown input(s) ['z']"),
    ("missing input", b'{"inputs": {"z": [[1]]}}', 400, "Missing named input: x"),
    ("empty instances", b'{"instances": []}', 400, "No values in 'instances' array"),
    ("signature not a string", b'{"signature_name": 3, "instances": [[1, 2, 3, 4]]}', 400, "'signature_name' key"),
    ("unknown signature", b'{"signature_name": "nope", "instances": [[1, 2, 3, 4]]}', 404, '"nope" not found'),
    ("float too big", b'{"instances": [[1e300, 2, 3, 4]]}', 400, "without loss of precision"),
    ("NaN is fine", b'{"instances": [[NaN, 2, 3, Infinity]]}', 200, ""),
]


def test_every_bad_input_gets_its_own_error(serve, models, tmp_path):
    monitoring = tmp_path / "monitoring.config"
    monitoring.write_text('prometheus_config { enable: true path: "/metrics" }')
    server = serve("--model_base_path", str(one_model_dir(tmp_path, models["one_v1"])), "--model_name", "one",
                   "--max_request_bytes", "4096", "--enable_batching", "--monitoring_config_file", str(monitoring),
                   "--access_log")
    for what, body, status, text in BAD:
        r = server.post("/v1/models/one:predict", data=body)
        assert r.status_code == status, (what, r.text)
        assert text in r.json().get("error", ""), (what, r.text)
        assert "Traceback" not in r.text
    too_big = b'{"instances": [' + b",".join([b"[1, 2, 3, 4]"] * 400) + b"]}"
    r = server.post("/v1/models/one:predict", data=too_big)
    assert r.status_code == 413 and "larger than the limit of 4096 bytes" in r.json()["error"]
    for path, status, text in [("/v1/models/nope:predict", 404, "Servable not found for request: Latest(nope)"),
                               ("/v1/models/one/versions/9:predict", 404, "Specific(one, 9)"),
                               ("/v1/models/one/labels/stable:predict", 400, "Unrecognized servable version label"),
                               ("/v1/models/one:classify", 501, ":classify is not served")]:
        r = server.post(path, data=b'{"instances": [[1, 2, 3, 4]]}')
        assert (r.status_code, r.json()["error"].startswith(text) or text in r.json()["error"]) == (status, True), r.text
    # TF Serving reads the JSON before it looks the model up
    r = server.post("/v1/models/nope:predict", data=b'{"instances": [')
    assert r.status_code == 400 and "JSON Parse error" in r.json()["error"], r.text
    for path, status, text in [("/v1/models", 400, "Missing model name in request."),
                               ("/v1/models/nope", 404, "Could not find any versions of model nope"),
                               ("/v1/models/one/versions/7", 404, "Could not find version 7 of model one"),
                               ("/v1/models/nope/metadata", 404, "Latest(nope)"),
                               ("/v2/anything", 404, "Malformed request")]:
        r = server.get(path)
        assert r.status_code == status and text in r.json()["error"], (path, r.text)
    assert server.get("/healthz").status_code == 200
    assert 'kiln_serve_requests_total{code="400",method="predict",model="one",version="1"}' in server.get("/metrics").text
    assert server.get("/monitoring/prometheus/metrics").status_code == 404  # moved by --monitoring_config_file
    code, log = server.stop()
    assert code == 0 and "Traceback" not in log
    access = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert {"time", "client", "method", "path", "status", "ms", "model", "version", "bytes_out"} <= set(access[0])
    assert [a["status"] for a in access if a["path"] == "/v1/models/nope:predict"] == [404, 400]


def test_a_request_past_its_deadline_gets_504_and_is_not_run(serve, models, tmp_path):
    server = serve("--model_base_path", str(one_model_dir(tmp_path, models["one_v1"])), "--model_name", "one",
                   "--rest_api_timeout_in_ms", "200",
                   "--batching_parameters_file", batching_file(tmp_path, max_batch_size=8, batch_timeout_micros=1000000,
                                                               num_batch_threads=1))
    r = server.predict("one", {"instances": rows(1).tolist()})
    assert r.status_code == 504 and "cancelled before it ran" in r.json()["error"]
    time.sleep(1.2)  # the batch's timeout passes: the cancelled request must not reach the backend
    assert server.metric("kiln_serve_backend_calls_total", model="one") == 0
    assert server.predict("one", {"inputs": rows(1).tolist()}).status_code == 504


def test_a_client_that_hangs_up_is_dropped_from_its_batch(serve, models, tmp_path):
    import socket

    server = serve("--model_base_path", str(one_model_dir(tmp_path, models["one_v1"])), "--model_name", "one",
                   "--batching_parameters_file", batching_file(tmp_path, max_batch_size=8, batch_timeout_micros=1000000,
                                                               num_batch_threads=1))
    body = json.dumps({"instances": rows(1).tolist()}).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(b"POST /v1/models/one:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        for _ in range(100):  # queued
            if server.metric("kiln_serve_queue_depth", model="one") == 1:
                break
            time.sleep(0.01)
    time.sleep(1.3)  # past the batch timeout: the hung-up request must not have run
    assert server.metric("kiln_serve_backend_calls_total", model="one") == 0
    assert server.predict("one", {"instances": rows(1).tolist()}).status_code == 200
    assert server.metric("kiln_serve_backend_calls_total", model="one") == 1
