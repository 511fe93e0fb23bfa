"""A small HTTP/1.1 server on asyncio and httptools (llhttp, the parser uvicorn uses).

Why not a framework: the server must bound what every connection may cost and answer overload
itself, and a general-purpose stack does neither cheaply. Here every connection has an idle
timeout (before its first request and between requests) and a read timeout (a request must
arrive whole within it: a half-sent request cannot hold a connection); headers, bodies,
connections and the bytes of all bodies held at once are bounded, and a request over a bound
is answered (400, 408, 413, 431 or 503) instead of being dropped; the clock of every
request starts when its first byte arrives. Draining stops accepting, lets in-flight requests
finish within a timeout, then answers what is left with a JSON 503.

A handler is ``handler(request) -> Response`` or an awaitable of one (a request whose answer
is ready at once costs no task); a request is handled after its whole body has arrived, one at
a time per connection (pipelined requests wait their turn).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import operator
import socket
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

import httptools

from .budget import MemoryBudget

_monotonic = time.monotonic
_REASONS = {200: "OK", 100: "Continue", 400: "Bad Request", 404: "Not Found", 408: "Request Timeout",
            413: "Payload Too Large",
            429: "Too Many Requests", 431: "Request Header Fields Too Large", 499: "Client Closed Request",
            500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable", 504: "Gateway Timeout"}
JSON = "application/json"
#: Requests parsed ahead of the one being handled on a connection before reading pauses.
_PIPELINE = 4
_METHODS = {m.encode(): m for m in ("GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH")}
_HEADS: dict = {}  # (status, content type) -> the status line and headers up to the length's value
#: Seconds a connection idle when the drain starts stays open for a request already on its way.
DRAIN_IDLE_GRACE = 1.0


@dataclass
class Limits:
    """What one connection, and all of them together, may hold."""

    max_body_bytes: int = 64 << 20
    body_budget_bytes: int = 256 << 20   # bodies held at once, all connections together
    max_header_bytes: int = 64 << 10     # request line and headers
    max_connections: int = 1024
    max_connections_per_client: int = 256   # from one peer address
    idle_timeout: float = 60.0           # no request in progress
    read_timeout: float = 30.0           # from a request's first byte to its last


class Request:
    """One parsed request. ``arrived`` is the monotonic time of its first byte; when the client
    hangs up before its answer, ``disconnected`` is set and ``on_gone`` (a handler's) is called.
    ``labels`` is what the handler says the request was about (for metrics and logs).

    Only the headers the server acts on are kept (``Content-Length`` and ``Expect``, repeated
    ones joined with ", "). The defaults are class attributes, so a request costs two stores."""

    method = ""
    target = b""
    body = b""  # one chunk as it came; several gathered in a bytearray
    keep_alive = True
    on_gone: Callable[[], None] | None = None
    disconnected = False
    refusal: "Response | None" = None  # set while reading: answer this, ignore the body
    labels: tuple = ()
    declared: bytes | None = None  # Content-Length
    expect: bytes | None = None
    _reserved = 0
    _filled = 0  # bytes of a body gathered in a bytearray

    def __init__(self, arrived: float, client: str):
        self.arrived = arrived
        self.client = client

    @property
    def path(self) -> bytes:
        return self.target.split(b"?", 1)[0]


@dataclass
class Response:
    status: int
    body: bytes | list = b""  # or a large one's pieces, written in turn
    content_type: str = JSON

    @property
    def size(self) -> int:
        return len(self.body) if self.body.__class__ is not list else sum(map(len, self.body))

    @classmethod
    def error(cls, status: int, message: str) -> "Response":
        return cls(status, json.dumps({"error": message}).encode())


Handler = Callable[[Request], "Response | Awaitable[Response]"]


class HttpServer:
    """Serves ``handler`` on a listening socket; see the module docstring."""

    def __init__(self, handler: Handler, limits: Limits | None = None, on_response=None,
                 budget: MemoryBudget | None = None):
        """``on_response(request, response, seconds)`` runs after every answer (metrics, access log);
        ``budget``: the worker's, which bodies share with what requests decode."""
        self.handler = handler
        self.limits = limits or Limits()
        self.budget = budget or MemoryBudget(self.limits.body_budget_bytes)
        self.on_response = on_response
        self.connections: set[_Connection] = set()
        self.peers: dict[str, set[_Connection]] = {}  # peer address -> its connections
        self.draining = False
        self._server: asyncio.base_events.Server | None = None
        self._sweeper: asyncio.Task | None = None

    async def start(self, sock: socket.socket) -> None:
        loop = self.loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self.protocol, sock=sock, backlog=2048)
        self._sweeper = loop.create_task(self._sweep())

    def protocol(self) -> asyncio.Protocol:
        return _Connection(self)

    async def _sweep(self) -> None:
        """Close connections past their idle or read timeout (one timer for all, not two per request).
        Past half the connection limit the idle timeout shrinks, down to a second at the limit."""
        limits = self.limits
        step = min(0.25, limits.idle_timeout / 4, limits.read_timeout / 4)
        while True:
            await asyncio.sleep(step)
            now = time.monotonic()
            half, idle = limits.max_connections / 2, limits.idle_timeout
            pressure = min(1.0, max(0.0, len(self.connections) - half) / half)
            cut = now + (idle - min(1.0, idle)) * pressure  # an idle deadline before it: idle long enough
            for conn in [c for c in self.connections if c.deadline is not None and
                         (c.deadline <= now or c.deadline <= cut and not c.busy)]:
                conn._timed_out()

    def admit(self, conn: "_Connection") -> str:
        """Make room for a new connection: a peer past its cap, or the worker past its limit, gives up
        its connection idle the longest (none: the new one is refused, the reason returned)."""
        limits = self.limits
        mine = self.peers.setdefault(conn.client, set())
        refusal = ""
        if len(mine) >= limits.max_connections_per_client:
            if not _close_longest_idle(mine):
                refusal = (f"this client holds its limit of {limits.max_connections_per_client} connections to "
                           "the server; retry later")
        elif len(self.connections) >= limits.max_connections and not _close_longest_idle(self.connections):
            refusal = f"the server holds its limit of {limits.max_connections} connections; retry later"
        mine.add(conn)
        self.connections.add(conn)
        return refusal

    def forget(self, conn: "_Connection") -> None:
        self.connections.discard(conn)
        mine = self.peers.get(conn.client)
        if mine is not None:
            mine.discard(conn)
            if not mine:
                del self.peers[conn.client]

    def reserve(self, request: Request, size: int) -> bool:
        """Count ``size`` more body bytes for ``request``; False when that would pass the budget."""
        budget = self.budget
        if budget.bodies + budget.held + size > budget.limit:
            return False
        budget.bodies += size
        request._reserved += size
        return True

    def release(self, request: Request) -> None:
        self.budget.bodies -= request._reserved
        if request._reserved >= 1 << 20:  # a large body: counted toward giving memory back
            self.budget.give(request._reserved, claimed=False)
        request._reserved = 0

    async def drain(self, timeout: float, message: str) -> None:
        """Answer 503 to every request that arrives, on any connection, old or new, for
        `DRAIN_IDLE_GRACE` s (at most ``timeout``): a keep-alive client may already be sending its
        next request, and a connection in the accept queue would be reset if the port closed at
        once. Then stop accepting and close the connections with nothing in progress; in-flight
        requests are answered and their connections closed after the answer; after ``timeout`` s,
        whatever is left is answered 503 ``message``."""
        self.draining = True
        deadline = time.monotonic() + timeout
        await asyncio.sleep(min(timeout, DRAIN_IDLE_GRACE))
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            if not conn.busy:
                conn.shut()
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for conn in list(self.connections):
            conn.cut_off(message)
        if self._sweeper is not None:  # nothing left to time out
            self._sweeper.cancel()


