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
                                [--apis rest grpc grpcio] [--rows 1] [--server_root CHECKOUT]

``--rows N`` sends N rows per request (a large-request case); ``--server_root`` serves with another
checkout's kiln (a branch's worktree) under these same clients, to compare branches side by side.
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

SERVER_ROOT = [ROOT]  # the checkout whose kiln serves (--server_root: another branch's, with these clients)
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
        self.proc = subprocess.Popen(args, cwd=SERVER_ROOT[0], env=dict(os.environ, PYTHONPATH=str(SERVER_ROOT[0])),
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
            if self._answered(self.status == 200):
                return
            self._send()

    def _answered(self, ok: bool) -> bool:
        """Count an answer; True when the run is over (and the connection closed)."""
        now = time.perf_counter()
        if ok:
            self.latencies.append(now - self.sent)
        else:
            self.errors[0] += 1
        if now >= self.stop_at:
            self.transport.close()
            if not self.done.done():
                self.done.set_result(None)
            return True
        return False

    def connection_lost(self, exc):
        if not self.done.done():
            self.done.set_result(None)


async def _load(port: int, clients: int, seconds: float, body: bytes, api: str = "rest") -> dict:
    loop = asyncio.get_running_loop()
    if api == "grpc":
        request, protocol = predict_message(body), _GrpcClient
    else:
        request, protocol = (b"POST /v1/models/model:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                             b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)), _Client
    latencies, errors = [], [0]
    stop_at = time.perf_counter() + seconds
    done = []
    for _ in range(clients):
        future = loop.create_future()
        done.append(future)
        await loop.create_connection(lambda f=future: protocol(request, stop_at, latencies, errors, f), "127.0.0.1", port)
    await asyncio.gather(*done)
    return {"latencies": latencies, "errors": errors[0], "seconds": seconds}


def predict_message(body: bytes) -> bytes:
    """The body's row as a serialized PredictRequest (tensor_content), as TF Serving's clients send it."""
    from kiln.serve import grpc_api

    request = grpc_api.messages()["PredictRequest"]()
    request.model_spec.name = "model"
    row = np.asarray(json.loads(body)["instances"], np.float32)
    tensor = request.inputs[INPUT_NAME[0]]
    tensor.dtype = 1
    for d in row.shape:
        tensor.tensor_shape.dim.add(size=d)
    tensor.tensor_content = row.tobytes()
    return request.SerializeToString()


def grpc_call_frames(message: bytes, stream: int) -> bytes:
    """One unary Predict call as HTTP/2 frames (HEADERS, then DATA with END_STREAM), its headers as
    literals HPACK does not index: the same bytes every call."""
    from hpack import Encoder, NeverIndexedHeaderTuple

    block = Encoder().encode([NeverIndexedHeaderTuple(*h) for h in _HEADERS])
    return _call_frames(block, message)(stream)


PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_HEADERS = ((":method", "POST"), (":scheme", "http"), (":path", "/tensorflow.serving.PredictionService/Predict"),
            (":authority", "127.0.0.1"), ("content-type", "application/grpc"), ("te", "trailers"))


def _call_frames(block: bytes, message: bytes):
    """``frames(stream)``: the frames of a call of ``message`` on ``stream``, made from bytes prepared once."""
    from hyperframe.frame import DataFrame, HeadersFrame

    body = b"\x00" + len(message).to_bytes(4, "big") + message  # in frames of HTTP/2's default 16 KiB at most
    frames = [HeadersFrame(1, block, flags=["END_HEADERS"]).serialize()] + [
        DataFrame(1, body[at:at + 16384], flags=["END_STREAM"] if at + 16384 >= len(body) else []).serialize()
        for at in range(0, len(body), 16384)]
    return lambda stream: b"".join(b"%s%s%s" % (f[:5], stream.to_bytes(4, "big"), f[9:]) for f in frames)


class _GrpcClient(_Client):
    """One HTTP/2 connection keeping one unary call in flight (raw frames, like the REST client): a new call
    as soon as the last one's trailers arrive. Its headers are indexed as a warm client's are (the
    first call adds them to the server's HPACK table, the next ones name them by index); every header
    block the server writes goes through an HPACK decoder, whose answer for a block of indexed fields
    only (which leaves the table as it is) is kept."""

    def __init__(self, message: bytes, stop_at: float, latencies: list, errors: list, done: asyncio.Future):
        from hpack import Decoder, Encoder
        from hyperframe.frame import SettingsFrame, WindowUpdateFrame

        self.stop_at, self.latencies, self.errors, self.done = stop_at, latencies, errors, done
        encoder = Encoder()
        self.first = _call_frames(encoder.encode(_HEADERS), message)
        self.frames = _call_frames(encoder.encode(_HEADERS), message)
        self.hello = (PREFACE + SettingsFrame(0, settings={SettingsFrame.INITIAL_WINDOW_SIZE: 1 << 30}).serialize() +
                      WindowUpdateFrame(0, window_increment=(1 << 30) - 65535).serialize())
        self.ack = SettingsFrame(0, flags=["ACK"]).serialize()
        self.decoder, self.known = Decoder(), {}
        self.buffer, self.stream, self.taken = b"", 1, 0

    def connection_made(self, transport):
        self.transport = transport
        transport.write(self.hello)
        self._send()

    def _send(self):
        self.sent = time.perf_counter()
        self.transport.write((self.frames if self.stream > 1 else self.first)(self.stream))

    def _headers(self, block: bytes) -> dict:
        headers = self.known.get(block)
        if headers is None:
            headers = dict(self.decoder.decode(block, raw=True))
            if all(b & 0x80 for b in block):
                self.known[block] = headers
            else:  # the table changed
                self.known.clear()
        return headers

    def data_received(self, data):
        data = self.buffer + data
        at, ok = 0, None
        while len(data) - at >= 9:
            size, kind, flags = int.from_bytes(data[at:at + 3], "big"), data[at + 3], data[at + 4]
            if len(data) - at - 9 < size:
                break
            if kind == 1:  # HEADERS (kiln's and grpcio's are neither padded nor prioritized)
                headers = self._headers(data[at + 9:at + 9 + size])
                if flags & 1:
                    ok = headers.get(b"grpc-status") == b"0"
            elif kind == 0:
                self.taken += size
            elif kind == 3:  # RST_STREAM: the call failed
                ok = False
            elif kind == 4 and not flags & 1:  # the server's SETTINGS, acknowledged
                self.transport.write(self.ack)
            elif kind == 6 and not flags & 1:  # PING
                self.transport.write(data[at:at + 4] + b"\x01" + data[at + 5:at + 9 + size])
            at += 9 + size
        self.buffer = data[at:]
        if ok is None or self._answered(ok):
            return
        if self.taken > 1 << 29:
            from hyperframe.frame import WindowUpdateFrame

            self.transport.write(WindowUpdateFrame(0, window_increment=self.taken).serialize())
            self.taken = 0
        self.stream += 2
        self._send()


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
    INPUT_NAME[0] = spec["input"]
    if spec.get("api") == "grpcio":
        json.dump(asyncio.run(_grpc_load(spec["port"], spec["clients"], spec["seconds"],
                                         Path(spec["body"]).read_bytes())), sys.stdout)
        return
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    result = asyncio.run(_load(spec["port"], spec["clients"], spec["seconds"], Path(spec["body"]).read_bytes(),
                               spec.get("api", "rest")))
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
    children = os.times()
    out = subprocess.run([sys.executable, __file__, "--client", json.dumps(
        {"port": port, "clients": clients, "seconds": seconds, "body": str(body), "api": api,
         "input": INPUT_NAME[0]})],
        capture_output=True, text=True, timeout=seconds + 120, check=True).stdout
    result = json.loads(out)
    cpu = _cpu_seconds(pids) - cpu0
    after = os.times()
    client = after.children_user + after.children_system - children.children_user - children.children_system
    lat = np.array(result["latencies"] or [np.nan]) * 1e3
    return {"req/s": len(result["latencies"]) / seconds, "p50": float(np.percentile(lat, 50)),
            "p99": float(np.percentile(lat, 99)), "errors": result["errors"],
            "cpu us": cpu / max(len(result["latencies"]), 1) * 1e6,
            "client us": client / max(len(result["latencies"]), 1) * 1e6}


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
    parser.add_argument("--apis", nargs="+", choices=("rest", "grpc", "grpcio"), default=["rest", "grpc"],
                        help="grpc: raw HTTP/2 frames (as cheap a client as REST's); grpcio: grpc.aio, one channel")
    parser.add_argument("--attacks", action="store_true",
                        help="instead: a 1-row client's latency and the server's peak memory under each attack "
                             "(bench/serve_attacks.py)")
    parser.add_argument("--only", nargs="+", help="with --attacks: only the attacks whose label holds one of these")
    parser.add_argument("--rows", type=int, default=1, help="rows per request (the in-process anchor runs one)")
    parser.add_argument("--server_root", type=Path, default=ROOT,
                        help="serve with the kiln of this checkout (to compare branches under the same clients)")
    parser.add_argument("--client", help=argparse.SUPPRESS)  # internal: run as the load-generating process
    args = parser.parse_args()
    if args.client:
        client_main(json.loads(args.client))
        return 0
    SERVER_ROOT[0] = args.server_root.resolve()
    work = Path(tempfile.mkdtemp(prefix="kiln-serve-bench-"))
    base, shape = build(work, args.model)
    from kiln.runtime import served

    INPUT_NAME[0] = next(iter(served.open(base / "1" / "model.tflite").signature().inputs))
    if args.attacks:
        from serve_attacks import attacks

        return attacks(base, shape, args, INPUT_NAME[0])
    rows = np.random.default_rng(0).standard_normal((args.rows, *shape)).astype(np.float32).round(3)
    row = rows[0]
    body = work / "body.json"
    body.write_bytes(json.dumps({"instances": rows.tolist()}).encode())
    batching = work / "batching.config"
    batching.write_text(BATCHING)
    modes = [("unbatched", None)] + ([("batched", batching)] if args.batched else []) + (
        [("bare", None)] if args.bare else [])
    print(f"{args.model} model {shape}, {args.rows} row(s) per request ({body.stat().st_size} bytes of JSON); {args.seconds:g} s per point, median of {args.repeats} "
          f"interleaved runs; raw-asyncio client process; {os.cpu_count()} CPU cores, load average "
          f"{os.getloadavg()[0]:.1f}")
    print(f"{'backend':<7} {'mode':<9} {'api':<6} {'workers':>7} {'clients':>7} {'req/s':>8} {'in-proc/s':>9} "
          f"{'ratio':>6} {'p50 ms':>7} {'p99 ms':>7} {'cpu us':>7} {'cpu ratio':>9} {'client us':>9} {'errors':>6} "
          f"{'load':>5}")
    for backend in args.backends:
        for mode, batching_file in modes:
            for workers in args.workers:
                server = (BareServer(base, backend, workers, body) if mode == "bare"
                          else Server(base, backend, workers, batching_file))
                try:  # the APIs interleaved, so that they share the machine's moments alike
                    apis = ["rest"] if mode == "bare" else args.apis
                    for api in apis:
                        run_load(server.port if api == "rest" else server.grpc_port, max(args.clients), 1.0, body,
                                 api=api)  # warm-up: every worker's interpreters
                    runs: dict = {(a, c): [] for a in apis for c in args.clients}
                    anchors: dict = {c: [] for c in args.clients}
                    loads: dict = {(a, c): [] for a in apis for c in args.clients}
                    for _ in range(args.repeats):
                        for clients in args.clients:
                            anchors[clients].append(in_process(base, backend, row, min(args.seconds, 1.0)))
                            for api in apis:
                                port = server.port if api == "rest" else server.grpc_port
                                runs[api, clients].append(run_load(port, clients, args.seconds, body, server.proc.pid,
                                                                   api))
                                loads[api, clients].append(os.getloadavg()[0])
                    for clients in args.clients:
                        anchor = float(np.median(anchors[clients]))
                        for api in apis:
                            got = runs[api, clients]
                            rate, p50, p99, cpu, client = (float(np.median([r[k] for r in got])) for k in
                                                           ("req/s", "p50", "p99", "cpu us", "client us"))
                            print(f"{backend:<7} {mode:<9} {api:<6} {workers:>7} {clients:>7} {rate:>8.0f} {anchor:>9.0f} "
                                  f"{rate / anchor:>6.3f} {p50:>7.2f} {p99:>7.2f} {cpu:>7.0f} {1e6 / anchor / cpu:>9.3f} "
                                  f"{client:>9.0f} {sum(r['errors'] for r in got):>6} "
                                  f"{np.median(loads[api, clients]):>5.1f}", flush=True)
                finally:
                    server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
