"""A served version's `Plan` (the prepared common predict request) answers exactly as the full path:
the same status, headers and bytes, for valid, invalid and edge-case requests, sent over real
sockets to two REST front ends over one model manager, one with plans and one without."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import threading

import numpy as np
import pytest

from kiln.serve.config import ModelSpec
from kiln.serve.http import Limits
from kiln.serve.metrics import Metrics
from kiln.serve.models import ModelManager
from kiln.serve.rest import INLINE_BODY_BYTES, Plan, RestApi
from kiln.serve.service import Service

from .conftest import exchange


def _bodies(rng) -> list[bytes]:
    fixed = [
        '{"instances": [[1.5, 2, 3, 4]]}', '{"instances": [[1, 2, 3, 4]]}', '{"inputs": [[0.5, 0.25, 0, -1]]}',
        '{"instances": [[1.5, 2, 3]]}', '{"instances": [[1.5, 2, 3, 4, 5]]}', '{"instances": [[[1.5, 2, 3, 4]]]}',
        '{"instances": [1.5, 2, 3, 4]}', '{"instances": []}', '{"instances": [[]]}', '{"instances": [[1.5, 2], [3]]}',
        '{"instances": [[1.5, true, 3, 4]]}', '{"instances": [[1.5, null, 3, 4]]}', '{"instances": [[1.5, "2", 3, 4]]}',
        '{"instances": [[NaN, Infinity, -Infinity, 1.0]]}', '{"instances": [[1e39, 1.0, 2.0, 3.0]]}',
        '{"instances": [[3.4028235e38, -3.4028235e38, 1e-45, -0.0]]}', '{"instances": [[1e400, 1.0, 2.0, 3.0]]}',
        '{"instances": [[100000000000000000000000000000, 0.5, 1, 2]]}', '{"instances": [[' + "7" * 1200 + ', 1, 2, 3]]}',
        '{"instances": [[1.5, 2, 3, 4]], "inputs": [[1.5, 2, 3, 4]]}', '{"instances": [[1.5, 2, 3, 4]], "signature_name": ""}',
        '{"instances": [[1.5, 2, 3, 4]], "signature_name": "serving_default"}',
        '{"instances": [[1.5, 2, 3, 4]], "signature_name": "nope"}', '{"instances": [[1.5, 2, 3, 4]], "signature_name": 3}',
        '{"instances": [{"x": [1.5, 2, 3, 4]}]}', '{"inputs": {"x": [[1.5, 2, 3, 4]]}}', '{"inputs": {"y": [[1.5]]}}',
        '[[1.5, 2, 3, 4]]', '"text"', '', '   ', '{"instances": [[1.5, 2, 3, 4]', '{"instances": [[1.5, 2, 3, 4]]} x',
        '{"instances": [[1.5, 2, 3, 4]], "instances": [[1.0]]}', '{"other": 1}', '\ufeff{"instances": [[1.5, 2, 3, 4]]}',
        '{"instances": ' + "[" * 80 + "1.5" + "]" * 80 + "}", '{"instances": [[1.5, 2, 3, 4]] }\n',
        '{"instances": [[65504.0, 65519.0, 65520.0, 1.5]]}', '{"instances": [[2.5e-5, 1e6, 1234567.0, 16777217]]}',
    ]
    out = [t.encode() for t in fixed] + ['{"instances": [[1.5, 2, 3, 4]]}'.encode("utf-16")]
    for _ in range(120):  # random rows: widths, counts, values of every size, ints and floats, both formats
        rows, width = int(rng.integers(1, 6)), int(rng.choice([4, 4, 4, 3, 5]))
        values = rng.standard_normal((rows, width)) * 10.0 ** rng.integers(-40, 40, (rows, width))
        texts = [[str(int(v)) if rng.random() < 0.2 else repr(float(v)) for v in row] for row in values]
        key = "instances" if rng.random() < 0.7 else "inputs"
        out.append(('{"%s": [%s]}' % (key, ", ".join("[" + ", ".join(r) + "]" for r in texts))).encode())
    for rows, digits in ((2000, 2), (5000, 5)):  # past the rows run on the event loop; past the body read there
        out.append(json.dumps({"instances": rng.standard_normal((rows, 4)).round(digits).tolist()}).encode())
    return out


def _exchange(port: int, request: bytes) -> bytes:
    answer = exchange(port, [request], timeout=30)
    assert b"\r\n\r\n" in answer, answer   # a whole answer, never a closed connection
    return answer


@pytest.fixture
def two_front_ends(models, tmp_path):
    """Ports of two REST front ends (with plans, without) over one manager serving one_v1 as "one"."""
    base = tmp_path / "one" / "1"
    base.mkdir(parents=True)
    shutil.copy(models["one_v1"], base / "model.tflite")
    manager = ModelManager([ModelSpec("one", str(base.parent))], metrics=Metrics(["one"]))
    manager.poll_once()
    service = Service(manager, 30.0)
    sockets = []
    for _ in range(2):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        sock.setblocking(False)
        sockets.append(sock)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    servers = [RestApi(service, plans=plans).server(Limits()) for plans in (True, False)]

    async def main():
        for sock, server in zip(sockets, servers):
            await server.start(sock)
        started.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(main()), loop.run_forever()), daemon=True)
    thread.start()
    assert started.wait(60)
    yield [s.getsockname()[1] for s in sockets], manager
    for server in servers:
        asyncio.run_coroutine_threadsafe(server.drain(0.0, "the test is over"), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    manager.close(drain=False)


def test_plan_answers_every_request_as_the_full_path(two_front_ends):
    (planned, full), manager = two_front_ends
    held = manager.acquire("one")
    try:
        plan = Plan.of(held)  # the model is of the kind a plan takes, so both paths are compared
        assert plan is not None and 1 <= plan.max_rows < 2000
    finally:
        manager.release(held)
    assert len(_bodies(np.random.default_rng(0))[-2]) <= INLINE_BODY_BYTES < len(_bodies(np.random.default_rng(0))[-1])
    statuses = set()
    for path in (b"/v1/models/one:predict", b"/v1/models/one/versions/1:predict", b"/v1/models/one/versions/7:predict",
                 b"/v1/models/nope:predict", b"/v1/models/one/labels/stable:predict"):
        for body in _bodies(np.random.default_rng(len(path))):
            request = b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (path, len(body), body)
            answer = _exchange(planned, request)
            assert answer == _exchange(full, request), (path, body)
            statuses.add(int(answer[9:12]))
    assert statuses == {200, 400, 404}  # valid and refused requests both went through the comparison
