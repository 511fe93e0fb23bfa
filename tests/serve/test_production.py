"""What no client may do to a running server, tried from outside with plain clients and raw sockets:
grow the metrics, fail other clients' requests, blow up its memory, get a 500, outlive the drain
timeout, stretch latency past the deadline, or hold a connection forever (issue #24)."""

from __future__ import annotations

import json
import socket
import threading
import time

import numpy as np
import pytest
import requests

from .conftest import batching_file, concurrently, one_model_dir, rows, sigterm_while

TABLE = np.arange(150, dtype=np.float32).reshape(50, 3) / 10.0


def status_of(pid: int) -> dict:
    with open(f"/proc/{pid}/status") as f:
        return {k: v.strip() for k, v in (line.split(":", 1) for line in f)}


def raw(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    """Send ``data`` on a new connection and read until the server closes it (or ``timeout``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except socket.timeout:
            pass
        return out


def test_requests_to_made_up_names_do_not_grow_the_metrics(serve, models, tmp_path):
    server = serve("--model_base_path", str(one_model_dir(tmp_path, models["one_v1"])), "--model_name", "one")
    body = json.dumps({"instances": rows(1).tolist()})
    server.predict("one", {"instances": rows(1).tolist()})
    before = len(server.get("/monitoring/prometheus/metrics").content)
    with requests.Session() as s:
        for i in range(2000):
            url = f"{server.url}/v1/models/made-up-{i}"
            r = [lambda: s.post(url + ":predict", data=body), lambda: s.post(f"{url}/versions/{i}:regress", data=body),
                 lambda: s.get(url + "/metadata"), lambda: s.get(f"{server.url}/v1/models/one/versions/{i + 5}"),
                 lambda: s.post(f"{server.url}/v1/models/one/labels/l{i}:predict", data=body)][i % 5]()
            assert r.status_code in (400, 404, 501), r.text
    page = server.get("/monitoring/prometheus/metrics").text
    print(f"metrics page: {before} bytes before, grew {len(page.encode()) - before} bytes after 2,000 made-up names")
    assert len(page.encode()) - before < 20_000
    assert 'model="(other)"' in page and "made-up" not in page and "l1999" not in page


@pytest.mark.parametrize("model, message", [
    ("embed_tfl", "input 'ids': index 77 is outside [0, 50)"),  # the model's table size, checked before batching
    ("embed_sm", "indices[0,1] = 77 is not in [0, 50)"),  # TensorFlow's kernel, on this request alone
])
def test_one_bad_request_among_32_concurrent_fails_alone(serve, models, tmp_path, model, message):
    server = serve("--model_base_path", str(models[model]), "--model_name", "e",
                   "--batching_parameters_file", batching_file(tmp_path, max_batch_size=32, batch_timeout_micros=300000,
                                                               num_batch_threads=1, max_enqueued_batches=100))
    ids = np.random.default_rng(4).integers(0, 50, (32, 2)).astype(np.int32)
    ids[13] = [7, 77]
    answers = concurrently(lambda i: server.predict("e", {"instances": [ids[i].tolist()]}), range(32), 32)
    codes = [a.status_code for a in answers]
    print(f"{model}: {codes.count(200)} x 200, {codes.count(400)} x 400 among 32 concurrent clients")
    assert codes == [400 if i == 13 else 200 for i in range(32)], [a.text for a in answers if a.status_code != 200]
    error = answers[13].json()["error"]
    assert message in error and "'ids'" in error
    for i in range(32):
        if i != 13:
            np.testing.assert_allclose(answers[i].json()["predictions"][0], TABLE[ids[i]].sum(0), rtol=1e-6)
    assert server.metric("kiln_serve_backend_calls_total", model="e") < 32 + (31 if model == "embed_sm" else 0)


@pytest.mark.slow  # (the fast lane measures 8 MiB bodies of other layouts: tests/serve/test_memory.py)
def test_a_60_mib_body_grows_memory_less_than_3_times_its_size(serve, models, tmp_path):
    server = serve("--model_base_path", str(one_model_dir(tmp_path, models["one_v1"])), "--model_name", "one",
                   "--access_log", "false")
    x = np.random.default_rng(0).standard_normal((750_000, 4)).astype(np.float32)
    body = json.dumps({"instances": x.tolist()}).encode()
    assert 55 << 20 < len(body) < 64 << 20
    server.predict("one", {"instances": rows(2).tolist()})
    before = int(status_of(server.proc.pid)["VmRSS"].split()[0]) << 10
    r = server.post("/v1/models/one:predict", data=body)
    assert r.status_code == 200, r.text[:300]
    assert len(r.json()["predictions"]) == 750_000
    peak = int(status_of(server.proc.pid)["VmHWM"].split()[0]) << 10
    print(f"a {len(body) / 2**20:.1f} MiB body grew peak RSS by {(peak - before) / 2**20:.0f} MiB "
          f"({(peak - before) / len(body):.2f}x the body)")
    assert peak - before < 3 * len(body), f"{(peak - before) / len(body):.2f}x the body"


def _malformed(rng) -> list[tuple[str, str, bytes]]:
    """(method, path, body): requests that must be refused with a 4xx, never a 500."""
    good = json.dumps({"instances": [{"a": [1.0, 2, 3, 4], "b": [0.5, 1]}]}).encode()
    cols = json.dumps({"inputs": {"a": [[1.0, 2, 3, 4]], "b": [[0.5, 1]]}}).encode()
    out = []
    structured = [
        b'{"inputs": {"a": [[1, 2, 3, 4], [1, 2, 3, 4]], "b": [[1, 2]]}}',  # batch sizes differ
        b'{"inputs": {"a": [' + b"[" * 1000 + b"1" + b"]" * 1000 + b'], "b": [[1, 2]]}}',  # nested 1000 deep
        b'{"inputs": {"a": [[' + b"9" * 5000 + b', 2, 3, 4]], "b": [[1, 2]]}}',  # 5000-digit integer
        b'{"inputs": {"a": [[1e400, 2, 3, 4]], "b": [[1, 2]]}}',
        b'{"inputs": {"a": [[1, 2, 3, 4]], "b": [[1, "x"]]}}',
        b'{"inputs": {"a": {"b64": "AAAA"}, "b": [[1, 2]]}}',
        b'{"inputs": {"a": [[null, 2, 3, 4]], "b": [[1, 2]]}}',
        b'{"inputs": {"a": [], "b": []}}',
        b'{"instances": [{"a": [1, 2, 3, 4]}]}',
        b'{"instances": "x"}', b'{"inputs": null}', b"null", b"[]", b"\xff\xfe", b'{"signature_name": [], "inputs": 1}',
        b'{"inputs": {"a": [[true, false, 1, 2]], "b": [[1, 2]]}}',
        b'{"instances": [{"a": [1, 2, 3, 4], "b": [1, 2], "c": 3}]}',
        b'{"inputs": {"a": [[1, 2, 3, 4]], "b": [[1, 2]]}, "signature_name": "nope"}',
        b'{"inputs": {"a": [[1, 2, 3, 4]], "b": [[' + b"1," * 3000 + b"1]]}}",
        b'{"inputs": {"a": [[1, 2, 3, 4]], "b": [[1, 2]]}' + b" " * 10 + b"}",
    ]
    for body in structured:
        out.append(("POST", "/v1/models/two:predict", body))
    for path in ["/v1/models/two/versions/" + "9" * 5000 + ":predict", "/v1/models/two/versions/-1:predict",
                 "/v1/models/two/labels/:predict", "/v1/models/:predict", "/v1/models/two:explain", "/v1//models",
                 "/v1/models/two/versions/99999999999999999999:predict", "/v1/models/%ff%fe:predict",
                 "/v1/models/two/metadata/extra", "/" + "a" * 5000]:
        out.append(("POST", path, good))
        out.append(("GET", path, b""))
    while len(out) < 900:  # byte-level damage to valid bodies
        body = bytearray(good if rng.random() < 0.5 else cols)
        for _ in range(rng.integers(1, 4)):
            if not body:
                break
            at = int(rng.integers(0, len(body)))
            kind = rng.integers(0, 4)
            if kind == 0:
                body[at] = int(rng.choice(list(b'[]{}",:0123456789.eE-+ntfa\\')))
            elif kind == 1:
                del body[at]
            elif kind == 2:
                body.insert(at, int(rng.integers(0, 256)))
            else:
                body = body[:at]
        out.append(("POST", "/v1/models/two:predict", bytes(body)))
    return out


@pytest.mark.parametrize("batching", [False, True])
def test_hundreds_of_malformed_requests_get_no_500(serve, models, tmp_path, batching):
    args = ["--model_base_path", str(models["two_tfl"]), "--model_name", "two", "--access_log", "false"]
    if batching:
        args += ["--batching_parameters_file", batching_file(tmp_path, max_batch_size=8, batch_timeout_micros=1000)]
    server = serve(*args)
    requests_ = _malformed(np.random.default_rng(1 + batching))
    codes = []
    with requests.Session() as s:
        for method, path, body in requests_:
            r = s.request(method, server.url + path, data=body, timeout=30)
            codes.append(r.status_code)
            assert r.status_code != 500 and "Traceback" not in r.text, (path, body[:200], r.text)
            assert r.headers["content-type"] == "application/json" and "error" in r.json() or r.status_code == 200
    for data in (b"GARBAGE\r\n\r\n", b"POST /v1/models/two:predict HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
                 b"POST /v1/models/two:predict HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"):
        answer = raw(server.port, data)
        assert answer.startswith(b"HTTP/1.1 400") and b'"error"' in answer, answer
    answer = raw(server.port, b"GET /v1/models/two HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200") and b"Connection: close" in answer  # answered, not upgraded
    print(f"batching={batching}: {len(codes)} malformed requests, {codes.count(500)} answered 500, codes "
          f"{sorted(set(codes))}")
    assert len(codes) >= 800 and 500 not in codes
    assert server.get("/healthz").status_code == 200
    assert server.metric("kiln_serve_requests_total", code="500") == 0


def test_a_half_second_drain_timeout_exits_within_two_seconds(serve, models, tmp_path):
    server = serve("--model_base_path", str(one_model_dir(tmp_path, models["slow"])), "--model_name", "slow",
                   "--rest_api_num_threads", "1", "--drain_timeout_seconds", "0.5")
    answers = []

    def ask():
        try:
            answers.append(requests.post(server.url + "/v1/models/slow:predict", timeout=30,
                                         data=json.dumps({"inputs": rows(1024).tolist()})))
        except requests.RequestException as exc:  # a reset connection would be a failure of the drain
            answers.append(exc)

    code, took = sigterm_while(server, [threading.Thread(target=ask) for _ in range(8)], 0.5, wait=10)
    print(f"drain timeout 0.5 s: exit {code} after {took:.2f} s, answers {[getattr(a, 'status_code', a) for a in answers]}")
    assert code == 0 and took < 2.0, (code, took)
    assert all(isinstance(a, requests.Response) for a in answers), answers
    assert {a.status_code for a in answers} <= {200, 503}
    cut = [a for a in answers if a.status_code == 503]
    assert cut and all("drain timeout" in a.json()["error"] or "shutting down" in a.json()["error"] for a in cut)


def test_unbatched_overload_answers_503_and_keeps_the_deadline(serve, models, tmp_path):
    server = serve("--model_base_path", str(one_model_dir(tmp_path, models["slow"])), "--model_name", "slow",
                   "--rest_api_num_threads", "1", "--max_queued_requests", "4", "--rest_api_timeout_in_ms", "1000",
                   "--access_log", "false")
    body = json.dumps({"inputs": rows(8).tolist()})

    def client(i):
        out = []
        with requests.Session() as s:
            for _ in range(4):
                start = time.monotonic()
                r = s.post(server.url + "/v1/models/slow:predict", data=body, timeout=30)
                out.append((r.status_code, time.monotonic() - start))
        return out

    results = [x for part in concurrently(client, range(48), 48) for x in part]
    codes = [c for c, _ in results]
    assert set(codes) <= {200, 503, 504} and codes.count(503) > 0 and codes.count(200) > 0
    latencies = sorted(t for _, t in results)
    print(f"unbatched overload, deadline 1 s: {codes.count(200)} x 200, {codes.count(503)} x 503, "
          f"{codes.count(504)} x 504; p50 {latencies[len(latencies) // 2]:.2f} s, "
          f"p99 {latencies[int(len(latencies) * 0.99)]:.2f} s, max {latencies[-1]:.2f} s")
    assert latencies[int(len(latencies) * 0.99)] <= 2.0, latencies[-10:]


def test_connection_limits_and_small_items(serve, models, tmp_path):
    base = one_model_dir(tmp_path, models["one_v1"])
    server = serve("--model_base_path", str(base), "--model_name", "one", "--http_idle_timeout_seconds", "0.5",
                   "--http_read_timeout_seconds", "0.5", "--max_request_bytes", "4096",
                   "--request_body_budget_bytes", "3000", "--max_connections", "3")
    x = rows(1)
    # paths are case-insensitive, as TF Serving's
    r = server.post("/V1/Models/one/Versions/1:PREDICT", data=json.dumps({"instances": x.tolist()}))
    assert r.status_code == 200, r.text
    assert server.get("/V1/MODELS/one/METADATA").status_code == 200
    # numbers beyond a double and versions beyond an int64 are the client's error
    r = server.post("/v1/models/one:predict", data=b'{"instances": [[1e400, 1, 2, 3]]}')
    assert r.status_code == 400 and "Number too big" in r.json()["error"]
    r = server.post("/v1/models/one/versions/" + "1" * 30 + ":predict", data=b"{}")
    assert r.status_code == 400 and "Failed to convert version" in r.json()["error"]
    # an idle connection is closed; a request that stops half-way gets 408 and is closed
    start = time.monotonic()
    assert raw(server.port, b"") == b"" and time.monotonic() - start < 3
    answer = raw(server.port, b"POST /v1/models/one:predict HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
    assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive whole" in answer
    # oversized headers; a body past the bytes budget; Expect: 100-continue
    answer = raw(server.port, b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 431")
    big = json.dumps({"instances": rows(40).tolist()}).encode()
    assert 3000 < len(big) <= 4096
    r = server.post("/v1/models/one:predict", data=big)
    assert r.status_code == 503 and "budget" in r.json()["error"]
    body = json.dumps({"instances": x.tolist()}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"POST /v1/models/one:predict HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))
        assert s.recv(100).startswith(b"HTTP/1.1 100 Continue")
        s.sendall(body)
        assert s.recv(1000).startswith(b"HTTP/1.1 200")
    # past the connection limit, when none is idle, requests on a new connection are answered 503 (not reset);
    # else the connection idle the longest is closed to make room
    busy = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(3)]
    for s in busy:
        s.sendall(b"GET /healthz HTTP/1.1\r\n")  # a request in progress: never closed for room
    time.sleep(0.05)
    try:
        answer = raw(server.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", timeout=0.3)
        assert answer.startswith(b"HTTP/1.1 503") and b"limit of 3 connections" in answer, answer
    finally:
        for s in busy:
            s.close()
    time.sleep(0.05)
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(3)]
    try:
        time.sleep(0.05)
        answer = raw(server.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", timeout=0.3)
        assert answer.startswith(b"HTTP/1.1 200")
        idle[0].settimeout(0.1)
        assert idle[0].recv(10) == b""  # the one idle the longest made room
    finally:
        for s in idle:
            s.close()
    time.sleep(0.2)
    page = server.get("/monitoring/prometheus/metrics").text
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds",
                 "process_start_time_seconds"):
        assert f"\n{name} " in page


def test_a_client_that_hangs_up_is_counted_as_499_not_504(serve, models, tmp_path):
    server = serve("--model_base_path", str(one_model_dir(tmp_path, models["one_v1"])), "--model_name", "one",
                   "--batching_parameters_file", batching_file(tmp_path, max_batch_size=8, batch_timeout_micros=800000,
                                                               num_batch_threads=1))
    body = json.dumps({"instances": rows(1).tolist()}).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(b"POST /v1/models/one:predict HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(0.2)
    time.sleep(1.0)
    assert server.metric("kiln_serve_requests_total", model="one", code="499") == 1
    assert server.metric("kiln_serve_requests_total", model="one", code="504") == 0
    assert server.metric("kiln_serve_backend_calls_total", model="one") == 0


def test_worker_processes_share_the_port_batching_and_metrics(serve, models, tmp_path, reference):
    server = serve("--model_base_path", str(one_model_dir(tmp_path, models["one_v1"])), "--model_name", "one",
                   "--num_workers", "2", "--access_log", "false",
                   "--batching_parameters_file", batching_file(tmp_path, max_batch_size=8, batch_timeout_micros=20000,
                                                               num_batch_threads=1))
    x = rows(40, seed=9)
    want = reference(models["one_sm1"], x=x)["y"]

    def ask(i):
        with requests.Session() as s:  # a connection each: the kernel hands them to either worker
            return s.post(server.url + "/v1/models/one:predict", data=json.dumps({"instances": [x[i].tolist()]}))

    answers = concurrently(ask, range(40), 20)
    assert [a.status_code for a in answers] == [200] * 40
    np.testing.assert_allclose([a.json()["predictions"][0] for a in answers], want, rtol=1e-5, atol=1e-6)
    assert server.metric("kiln_serve_requests_total", model="one", code="200") == 40  # summed over the workers
    assert server.metric("kiln_serve_batch_size_sum", model="one") - server.metric("kiln_serve_padding_rows_total") == 40
    code, log = server.stop()
    assert code == 0 and log.count("draining") == 2, log


def test_a_keras_model_with_two_dtypes_isolates_a_bad_index_the_kernel_finds(serve, tmp_path):
    """A model kiln's tests did not write: Keras's Embedding wraps negative ids before its GATHER,
    so no table range is declared on the input and the kernel finds the bad id. The bad request
    fails alone, its 400 naming the integer input; the others equal Keras."""
    import tensorflow as tf

    import kiln

    feat = tf.keras.Input((3,), dtype=tf.float32, name="feat")
    tok = tf.keras.Input((2,), dtype=tf.int32, name="tok")
    looked_up = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(10, 3)(tok))
    out = tf.keras.layers.Dense(2, activation="softmax")(tf.keras.layers.Concatenate()([feat, looked_up]))
    model = tf.keras.Model([feat, tok], out)
    path = tmp_path / "km" / "1" / "model.tflite"
    path.parent.mkdir(parents=True)
    path.write_bytes(kiln.TFLiteConverter.from_keras_model(model).convert())
    server = serve("--model_base_path", str(path.parent.parent), "--model_name", "km",
                   "--batching_parameters_file", batching_file(tmp_path, max_batch_size=16, batch_timeout_micros=300000,
                                                               num_batch_threads=1))
    x = rows(16, 3, seed=5)
    ids = np.random.default_rng(6).integers(0, 10, (16, 2)).astype(np.int32)
    ids[5] = [3, 10]
    answers = concurrently(lambda i: server.predict("km", {"instances": [{"feat": x[i].tolist(),
                                                                           "tok": ids[i].tolist()}]}), range(16), 16)
    assert [a.status_code for a in answers] == [400 if i == 5 else 200 for i in range(16)], [a.text for a in answers]
    error = answers[5].json()["error"]
    assert "input(s) 'tok':" in error and "'feat'" not in error, error
    good = [i for i in range(16) if i != 5]
    want = model([x[good], ids[good]]).numpy()
    np.testing.assert_allclose([answers[i].json()["predictions"][0] for i in good], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["kiln", "litert"])
def test_a_large_request_claims_the_peak_of_its_rows_live_tensors(models, tmp_path, backend):
    """The slow model is a chain of 1024-wide layers: at its peak a call holds its input row, its
    output row and two 1024-float intermediates per row — not all 26 of its batch tensors at once."""
    from kiln.serve.backends import load
    from kiln.serve.models import _row_work

    loaded = load(one_model_dir(tmp_path, models["slow"]) / "1", backend)
    assert _row_work(loaded) == 4 * (4 + 3 + 2 * 1024)
