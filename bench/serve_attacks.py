"""``kiln serve`` under hostile and heavy clients (issue #31): for each attack, the p50 / p99 latency of a
well-behaved 1-row client (REST and gRPC, one request after another) while the attack runs, the server's peak
resident memory (all its processes) and the load average. Run through ``python bench/serve_bench.py --attacks``
(the same MLP model, ``--workers 1 2``).

Attacks: none (the baseline); 1,100 sockets held from another address (127.0.0.2), 200 of them with half-sent
headers; 4 concurrent REST bodies of 57 MiB (rows of objects); 8 concurrent gRPC calls of 60 MiB; 64 connections
sending malformed and deeply nested JSON as fast as they are answered.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import numpy as np

from serve_bench import Server, _server_pids


def _peak_reset(pids) -> None:
    for pid in pids:
        try:
            Path(f"/proc/{pid}/clear_refs").write_text("5")
        except OSError:
            pass


def _memory(pids, key: str) -> int:
    total = 0
    for pid in pids:
        try:
            total += next(int(line.split()[1]) << 10 for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                          if line.startswith(key + ":"))
        except (OSError, StopIteration):
            pass
    return total


def _held_sockets(port: int, stop: threading.Event, note: list) -> None:
    held = []
    for i in range(1100):
        s = socket.socket()
        s.bind(("127.0.0.2", 0))
        try:
            s.connect(("127.0.0.1", port))
            if i < 200:
                s.sendall(b"POST /v1/models/model:predict HTTP/1.1\r\nHost: x\r\n")
            held.append(s)
        except OSError:
            s.close()
    note.append(f"{len(held)} sockets held")
    stop.wait()
    for s in held:
        s.close()


def _big_rest(port: int, stop: threading.Event, note: list, width: int, name: str) -> None:
    import requests

    x = np.random.default_rng(1).standard_normal((430_000 * 6 // width, width)).astype(np.float32)
    body = json.dumps({"instances": [{name: r.tolist()} for r in x]}).encode()
    codes = []
    threads = [threading.Thread(target=lambda: codes.append(requests.post(
        f"http://127.0.0.1:{port}/v1/models/model:predict", data=body, timeout=600).status_code)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    note.append(f"4 x {len(body) / 2**20:.0f} MiB: {codes}")


def _big_grpc(port: int, stop: threading.Event, note: list, width: int, name: str) -> None:
    import grpc

    from kiln.serve import grpc_api

    request = grpc_api.messages()["PredictRequest"]()
    request.model_spec.name = "model"
    x = np.zeros(((60 << 20) // (4 * width), width), np.float32)
    tensor = request.inputs[name]
    tensor.dtype = 1
    for d in x.shape:
        tensor.tensor_shape.dim.add(size=d)
    tensor.tensor_content = x.tobytes()
    data = request.SerializeToString()
    codes = []
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        call = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")

        def one():
            try:
                call(data, timeout=600)
                codes.append("OK")
            except grpc.RpcError as exc:
                codes.append(exc.code().name)

        threads = [threading.Thread(target=one) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    note.append(f"8 x {len(data) / 2**20:.0f} MiB: " + ", ".join(f"{codes.count(c)} {c}" for c in sorted(set(codes))))


def _malformed(port: int, stop: threading.Event, note: list) -> None:
    bodies = [b'{"instances": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", b'{"instances": [[1, 2, "x"]]}',
              b'{"inputs": {"x": [' + b'{"a":' * 990 + b"1" + b"}" * 990 + b"]}}", b"\xff\xfe", b'{"instances": [[1e400]]}']
    counts = {}

    def client(i):
        with socket.create_connection(("127.0.0.1", port)) as s:
            while not stop.is_set():
                body = bodies[i % len(bodies)]
                s.sendall(b"POST /v1/models/model:predict HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                          % (len(body), body))
                answer = s.recv(65536)
                code = answer[9:12].decode()
                counts[code] = counts.get(code, 0) + 1
                if b"Connection: close" in answer or not answer:
                    return

    threads = [threading.Thread(target=client, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    note.append(", ".join(f"{n} x {c}" for c, n in sorted(counts.items())))


def _probe(server, name: str, row: np.ndarray, attack, seconds: float) -> dict:
    """The 1-row clients' latencies while ``attack`` runs (at least ``seconds``), and the peak memory."""
    import grpc
    import requests

    from kiln.serve import grpc_api

    request = grpc_api.messages()["PredictRequest"]()
    request.model_spec.name = "model"
    tensor = request.inputs[name]
    tensor.dtype = 1
    for d in (1, *row.shape):
        tensor.tensor_shape.dim.add(size=d)
    tensor.tensor_content = row.tobytes()
    data = request.SerializeToString()
    body = json.dumps({"instances": [row.tolist()]}).encode()
    pids = _server_pids(server.proc.pid)
    rest, rpc, note, stop = [], [], [], threading.Event()
    with requests.Session() as s, grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        call = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")
        for _ in range(20):
            s.post(server.url, data=body)
            call(data, timeout=10)
        before = _memory(pids, "VmRSS")
        _peak_reset(pids)
        thread = threading.Thread(target=attack, args=(stop, note))
        thread.start()
        start = time.monotonic()
        loads = []
        while thread.is_alive() or time.monotonic() - start < seconds:
            if time.monotonic() - start >= seconds and not stop.is_set():
                stop.set()
            began = time.perf_counter()
            ok = s.post(server.url, data=body, timeout=30).status_code == 200
            rest.append(time.perf_counter() - began if ok else float("inf"))
            began = time.perf_counter()
            call(data, timeout=30)
            rpc.append(time.perf_counter() - began)
            loads.append(os.getloadavg()[0])
            time.sleep(0.005)
        thread.join()
    peak = _memory(pids, "VmHWM") - before
    rest, rpc = np.sort(rest) * 1e3, np.sort(rpc) * 1e3
    return {"rest": (np.percentile(rest, 50), np.percentile(rest, 99)), "grpc": (np.percentile(rpc, 50),
            np.percentile(rpc, 99)), "n": len(rest), "peak MiB": peak / 2**20, "load": float(np.median(loads)),
            "attack": "; ".join(note)}