class _Connection(asyncio.Protocol):
    """One connection. An idle one costs its socket and a few hundred bytes: slots, and a parser
    made when its first byte arrives (an event to wait on only once its transport is full)."""

    __slots__ = ("server", "limits", "loop", "transport", "parser", "client", "current", "ready", "task",
                 "header_bytes", "heads", "deadline", "over_limit", "closed", "stopped", "lingering", "paused",
                 "writable", "can_write", "handler", "max_header_bytes", "max_body_bytes", "body_budget",
                 "read_timeout", "idle_timeout")

    def __init__(self, server: HttpServer):
        self.server = server
        self.limits = server.limits
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.parser = None
        self.client = ""
        self.current: Request | None = None    # being read
        self.ready: list[Request] = []    # read whole, waiting their turn (at most _PIPELINE)
        self.task: asyncio.Task | None = None   # handling ready[0]
        self.header_bytes = 0  # of the request line so far
        self.heads: list | tuple = ()  # (name, value) of the request being read, until its headers are in
        self.deadline: float | None = None  # of the idle or read timeout now running
        self.over_limit = ""
        self.closed = False
        self.stopped = False  # the parser gave up on this connection: read nothing more
        self.lingering = False  # answered and closing: what still comes is read and dropped
        self.paused = False   # reading paused: _PIPELINE requests wait
        self.writable = True  # the transport takes more (the flag, and an event to wait on)
        self.can_write: asyncio.Event | None = None
        self.handler = server.handler
        self.max_header_bytes = self.limits.max_header_bytes
        self.max_body_bytes = self.limits.max_body_bytes
        self.body_budget = self.limits.body_budget_bytes
        self.read_timeout = self.limits.read_timeout
        self.idle_timeout = self.limits.idle_timeout

    # -- lifecycle -----------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        accept(self, transport)
        self._arm(min(self.limits.idle_timeout, 1.0) if self.over_limit else self.limits.idle_timeout)

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.server.forget(self)
        self._disarm()
        for request in [self.current, *self.ready]:
            if request is not None:
                self.server.release(request)
                request.disconnected = True
                if request.on_gone is not None:
                    request.on_gone()
        self.current = None

    @property
    def busy(self) -> bool:
        return self.task is not None or self.current is not None or bool(self.ready)

    def shut(self) -> None:
        self.transport.close()

    def cut_off(self, message: str) -> None:
        """Drain ran out: answer the request being handled 503 ``message`` and close."""
        response = Response.error(503, message)
        if self.closed:
            return
        if self.task is not None:
            self.task.cancel()
            self.task = None
            if self.ready:
                request = self.ready[0]
                self._write(request, response, close=True)
                if self.server.on_response is not None:
                    self.server.on_response(request, response, 0.0)
        self.transport.close()

    def _arm(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds  # the server's sweep closes the connection past it

    def _disarm(self) -> None:
        self.deadline = None

    def _timed_out(self) -> None:
        self.deadline = None
        if self.current is not None and not self.closed and not self.ready:  # started, did not arrive whole
            self._write(self.current, Response.error(408, f"the request did not arrive whole within "
                                                          f"{self.limits.read_timeout:g} s"), close=True)
        if self.transport is not None:
            self.transport.close()

    def pause_writing(self) -> None:
        self.writable = False
        if self.can_write is None:
            self.can_write = asyncio.Event()
        self.can_write.clear()

    def resume_writing(self) -> None:
        self.writable = True
        if self.can_write is not None:
            self.can_write.set()

    # -- reading -------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.stopped:
            return
        if self.parser is None:
            self.parser = httptools.HttpRequestParser(self)
        try:
            self.parser.feed_data(data)
            if self.heads and self.header_bytes + _head_size(self.heads) > self.max_header_bytes:
                raise _TooLarge()  # headers still arriving, already past the limit
        except _TooLarge:
            self._fail(431, f"the request line and headers are larger than the limit of "
                            f"{self.limits.max_header_bytes} bytes")
        except httptools.HttpParserUpgrade:  # answered as a plain request (no upgrade), then closed
            self.stopped = True
            self.transport.pause_reading()
            if self.ready:
                self.ready[-1].keep_alive = False
            else:
                self._fail(400, "protocol upgrades are not served")
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, _TooLarge):
                self._fail(431, f"the request line and headers are larger than the limit of "
                                f"{self.limits.max_header_bytes} bytes")
            elif isinstance(cause, _Stop):
                self.stopped = True
                if not self.lingering:
                    self.transport.pause_reading()
            else:  # a bug in a callback: answered, never a traceback to the client
                self._fail(500, f"Internal: {type(cause).__name__}: {cause}")
        except httptools.HttpParserError as exc:
            self._fail(400, f"malformed HTTP request: {exc}")

    def _fail(self, status: int, message: str) -> None:
        """Answer a request that cannot be read on (parse error, oversized headers) and close."""
        self.stopped = True
        if self.closed:
            return
        request = self.current or Request(time.monotonic(), self.client)
        self.current = None
        if self.task is None and not self.ready:
            self._write(request, Response.error(status, message), close=True)
        self.transport.close()

    def on_message_begin(self) -> None:
        now = _monotonic()
        self.current = Request(now, self.client)
        self.heads = []
        self.header_bytes = 0
        self.deadline = now + self.read_timeout  # _arm, with the clock already read

    def on_url(self, url: bytes) -> None:
        self.header_bytes += len(url)
        if self.header_bytes > self.max_header_bytes:
            raise _TooLarge()
        self.current.target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.heads.append((name, value))  # measured and read once they are all in (or per read, see data_received)

    def on_headers_complete(self) -> None:
        request, parser, heads = self.current, self.parser, self.heads
        self.heads = ()
        if heads:
            if self.header_bytes + sum(map(len, _chain(heads))) + 4 * len(heads) > self.max_header_bytes:
                raise _TooLarge()  # (as _head_size counts)
            names = b"\n%b\n" % b"\n".join(map(_name, heads)).lower()
            at = names.find(b"\ncontent-length\n")
            if at >= 0:
                request.declared = heads[names.count(b"\n", 0, at)][1] \
                    if names.find(b"\ncontent-length\n", at + 1) < 0 else _header(heads, names, b"\ncontent-length\n")
            if b"\nexpect\n" in names:
                request.expect = _header(heads, names, b"\nexpect\n")
        method = parser.get_method()
        request.method = _METHODS.get(method) or method.decode("latin-1")
        if not parser.should_keep_alive():
            request.keep_alive = False
        declared, server = request.declared, self.server
        if declared is not None and request.expect is None and not self.over_limit and not server.draining \
                and declared.isdigit():  # the common request: its body reserved at once, or _admit decides
            size = int(declared)
            budget = server.budget
            if size <= self.max_body_bytes and budget.bodies + budget.held + size <= self.body_budget:
                budget.bodies += size
                request._reserved = size
                return
        self._admit(request)

    def _admit(self, request: Request) -> None:
        """Refuse what the server will not read (over the connection limit, draining, a declared
        body over its limit or the budget) and answer ``Expect: 100-continue``."""
        limits, declared, expect = self.limits, request.declared, request.expect
        # (repeated headers arrive joined with ", ": a joined length is not a number)
        refusal = None
        if self.over_limit:
            refusal = Response.error(503, self.over_limit)
        elif self.server.draining:
            refusal = Response.error(503, "the server is shutting down; the request was not accepted")
        elif declared is not None and declared.isdigit():
            size = int(declared)
            if size > limits.max_body_bytes:
                refusal = Response.error(413, f"request body of {size} bytes is larger than the limit of "
                                              f"{limits.max_body_bytes} bytes")
            elif not self.server.reserve(request, size):
                refusal = _budget_refusal(self.server)
        if refusal is not None:
            request.refusal = refusal
            self._refuse_now(request)
        if expect is not None and expect.lower() == b"100-continue" and not self.closed:
            if refusal is None:
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            else:  # the client waits for this before it sends the body: answer now and close
                request.keep_alive = False
                self.current = None
                self._queue(request)
                raise _Stop()

    def _refuse_now(self, request: Request) -> None:
        """Answer a refusal decided while the request is read (from its headers, or as its body grows)
        at once when nothing waits before it on the connection, with ``Connection: close``: a client
        that sent ``Expect: 100-continue`` never uploads the body; one that sends it all before it
        reads still sees the answer, since what comes is read and dropped (a lingering close) until
        it hangs up or the read timeout passes. Else it is answered in turn, after the body."""
        if self.ready or self.task is not None or self.closed:
            return
        self.server.release(request)
        self.current = None
        self.lingering = True
        self._write(request, request.refusal, close=False, linger=True)
        if self.server.on_response is not None:
            self.server.on_response(request, request.refusal, 0.0)
        self.deadline = _monotonic() + self.read_timeout  # then the sweep closes it
        raise _Stop()

    def on_body(self, body: bytes) -> None:
        request = self.current
        if not request.body and request.refusal is None and len(body) <= request._reserved:
            request.body = body  # most bodies come in one piece, within their reservation: kept as they are
            return
        self._more_body(request, body)

    def _more_body(self, request: Request, body: bytes) -> None:
        if request.refusal is not None:
            return  # read and dropped: the answer is already decided
        held = request.body
        size = (request._filled if held.__class__ is bytearray else len(held)) + len(body)
        if size > self.limits.max_body_bytes or size > request._reserved and \
                not self.server.reserve(request, size - request._reserved):
            request.refusal = _budget_refusal(self.server) if size <= self.limits.max_body_bytes else Response.error(
                413, f"request body is larger than the limit of {self.limits.max_body_bytes} bytes")
            self.server.release(request)
            request.body = b""
            self._refuse_now(request)
            return
        if not held:
            request.body = body  # most bodies come in one piece: kept as they are
        elif held.__class__ is bytes:  # room for the whole declared body, each piece copied once into place
            held, request.body = request.body, bytearray(max(request._reserved, size))
            request.body[:len(held)] = held
            request.body[len(held):size] = body
        elif size <= len(held):
            held[request._filled:size] = body
        else:  # (a chunked body past its room)
            del held[request._filled:]
            held += body
        request._filled = size

    def on_message_complete(self) -> None:
        request, self.current = self.current, None
        if request.body.__class__ is bytearray and request._filled < len(request.body):
            del request.body[request._filled:]
        self.deadline = None  # _disarm
        if self.ready or self.task is not None or request.refusal is not None or not self.writable or self.closed:
            self._queue(request)
            return
        # the common request: nothing before it on the connection, answered now unless its handler awaits
        result = self._handle(request)
        if result.__class__ is not Response:
            self.ready.append(request)
            self.task = self.loop.create_task(self._await(request, result))
            return
        self._reply(request, result)
        if not self.closed:
            if self.server.draining:
                self.transport.close()
            else:
                self.deadline = _monotonic() + self.idle_timeout  # _arm

    def _queue(self, request: Request) -> None:
        ready = self.ready
        ready.append(request)
        if len(ready) >= _PIPELINE:
            self.paused = True
            self.transport.pause_reading()
        if self.task is None:
            self._answer_ready()

    # -- answering -----------------------------------------------------------------------------
    def _handle(self, request: Request):
        try:
            return self.handler(request)
        except Exception as exc:  # a bug in a handler: answered, never a traceback to the client
            return Response.error(500, f"Internal: {type(exc).__name__}: {exc}")

    def _answer_ready(self) -> None:
        """Answer the requests read whole, in order: at once while the handler answers at once,
        else in a task that awaits the answer and then goes on."""
        ready = self.ready
        while ready and not self.closed and self.task is None:
            request = ready[0]
            if request.refusal is not None:
                self._answered(request, request.refusal)
                continue
            result = self._handle(request)
            if result.__class__ is Response and self.writable:
                self._answered(request, result)
            else:
                self.task = self.loop.create_task(self._await(request, result))
                return
        if not ready and self.current is None and self.task is None and not self.closed:
            if self.server.draining:
                self.transport.close()
            else:
                self.deadline = _monotonic() + self.idle_timeout  # _arm

    async def _await(self, request: Request, result) -> None:
        if not isinstance(result, Response):
            try:
                result = await result
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                result = Response.error(500, f"Internal: {type(exc).__name__}: {exc}")
        if not self.writable and not self.closed:
            await self.can_write.wait()
        self.task = None
        self._answered(request, result)
        self._answer_ready()

    def _answered(self, request: Request, response: Response) -> None:
        """Answer ``ready[0]`` and take it off the queue."""
        self._reply(request, response)
        self.ready.pop(0)
        if self.paused and len(self.ready) < _PIPELINE and not self.closed:
            self.paused = False
            self.transport.resume_reading()

    def _reply(self, request: Request, response: Response) -> None:
        """Write ``response`` (499 in the metrics when the client is gone), release the body's bytes."""
        server = self.server
        if request._reserved:
            if request._reserved >= 1 << 20:
                server.release(request)
            else:
                server.budget.bodies -= request._reserved  # release
                request._reserved = 0
            request.body = b""
        if self.closed:
            response = Response.error(499, "the client closed the connection before the answer")
        elif request.keep_alive and not server.draining and request.refusal is None \
                and request.method != "HEAD" and response.body.__class__ is bytes and len(response.body) < 65536:
            body = response.body
            head = _HEADS.get((response.status, response.content_type)) or _head(response)
            self.transport.write(b"%s%d\r\n\r\n%s" % (head, len(body), body))
        else:
            close = not request.keep_alive or server.draining or request.refusal is not None \
                and request.refusal.status == 503
            self._write(request, response, close)
            if response.body.__class__ is list:  # a large answer: freed once sent, counted toward giving memory back
                server.budget.give(response.size, claimed=False)
        if server.on_response is not None:
            server.on_response(request, response, 0.0)

    def _write(self, request: Request, response: Response, close: bool, linger: bool = False) -> None:
        body = b"" if request.method == "HEAD" else response.body
        start = _HEADS.get((response.status, response.content_type)) or _head(response)
        end = b"\r\nConnection: close\r\n\r\n" if close or linger else b"\r\n\r\n"
        if body.__class__ is list:
            self.transport.write(b"%s%d%s" % (start, response.size, end))
            self.transport.writelines(body)
        elif len(body) < 65536:
            self.transport.write(b"%s%d%s%s" % (start, len(response.body), end, body))
        else:
            self.transport.write(b"%s%d%s" % (start, len(response.body), end))
            self.transport.write(body)
        if close:
            self.transport.close()


