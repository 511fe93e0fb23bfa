"""Models built once per session (TensorFlow -> SavedModel -> kiln's converter) and a real server.

`Server` starts ``python -m kiln serve`` in a subprocess on a free 127.0.0.1 port and talks to
it over HTTP, as a client would.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
tf = pytest.importorskip("tensorflow")
requests = pytest.importorskip("requests")


class TwoHeads(tf.Module):
    """Two inputs, two outputs: exercises the object forms of rows and columns."""

    def __init__(self, scale: float = 1.0):
        self.w = tf.Variable(tf.reshape(tf.range(12, dtype=tf.float32), [4, 3]) / 10.0 * scale)

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="a"),
                                  tf.TensorSpec([None, 2], tf.float32, name="b")])
    def serve(self, a, b):
        return {"scores": tf.nn.relu(tf.matmul(a, self.w) - 0.5), "doubled": b * 2.0}


class OneHead(tf.Module):
    """One input, one output: the bare-list forms. ``scale`` tells versions apart."""

    def __init__(self, scale: float):
        self.w = tf.Variable(tf.reshape(tf.range(12, dtype=tf.float32), [4, 3]) / 10.0 * scale)

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def serve(self, x):
        return {"y": tf.tanh(tf.matmul(x, self.w))}


class Slow(tf.Module):
    """One input, one output, and a few milliseconds of compute per call: a worker that is busy while
    requests arrive, so that a queue can fill."""

    def __init__(self):
        rng = np.random.default_rng(3)
        self.w_in = tf.constant(rng.standard_normal((4, 1024)).astype(np.float32) / 2)
        self.w = tf.constant(rng.standard_normal((1024, 1024)).astype(np.float32) / 32)
        self.w_out = tf.constant(rng.standard_normal((1024, 3)).astype(np.float32) / 32)

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def serve(self, x):
        h = tf.tanh(tf.matmul(x, self.w_in))
        for _ in range(24):
            h = tf.tanh(tf.matmul(h, self.w))
        return {"y": tf.matmul(h, self.w_out)}


class Strings(tf.Module):
    """Bytes in, bytes and lengths out: the b64 forms (TensorFlow backend)."""

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def serve(self, text):
        return {"echo_bytes": text, "length": tf.strings.length(text)}


class InGraphBatched(tf.Module):
    """Already batched in the graph (BatchFunction), as ``kiln infer-convert`` leaves a model."""

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def serve(self, x):
        @tf.nondifferentiable_batch_function(1, 8, 20000, allowed_batch_sizes=[2, 4, 8])
        def body(x):
            return x * 3.0

        return {"y": body(x)}


class Embed(tf.Module):
    """Integer ids looked up in a 50-row table: an index outside it fails the model."""

    def __init__(self):
        self.table = tf.Variable(tf.reshape(tf.range(150, dtype=tf.float32), [50, 3]) / 10.0)

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.int32, name="ids")])
    def serve(self, ids):
        return {"vec": tf.reduce_sum(tf.gather(self.table, ids), axis=1)}


def save(module, path: Path) -> Path:
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve.get_concrete_function()})
    return path


def to_tflite(saved_model: Path, out: Path) -> Path:
    import kiln

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(kiln.TFLiteConverter.from_saved_model(str(saved_model)).convert())
    return out


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """{name: path}: SavedModels and .tflite files laid out as TF Serving model directories."""
    root = tmp_path_factory.mktemp("serve_models")
    out = {}
    out["two_sm"] = save(TwoHeads(), root / "two_sm" / "1").parent
    to_tflite(root / "two_sm" / "1", root / "two_tfl" / "1" / "model.tflite")
    out["two_tfl"] = root / "two_tfl"
    for version, scale in ((1, 1.0), (2, -2.0)):
        sm = save(OneHead(scale), root / "staging" / f"one_sm{version}")
        to_tflite(sm, root / "staging" / f"one_v{version}.tflite")
    out["one_v1"] = root / "staging" / "one_v1.tflite"
    out["one_v2"] = root / "staging" / "one_v2.tflite"
    out["one_sm1"] = root / "staging" / "one_sm1"
    out["one_sm2"] = root / "staging" / "one_sm2"
    out["slow_sm"] = save(Slow(), root / "staging" / "slow_sm")
    out["slow"] = to_tflite(out["slow_sm"], root / "staging" / "slow.tflite")
    out["strings"] = save(Strings(), root / "strings" / "1").parent
    out["batched_sm"] = save(InGraphBatched(), root / "batched_sm" / "1").parent
    out["embed_sm"] = save(Embed(), root / "embed_sm" / "1").parent
    to_tflite(root / "embed_sm" / "1", root / "embed_tfl" / "1" / "model.tflite")
    out["embed_tfl"] = root / "embed_tfl"
    return out


@pytest.fixture(scope="session")
def reference():
    """TensorFlow's outputs for a SavedModel signature (the reference values)."""
    cache = {}

    def run(saved_model, **feeds):
        key = os.fspath(saved_model)
        if key not in cache:
            cache[key] = tf.saved_model.load(key).signatures["serving_default"]
        return {k: v.numpy() for k, v in cache[key](**{n: tf.constant(a) for n, a in feeds.items()}).items()}

    return run


