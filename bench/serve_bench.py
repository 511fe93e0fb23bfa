"""``kiln serve`` against calling the interpreter in-process: how much of the model's speed survives HTTP.

A model (``--model mlp``: a 16 -> 64 -> 64 -> 10 MLP, where the front end is nearly all the cost;
``cnn``: a small CNN on 32x32x3 images) is served by ``kiln serve`` (unbatched, and batched with
``--batched``) with 1 and 2 worker processes on 127.0.0.1; with ``--bare``, also a bare-bones
server (bench/serve_bare.py: the least any Python front end does per request) as the floor. The
load comes from a separate client process that keeps 1, 8 and 64 keep-alive connections busy (closed loop) with single-row
``instances`` requests, written with raw asyncio so the client costs little CPU of the shared
cores. The anchor is the same model's runner called in a loop in one process
(``kiln.runtime.open(...).new_runner()``, one row per call), measured in the same run. Each
point runs ``--repeats`` times, interleaved with the anchor, and the medians are printed:
server requests/s, the ratio server / in-process, p50 and p99 latency, the server's CPU time per
request (all its processes; it does not move with the load of other programs, unlike requests/s)
and the CPU ratio (the anchor's time per call / the server's CPU per request: the throughput ratio
one core would give), errors.

Goal (issue #24): the ratio at 64 clients >= 0.15 for the MLP on a 2-core machine.

    python bench/serve_bench.py [--backends kiln litert] [--model mlp|cnn] [--workers 1 2]
                                [--clients 1 8 64] [--seconds 3] [--repeats 3] [--batched] [--bare]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BATCHING = """
max_batch_size { value: 64 }
batch_timeout_micros { value: 1000 }
max_enqueued_batches { value: 256 }
num_batch_threads { value: 1 }
"""


def build(out_dir: Path, kind: str) -> tuple[Path, tuple]:
    """The model as model/1/model.tflite under ``out_dir``, and its input row shape."""
    import tensorflow as tf

    import kiln

    tf.random.set_seed(0)
    layers = tf.keras.layers
    if kind == "mlp":
        shape = (16,)
        body = [layers.Dense(64, activation="relu"), layers.Dense(64, activation="relu"), layers.Dense(10)]
    else:
        shape = (32, 32, 3)
        body = [layers.Conv2D(16, 3, activation="relu"), layers.MaxPooling2D(), layers.Conv2D(32, 3, activation="relu"),
                layers.MaxPooling2D(), layers.Flatten(), layers.Dense(64, activation="relu"), layers.Dense(10)]
    model = tf.keras.Sequential([tf.keras.Input(shape), *body])
    path = out_dir / "model" / "1" / "model.tflite"
    path.parent.mkdir(parents=True)
    path.write_bytes(kiln.TFLiteConverter.from_keras_model(model).convert())
    return path.parent.parent, shape


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, base: Path, backend: str, workers: int, batching: Path | None, extra: tuple = ()):
        self.port, self.grpc_port = free_port(), free_port()
        args = [sys.executable, "-m", "kiln", "serve", "--model_base_path", str(base), "--model_name", "model",
                "--rest_api_port", str(self.port), "--port", str(self.grpc_port), "--backend", backend,
                "--num_workers", str(workers), *extra]
        if batching is not None:
            args += ["--batching_parameters_file", str(batching)]
        self.proc = subprocess.Popen(args, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"kiln serve exited: {self.proc.stderr.read()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
                    if s.recv(100).startswith(b"HTTP/1.1 200"):
                        time.sleep(0.5 * workers)  # every worker loaded (each loads before it accepts)
                        return
            except OSError:
                time.sleep(0.2)
        raise SystemExit("kiln serve did not become ready")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(120)


class BareServer:
    """bench/serve_bare.py: the floor any Python front end pays, served the same way."""

    def __init__(self, base: Path, backend: str, workers: int, body: Path):
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "serve_bare.py"),
                                      str(base / "1" / "model.tflite"), str(self.port), str(workers), backend],
                                     cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), start_new_session=True)
        request = (b"POST /v1/models/model:predict HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                   % (len(body.read_bytes()), body.read_bytes()))
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
                    s.sendall(request)
                    if s.recv(100).startswith(b"HTTP/1.1 200"):
                        time.sleep(1.0 * workers)  # every worker loaded
                        return
            except OSError:
                time.sleep(0.2)
        raise SystemExit("the bare-bones server did not answer")

    def stop(self):
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(120)


# -- the load: raw asyncio, so the client's own CPU cost stays small -------------------------------

class _Client(asyncio.Protocol):
    """One keep-alive connection sending ``request`` again as soon as the answer is whole."""

    def __init__(self, request: bytes, stop_at: float, latencies: list, errors: list, done: asyncio.Future):
        self.request, self.stop_at, self.latencies, self.errors, self.done = request, stop_at, latencies, errors, done
        self.buffer = b""
        self.need = None

    def connection_made(self, transport):
        self.transport = transport
        self._send()

    def _send(self):
        self.sent = time.perf_counter()
        self.transport.write(self.request)

    def data_received(self, data):
        self.buffer += data
        while True:
            if self.need is None:
                end = self.buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = self.buffer[:end].lower()
                at = head.find(b"content-length:")
                length = int(head[at + 15:head.find(b"\r\n", at) if head.find(b"\r\n", at) > 0 else None]) if at >= 0 else 0
                self.status = int(head[9:12])
                self.need = end + 4 + length
            if len(self.buffer) < self.need:
                return
            self.buffer = self.buffer[self.need:]
            self.need = None
            now = time.perf_counter()
            if self.status == 200:
                self.latencies.append(now - self.sent)
            else:
                self.errors[0] += 1
            if now >= self.stop_at:
                self.transport.close()
                if not self.done.done():
                    self.done.set_result(None)
                return
            self._send()

    def connection_lost(self, exc):
        if not self.done.done():
            self.done.set_result(None)


async def _load(port: int, clients: int, seconds: float, body: bytes) -> dict:
    loop = asyncio.get_running_loop()
    request = (b"POST /v1/models/model:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    latencies, errors = [], [0]
    stop_at = time.perf_counter() + seconds
    done = []
    for _ in range(clients):
        future = loop.create_future()
        done.append(future)
        await loop.create_connection(lambda f=future: _Client(request, stop_at, latencies, errors, f), "127.0.0.1", port)
    await asyncio.gather(*done)
    return {"latencies": latencies, "errors": errors[0], "seconds": seconds}


async def _grpc_load(port: int, clients: int, seconds: float, body: bytes) -> dict:
    """The same load over gRPC: ``clients`` calls kept in flight on one channel (grpc.aio), each a
    PredictRequest of the body's row, serialized once."""
    import grpc

    from kiln.serve import grpc_api

    m = grpc_api.messages()
    row = np.asarray(json.loads(body)["instances"], np.float32)
    request = m["PredictRequest"]()
    request.model_spec.name = "model"
    tensor = request.inputs[INPUT_NAME[0]]
    tensor.dtype = 1
    for d in row.shape:
        tensor.tensor_shape.dim.add(size=d)
    tensor.tensor_content = row.tobytes()
    data = request.SerializeToString()
    latencies, errors = [], [0]
    stop_at = time.perf_counter() + seconds
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")

        async def one():
            while time.perf_counter() < stop_at:
                sent = time.perf_counter()
                try:
                    await call(data, timeout=30)
                    latencies.append(time.perf_counter() - sent)
                except grpc.aio.AioRpcError:
                    errors[0] += 1

        await asyncio.gather(*[one() for _ in range(clients)])
    return {"latencies": latencies, "errors": errors[0], "seconds": seconds}