class _TooLarge(Exception):
    """Raised inside a parser callback: the headers passed the limit."""


class _Stop(Exception):
    """Raised inside a parser callback: stop reading this connection (its answer is queued)."""


_name = operator.itemgetter(0)
_chain = itertools.chain.from_iterable


def accept(conn, transport) -> None:
    """A new connection (HTTP/1.1's or gRPC's): its transport, its client's address, keep-alive probes and
    no Nagle delay, and its admission (``over_limit``: a refusal's reason, answered to its first request)."""
    conn.transport = transport
    peer = transport.get_extra_info("peername")
    conn.client = peer[0] if isinstance(peer, tuple) else ""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
    conn.over_limit = conn.server.admit(conn)


def _head_size(heads: list) -> int:
    """The bytes of the headers ``heads`` (as ``name: value\\r\\n``), counted without a Python step per header."""
    return sum(map(len, _chain(heads))) + 4 * len(heads)


def _header(heads: list, names: bytes, key: bytes) -> bytes:
    """The value of the header ``key`` (``\\nname\\n``, lower case) that ``names`` (the names joined with and
    between newlines, lower case) holds; repeated headers joined with ", "."""
    at = names.find(key)
    if names.find(key, at + 1) < 0:
        return heads[names.count(b"\n", 0, at)][1]
    return b", ".join([value for name, value in heads if name.lower() == key[1:-1]])


def _head(response: Response) -> bytes:
    """The status line and headers of ``response`` up to the length's value (made once per status and type)."""
    start = _HEADS[response.status, response.content_type] = (
        f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Unknown')}\r\n"
        f"Content-Type: {response.content_type}\r\nContent-Length: ").encode("latin-1")
    return start


def _close_longest_idle(connections) -> bool:
    """Close the connection of ``connections`` idle the longest (the earliest idle deadline); False
    when all are busy."""
    idle = [c for c in connections if not c.busy and c.deadline is not None and not c.closed]
    if not idle:
        return False
    oldest = min(idle, key=_deadline)
    oldest.server.forget(oldest)
    oldest.closed = True
    oldest.transport.close()
    return True


_deadline = operator.attrgetter("deadline")


def _budget_refusal(server: HttpServer) -> Response:
    budget = server.budget
    return Response.error(503, f"the server holds {budget.bodies + budget.held} bytes of requests, its budget is "
                               f"{budget.limit}; retry later")