def one_model_dir(tmp_path: Path, tflite: Path, version: int = 1) -> Path:
    base = tmp_path / "one"
    (base / str(version)).mkdir(parents=True)
    shutil.copy(tflite, base / str(version) / "model.tflite")
    return base


def exchange(port: int, pieces: list[bytes], pause: float = 0.0, timeout: float = 10.0) -> bytes:
    """Send ``pieces`` on a new connection (``pause`` seconds after each) and read one answer:
    its head, then as many body bytes as its Content-Length says. What came before the server
    closed, when it closes first."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for piece in pieces:
            conn.sendall(piece)
            time.sleep(pause)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        while len(body) < length:
            body += conn.recv(65536)
    return head + b"\r\n\r\n" + body


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``kiln serve`` in a subprocess; ``stop()`` sends SIGTERM and returns (exit code, log)."""

    def __init__(self, *args: str, ready_timeout: float = 120.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"kiln-serve-{self.port}.log"
        self._log = open(self.log_path, "w+")
        if "--port" not in args:  # no gRPC unless a test asks for it
            args = ("--port", "0", *args)
        self.proc = subprocess.Popen([sys.executable, "-m", "kiln", "serve", "--rest_api_port", str(self.port),
                                      *args], cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + ready_timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"kiln serve exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if requests.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return
            except (requests.ConnectionError, requests.Timeout):  # not listening, or not accepting yet
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"kiln serve not ready after {ready_timeout} s:\n{self.log()}")
            time.sleep(0.1)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def get(self, path: str, **kw):
        return requests.get(self.url + path, timeout=60, **kw)

    def post(self, path: str, body=None, data=None, **kw):
        if data is None:
            data = json.dumps(body)
        return requests.post(self.url + path, data=data, timeout=60, **kw)

    def predict(self, model: str, body, suffix: str = ""):
        return self.post(f"/v1/models/{model}{suffix}:predict", body)

    def metric(self, name: str, **labels) -> float:
        """One sample of the Prometheus text (0 when absent)."""
        from prometheus_client.parser import text_string_to_metric_families

        total = 0.0
        for family in text_string_to_metric_families(self.get("/monitoring/prometheus/metrics").text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    total += sample.value
        return total

    def stop(self, timeout: float = 60.0) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"kiln serve did not stop on SIGTERM:\n{self.log()}")
        return self.proc.returncode, self.log()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def serve():
    """serve(*flags) -> a started Server; every server is stopped at the end of the test."""
    started = []

    def start(*args, **kw):
        server = Server(*args, **kw)
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()


def rows(n: int, width: int = 4, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, width)).astype(np.float32)


def batching_file(tmp_path, **params) -> str:
    path = tmp_path / "batching.config"
    lines = []
    for key, value in params.items():
        if isinstance(value, (list, tuple)):
            lines += [f"{key}: {v}" for v in value]
        elif isinstance(value, bool):
            lines.append(f"{key}: {'true' if value else 'false'}" if key == "pad_variable_length_inputs"
                         else f"{key} {{ value: {'true' if value else 'false'} }}")
        else:
            lines.append(f"{key} {{ value: {value} }}")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def sigterm_while(server: Server, threads: list, after: float, wait: float = 30.0) -> tuple[int, float]:
    """Start ``threads``, send SIGTERM ``after`` seconds later, wait for the server to exit, join them:
    (exit code, seconds from the signal to the exit)."""
    for t in threads:
        t.start()
    time.sleep(after)
    start = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    code = server.proc.wait(wait)
    took = time.monotonic() - start
    for t in threads:
        t.join(30)
    return code, took


def concurrently(fn, items, workers):
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(fn, items))