def attacks(base: Path, shape: tuple, args, name: str) -> int:
    """The table, for ``args.workers``; ``name``: the model's input."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    width = int(np.prod(shape))
    row = np.random.default_rng(0).standard_normal(shape).astype(np.float32).round(3)
    plan = [("none", lambda port, gport: (lambda stop, note: stop.wait())),
            ("1,100 sockets held (200 half-sent)", lambda port, gport: lambda stop, note: _held_sockets(port, stop, note)),
            ("4 REST bodies of 57 MiB", lambda port, gport: lambda stop, note: _big_rest(port, stop, note, width, name)),
            ("8 gRPC calls of 60 MiB", lambda port, gport: lambda stop, note: _big_grpc(gport, stop, note, width, name)),
            ("64 connections of malformed JSON", lambda port, gport: lambda stop, note: _malformed(port, stop, note))]
    print(f"{'attack':<36} {'workers':>7} {'REST p50/p99 ms':>16} {'gRPC p50/p99 ms':>16} {'n':>5} {'peak MiB':>8} "
          f"{'load':>5}  attacker's answers")
    for workers in args.workers:
        server = Server(base, args.backends[0], workers, None, ("--max_connections_per_client", "256"))
        server.url = f"http://127.0.0.1:{server.port}/v1/models/model:predict"
        try:
            for label, make in plan:
                r = _probe(server, name, row, make(server.port, server.grpc_port), args.seconds)
                print(f"{label:<36} {workers:>7} {r['rest'][0]:>7.1f} / {r['rest'][1]:<6.1f} {r['grpc'][0]:>7.1f} / "
                      f"{r['grpc'][1]:<6.1f} {r['n']:>5} {r['peak MiB']:>8.0f} {r['load']:>5.1f}  {r['attack']}",
                      flush=True)
        finally:
            server.stop()
    return 0
