"""gRPC's transport: HTTP/2 (RFC 9113) and HPACK (RFC 7541) on the worker's event loop.

Why not grpcio's server: it costs about 230 us of CPU per unary call (its completion queue and
thread handoffs) where a whole REST request costs about 45 us, and it reads a whole message before
any handler sees it. Here a call is read by the event loop that reads REST requests, answered
from the read callback when its handler answers at once, and admitted from its first DATA frame:
gRPC's 5-byte prefix declares the message's size, so a message over a limit or the memory budget
is refused while the client may still send only the stream's first window (64 KiB); an admitted
message gets a window of its size and is copied once, into room of that size.

Served: unary calls over cleartext HTTP/2 with prior knowledge (what gRPC clients speak without
TLS), identity, gzip and deflate messages, the client's deadline (grpc-timeout), cancellation
(RST_STREAM), flow control both ways, PING, GOAWAY when the server drains or closes an idle
connection. The application (`kiln.serve.grpc_service`) gives ``admit(call, head)``,
``handle(call)`` (an answer, an error or an awaitable of one) and ``finished(call)``.
"""

from __future__ import annotations

import asyncio
import re
import socket
import struct
import time
import zlib

from .http import HttpServer

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, \
    COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0, 1, 3, 5, 6, 7, 9, 11
_FRAME = struct.Struct(">HBBBL")  # length (24 bits, as 16 + 8), type, flags, stream
MAX_FRAME = 16384     # the largest frame a client may send (HTTP/2's default, not raised)
STREAM_WINDOW = 65535  # what a client may send on a stream before its message is admitted (the default)
CONNECTION_WINDOW = 1 << 20
MAX_STREAMS = 1024    # open streams per connection; past it a new one is refused (REFUSED_STREAM: retried)
_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
RECEIVING, HANDLING, SENDING, DONE = range(4)


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return _FRAME.pack(n >> 8, n & 0xFF, kind, flags, stream) + payload


# -- HPACK -----------------------------------------------------------------------------------------

_STATIC_NAMES = (":authority :method :method :path :path :scheme :scheme :status :status :status :status :status "
                 ":status :status accept-charset accept-encoding accept-language accept-ranges accept "
                 "access-control-allow-origin age allow authorization cache-control content-disposition "
                 "content-encoding content-language content-length content-location content-range content-type "
                 "cookie date etag expect expires from host if-match if-modified-since if-none-match if-range "
                 "if-unmodified-since last-modified link location max-forwards proxy-authenticate "
                 "proxy-authorization range referer refresh retry-after server set-cookie strict-transport-security "
                 "transfer-encoding user-agent vary via www-authenticate").split()
_STATIC_VALUES = {2: "GET", 3: "POST", 4: "/", 5: "/index.html", 6: "http", 7: "https", 8: "200", 9: "204",
                  10: "206", 11: "304", 12: "400", 13: "404", 14: "500", 16: "gzip, deflate"}
STATIC = [(n.encode(), _STATIC_VALUES.get(i, "").encode()) for i, n in enumerate(_STATIC_NAMES, 1)]
#: The Huffman code's length in bits for each symbol 0..256, as chr(48 + bits): the code is canonical
#: (RFC 7541, appendix B), so the lengths are all of it.
_HUFFMAN_BITS = ("=GLLLLLLLHNLLNLLLLLLLLNLLLLLLLLL6::<=68;::8;8666555666666678?6<:=67777777777777777777777878=C=>6?5656"
                 "5666577666567655677777?;>=LDFDDFFFGFGGGGGHGHHFGHGGGGEFGFGGHFEDFFGGEGFFHEFGGEEFEGFGGDFFFGFFGJJDCFGFI"
                 "JJJKKJHICEJKKJKHEEJJLKKKDHDEFEEGFFIIHHJGJKJJKKKKKLKKKKKJN")


def _huffman_tables():
    lengths = [ord(c) - 48 for c in _HUFFMAN_BITS]
    counts = [0] * 31
    for n in lengths:
        counts[n] += 1
    return counts, sorted(range(257), key=lambda s: (lengths[s], s))


_COUNTS, _SYMBOLS = _huffman_tables()


class CompressionError(Exception):
    """A header block that does not decode: the connection's HPACK state is lost."""


