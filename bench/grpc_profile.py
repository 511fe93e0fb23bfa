"""Where a 1-row gRPC Predict's server CPU goes (issue #31), unprofiled, in one process without sockets.

    python bench/grpc_profile.py [--calls 20000]

Prints, for the MLP of bench/serve_bench.py:
- split: a worker's `kiln.serve.http2` connection fed one call's frames at a time (HEADERS with HPACK-indexed
  headers, DATA with END_STREAM, as a warm client sends them), each `h2` method it calls timed, and the
  application (`GrpcApi.handle`); REST's whole request the same way (`data_received` of one request);
- streams: `h2` alone per call while 0 / 63 / 255 / 1023 other streams stay open on the connection (its walk
  over the connection's streams for every new one);
- nghttp2: the same calls answered by libnghttp2 (C, the system's libnghttp2.so.14) through ctypes, a
  measurement of what a C HTTP/2 library costs driven from Python, not a transport kiln uses.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import ctypes
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import serve_bench as sb  # noqa: E402


class _Transport:
    """What a connection writes, kept (no socket: the split leaves out the syscalls)."""

    def __init__(self):
        self.out = []

    def get_extra_info(self, name):
        return None

    def write(self, data):
        self.out.append(data)

    def writelines(self, pieces):
        self.out.append(b"".join(pieces))

    def close(self):
        pass

    def is_closing(self):
        return False

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass


def _client(message: bytes):
    """(the client's first bytes, frames(stream) of a call, a HEADERS block alone) as a warm client sends them."""
    from hpack import Encoder
    from hyperframe.frame import SettingsFrame, WindowUpdateFrame

    encoder = Encoder()
    first = sb._call_frames(encoder.encode(sb._HEADERS), message)
    frames = sb._call_frames(encoder.encode(sb._HEADERS), message)
    hello = (sb.PREFACE + SettingsFrame(0, settings={SettingsFrame.INITIAL_WINDOW_SIZE: 1 << 30}).serialize() +
             WindowUpdateFrame(0, window_increment=(1 << 30) - 65535).serialize())
    return hello + first(1), frames, encoder.encode(sb._HEADERS)


def split(base: Path, row: np.ndarray, calls: int) -> None:
    from kiln.serve.budget import MemoryBudget
    from kiln.serve.config import ModelSpec
    from kiln.serve.grpc_service import GrpcApi
    from kiln.serve.http import Limits
    from kiln.serve.metrics import Metrics
    from kiln.serve.models import ModelManager
    from kiln.serve.rest import RestApi
    from kiln.serve.service import Service

    limits, specs = Limits(), [ModelSpec("model", str(base))]
    manager = ModelManager(specs, "kiln", None, None, None, Metrics(s.name for s in specs), False, 256, True)
    manager.poll_once()
    service = Service(manager, 30.0, MemoryBudget(limits.body_budget_bytes))
    body = json.dumps({"instances": row[None].tolist()}).encode()
    hello, frames, _ = _client(sb.predict_message(body))
    request = (b"POST /v1/models/model:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

    async def run():
        api = GrpcApi(service, limits)
        server = api.server()
        server.loop = asyncio.get_running_loop()
        conn, transport = server.protocol(), _Transport()
        conn.connection_made(transport)
        conn.data_received(hello)
        spent, clock = collections.Counter(), time.perf_counter

        def timed(name, method):
            def call(*args, **kwargs):
                start = clock()
                try:
                    return method(*args, **kwargs)
                finally:
                    spent[name] += clock() - start
            return call

        for name in ("receive_data", "send_headers", "send_data", "acknowledge_received_data", "data_to_send",
                     "local_flow_control_window"):
            setattr(conn.h2, name, timed(f"h2.{name}", getattr(conn.h2, name)))
        api.handle = timed("application (GrpcApi.handle)", api.handle)
        stream, whole = 1, {}
        for repeat in range(2):  # the first warms up
            spent.clear()
            start = clock()
            for _ in range(calls):
                stream += 2
                conn.data_received(frames(stream))
            whole = {"all": (clock() - start) / calls * 1e6, **{k: v / calls * 1e6 for k, v in spent.items()}}
        answers = {len(w) for w in transport.out[-calls:]}  # one write per call: the same answer (+ WINDOW_UPDATE)
        assert len(transport.out) >= 2 * calls and answers <= {min(answers), min(answers) + 13}, answers
        h2 = sum(v for k, v in whole.items() if k.startswith("h2."))
        print(f"gRPC, one call per read: {whole['all']:.1f} us per call; h2 {h2:.1f}, application "
              f"{whole['application (GrpcApi.handle)']:.1f}, kiln's transport "
              f"{whole['all'] - h2 - whole['application (GrpcApi.handle)']:.1f}")
        for name, value in sorted(whole.items(), key=lambda kv: -kv[1])[1:]:
            print(f"    {name:<32} {value:6.1f} us")
        rest = RestApi(service, None).server(limits)
        rest.loop = asyncio.get_running_loop()
        conn, transport = rest.protocol(), _Transport()
        conn.connection_made(transport)
        for repeat in range(2):
            start = clock()
            for _ in range(calls):
                conn.data_received(request)
        assert transport.out[-1].startswith(b"HTTP/1.1 200")
        print(f"REST, one request per read: {(clock() - start) / calls * 1e6:.1f} us per request")

    asyncio.run(run())
    manager.close(drain=True, timeout=0)


def streams(calls: int) -> None:
    from h2.connection import H2Connection
    from h2.events import DataReceived
    from h2.settings import SettingCodes, Settings
    from hyperframe.frame import HeadersFrame

    from kiln.serve import http2

    for held in (0, 63, 255, 1023):
        hello, frames, block = _client(b"\x0a\x07\x0a\x05model" + b"x" * 80)
        h2 = H2Connection(http2.CONFIG)
        h2.decoder, h2.encoder = http2._Decoder(h2.decoder.max_header_list_size), http2._Encoder()
        h2.local_settings = Settings(client=False, initial_values={SettingCodes.MAX_CONCURRENT_STREAMS: 1024})
        h2.initiate_connection()
        h2.increment_flow_control_window((1 << 20) - 65535)
        h2.receive_data(hello)
        h2.send_headers(1, http2._OK, end_stream=True)  # the first call answered
        stream = 1
        for _ in range(held):  # calls whose message has not come
            stream += 2
            h2.receive_data(HeadersFrame(stream, block, flags=["END_HEADERS"]).serialize())
        h2.data_to_send()
        start = time.perf_counter()
        for _ in range(calls // 4):
            stream += 2
            for event in h2.receive_data(frames(stream)):
                if event.__class__ is DataReceived:
                    h2.acknowledge_received_data(event.flow_controlled_length, stream)
            h2.send_headers(stream, http2._HEAD)
            h2.send_data(stream, b"\0\0\0\0\x3c" + b"y" * 60)
            h2.send_headers(stream, http2._OK, end_stream=True)
            h2.data_to_send()
        print(f"h2 alone, {held:4d} other streams open: {(time.perf_counter() - start) / (calls // 4) * 1e6:6.1f} us per call")


class _NV(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_char_p), ("namelen", ctypes.c_size_t),
                ("valuelen", ctypes.c_size_t), ("flags", ctypes.c_uint8)]


class _FrameHead(ctypes.Structure):
    _fields_ = [("length", ctypes.c_size_t), ("stream_id", ctypes.c_int32), ("type", ctypes.c_uint8),
                ("flags", ctypes.c_uint8), ("reserved", ctypes.c_uint8)]


_READ = ctypes.CFUNCTYPE(ctypes.c_ssize_t, ctypes.c_void_p, ctypes.c_int32, ctypes.POINTER(ctypes.c_uint8),
                         ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint32), ctypes.c_void_p, ctypes.c_void_p)


class _Provider(ctypes.Structure):
    _fields_ = [("source", ctypes.c_void_p), ("read_callback", _READ)]


def nghttp2(calls: int) -> None:
    C = ctypes
    try:
        lib = C.CDLL("libnghttp2.so.14")
    except OSError as exc:
        print(f"nghttp2: not measured ({exc})")
        return
    lib.nghttp2_session_mem_recv.restype = lib.nghttp2_session_mem_send.restype = C.c_ssize_t
    lib.nghttp2_session_mem_recv.argtypes = [C.c_void_p, C.c_char_p, C.c_size_t]
    lib.nghttp2_session_mem_send.argtypes = [C.c_void_p, C.POINTER(C.c_void_p)]
    lib.nghttp2_submit_response.argtypes = [C.c_void_p, C.c_int32, C.POINTER(_NV), C.c_size_t, C.POINTER(_Provider)]
    lib.nghttp2_submit_trailer.argtypes = [C.c_void_p, C.c_int32, C.POINTER(_NV), C.c_size_t]

    def nvs(pairs):
        array = (_NV * len(pairs))()
        for i, (k, v) in enumerate(pairs):
            array[i].name, array[i].value, array[i].namelen, array[i].valuelen = k, v, len(k), len(v)
        return array

    head, ok, answer = nvs([(b":status", b"200"), (b"content-type", b"application/grpc")]), nvs([(b"grpc-status", b"0")]), \
        b"\0\0\0\0\x3c" + b"y" * 60
    paths, ended, pending = {}, [], {}

    def on_header(session, frame, name, namelen, value, valuelen, flags, user):
        if name[:namelen] == b":path":
            paths[frame[0].stream_id] = value[:valuelen]
        return 0

    def on_chunk(session, flags, stream, data, length, user):
        pending[stream] = data[:length]  # the request's message (the application would parse it)
        return 0

    def on_frame(session, frame, user):
        if frame[0].flags & 1 and frame[0].type in (0, 1):  # END_STREAM on DATA or HEADERS: the call is whole
            ended.append(frame[0].stream_id)
        return 0

    def read(session, stream, buffer, length, flags, source, user):
        C.memmove(buffer, answer, len(answer))
        flags[0] = 0x01 | 0x02  # EOF, NO_END_STREAM: the trailers end the stream
        lib.nghttp2_submit_trailer(session, stream, ok, 1)
        return len(answer)

    callbacks = [C.CFUNCTYPE(C.c_int, C.c_void_p, C.POINTER(_FrameHead), C.c_void_p)(on_frame),
                 C.CFUNCTYPE(C.c_int, C.c_void_p, C.POINTER(_FrameHead), C.POINTER(C.c_char), C.c_size_t,
                             C.POINTER(C.c_char), C.c_size_t, C.c_uint8, C.c_void_p)(on_header),
                 C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_uint8, C.c_int32, C.POINTER(C.c_char), C.c_size_t,
                             C.c_void_p)(on_chunk)]
    table, session = C.c_void_p(), C.c_void_p()
    lib.nghttp2_session_callbacks_new(C.byref(table))
    lib.nghttp2_session_callbacks_set_on_frame_recv_callback(table, callbacks[0])
    lib.nghttp2_session_callbacks_set_on_header_callback(table, callbacks[1])
    lib.nghttp2_session_callbacks_set_on_data_chunk_recv_callback(table, callbacks[2])
    lib.nghttp2_session_server_new(C.byref(session), table, None)
    lib.nghttp2_session_callbacks_del(table)
    lib.nghttp2_submit_settings(session, 0, None, 0)
    provider = _Provider(read_callback=_READ(read))
    pointer = C.c_void_p()

    def feed(data: bytes) -> bytes:
        assert lib.nghttp2_session_mem_recv(session, data, len(data)) == len(data)
        for stream in ended:
            paths.pop(stream)
            pending.pop(stream)
            lib.nghttp2_submit_response(session, stream, head, 2, C.byref(provider))
        ended.clear()
        out = []
        while (n := lib.nghttp2_session_mem_send(session, C.byref(pointer))) > 0:
            out.append(C.string_at(pointer, n))
        return b"".join(out)

    hello, frames, _ = _client(b"\x0a\x07\x0a\x05model" + b"x" * 80)
    feed(hello)
    stream = 1
    for repeat in range(2):
        start = time.perf_counter()
        for _ in range(calls):
            stream += 2
            out = feed(frames(stream))
        assert len(out) == 9 + 2 + 9 + len(answer) + 9 + 1, out  # HEADERS, DATA, trailers (indexed HPACK)
    print(f"libnghttp2 through ctypes: {(time.perf_counter() - start) / calls * 1e6:.1f} us per call (the same frames "
          f"in, headers + message + trailers out)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kiln-grpc-profile-"))
    base, shape = sb.build(work, "mlp")
    from kiln.runtime import served

    sb.INPUT_NAME[0] = next(iter(served.open(base / "1" / "model.tflite").signature().inputs))
    row = np.random.default_rng(0).standard_normal(shape).astype(np.float32).round(3)
    print(f"load average {os.getloadavg()[0]:.1f}")
    split(base, row, args.calls)
    streams(args.calls)
    nghttp2(args.calls)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