def client_main(spec: dict) -> None:
    if spec.get("api") == "grpc":
        INPUT_NAME[0] = spec["input"]
        json.dump(asyncio.run(_grpc_load(spec["port"], spec["clients"], spec["seconds"],
                                         Path(spec["body"]).read_bytes())), sys.stdout)
        return
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    result = asyncio.run(_load(spec["port"], spec["clients"], spec["seconds"], Path(spec["body"]).read_bytes()))
    json.dump(result, sys.stdout)


INPUT_NAME = [""]  # the model's input (gRPC names it)


def _cpu_seconds(pids) -> float:
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            pass
    return total


def _server_pids(pid: int) -> list[int]:
    """The server and its worker processes (Linux /proc)."""
    pids = [pid]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    pids.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                pass
    return pids


def run_load(port: int, clients: int, seconds: float, body: Path, server_pid: int | None = None,
             api: str = "rest") -> dict:
    pids = _server_pids(server_pid) if server_pid else []
    cpu0 = _cpu_seconds(pids)
    out = subprocess.run([sys.executable, __file__, "--client", json.dumps(
        {"port": port, "clients": clients, "seconds": seconds, "body": str(body), "api": api,
         "input": INPUT_NAME[0]})],
        capture_output=True, text=True, timeout=seconds + 120, check=True).stdout
    result = json.loads(out)
    cpu = _cpu_seconds(pids) - cpu0
    lat = np.array(result["latencies"] or [np.nan]) * 1e3
    return {"req/s": len(result["latencies"]) / seconds, "p50": float(np.percentile(lat, 50)),
            "p99": float(np.percentile(lat, 99)), "errors": result["errors"],
            "cpu us": cpu / max(len(result["latencies"]), 1) * 1e6}


