"""gRPC's transport: HTTP/2 by the `h2` library (python-hyper) on the worker's event loop.

Why not grpcio's server: it costs about 230 us of CPU per unary call (its completion queue and
thread handoffs) and reads a whole message before any handler sees it. Here `h2` keeps HTTP/2's
protocol (frames, HPACK, stream states, SETTINGS, PING, flow control's bookkeeping) and kiln keeps
gRPC's part: a call is read by the event loop that reads REST requests, answered from the read
callback when its handler answers at once, and admitted from its first DATA frame: gRPC's 5-byte
prefix declares the message's size, so a message over a limit or the memory budget is refused while
the client may still send only the stream's first window (HTTP/2's default, 64 KiB); an admitted
message gets a window of its size and is copied once, into room of that size.

Served: unary calls over cleartext HTTP/2 with prior knowledge (what gRPC clients speak without
TLS), identity, gzip and deflate messages, the client's deadline (grpc-timeout), cancellation
(RST_STREAM), GOAWAY when the server drains or closes an idle connection, and GOAWAY with `h2`'s
error code for a client that breaks the protocol. The application (`kiln.serve.grpc_service`) gives
``admit(call, head)``, ``handle(call)`` (an answer, an error or an awaitable of one) and ``finished(call)``.
"""

from __future__ import annotations

import asyncio
import re
import time
import zlib

from h2.config import H2Configuration
from h2.connection import ConnectionState, H2Connection
from h2.errors import ErrorCodes
from h2.events import DataReceived, RemoteSettingsChanged, RequestReceived, StreamEnded, StreamReset, WindowUpdated
from h2.exceptions import ProtocolError, StreamClosedError
from h2.settings import SettingCodes, Settings
from hpack import Decoder, Encoder, NeverIndexedHeaderTuple

from .http import HttpServer, accept

#: Headers are read as bytes (no decoding) and not checked against RFC 9113's rules: kiln reads only
#: :path, grpc-timeout and grpc-encoding, as opaque bytes, and passes no header on; its own are constants.
CONFIG = H2Configuration(client_side=False, header_encoding=None, validate_inbound_headers=False,
                         normalize_inbound_headers=False, validate_outbound_headers=False,
                         normalize_outbound_headers=False)
CONNECTION_WINDOW = 1 << 20  # what all of a connection's streams may send before the server reads it
MAX_STREAMS = 1024           # open streams per connection (SETTINGS_MAX_CONCURRENT_STREAMS)
_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
RECEIVING, HANDLING, SENDING, DONE = range(4)
_HEAD = ((b":status", b"200"), (b"content-type", b"application/grpc"))
_OK = ((b"grpc-status", b"0"),)
_TEXT_UNSAFE = re.compile(rb"[^\x20-\x24\x26-\x7e]")


class _Decoder(Decoder):
    """hpack's decoder, remembering the blocks of indexed fields only (each byte one field; they leave
    the table as it is): a warm gRPC client's request headers are such a block, the same bytes every call."""

    def __init__(self, max_header_list_size: int):
        super().__init__(max_header_list_size=max_header_list_size)
        self.known: dict = {}

    def decode(self, data, raw: bool = False):
        got = self.known.get(data)
        if got is None:
            got = super().decode(data, raw)
            if not all(b & 0x80 for b in data):
                self.known.clear()  # the table may have changed
            elif raw and len(self.known) < 64:
                self.known[data] = got
        return got


class _Encoder(Encoder):
    """hpack's encoder, remembering the header lists it wrote as indexed fields only (kiln's answer
    headers and trailers once the client's table holds them): the same bytes every call until the table changes."""

    def __init__(self):
        super().__init__()
        self.known: dict = {}

    def encode(self, headers, huffman: bool = True) -> bytes:
        key = tuple(headers)
        got = None if self.table_size_changes else self.known.get(key)  # (a size change is written first)
        if got is None:
            got = super().encode(headers, huffman)
            if not all(b & 0x80 for b in got):
                self.known.clear()  # the table may have changed
            elif len(self.known) < 16:
                self.known[key] = got
        return got


