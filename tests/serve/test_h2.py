"""gRPC's transport (kiln/serve/http2.py, on the `h2` library) over real sockets, as a stranger's client
meets it: a call admitted or refused from its first DATA frame (before the rest of its message is sent),
many calls on one connection, a client that cancels, a client that breaks HTTP/2 (GOAWAY with the
right code, the server serving everyone else), gzip from grpcio's client. Raw frames are written and
read with `hyperframe` and `hpack`."""

from __future__ import annotations

import socket
import struct
import threading
import time

import numpy as np
import pytest

from .conftest import batching_file, free_port, one_model_dir, rows

grpc = pytest.importorskip("grpc")
pytest.importorskip("tensorflow_serving.apis.predict_pb2")
from hpack import Decoder, Encoder  # noqa: E402
from hyperframe.frame import (  # noqa: E402
    ContinuationFrame, DataFrame, Frame, GoAwayFrame, HeadersFrame, PingFrame, RstStreamFrame, SettingsFrame,
    WindowUpdateFrame,
)
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc  # noqa: E402

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
PATH = "/tensorflow.serving.PredictionService/Predict"
NO_ERROR, PROTOCOL_ERROR, FRAME_SIZE_ERROR, ENHANCE_YOUR_CALM = 0, 1, 6, 11


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


def _prefixed(message: bytes) -> bytes:
    return b"\x00" + len(message).to_bytes(4, "big") + message


class Raw:
    """A bare HTTP/2 client connection: frames out, frames in (hyperframe's; a HEADERS frame's
    ``headers`` decoded by the connection's HPACK decoder)."""

    def __init__(self, port: int, hello: bytes = PREFACE + SettingsFrame(0).serialize()):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.sendall(hello)
        self.buffer = b""
        self.encoder, self.decoder = Encoder(), Decoder()

    def block(self, path: str = PATH, *more: tuple) -> bytes:
        return self.encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", path),
                                    ("content-type", "application/grpc"), *more])

    def call(self, sid: int, message: bytes, path: str = PATH) -> bytes:
        """A whole unary call: HEADERS, then its message in one DATA frame that ends the stream."""
        return (HeadersFrame(sid, self.block(path), flags=["END_HEADERS"]).serialize() +
                DataFrame(sid, _prefixed(message), flags=["END_STREAM"]).serialize())

    def send(self, *frames) -> None:
        self.sock.sendall(b"".join(f if isinstance(f, bytes) else f.serialize() for f in frames))

    def frames(self, until, timeout: float = 10.0) -> list:
        """Frames read until ``until(frame)`` is true for one of them (or the connection closes: None last)."""
        got, deadline = [], time.monotonic() + timeout
        while time.monotonic() < deadline:
            while len(self.buffer) >= 9:
                one, size = Frame.parse_frame_header(memoryview(self.buffer[:9]))
                if len(self.buffer) < 9 + size:
                    break
                one.parse_body(memoryview(self.buffer[9:9 + size]))
                self.buffer = self.buffer[9 + size:]
                if isinstance(one, HeadersFrame):
                    one.headers = dict(self.decoder.decode(one.data, raw=True))
                got.append(one)
                if until(one):
                    return got
            data = self.sock.recv(1 << 20)
            if not data:
                return got + [None]
            self.buffer += data
        raise AssertionError(f"no such frame in {got}")

    def ended(self, sid: int) -> list:
        """Frames up to the one that ends stream ``sid`` (its trailers, or a RST_STREAM)."""
        return self.frames(lambda f: f is None or f.stream_id == sid and (isinstance(f, RstStreamFrame) or
                                                             isinstance(f, HeadersFrame) and "END_STREAM" in f.flags))

    def goaway(self) -> GoAwayFrame:
        """The GOAWAY the server ends the connection with; the connection is closed after it."""
        got = self.frames(lambda f: f is None or isinstance(f, GoAwayFrame), timeout=10)
        assert self.sock.recv(1 << 16) == b""
        return next(f for f in got if isinstance(f, GoAwayFrame))


def _split(block: bytes, sid: int = 1) -> list:
    """A header block over HEADERS and as many CONTINUATION frames as 16 KiB frames need."""
    pieces = [block[at:at + 16384] for at in range(0, len(block), 16384)]
    return [HeadersFrame(sid, pieces[0])] + [ContinuationFrame(sid, p) for p in pieces[1:-1]] + [
        ContinuationFrame(sid, pieces[-1], flags=["END_HEADERS"])]


