"""gRPC's transport (kiln/serve/h2.py) over real sockets: HPACK against RFC 7541's examples, a call
admitted or refused from its first DATA frame (before the rest of its message is sent), and the
protocol's other paths (PING, CONTINUATION, padding, RST_STREAM, gzip, a client that is not HTTP/2)."""

from __future__ import annotations

import socket
import struct
import time

import numpy as np
import pytest

from kiln.serve.h2 import (
    CONTINUATION, DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, PADDED, PING, PREFACE, RST_STREAM, SETTINGS,
    WINDOW_UPDATE, Decoder, frame, literal,
)

from .conftest import free_port, one_model_dir, rows

grpc = pytest.importorskip("grpc")
pytest.importorskip("tensorflow_serving.apis.predict_pb2")
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc  # noqa: E402

PATH = b"/tensorflow.serving.PredictionService/Predict"


def test_hpack_decodes_rfc_7541s_request_examples():
    """Appendix C.3 (literals) and C.4 (Huffman-coded), three requests each on one connection's table."""
    want = [{b":method": b"GET", b":scheme": b"http", b":path": b"/", b":authority": b"www.example.com"},
            {b":method": b"GET", b":scheme": b"http", b":path": b"/", b":authority": b"www.example.com",
             b"cache-control": b"no-cache"},
            {b":method": b"GET", b":scheme": b"https", b":path": b"/index.html", b":authority": b"www.example.com",
             b"custom-key": b"custom-value"}]
    for blocks in (["828684410f7777772e6578616d706c652e636f6d", "828684be58086e6f2d6361636865",
                    "828785bf400a637573746f6d2d6b65790c637573746f6d2d76616c7565"],
                   ["828684418cf1e3c2e5f23a6ba0ab90f4ff", "828684be5886a8eb10649cbf",
                    "828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf"]):
        decoder = Decoder()
        assert [decoder.decode(bytes.fromhex(b)) for b in blocks] == want
        assert decoder.size == 164  # the table after the third request, as the RFC gives it
    from kiln.serve.h2 import CompressionError

    for bad in ("80", "c0", "418cf1e3c2e5f23a6ba0ab90f4", "3fe21f"):  # index 0, past the table, cut short, size > 4096
        with pytest.raises(CompressionError):
            Decoder().decode(bytes.fromhex(bad))


def _message(model: str, x: np.ndarray) -> bytes:
    from kiln.serve import grpc_api

    request = grpc_api.messages()["PredictRequest"]()
    request.model_spec.name = model
    tensor = request.inputs["x"]
    tensor.dtype = 1
    for d in x.shape:
        tensor.tensor_shape.dim.add(size=d)
    tensor.tensor_content = x.astype(np.float32).tobytes()
    return request.SerializeToString()