class Call:
    """One gRPC call (an HTTP/2 stream): what its headers said, its message, its state. The defaults
    are class attributes, so a call costs three stores."""

    deadline = encoding = on_gone = out = task = refusal = ticket = None
    size, filled, prefix, state, gone, admitted, message, compressed = -1, 0, b"", RECEIVING, False, False, b"", 0

    def __init__(self, sid: int, path: bytes, arrived: float):
        self.sid, self.path, self.arrived = sid, path, arrived


class GrpcServer(HttpServer):
    """Serves ``app`` over HTTP/2 on a listening socket, with REST's connection limits (per worker, per
    client, idle timeout) and drain."""

    def __init__(self, app, limits, budget):
        super().__init__(None, limits, None, budget)
        self.app = app

    def protocol(self):
        return _Connection(self)


class _Connection(asyncio.Protocol):
    def __init__(self, server: GrpcServer):
        self.server, self.app, self.limits, self.loop = server, server.app, server.limits, server.loop
        self.transport = None
        self.client = ""
        self.h2 = H2Connection(CONFIG)
        self.calls: dict[int, Call] = {}
        self.receiving = 0             # calls whose message is on its way (the read timeout runs while any is)
        self.blocked: list[Call] = []  # answers waiting for the client's windows
        self.deadline: float | None = None
        self.closed = False
        self.over_limit = ""

    # -- lifecycle -----------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        accept(self, transport)
        h2 = self.h2
        h2.decoder, h2.encoder = _Decoder(h2.decoder.max_header_list_size), _Encoder()
        h2.local_settings = Settings(client=False, initial_values={
            SettingCodes.MAX_CONCURRENT_STREAMS: MAX_STREAMS,
            SettingCodes.MAX_HEADER_LIST_SIZE: self.limits.max_header_bytes})
        h2.initiate_connection()
        h2.increment_flow_control_window(CONNECTION_WINDOW - 65535)
        self._send()
        self.deadline = time.monotonic() + (min(self.limits.idle_timeout, 1.0) if self.over_limit
                                            else self.limits.idle_timeout)

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.server.forget(self)
        self.deadline = None
        for call in list(self.calls.values()):
            self._drop(call)

    @property
    def busy(self) -> bool:
        return bool(self.calls)

    def _send(self) -> None:
        data = self.h2.data_to_send()
        if data and not self.closed:
            self.transport.write(data)

    def shut(self, code: int = 0, text: str = "") -> None:
        """GOAWAY (the streams after the last one opened were not processed: a client may retry them) and close."""
        if not self.closed:
            self.h2.close_connection(code, text.encode()[:256] or None)
            self._send()
            self.transport.close()
            self.closed = True

    def cut_off(self, message: str) -> None:
        """The drain ran out: answer every open call UNAVAILABLE ``message`` and close."""
        for call in list(self.calls.values()):
            if call.state < SENDING:
                self._answer(call, (14, message))
        self.shut()

    def _timed_out(self) -> None:
        self.deadline = None
        self.shut()

    def _settle(self) -> None:
        """After a call ends: close when draining, else start the idle clock when nothing is open."""
        if not self.calls and not self.closed:
            if self.server.draining:
                self.shut()
            else:
                self.deadline = time.monotonic() + self.limits.idle_timeout

    # -- reading -------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            events = self.h2.receive_data(data)
        except ProtocolError as exc:  # `h2` has written GOAWAY with the error's code, except for a bad preface
            if self.h2.state_machine.state is not ConnectionState.CLOSED:
                self.h2.close_connection(exc.error_code, str(exc).encode())
            self._send()
            self.transport.close()
            self.closed = True
            return
        for event in events:
            try:
                self._event(event)
            except StreamClosedError:  # a later frame of this read reset the stream: its StreamReset follows
                pass
            if self.closed:
                return
        self._send()

    def _event(self, event) -> None:
        kind = event.__class__
        if kind is DataReceived:
            self._data(event)
        elif kind is RequestReceived:
            self._request(event)
        elif kind is StreamEnded:
            call = self.calls.get(event.stream_id)
            if call is not None and call.state == RECEIVING:
                self._complete(call)
        elif kind is StreamReset:
            call = self.calls.get(event.stream_id)
            if call is not None:
                self._drop(call)
        elif (kind is WindowUpdated or kind is RemoteSettingsChanged) and self.blocked:
            self._flush()

    def _request(self, event) -> None:
        sid, now = event.stream_id, time.monotonic()
        headers = dict(event.headers)
        call = self.calls[sid] = Call(sid, headers.get(b":path", b""), now)
        if not self.receiving:
            self.deadline = now + self.limits.read_timeout  # a message must arrive within it
        self.receiving += 1
        timeout = headers.get(b"grpc-timeout")
        if timeout:
            unit = _UNITS.get(timeout[-1:])
            if unit is not None and timeout[:-1].isdigit() and len(timeout) <= 9:
                call.deadline = now + int(timeout[:-1]) * unit
        call.encoding = headers.get(b"grpc-encoding")
        call.refusal = self.over_limit or None

    def _data(self, event) -> None:
        sid, data = event.stream_id, event.data
        call = self.calls.get(sid)
        try:
            if call is not None and call.state == RECEIVING:
                self._take(call, data)
        finally:  # the connection's window (and an admitted call's) opens again; a refused call's stays shut
            self.h2.acknowledge_received_data(event.flow_controlled_length, sid)

    def _take(self, call: Call, data: bytes) -> None:
        start, stop = 0, len(data)
        if call.size < 0:  # gRPC's prefix (a flag and the message's size), maybe in pieces
            take = min(5 - len(call.prefix), stop)
            call.prefix += data[:take]
            start = take
            if len(call.prefix) < 5:
                return
            call.compressed, call.size = call.prefix[0], int.from_bytes(call.prefix[1:], "big")
            if not self._admit(call, data[start:start + 512]):
                return
            if stop - start == call.size:  # the common call: prefix and message in one frame
                call.message, call.filled = data[start:], call.size
                return
            call.message = bytearray(call.size)
            grant = call.size - (stop - start) - self.h2.remote_flow_control_window(call.sid)
            if grant > 0:  # the window to send all of it
                self.h2.increment_flow_control_window(min(grant, 0x7FFFFFFF - 65535), call.sid)
        if stop > start:
            if call.filled + stop - start > call.size:
                self._refuse(call, (3, "a unary call takes one message; more data came after it"))
                return
            call.message[call.filled:call.filled + stop - start] = memoryview(data)[start:stop]
            call.filled += stop - start

    def _admit(self, call: Call, head: bytes) -> bool:
        refusal = self.app.admit(call, head)
        if refusal is None:
            call.admitted = True
            return True
        self._refuse(call, refusal)
        return False

    def _refuse(self, call: Call, error: tuple) -> None:
        """Answer ``error`` now; a client still sending is told to stop (RST_STREAM NO_ERROR)."""
        still_sending = call.state == RECEIVING
        self._answer(call, error)
        if still_sending and not self.closed:
            try:
                self.h2.reset_stream(call.sid, ErrorCodes.NO_ERROR)
            except StreamClosedError:  # its last frame had come: nothing to stop
                return

    def _complete(self, call: Call) -> None:
        """The client's side is over: check the message and hand it to the application."""
        self._received(call)
        call.state = HANDLING
        if call.size < 0:
            call.size = len(call.prefix)  # no message (or a part of a prefix): an empty one
            if not self._admit(call, b""):
                return
        if call.filled < call.size:
            return self._refuse(call, (13, f"the message ended after {call.filled} of its {call.size} bytes"))
        if call.compressed:
            error = self._inflate(call)
            if error is not None:
                return self._refuse(call, error)
        try:
            result = self.app.handle(call)
        except Exception as exc:  # a bug in the application: answered, never a traceback to the client
            result = (13, f"Internal: {type(exc).__name__}: {exc}")
        if result.__class__ is bytes or result.__class__ is tuple or result.__class__ is list:
            self._answer(call, result)
        else:
            call.task = self.loop.create_task(self._await(call, result))

    def _received(self, call: Call) -> None:
        if call.state == RECEIVING:
            self.receiving -= 1
            if not self.receiving:
                self.deadline = None  # (the idle clock starts once no call is open)

    def _inflate(self, call: Call):
        encoding, limit = call.encoding, self.app.max_request_bytes
        if encoding not in (b"gzip", b"deflate"):
            return 12, f"Compression algorithm '{(encoding or b'').decode('latin-1')[:40]}' is not supported"
        inflater = zlib.decompressobj(31 if encoding == b"gzip" else 15)
        try:
            message = inflater.decompress(call.message, limit + 1)
        except zlib.error as exc:
            return 13, f"the message does not decompress ({encoding.decode()}): {exc}"
        if len(message) > limit or inflater.unconsumed_tail:
            return 8, f"Received message larger than max (more than {limit} bytes once decompressed)"
        call.message = message
        return None

    async def _await(self, call: Call, pending) -> None:
        try:
            result = await pending
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug in the application: answered, never a traceback to the client
            result = (13, f"Internal: {type(exc).__name__}: {exc}")
        call.task = None
        self._answer(call, result)
        self._send()

    # -- writing -------------------------------------------------------------------------------
    def _answer(self, call: Call, result) -> None:
        """Answer ``result``: a message (bytes, or its pieces in a list) or ``(code, text)``. Its frames wait in
        `h2` for `_send`: once per read, so the answers to all the calls a read brought go out in one write."""
        if call.admitted:
            call.admitted = False
            self.app.finished(call)
        if call.gone or self.closed or call.state >= SENDING:
            return
        self._received(call)
        h2, sid = self.h2, call.sid
        if result.__class__ is tuple:
            code, text = result
            text = _TEXT_UNSAFE.sub(lambda m: b"%%%02X" % m.group()[0], text.encode()[:4096])
            h2.send_headers(sid, (*_HEAD, (b"grpc-status", b"%d" % code),
                                  NeverIndexedHeaderTuple(b"grpc-message", text)), end_stream=True)
            return self._end(call)
        size = len(result) if result.__class__ is bytes else sum(map(len, result))
        prefix = b"\x00" + size.to_bytes(4, "big")
        h2.send_headers(sid, _HEAD)
        if result.__class__ is bytes and not self.blocked and \
                size + 5 <= min(h2.local_flow_control_window(sid), h2.max_outbound_frame_size):
            h2.send_data(sid, prefix + result)  # the common answer: three frames in one write
            h2.send_headers(sid, _OK, end_stream=True)
            return self._end(call)
        call.out = [memoryview(prefix)] + [memoryview(piece).cast("B") for piece in
                                           ([result] if result.__class__ is bytes else result)]
        call.state = SENDING
        self.blocked.append(call)
        self._flush()

    def _flush(self) -> None:
        """Send what the client's windows allow of the answers waiting for them, in order."""
        h2 = self.h2
        for call in list(self.blocked):
            out, sid = call.out, call.sid
            while out and not self.closed:
                piece = out[0]
                n = min(len(piece), h2.local_flow_control_window(sid), h2.max_outbound_frame_size)
                if n <= 0:
                    break
                h2.send_data(sid, piece[:n])
                if n == len(piece):
                    out.pop(0)
                else:
                    out[0] = piece[n:]
            if out:
                if not h2.outbound_flow_control_window:
                    break
                continue
            self.blocked.remove(call)
            h2.send_headers(sid, _OK, end_stream=True)
            self._end(call)

    def _end(self, call: Call) -> None:
        call.state = DONE
        call.out = None
        if self.calls.pop(call.sid, None) is not None:
            self._settle()

    def _drop(self, call: Call) -> None:
        """The client reset the call or hung up: no answer is written; a handler still working is told."""
        call.gone = True
        self._received(call)
        if call in self.blocked:
            self.blocked.remove(call)
        if call.on_gone is not None:
            call.on_gone()
        if call.state == RECEIVING and call.admitted:  # no handler holds it
            call.admitted = False
            self.app.finished(call)
        self.calls.pop(call.sid, None)
        if not self.closed:
            self._settle()