def _trailers(got: list, sid: int) -> dict:
    return next(f.headers for f in reversed(got) if isinstance(f, HeadersFrame) and f.stream_id == sid)


def _outputs(got: list, sid: int, rows_: int) -> np.ndarray:
    answer = b"".join(f.data for f in got if isinstance(f, DataFrame) and f.stream_id == sid)
    response = predict_pb2.PredictResponse.FromString(answer[5:])
    return np.frombuffer(response.outputs["y"].tensor_content, np.float32).reshape(rows_, 3)


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
    head = _message("one", rows(1))[:100]
    conn = Raw(port)
    for sid, size in ((1, 60 << 20), (3, 4_900_000)):
        conn.send(HeadersFrame(sid, conn.block(), flags=["END_HEADERS"]),
                  DataFrame(sid, b"\x00" + size.to_bytes(4, "big") + head))
        if sid == 1:
            got = conn.frames(lambda f: isinstance(f, RstStreamFrame))
            block = _trailers(got, 1)
            assert block[b"grpc-status"] == b"8"
            assert b"Received message larger than max (62914560 vs. 5000000)" in block[b"grpc-message"]
            assert (got[-1].stream_id, got[-1].error_code) == (1, NO_ERROR)
        else:  # admitted: the window for the rest of it at once
            got = conn.frames(lambda f: isinstance(f, WindowUpdateFrame) and f.stream_id == sid)
            window = 65535 - 105 + sum(f.window_increment for f in got if isinstance(f, WindowUpdateFrame)
                                       and f.stream_id == sid)
            assert window >= size - 100
    other = Raw(port)  # the budget now holds 4.9 MB of stream 3: a second such message does not fit
    other.send(HeadersFrame(1, other.block(), flags=["END_HEADERS"]),
               DataFrame(1, b"\x00" + (4_900_000).to_bytes(4, "big") + head))
    block = _trailers(other.ended(1), 1)
    assert block[b"grpc-status"] == b"14" and block[b"grpc-message"].startswith(b"OOM when allocating the PredictRequest")
    conn.send(RstStreamFrame(3, error_code=8))  # cancelled: its room is given back
    time.sleep(0.2)
    x = rows(1)
    other.send(other.call(3, _message("one", x)))
    got = other.ended(3)
    assert _trailers(got, 3)[b"grpc-status"] == b"0"
    np.testing.assert_array_equal(_outputs(got, 3, 1), np.float32(server.predict("one", {"instances": x.tolist()})
                                                                  .json()["predictions"]))
    time.sleep(0.2)
    assert server.metric("kiln_serve_requests_total", model="one", code="413") == 1
    assert server.metric("kiln_serve_requests_total", model="one", code="503") == 1


def test_many_calls_on_one_connection_in_one_write(raw_server):
    """300 calls sent at once on one connection, headers split over CONTINUATION frames and messages
    over padded DATA frames on some: every call answered with its own rows, past the connection's first
    window (the answers wait for the client's WINDOW_UPDATE)."""
    server, port = raw_server
    conn = Raw(port)
    settings = conn.frames(lambda f: isinstance(f, SettingsFrame))[-1].settings
    assert settings[SettingsFrame.MAX_CONCURRENT_STREAMS] == 1024
    x = rows(300 * 2, seed=3).reshape(300, 2, 4)
    frames = []
    for i in range(300):
        sid = 2 * i + 1
        body = _prefixed(_message("one", x[i]))
        if i % 3:
            frames.append(conn.call(sid, _message("one", x[i])))
        else:
            block = conn.block(PATH, ("grpc-timeout", "20S"))
            frames += [HeadersFrame(sid, block[:7]), ContinuationFrame(sid, block[7:20]),
                       ContinuationFrame(sid, block[20:], flags=["END_HEADERS"]),
                       DataFrame(sid, body[:3], flags=["PADDED"], pad_length=3), DataFrame(sid, body[3:], flags=["END_STREAM"])]
    conn.send(*frames)
    got, ended, taken = [], set(), 0
    while len(ended) < 300:
        more = conn.frames(lambda f: f is None or isinstance(f, HeadersFrame) and "END_STREAM" in f.flags)
        assert more[-1] is not None
        got += more
        ended.add(more[-1].stream_id)
        taken += sum(len(f.data) for f in more if isinstance(f, DataFrame))
        if taken > 32768:
            conn.send(WindowUpdateFrame(0, window_increment=taken))
            taken = 0
    want = np.float32(server.predict("one", {"instances": x.reshape(600, 4).tolist()}).json()["predictions"])
    for i in range(300):
        assert _trailers(got, 2 * i + 1)[b"grpc-status"] == b"0"
        np.testing.assert_array_equal(_outputs(got, 2 * i + 1, 2), want[2 * i:2 * i + 2])