def in_process(base: Path, backend: str, row: np.ndarray, seconds: float) -> float:
    """Calls per second of the model's runner in this process, one row per call."""
    from kiln.runtime import served

    model = served.open(base / "1" / "model.tflite", backend)
    signature = model.signature()
    runner = model.new_runner()
    feeds = {next(iter(signature.inputs)): row[None]}
    for _ in range(20):
        runner.run(signature.key, feeds)
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(50):
            runner.run(signature.key, feeds)
        calls += 50
    return calls / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["kiln", "litert"])
    parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--clients", nargs="+", type=int, default=[1, 8, 64])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batched", action="store_true", help="also serve with batching on")
    parser.add_argument("--bare", action="store_true",
                        help="also measure bench/serve_bare.py, a bare-bones server (the floor of any Python front end)")
    parser.add_argument("--apis", nargs="+", choices=("rest", "grpc"), default=["rest", "grpc"])
    parser.add_argument("--attacks", action="store_true",
                        help="instead: a 1-row client's latency and the server's peak memory under each attack "
                             "(bench/serve_attacks.py)")
    parser.add_argument("--client", help=argparse.SUPPRESS)  # internal: run as the load-generating process
    args = parser.parse_args()
    if args.client:
        client_main(json.loads(args.client))
        return 0
    work = Path(tempfile.mkdtemp(prefix="kiln-serve-bench-"))
    base, shape = build(work, args.model)
    from kiln.runtime import served

    INPUT_NAME[0] = next(iter(served.open(base / "1" / "model.tflite").signature().inputs))
    if args.attacks:
        from serve_attacks import attacks

        return attacks(base, shape, args, INPUT_NAME[0])
    row = np.random.default_rng(0).standard_normal(shape).astype(np.float32).round(3)
    body = work / "body.json"
    body.write_bytes(json.dumps({"instances": [row.tolist()]}).encode())
    batching = work / "batching.config"
    batching.write_text(BATCHING)
    modes = [("unbatched", None)] + ([("batched", batching)] if args.batched else []) + (
        [("bare", None)] if args.bare else [])
    print(f"{args.model} model {shape}, one row per request; {args.seconds:g} s per point, median of {args.repeats} "
          f"interleaved runs; raw-asyncio client process; {os.cpu_count()} CPU cores, load average "
          f"{os.getloadavg()[0]:.1f}")
    print(f"{'backend':<7} {'mode':<9} {'api':<4} {'workers':>7} {'clients':>7} {'req/s':>8} {'in-proc/s':>9} "
          f"{'ratio':>6} {'p50 ms':>7} {'p99 ms':>7} {'cpu us':>7} {'cpu ratio':>9} {'errors':>6} {'load':>5}")
    for backend in args.backends:
        for mode, batching_file in modes:
            for workers in args.workers:
                server = (BareServer(base, backend, workers, body) if mode == "bare"
                          else Server(base, backend, workers, batching_file))
                try:
                    for api in (["rest"] if mode == "bare" else args.apis):
                        port = server.grpc_port if api == "grpc" else server.port
                        run_load(port, max(args.clients), 1.0, body, api=api)  # warm-up: every worker's interpreters
                        runs: dict = {c: [] for c in args.clients}
                        anchors: dict = {c: [] for c in args.clients}
                        loads: dict = {c: [] for c in args.clients}
                        for _ in range(args.repeats):
                            for clients in args.clients:
                                anchors[clients].append(in_process(base, backend, row, min(args.seconds, 1.0)))
                                runs[clients].append(run_load(port, clients, args.seconds, body, server.proc.pid, api))
                                loads[clients].append(os.getloadavg()[0])
                        for clients in args.clients:
                            rate = float(np.median([r["req/s"] for r in runs[clients]]))
                            anchor = float(np.median(anchors[clients]))
                            p50 = float(np.median([r["p50"] for r in runs[clients]]))
                            p99 = float(np.median([r["p99"] for r in runs[clients]]))
                            errors = sum(r["errors"] for r in runs[clients])
                            cpu = float(np.median([r["cpu us"] for r in runs[clients]]))
                            print(f"{backend:<7} {mode:<9} {api:<4} {workers:>7} {clients:>7} {rate:>8.0f} {anchor:>9.0f} "
                                  f"{rate / anchor:>6.3f} {p50:>7.2f} {p99:>7.2f} {cpu:>7.0f} {1e6 / anchor / cpu:>9.3f} "
                                  f"{errors:>6} {np.median(loads[clients]):>5.1f}", flush=True)
                finally:
                    server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