class Raw:
    """A bare HTTP/2 client connection: frames out, frames in (type, flags, stream, payload)."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
        self.buffer = b""
        self.decoder = Decoder()

    def send(self, *frames: bytes) -> None:
        self.sock.sendall(b"".join(frames))

    def frames(self, until, timeout: float = 10.0) -> list:
        """Frames read until ``until(frame)`` is true for one of them (or the connection closes)."""
        got, deadline = [], time.monotonic() + timeout
        while time.monotonic() < deadline:
            while len(self.buffer) >= 9:
                size = int.from_bytes(self.buffer[:3], "big")
                if len(self.buffer) < 9 + size:
                    break
                kind, flags, sid = self.buffer[3], self.buffer[4], int.from_bytes(self.buffer[5:9], "big")
                one = (kind, flags, sid, self.buffer[9:9 + size])
                self.buffer = self.buffer[9 + size:]
                if kind == HEADERS:
                    one = (kind, flags, sid, self.decoder.decode(one[3]))
                got.append(one)
                if until(one):
                    return got
            data = self.sock.recv(1 << 20)
            if not data:
                return got + [("closed",)]
            self.buffer += data
        raise AssertionError(f"no such frame in {got}")

    def ended(self, sid: int) -> list:
        return self.frames(lambda f: f[0] in (HEADERS, RST_STREAM) and f[2] == sid and f[1] & END_STREAM)


def _headers(sid: int, flags: int = END_HEADERS, path: bytes = PATH) -> bytes:
    block = b"\x83\x86" + literal(b":path", path) + literal(b"content-type", b"application/grpc")
    return frame(HEADERS, flags, sid, block)


@pytest.fixture
def raw_server(serve, models, tmp_path):
    port = free_port()
    server = serve("--model_base_path", str(one_model_dir(tmp_path, models["one_v1"])), "--model_name", "one",
                   "--port", str(port), "--request_body_budget_bytes", "6000000", "--max_request_bytes", "5000000")
    return server, port


def test_a_message_is_admitted_or_refused_from_its_first_frame(raw_server):
    """The 5-byte prefix declares the size: past --max_request_bytes or the memory budget the call is
    answered (and the client told to stop, RST_STREAM NO_ERROR) while the client has sent only its first
    frame; an admitted message gets a window of its size at once; both are counted."""
    server, port = raw_server
    x = rows(1)
    head = _message("one", x)[:100]
    conn = Raw(port)
    for sid, size, code, text in ((1, 60 << 20, "8", b"Received message larger than max (62914560 vs. 5000000)"),
                                  (3, 4_900_000, None, None)):
        conn.send(_headers(sid), frame(DATA, 0, sid, b"\x00" + size.to_bytes(4, "big") + head))
        if code is not None:
            block = conn.ended(sid)[-1][3]
            assert block[b"grpc-status"] == code.encode() and text in block[b"grpc-message"]
            assert conn.frames(lambda f: f[0] == RST_STREAM)[-1][2:] == (sid, struct.pack(">L", 0))  # NO_ERROR
        else:  # admitted: the rest of it may come
            got = conn.frames(lambda f: f[0] == WINDOW_UPDATE and f[2] == sid)
            assert int.from_bytes(got[-1][3], "big") == size + 5
    other = Raw(port)  # the budget now holds 4.9 MB of stream 3: a second such message does not fit
    other.send(_headers(1), frame(DATA, 0, 1, b"\x00" + (4_900_000).to_bytes(4, "big") + head))
    got = other.ended(1)
    block = next(f[3] for f in got if f[0] == HEADERS)
    assert block[b"grpc-status"] == b"14" and block[b"grpc-message"].startswith(b"OOM when allocating the PredictRequest")
    conn.send(frame(RST_STREAM, 0, 3, struct.pack(">L", 8)))  # cancelled: its room is given back
    time.sleep(0.2)
    message = _message("one", x)
    other.send(_headers(3), frame(DATA, END_STREAM, 3, b"\x00" + len(message).to_bytes(4, "big") + message))
    assert next(f for f in other.ended(3) if f[0] == HEADERS and f[1] & END_STREAM)[3][b"grpc-status"] == b"0"
    time.sleep(0.2)
    assert server.metric("kiln_serve_requests_total", model="one", code="413") == 1
    assert server.metric("kiln_serve_requests_total", model="one", code="503") == 1


def test_protocol_paths(raw_server):
    server, port = raw_server
    x = rows(2, seed=3)
    message = _message("one", x)
    body = b"\x00" + len(message).to_bytes(4, "big") + message
    conn = Raw(port)
    conn.send(frame(PING, 0, 0, b"12345678"))
    assert conn.frames(lambda f: f[0] == PING)[-1][1:] == (1, 0, b"12345678")
    # headers split over CONTINUATION frames, the message over padded DATA frames
    block = b"\x83\x86" + literal(b":path", PATH) + literal(b"content-type", b"application/grpc") + literal(
        b"grpc-timeout", b"10S")
    conn.send(frame(HEADERS, 0, 1, block[:7]), frame(CONTINUATION, 0, 1, block[7:20]),
              frame(CONTINUATION, END_HEADERS, 1, block[20:]),
              frame(DATA, PADDED, 1, b"\x03" + body[:3] + b"\x00" * 3), frame(DATA, END_STREAM, 1, body[3:]))
    got = conn.ended(1)
    answer = b"".join(f[3] for f in got if f[0] == DATA and f[2] == 1)
    response = predict_pb2.PredictResponse.FromString(answer[5:])
    rest = server.predict("one", {"instances": x.tolist()}).json()["predictions"]
    np.testing.assert_array_equal(np.frombuffer(response.outputs["y"].tensor_content, np.float32).reshape(2, 3),
                                  np.float32(rest))
    assert got[-1][3][b"grpc-status"] == b"0"
    # a call reset by its client before its message is whole: no answer, the connection goes on
    conn.send(_headers(3), frame(DATA, 0, 3, body[:10]), frame(RST_STREAM, 0, 3, struct.pack(">L", 8)),
              _headers(5, END_HEADERS | END_STREAM, b"/tensorflow.serving.PredictionService/Nope"))
    got = conn.ended(5)
    assert not [f for f in got if f[2] == 3] and got[-1][3][b"grpc-status"] == b"12"
    # frames on a stream the client may not open: the connection ends with GOAWAY PROTOCOL_ERROR
    conn.send(frame(DATA, 0, 9, b"x"))
    got = conn.frames(lambda f: f[0] == GOAWAY)
    assert got[-1][3][4:8] == struct.pack(">L", 1)
    # an HTTP/1 request on the gRPC port: GOAWAY and the connection closed
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        assert b"not HTTP/2" in data
    # gzip-compressed messages from grpcio's client
    with grpc.insecure_channel(f"127.0.0.1:{port}", compression=grpc.Compression.Gzip) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        request = predict_pb2.PredictRequest.FromString(message)
        got = stub.Predict(request, timeout=10)
        np.testing.assert_array_equal(np.frombuffer(got.outputs["y"].tensor_content, np.float32).reshape(2, 3),
                                      np.float32(rest))
    assert server.get("/healthz").status_code == 200