def test_a_client_that_breaks_http2_gets_goaway_and_others_are_served(raw_server):
    """Each broken connection ends with GOAWAY and the error's code; a connection opened before them,
    and grpcio's client after them, are served."""
    server, port = raw_server
    good = Raw(port)
    good.send(PingFrame(0, opaque_data=b"12345678"))
    pong = good.frames(lambda f: isinstance(f, PingFrame))[-1]
    assert "ACK" in pong.flags and pong.opaque_data == b"12345678"
    assert Raw(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").goaway().error_code == PROTOCOL_ERROR  # HTTP/1
    x = rows(2, seed=4)
    for frames, code in ((lambda c: [c.call(1, _message("one", x)), DataFrame(9, b"x")], PROTOCOL_ERROR),  # not open
                         (lambda c: [HeadersFrame(2, c.block(), flags=["END_HEADERS"])], PROTOCOL_ERROR),  # even
                         (lambda c: [DataFrame(1, b"x" * 16385)], FRAME_SIZE_ERROR),  # past the 16 KiB default
                         # a header block that does not decode (h2 says PROTOCOL_ERROR where RFC 9113 asks
                         # COMPRESSION_ERROR: either ends the connection), headers past 64 KiB
                         (lambda c: [HeadersFrame(1, b"\xff\xff\xff\x0f", flags=["END_HEADERS"])], PROTOCOL_ERROR),
                         (lambda c: _split(c.block(PATH, ("x-big", "x" * 70_000))), ENHANCE_YOUR_CALM),
                         (lambda c: [HeadersFrame(1, c.block()), PingFrame(0)], PROTOCOL_ERROR)):  # cut headers
        bad = Raw(port)
        bad.send(*frames(bad))
        assert bad.goaway().error_code == code
    message = _message("one", x)
    good.send(good.call(1, message))
    got = good.ended(1)
    want = np.float32(server.predict("one", {"instances": x.tolist()}).json()["predictions"])
    assert _trailers(got, 1)[b"grpc-status"] == b"0"
    np.testing.assert_array_equal(_outputs(got, 1, 2), want)
    # gzip-compressed messages from grpcio's client
    with grpc.insecure_channel(f"127.0.0.1:{port}", compression=grpc.Compression.Gzip) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        answer = stub.Predict(predict_pb2.PredictRequest.FromString(message), timeout=10)
        np.testing.assert_array_equal(np.frombuffer(answer.outputs["y"].tensor_content, np.float32).reshape(2, 3), want)
    assert server.get("/healthz").status_code == 200


def test_a_call_its_client_cancels(serve, models, tmp_path):
    """A call reset before its message is whole gets no answer and its connection goes on; a call
    cancelled by grpcio's client while it waits for its batch is counted 499, and the next is served."""
    port = free_port()
    server = serve("--model_base_path", str(one_model_dir(tmp_path, models["one_v1"])), "--model_name", "one",
                   "--port", str(port), "--batching_parameters_file",
                   batching_file(tmp_path, max_batch_size=8, batch_timeout_micros=400000, num_batch_threads=1))
    x = rows(2, seed=5)
    conn = Raw(port)
    body = _prefixed(_message("one", x))
    conn.send(HeadersFrame(3, conn.block(), flags=["END_HEADERS"]), DataFrame(3, body[:10]), RstStreamFrame(3, error_code=8),
              HeadersFrame(5, conn.block("/tensorflow.serving.PredictionService/Nope"), flags=["END_HEADERS", "END_STREAM"]))
    got = conn.ended(5)
    assert not [f for f in got if f.stream_id == 3] and _trailers(got, 5)[b"grpc-status"] == b"12"
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        request = predict_pb2.PredictRequest.FromString(_message("one", x))
        pending = stub.Predict.future(request, timeout=10)
        time.sleep(0.15)
        assert pending.cancel()
        answers = []
        thread = threading.Thread(target=lambda: answers.append(stub.Predict(request, timeout=10)))
        thread.start()
        thread.join(15)
    want = np.float32(server.predict("one", {"instances": x.tolist()}).json()["predictions"])
    np.testing.assert_array_equal(np.frombuffer(answers[0].outputs["y"].tensor_content, np.float32).reshape(2, 3), want)
    deadline = time.monotonic() + 5
    while server.metric("kiln_serve_requests_total", model="one", code="499") < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.metric("kiln_serve_requests_total", model="one", code="499") == 1
