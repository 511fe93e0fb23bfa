"""The HTTP layer reads headers in one pass once they are all in (or, while they still arrive, once per
read): the header limit, Content-Length and Expect must come out as a per-header reading gives them,
whatever the case, order, count or repetition of the headers and however the bytes are split."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest

from kiln.serve.http import HttpServer, Limits, Response

from .conftest import exchange

LIMIT = 2048


def _echo(request) -> Response:
    return Response(200, json.dumps({"method": request.method, "target": request.target.decode(),
                                     "body": bytes(request.body).decode("latin-1")}).encode())


@pytest.fixture(scope="module")
def port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.setblocking(False)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    server = HttpServer(_echo, Limits(max_header_bytes=LIMIT, max_body_bytes=1000, body_budget_bytes=10_000))

    async def main():
        await server.start(sock)
        started.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(main()), loop.run_forever()), daemon=True)
    thread.start()
    assert started.wait(30)
    yield sock.getsockname()[1]
    asyncio.run_coroutine_threadsafe(server.drain(0.0, "the test is over"), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def _status(answer: bytes) -> int:
    return int(answer[9:12])


@pytest.mark.parametrize("name", [b"Content-Length", b"content-length", b"CONTENT-LENGTH", b"cOnTeNt-LeNgTh"])
@pytest.mark.parametrize("extra", [0, 1, 40])
def test_content_length_in_any_case_among_any_number_of_headers(port, name, extra):
    others = b"".join(b"X-H%d: v%d\r\n" % (i, i) for i in range(extra))
    request = b"POST /p HTTP/1.1\r\n%sHost: x\r\n%s: 5\r\n%s\r\nhello" % (others, name, others)
    answer = exchange(port, [request])
    assert _status(answer) == 200 and json.loads(answer.split(b"\r\n\r\n", 1)[1])["body"] == "hello"


def test_a_declared_body_over_the_limit_is_refused_by_its_header(port):
    answer = exchange(port, [b"POST /p HTTP/1.1\r\ncontent-LENGTH: 5000\r\n\r\n" + b"x" * 5000])
    assert _status(answer) == 413 and b"request body of 5000 bytes is larger than the limit of 1000" in answer
    assert b"Connection: close" in answer


@pytest.mark.parametrize("expect", [b"", b"Expect: 100-continue\r\n"])
def test_a_body_over_the_limit_is_answered_413_before_it_is_sent(port, expect):
    """Answered from the headers, before any of the body: with Expect: 100-continue instead of 100."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(b"POST /p HTTP/1.1\r\n%bContent-Length: 100000000\r\n\r\n" % expect)
        answer = conn.recv(1000)
        assert _status(answer) == 413 and b"larger than the limit of 1000 bytes" in answer, answer
        if not expect:  # the body may still come: it is read and dropped, so the client sees no reset
            for _ in range(100):
                conn.sendall(b"x" * 65536)
            conn.shutdown(socket.SHUT_WR)
            assert conn.recv(1000) == b""  # then closed in order


def test_a_chunked_body_growing_past_the_limit_is_answered_413_at_once(port):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(b"POST /p HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n" + b"x" * 2048 + b"\r\n")
        answer = conn.recv(1000)
        assert _status(answer) == 413 and b"larger than the limit of 1000 bytes" in answer, answer


@pytest.mark.parametrize("expect", [b"Expect: 100-continue", b"EXPECT: 100-Continue", b"expect: 100-continue"])
def test_expect_continue_in_any_case(port, expect):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(b"POST /p HTTP/1.1\r\n%s\r\nContent-Length: 2\r\n\r\n" % expect)
        assert conn.recv(100).startswith(b"HTTP/1.1 100 Continue")
        conn.sendall(b"ok")
        assert conn.recv(1000).startswith(b"HTTP/1.1 200")


def test_repeated_content_length_never_reads_a_wrong_body(port):
    for values in ((b"5", b"5"), (b"5", b"6")):
        request = b"POST /p HTTP/1.1\r\nContent-Length: %s\r\nContent-Length: %s\r\n\r\nhello!" % values
        answer = exchange(port, [request])
        assert _status(answer) in (200, 400), answer  # llhttp refuses the pair; never a 500
        if _status(answer) == 200:
            assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["body"] == "hello"


def _head(total: int) -> bytes:
    """A GET whose request line and headers count ``total`` bytes as the limit counts them (target, and
    name + value + 4 per header)."""
    target = b"/t"
    filler = total - len(target) - (len(b"Host") + len(b"x") + 4) - (len(b"X-Fill") + 4)
    return b"GET %s HTTP/1.1\r\nHost: x\r\nX-Fill: %s\r\n\r\n" % (target, b"f" * filler)


@pytest.mark.parametrize("split", [None, 7, 300])
def test_the_header_limit_to_the_byte_in_one_read_or_many(port, split):
    for total, status in ((LIMIT, 200), (LIMIT + 1, 431)):
        request = _head(total)
        pieces = [request] if split is None else [request[i:i + split] for i in range(0, len(request), split)]
        answer = exchange(port, pieces, 0.0 if split is None else 0.001)
        assert _status(answer) == status, (total, split, answer[:100])
        if status == 431:
            assert b"larger than the limit of 2048 bytes" in answer


def test_headers_that_never_end_are_cut_off_at_the_limit(port):
    """Headers arriving in many reads without an end: refused once they pass the limit, not when they end."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(b"GET /t HTTP/1.1\r\n")
        answer = b""
        for i in range(200):
            try:
                conn.sendall(b"X-Many-%d: %s\r\n" % (i, b"v" * 50))
            except OSError:  # closed by the server after its answer
                break
            time.sleep(0.002)
        conn.settimeout(5)
        while True:
            try:
                chunk = conn.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