def huffman(data: bytes) -> bytes:
    """Decode HPACK's canonical Huffman code (bit by bit: only header values not seen before come here)."""
    out = bytearray()
    value = int.from_bytes(data, "big")
    code = first = index = length = 0
    for shift in range(8 * len(data) - 1, -1, -1):
        code |= (value >> shift) & 1
        length += 1
        count = _COUNTS[length]
        if code - count < first:
            symbol = _SYMBOLS[index + code - first]
            if symbol == 256:
                raise CompressionError("EOS in a Huffman-coded string")
            out.append(symbol)
            code = first = index = length = 0
        else:
            index += count
            first = (first + count) << 1
            code <<= 1
            if length == 30:
                raise CompressionError("an invalid Huffman code")
    if length > 7 or code >> 1 != (1 << length) - 1:
        raise CompressionError("Huffman padding that is not a prefix of EOS")
    return bytes(out)


def _integer(block: bytes, at: int, bits: int) -> tuple[int, int]:
    mask = (1 << bits) - 1
    value = block[at] & mask
    at += 1
    if value < mask:
        return value, at
    shift = 0
    while True:
        byte = block[at]
        at += 1
        value += (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
        if shift > 28:
            raise CompressionError("an integer too large")


def _string(block: bytes, at: int) -> tuple[bytes, int]:
    coded = block[at] & 0x80
    size, at = _integer(block, at, 7)
    if at + size > len(block):
        raise CompressionError("a string past the block's end")
    raw = block[at:at + size]
    return (huffman(raw) if coded else raw), at + size


def encode_integer(value: int, bits: int, first: int = 0) -> bytes:
    mask = (1 << bits) - 1
    if value < mask:
        return bytes((first | value,))
    out, value = bytearray((first | mask,)), value - mask
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header as a literal without indexing (new name, no Huffman): the client's table stays as it was."""
    return b"\x00" + encode_integer(len(name), 7) + name + encode_integer(len(value), 7) + value


class Decoder:
    """One connection's HPACK decoder (its dynamic table, at most 4096 bytes: HTTP/2's default)."""

    def __init__(self, max_size: int = 4096, max_list: int = 64 << 10):
        self.table: list[tuple[bytes, bytes]] = []  # newest first
        self.size, self.max_size, self.limit, self.max_list = 0, max_size, max_size, max_list
        self.known: dict[bytes, dict] = {}  # blocks of indexed fields only, decoded while the table stays as it is

    def decode(self, block: bytes) -> dict:
        known = self.known.get(block)
        if known is not None:
            return known
        out, total, at, changed = {}, 0, 0, False
        try:
            while at < len(block):
                byte = block[at]
                if byte & 0x80:
                    index, at = _integer(block, at, 7)
                    name, value = self._entry(index)
                elif byte & 0x40 or not byte & 0x20:
                    index, at = _integer(block, at, 6 if byte & 0x40 else 4)
                    if index:
                        name = self._entry(index)[0]
                    else:
                        name, at = _string(block, at)
                    value, at = _string(block, at)
                    if byte & 0x40:
                        self._add(name, value)
                        changed = True
                else:  # a dynamic table size update
                    size, at = _integer(block, at, 5)
                    if size > self.max_size:
                        raise CompressionError(f"a table size of {size} over {self.max_size}")
                    self.limit, changed = size, True
                    self._evict()
                total += len(name) + len(value) + 32
                if total > self.max_list:
                    raise CompressionError(f"headers larger than the limit of {self.max_list} bytes")
                out[name] = value
        except IndexError:
            raise CompressionError("a header block cut short") from None
        if changed:
            self.known.clear()
        elif len(self.known) < 64:
            self.known[block] = out
        return out

    def _entry(self, index: int) -> tuple[bytes, bytes]:
        if 0 < index <= 61:
            return STATIC[index - 1]
        if 61 < index <= 61 + len(self.table):
            return self.table[index - 62]
        raise CompressionError(f"header index {index} is not in the table")

    def _add(self, name: bytes, value: bytes) -> None:
        self.table.insert(0, (name, value))
        self.size += len(name) + len(value) + 32
        self._evict()

    def _evict(self) -> None:
        while self.size > self.limit:
            name, value = self.table.pop()
            self.size -= len(name) + len(value) + 32


# -- the connection ------------------------------------------------------------------------------

_CONTENT_TYPE = b"\x88\x0f\x10" + encode_integer(16, 7) + b"application/grpc"  # :status 200, content-type
_OK = literal(b"grpc-status", b"0")
_TEXT_UNSAFE = re.compile(rb"[^\x20-\x24\x26-\x7e]")


class Call:
    """One gRPC call (an HTTP/2 stream): what its headers said, its message, its state. The defaults
    are class attributes, so a call costs four stores."""

    deadline = encoding = on_gone = out = task = refusal = ticket = None
    size, filled, prefix, state, gone, admitted, message, compressed = -1, 0, b"", RECEIVING, False, False, b"", 0

    def __init__(self, sid: int, path: bytes, arrived: float, window: int):
        self.sid, self.path, self.arrived, self.window = sid, path, arrived, window


class _ConnectionError(Exception):
    def __init__(self, code: int, text: str):
        super().__init__(text)
        self.code = code


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
        self.buf = b""
        self.preface = False
        self.decoder = Decoder(max_list=self.limits.max_header_bytes)
        self.calls: dict[int, Call] = {}
        self.last_sid = 0
        self.receiving = 0           # calls whose message is on its way (the read timeout runs while any is)
        self.send_window = 65535     # the connection's, granted by the client
        self.initial_window = 65535  # each new stream's, granted by the client
        self.max_frame = 16384       # the client's
        self.received = 0            # bytes taken since the last connection WINDOW_UPDATE
        self.blocked: list[Call] = []  # answers waiting for the client's windows
        self.continuing: list | None = None  # [stream, flags, fragments, size] until END_HEADERS
        self.deadline: float | None = None
        self.closed = False
        self.over_limit = ""

    # -- lifecycle -----------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.client = peer[0] if isinstance(peer, tuple) else ""
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self.over_limit = self.server.admit(self)
        settings = struct.pack(">HLHLHL", 3, MAX_STREAMS, 5, MAX_FRAME, 6, self.limits.max_header_bytes)
        transport.write(frame(SETTINGS, 0, 0, settings) +
                        frame(WINDOW_UPDATE, 0, 0, struct.pack(">L", CONNECTION_WINDOW - 65535)))
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

    def shut(self, code: int = NO_ERROR, text: str = "") -> None:
        """GOAWAY (the streams after ``last_sid`` were not processed: a client may retry them) and close."""
        if not self.closed:
            self.transport.write(frame(GOAWAY, 0, 0, struct.pack(">LL", self.last_sid, code) + text.encode()[:256]))
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
        if self.buf:
            data = self.buf + data
        if not self.preface:
            if len(data) < 24:
                self.buf = data
                if not PREFACE.startswith(data):
                    self.shut(PROTOCOL_ERROR, "not HTTP/2 with prior knowledge")
                return
            if data[:24] != PREFACE:
                self.shut(PROTOCOL_ERROR, "not HTTP/2 with prior knowledge")
                return
            self.preface, data = True, data[24:]
        at, end = 0, len(data)
        try:
            while end - at >= 9:
                high, low, kind, flags, sid = _FRAME.unpack_from(data, at)
                size = high << 8 | low
                if size > MAX_FRAME:
                    raise _ConnectionError(FRAME_SIZE_ERROR, f"a frame of {size} bytes, over {MAX_FRAME}")
                stop = at + 9 + size
                if stop > end:
                    break
                sid &= 0x7FFFFFFF
                if self.continuing is not None and kind != CONTINUATION:
                    raise _ConnectionError(PROTOCOL_ERROR, "a header block interrupted")
                if kind == DATA:
                    self._data(flags, sid, data, at + 9, stop)
                elif kind == HEADERS:
                    self._headers(flags, sid, data[at + 9:stop])
                else:
                    self._control(kind, flags, sid, data[at + 9:stop])
                at = stop
                if self.closed:
                    return
        except _ConnectionError as exc:
            self.shut(exc.code, str(exc))
            return
        except CompressionError as exc:
            self.shut(COMPRESSION_ERROR, str(exc))
            return
        self.buf = data[at:]
        if self.received >= CONNECTION_WINDOW // 2:
            self.transport.write(frame(WINDOW_UPDATE, 0, 0, struct.pack(">L", self.received)))
            self.received = 0

    def _control(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if kind == SETTINGS:
            if sid or len(payload) % 6:
                raise _ConnectionError(PROTOCOL_ERROR, "a malformed SETTINGS frame")
            if flags & ACK:
                return
            for at in range(0, len(payload), 6):
                key, value = struct.unpack_from(">HL", payload, at)
                if key == 4:  # INITIAL_WINDOW_SIZE: every open stream's window moves with it
                    if value > 0x7FFFFFFF:
                        raise _ConnectionError(FLOW_CONTROL_ERROR, "a window over 2^31-1")
                    for call in self.calls.values():
                        call.window += value - self.initial_window
                    self.initial_window = value
                elif key == 5:
                    if not 16384 <= value <= 16777215:
                        raise _ConnectionError(PROTOCOL_ERROR, f"a maximum frame size of {value}")
                    self.max_frame = value
            self.transport.write(frame(SETTINGS, ACK, 0))
            self._flush()
        elif kind == WINDOW_UPDATE:
            if len(payload) != 4:
                raise _ConnectionError(FRAME_SIZE_ERROR, "a WINDOW_UPDATE frame not of 4 bytes")
            step = int.from_bytes(payload, "big") & 0x7FFFFFFF
            if not sid:
                self.send_window += step
                if not step or self.send_window > 0x7FFFFFFF:
                    raise _ConnectionError(FLOW_CONTROL_ERROR, "a bad connection window update")
            elif sid in self.calls:
                self.calls[sid].window += step
            self._flush()
        elif kind == PING:
            if len(payload) != 8 or sid:
                raise _ConnectionError(FRAME_SIZE_ERROR, "a malformed PING frame")
            if not flags & ACK:
                self.transport.write(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            call = self.calls.get(sid)
            if call is not None:
                self._drop(call)
        elif kind == CONTINUATION:
            pending = self.continuing
            if pending is None or pending[0] != sid:
                raise _ConnectionError(PROTOCOL_ERROR, "a CONTINUATION frame out of place")
            pending[2].append(payload)
            pending[3] += len(payload)
            if pending[3] > self.limits.max_header_bytes:
                raise _ConnectionError(ENHANCE_YOUR_CALM, f"headers larger than the limit of "
                                                          f"{self.limits.max_header_bytes} bytes")
            if flags & END_HEADERS:
                self.continuing = None
                self._header_block(sid, pending[1], b"".join(pending[2]))
        elif kind == PUSH_PROMISE:
            raise _ConnectionError(PROTOCOL_ERROR, "a client may not push")
        # PRIORITY, GOAWAY (the client closes when it is done) and unknown frame types: nothing to do

    def _headers(self, flags: int, sid: int, payload: bytes) -> None:
        if flags & PADDED:
            pad = payload[0] if payload else 256
            if pad >= len(payload):
                raise _ConnectionError(PROTOCOL_ERROR, "padding past the frame")
            payload = payload[1:len(payload) - pad]
        if flags & PRIORITY_FLAG:
            payload = payload[5:]
        if not flags & END_HEADERS:
            self.continuing = [sid, flags, [payload], len(payload)]
            return
        self._header_block(sid, flags, payload)

    def _header_block(self, sid: int, flags: int, block: bytes) -> None:
        headers = self.decoder.decode(block)  # always: the table must follow the client's
        call = self.calls.get(sid)
        if call is not None:  # trailers
            if flags & END_STREAM and call.state == RECEIVING:
                self._complete(call)
            return
        if not sid % 2 or sid <= self.last_sid:
            if sid % 2 and sid <= self.last_sid:  # a stream that is over
                self.transport.write(frame(RST_STREAM, 0, sid, struct.pack(">L", STREAM_CLOSED)))
                return
            raise _ConnectionError(PROTOCOL_ERROR, f"headers on stream {sid}")
        self.last_sid = sid
        if len(self.calls) >= MAX_STREAMS:
            self.transport.write(frame(RST_STREAM, 0, sid, struct.pack(">L", REFUSED_STREAM)))
            return
        now = time.monotonic()
        call = self.calls[sid] = Call(sid, headers.get(b":path", b""), now, self.initial_window)
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
        if flags & END_STREAM:
            self._complete(call)

    def _data(self, flags: int, sid: int, data: bytes, start: int, stop: int) -> None:
        self.received += stop - start
        if flags & PADDED:
            pad = data[start] if stop > start else 256
            if pad >= stop - start:
                raise _ConnectionError(PROTOCOL_ERROR, "padding past the frame")
            start, stop = start + 1, stop - pad
        call = self.calls.get(sid)
        if call is None or call.state != RECEIVING:
            if not sid or sid > self.last_sid:
                raise _ConnectionError(PROTOCOL_ERROR, f"DATA on stream {sid}, which is not open")
            return  # a call refused or reset: what was on its way is dropped
        if call.size < 0 and not call.prefix and stop - start >= 5:  # the common call: prefix and message in one frame
            call.compressed, call.size = data[start], int.from_bytes(data[start + 1:start + 5], "big")
            start += 5
            if not self._admit(call, data[start:min(stop, start + 512)]):
                return
            if stop - start == call.size:
                call.message, call.filled = data[start:stop], call.size
                if flags & END_STREAM:
                    self._complete(call)
                return
            self._room(call)
        elif call.size < 0:  # gRPC's prefix (a flag and the message's size), in pieces
            take = min(5 - len(call.prefix), stop - start)
            call.prefix += data[start:start + take]
            start += take
            if len(call.prefix) < 5:
                if flags & END_STREAM:
                    self._complete(call)
                return
            call.compressed, call.size = call.prefix[0], int.from_bytes(call.prefix[1:], "big")
            if not self._admit(call, data[start:min(stop, start + 512)]):
                return
            self._room(call)
        if stop > start:
            if call.filled + stop - start > call.size:
                self._refuse(call, (3, "a unary call takes one message; more data came after it"))
                return
            call.message[call.filled:call.filled + stop - start] = memoryview(data)[start:stop]
            call.filled += stop - start
        if flags & END_STREAM:
            self._complete(call)

    def _room(self, call: Call) -> None:
        """Room for an admitted message that comes in several frames; the window to send all of it."""
        call.message = bytearray(call.size)
        if call.size + 5 > STREAM_WINDOW:
            self.transport.write(frame(WINDOW_UPDATE, 0, call.sid, struct.pack(">L", call.size + 5)))

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
            self.transport.write(frame(RST_STREAM, 0, call.sid, struct.pack(">L", NO_ERROR)))

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

    # -- writing -------------------------------------------------------------------------------
    def _answer(self, call: Call, result) -> None:
        """Write ``result``: a message (bytes, or its pieces in a list) or ``(code, text)``."""
        if call.admitted:
            call.admitted = False
            self.app.finished(call)
        if call.gone or self.closed or call.state >= SENDING:
            return
        self._received(call)
        sid = call.sid
        if result.__class__ is tuple:
            code, text = result
            block = _CONTENT_TYPE + literal(b"grpc-status", b"%d" % code) + literal(
                b"grpc-message", _TEXT_UNSAFE.sub(lambda m: b"%%%02X" % m.group()[0], text.encode()[:4096]))
            self.transport.write(frame(HEADERS, END_HEADERS | END_STREAM, sid, block))
            return self._end(call)
        size = len(result) if result.__class__ is bytes else sum(map(len, result))
        prefix = b"\x00" + size.to_bytes(4, "big")
        window = min(self.send_window, call.window)
        if size + 5 <= min(window, self.max_frame) and not self.blocked and result.__class__ is bytes:
            self.send_window -= size + 5  # the common answer: three frames in one write
            self.transport.write(b"%s%s%s%s%s" % (_FRAME.pack(0, len(_CONTENT_TYPE), HEADERS, END_HEADERS, sid),
                                                  _CONTENT_TYPE, _data_head(size + 5, sid), prefix + result,
                                                  _FRAME.pack(0, len(_OK), HEADERS, END_HEADERS | END_STREAM, sid) + _OK))
            return self._end(call)
        self.transport.write(frame(HEADERS, END_HEADERS, sid, _CONTENT_TYPE))
        call.out = [memoryview(prefix)] + [memoryview(piece).cast("B") for piece in
                                           ([result] if result.__class__ is bytes else result)]
        call.state = SENDING
        self.blocked.append(call)
        self._flush()

    def _flush(self) -> None:
        """Send what the client's windows allow of the answers waiting for them, in order."""
        for call in list(self.blocked):
            out = call.out
            while out and self.send_window > 0 and call.window > 0 and not self.closed:
                piece = out[0]
                n = min(len(piece), self.send_window, call.window, self.max_frame)
                self.transport.write(_data_head(n, call.sid))
                self.transport.write(piece[:n])
                self.send_window -= n
                call.window -= n
                if n == len(piece):
                    out.pop(0)
                else:
                    out[0] = piece[n:]
            if out:
                if self.send_window <= 0:
                    return
                continue
            self.blocked.remove(call)
            if not self.closed:
                self.transport.write(frame(HEADERS, END_HEADERS | END_STREAM, call.sid, _OK))
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


def _data_head(size: int, sid: int) -> bytes:
    return _FRAME.pack(size >> 8, size & 0xFF, DATA, 0, sid)
