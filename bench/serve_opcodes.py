"""Python bytecodes a ``kiln serve`` worker runs per predict request, by module and by function.

Timings on a shared 2-core machine move by tens of percent from run to run; the request path is
bound by the interpreter (perf: most of a worker's samples in libpython, one read and one write
system call per request), so the count of bytecodes it executes is the deterministic measure of
its cost. One worker (the real `RestApi` over the real `HttpServer`, on uvloop, as ``kiln serve``
runs it) answers ``--requests`` identical single-row ``instances`` requests from a client thread
on one keep-alive connection (with ``--api grpc``: the real `GrpcApi` over `kiln.serve.http2`, the same
row as a Predict call, one call after another on one HTTP/2 connection); ``sys.settrace`` opcode events are counted on the worker's thread
only (C code such as the runner's NumPy kernels, httptools and uvloop counts nothing).
With ``--bare`` the same is counted for bench/serve_bare.py's handler, the floor.

    python bench/serve_opcodes.py [--model mlp] [--requests 300] [--top 25] [--bare] [--api rest|grpc]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


class Counting:
    """A ``sys.settrace`` tracer counting opcode events by (file, function)."""

    def __init__(self):
        self.counts: Counter = Counter()
        self.on = False

    def trace(self, frame, event, arg):
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        if event == "opcode" and self.on:
            code = frame.f_code
            self.counts[code.co_filename, code.co_name] += 1
        return self.trace


def _kiln_worker(base: Path, sock: socket.socket, ready: threading.Event, tracer: Counting, api: str = "rest"):
    from kiln.serve.config import ModelSpec
    from kiln.serve.grpc_service import GrpcApi
    from kiln.serve.http import Limits
    from kiln.serve.metrics import Metrics
    from kiln.serve.models import ModelManager
    from kiln.serve.rest import RestApi
    from kiln.serve.server import _cap_blas_threads, _new_loop
    from kiln.serve.service import Service

    _cap_blas_threads(1)
    specs = [ModelSpec("model", str(base))]
    manager = ModelManager(specs, metrics=Metrics(s.name for s in specs))
    manager.poll_once()
    service = Service(manager, 30.0)
    loop = _new_loop()
    asyncio.set_event_loop(loop)

    async def main():
        front = GrpcApi(service, Limits()).server() if api == "grpc" else RestApi(service).server(Limits())
        await front.start(sock)
        ready.set()
        await asyncio.Event().wait()

    sys.settrace(tracer.trace)
    loop.run_until_complete(main())


def _bare_worker(base: Path, sock: socket.socket, ready: threading.Event, tracer: Counting):
    import serve_bare

    sys.settrace(tracer.trace)
    threading.Timer(2.0, ready.set).start()  # it has no readiness signal; loading takes well under 2 s
    serve_bare.serve(str(base / "1" / "model.tflite"), sock, "kiln")


def _exchange(conn: socket.socket, request: bytes) -> bytes:
    conn.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    while len(rest) < length:
        rest += conn.recv(65536)
    return head + b"\r\n\r\n" + rest


def _grpc_exchange(conn: socket.socket, message: bytes, stream: int) -> bytes:
    """One Predict call over HTTP/2; the frames that answered it."""
    from serve_bench import grpc_call_frames

    conn.sendall(grpc_call_frames(message, stream))
    data = b""
    while True:
        data += conn.recv(65536)
        at = 0
        while len(data) - at >= 9:
            size = int.from_bytes(data[at:at + 3], "big")
            if data[at + 3] == 1 and data[at + 4] & 1 and int.from_bytes(data[at + 5:at + 9], "big") == stream:
                return data
            at += 9 + size


def count(base: Path, body: bytes, requests: int, bare: bool, api: str = "rest") -> tuple[Counter, bytes]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    sock.setblocking(False)
    port = sock.getsockname()[1]
    tracer, ready = Counting(), threading.Event()
    worker = _bare_worker if bare else _kiln_worker
    threading.Thread(target=worker, args=(base, sock, ready, tracer) + ((api,) if api == "grpc" else ()),
                     daemon=True).start()
    ready.wait(120)
    if api == "grpc":
        import serve_bench
        from kiln.runtime import served
        from hyperframe.frame import SettingsFrame

        serve_bench.INPUT_NAME[0] = next(iter(served.open(base / "1" / "model.tflite").signature().inputs))
        message = serve_bench.predict_message(body)
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(serve_bench.PREFACE + SettingsFrame(0).serialize())
            for stream in range(1, 401, 2):
                answer = _grpc_exchange(conn, message, stream)
            tracer.on = True
            for stream in range(401, 401 + 2 * requests, 2):
                _grpc_exchange(conn, message, stream)
            tracer.on = False
        return tracer.counts, answer
    request = (b"POST /v1/models/model:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    with socket.create_connection(("127.0.0.1", port)) as conn:
        for _ in range(200):  # warm: caches filled, specialized bytecode settled
            answer = _exchange(conn, request)
        tracer.on = True
        for _ in range(requests):
            _exchange(conn, request)
        tracer.on = False
    return tracer.counts, answer


def _module(filename: str) -> str:
    path = Path(filename)
    for anchor in ("kiln", "bench"):
        if anchor in path.parts:
            return "/".join(path.parts[path.parts.index(anchor):])
    return path.name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--bare", action="store_true", help="count bench/serve_bare.py's handler instead")
    parser.add_argument("--api", choices=("rest", "grpc"), default="rest")
    parser.add_argument("--base", type=Path, help="a model base path already built (skips TensorFlow)")
    args = parser.parse_args()
    if args.base is None:
        from serve_bench import build

        args.base, _ = build(Path(tempfile.mkdtemp(prefix="kiln-serve-opcodes-")), args.model)
        print(f"model base path: {args.base} (pass --base to reuse it)")
    shape = (16,) if args.model == "mlp" else (32, 32, 3)
    row = np.random.default_rng(0).standard_normal(shape).astype(np.float32).round(3)
    body = json.dumps({"instances": [row.tolist()]}).encode()
    counts, answer = count(args.base, body, args.requests, args.bare, args.api)
    assert answer.startswith(b"HTTP/1.1 200") or answer.endswith(b"grpc-status\x010"), answer[-200:]
    n = args.requests
    total = sum(counts.values())
    print(f"{'bare-bones server' if args.bare else 'kiln serve'}: {total / n:,.0f} bytecodes per request "
          f"({n} requests)")
    modules: Counter = Counter()
    for (filename, _), c in counts.items():
        modules[_module(filename)] += c
    print("\nby module:")
    for name, c in modules.most_common():
        if c / n >= 1:
            print(f"  {c / n:8.1f}  {name}")
    print(f"\ntop {args.top} functions:")
    for (filename, func), c in counts.most_common(args.top):
        print(f"  {c / n:8.1f}  {_module(filename)}:{func}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
