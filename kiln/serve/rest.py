"""TF Serving's REST API (``model_servers/http_rest_api_util.cc``) over `kiln.serve.http`.

Routes, matched case-insensitively (``/V1/Models/...`` too):
``POST /v1/models/NAME[/versions/N | /labels/L]:predict`` and
``GET /v1/models/NAME[/versions/N | /labels/L][/metadata]``, plus the metrics page,
``/healthz`` and ``/readyz``. Every error is ``{"error": "<message>"}`` with the HTTP status of
its TF Serving code; nothing a client sends produces a traceback or a 500. Access logs are one
JSON object per line on the ``kiln.serve.access`` logger.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import json
import logging
import math
import re
import time
from urllib.parse import unquote

from . import backends
from .batching import InlineExecutor
from .http import HttpServer, Limits, Request, Response
from .budget import CLAIM
from .jsonbody import CHUNK, parse_body, parse_text
from .service import Service
from .status import InvalidArgument, ServeError, Unimplemented
from .tensors import answer_pieces, format_response, parse_request, plain_float_feed

PREDICT_PATH = re.compile(r"/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:(classify|regress|predict)",
                          re.IGNORECASE)
STATUS_PATH = re.compile(r"/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?(?:/(metadata))?",
                         re.IGNORECASE)
MODEL_IN_PATH = re.compile(r"/v1/models/([^/:]+)", re.IGNORECASE)
#: Bodies up to this size are decoded on the event loop (well under a millisecond); larger ones in
#: a worker thread, so a big request does not stall every other connection.
INLINE_BODY_BYTES = 64 << 10
#: Outputs up to this many elements are written on the event loop, larger ones in a worker thread.
INLINE_OUTPUT_ELEMENTS = 16384
#: Predict URLs of served models whose parse is kept (a client sends the same few again and again).
ROUTE_CACHE_SIZE = 256
#: One thread decodes large bodies and writes large answers: however many big requests are in
#: flight, the event loop shares the interpreter with one such thread (and the model's).
_BULK = cf.ThreadPoolExecutor(1, thread_name_prefix="kiln-bulk")
access_log = logging.getLogger("kiln.serve.access")
_INFO, _monotonic = logging.INFO, time.monotonic
log = logging.getLogger("kiln.serve")


def _json(payload: dict, status: int = 200) -> Response:
    return Response(status, json.dumps(payload, indent=1).encode())


def parse_version(text: str | None) -> int | None:
    """A version from the URL; TF Serving's error for one that is not an int64."""
    if not text:
        return None
    if len(text) > 19 or int(text) >= 2 ** 63:
        raise InvalidArgument(f"Failed to convert version: {text[:40]}{'...' if len(text) > 40 else ''} to numeric.")
    return int(text)


def _decode(body, held, ticket=None):
    """Body to (served version, signature, feeds, format), in TF Serving's order of checks: the
    JSON, then the model and version, then the signature and its inputs. A large body's tensors
    are claimed on ``ticket`` (the worker's memory budget) before they are allocated."""
    token = CLAIM.set(ticket.claim if ticket is not None else None)
    try:
        return _decode_claimed(body, held)
    finally:
        CLAIM.reset(token)


def _decode_claimed(body, held):
    doc = parse_body(body)
    signature_name = doc.get("signature_name", "")
    if not isinstance(signature_name, str):
        raise InvalidArgument("'signature_name' key must be a string value.")
    if isinstance(held, ServeError):
        raise held
    signature = backends.signature(held.loaded, signature_name)
    # (a large body's arrays look for booleans a run at a time: one scan of it all would hold the interpreter)
    may_hold_bools = len(body) > CHUNK or b"true" in body or b"false" in body
    feeds, fmt = parse_request(doc, signature.inputs, may_hold_bools)
    return signature, feeds, fmt


class Plan:
    """A served version's default signature prepared once for the common predict request: one
    float input whose dimensions past the batch are fixed, run on the request's thread. What
    such a request still costs: one JSON read, one `np.array`, a shape compare, the call.
    Whatever does not fit the plan takes the full path, which gives the same answers (pinned by
    tests/serve/test_plan.py)."""

    __slots__ = ("key", "name", "dtype", "rank", "inner", "executor", "max_rows", "inline_rows")

    def __init__(self, key: str, name: str, dtype, shape: tuple, executor: InlineExecutor, outputs: dict):
        self.key, self.name, self.dtype, self.executor = key, name, dtype, executor
        # requests of more rows go to the executor's worker threads (InlineExecutor.submit)
        self.max_rows = executor.max_rows if executor.larger is not None else math.inf
        self.rank, self.inner = len(shape), tuple(shape[1:])
        # answers of up to this many rows are written on the event loop (0: their size is not known ahead)
        per_row = sum(math.prod(o.shape[1:]) for o in outputs.values()) \
            if all(o.shape and min(o.shape[1:], default=0) >= 0 for o in outputs.values()) else 0
        self.inline_rows = INLINE_OUTPUT_ELEMENTS // max(per_row, 1) if per_row else 0

    @classmethod
    def of(cls, held) -> "Plan | None":
        """The plan of a served version, None when its default signature is not of that kind."""
        if not isinstance(held.executor, InlineExecutor):
            return None
        try:
            signature = held.loaded.signature(None)
        except Exception:  # no default signature: the full path words the error
            return None
        if len(signature.inputs) != 1 or not signature.batched:
            return None
        (name, spec), = signature.inputs.items()
        shape = spec.shape
        if spec.dtype.kind != "f" or spec.index_range is not None or not shape or shape[0] >= 0 \
                or min(shape[1:], default=0) < 0:
            return None
        return cls(signature.key, name, spec.dtype, shape, held.executor, signature.outputs)

    def decode(self, body) -> tuple | None:
        """(feeds, format, rows) of a request body this plan takes; None for any other (or a bad one)."""
        if b"true" in body or b"false" in body:  # bools read as numbers by NumPy: the full path decides
            return None
        try:
            doc = parse_text(body)
        except InvalidArgument:
            return None
        if doc.__class__ is not dict or doc.get("signature_name", "") != "":
            return None
        decoded = plain_float_feed(doc, self.name, self.dtype)
        if decoded is None:
            return None
        feeds, fmt = decoded
        shape = feeds[self.name].shape
        if len(shape) != self.rank or shape[1:] != self.inner:
            return None
        return feeds, fmt, shape[0]


class RestApi:
    """The REST routes of one worker over a shared `Service`. ``plans``: answer the common predict
    request by a served version's `Plan` (False: always by the full path, for tests)."""

    def __init__(self, service: Service, metrics_path: str | None = "/monitoring/prometheus/metrics",
                 plans: bool = True):
        self.plans = plans
        self.service = service
        self.manager = service.manager
        self.metrics = service.metrics
        self.metrics_path = metrics_path
        self._routes: dict[bytes, tuple] = {}  # request target -> (name, version, label, model label)

    def server(self, limits: Limits) -> HttpServer:
        self.http = HttpServer(self.handle, limits, self.answered, self.service.budget)
        return self.http

    # -- routing -------------------------------------------------------------------------------
    def handle(self, request: Request):
        """The answer, or an awaitable of it when it is not ready at once."""
        if request.method == "POST":
            route = self._routes.get(request.target)
            if route is not None:
                try:
                    return self._predict(request, route)
                except ServeError as exc:
                    return Response.error(exc.http_status, str(exc))
        try:
            path = unquote(request.path.decode("latin-1"), errors="strict")
        except UnicodeDecodeError:
            return Response.error(400, "Malformed request: the path is not UTF-8")
        lowered = path[:4].lower()
        if lowered == "/v1/" or lowered == "/v1":
            return self._v1(request, path)
        if request.method == "GET" and path == self.metrics_path:
            return self._metrics_page()
        if request.method == "GET" and path == "/healthz":
            return _json({"status": "ok"})
        if request.method == "GET" and path == "/readyz":
            if self.service.draining:
                return _json({"status": "draining"}, 503)
            if not self.manager.ready:
                return _json({"status": "loading", "models": self.manager.model_names()}, 503)
            return _json({"status": "ready", "models": self.manager.model_names()})
        return Response.error(404, f"Malformed request: {request.method} {path[:200]}")

    async def _metrics_page(self) -> Response:
        text = await asyncio.get_running_loop().run_in_executor(None, self.metrics.render)
        return Response(200, text, "text/plain; version=0.0.4; charset=utf-8")

    def _v1(self, request: Request, path: str):
        request.labels = (self.metrics.model_label(""), "", "other")
        try:
            if request.method == "POST" and (m := PREDICT_PATH.fullmatch(path)):
                return self._predict(request, self._route(request, m.groups()))
            if request.method == "GET" and (m := STATUS_PATH.fullmatch(path)):
                return self._model_get(request, m.groups())
            raise InvalidArgument(f"Malformed request: {request.method} {path[:200]}")
        except ServeError as exc:
            return Response.error(exc.http_status, str(exc))

    # -- predict -------------------------------------------------------------------------------
    def _route(self, request: Request, groups) -> tuple:
        """(name, version, label, model label) of a predict URL; kept for the next request to the
        same URL when it names a served model."""
        name, version, label, method = groups
        method = method.lower()
        request.labels = (self.metrics.model_label(name), "", method)
        if method != "predict":
            raise Unimplemented(f"kiln serve answers :predict; :{method} is not served")
        route = (name, parse_version(version), label, self.metrics.model_label(name))
        if route[3] == name and len(self._routes) < ROUTE_CACHE_SIZE:
            self._routes[request.target] = route
        return route

    def _predict(self, request: Request, route: tuple):
        name, version, label, model = route
        plan = None
        try:
            held = self.manager.acquire(name, version, label)
        except ServeError as exc:
            request.labels = (model, "", "predict")
            held = exc  # raised once the body has been read as JSON (TF Serving's order)
        else:
            request.labels = held.predict_labels  # (a served version's model is a configured name)
            if self.plans:
                plan = held.plans.get("rest", False)
                if plan is False:
                    plan = held.plans["rest"] = Plan.of(held)
        body = request.body
        if len(body) > INLINE_BODY_BYTES:
            return self._predict_later(request, held, None)
        try:
            decoded = plan.decode(body) if plan is not None and not self.service.draining else None
            if decoded is not None:  # the common request, checked by its plan as Service.submit checks it
                feeds, fmt, rows = decoded
                request.body = b""
                deadline = request.arrived + self.service.timeout
                if rows <= plan.max_rows:
                    outputs, job = plan.executor.run(plan.key, feeds, rows, deadline), None
                else:
                    job = plan.executor.submit(plan.key, feeds, deadline)
            else:
                signature, feeds, fmt = _decode(body, held)
                request.body = b""  # the arrays hold what is needed now
                job = self.service.submit(held, signature, feeds, request.arrived)
        except BaseException:
            self._release(held)
            raise
        if job is None:
            self.manager.release(held)
            return Response(200, format_response(outputs, fmt)) if rows <= plan.inline_rows \
                else self._respond(outputs, fmt)
        if not job.done:
            return self._predict_later(request, held, (job, fmt))
        self.manager.release(held)
        return self._respond(job.future.result(), fmt)

    async def _predict_later(self, request: Request, held, started) -> Response:
        ticket = self.service.budget.ticket(request._reserved)
        try:
            if started is None:
                loop = asyncio.get_running_loop()
                signature, feeds, fmt = await loop.run_in_executor(_BULK, _decode, request.body, held, ticket)
                request.body = bytearray()  # the arrays hold what is needed now
                self.http.release(request)
                job = self.service.submit(held, signature, feeds, request.arrived)
                del feeds
            else:
                job, fmt = started

            def on_gone(cancel):
                request.on_gone = cancel

            outputs = await self.service.outputs(job, on_gone)
        except ServeError as exc:
            return Response.error(exc.http_status, str(exc))
        finally:
            self._release(held)
            ticket.close()
        answer = self._respond(outputs, fmt)
        return answer if isinstance(answer, Response) else await answer

    def _release(self, held) -> None:
        if held is not None and not isinstance(held, ServeError):
            self.manager.release(held)

    def _respond(self, outputs: dict, fmt: str):
        elements = 0
        for output in outputs.values():
            elements += getattr(output, "size", 1)
        if elements <= INLINE_OUTPUT_ELEMENTS:
            return Response(200, format_response(outputs, fmt))
        return self._respond_later(outputs, fmt)

    async def _respond_later(self, outputs: dict, fmt: str) -> Response:
        text = await asyncio.get_running_loop().run_in_executor(_BULK, answer_pieces, outputs, fmt)
        return Response(200, text)

    # -- status and metadata -------------------------------------------------------------------
    def _model_get(self, request: Request, groups) -> Response:
        name, version, label, sub = groups
        method = (sub or "status").lower()
        if not name:
            raise InvalidArgument("Missing model name in request.")
        request.labels = (self.metrics.model_label(name), "", method)
        number = parse_version(version)
        if method == "metadata":
            return _json(self.manager.metadata(name, number, label))
        return _json(self.manager.status(name, number, label))

    # -- after every answer --------------------------------------------------------------------
    def answered(self, request: Request, response: Response, seconds: float) -> None:
        labels = request.labels
        if not labels and request.path[:3].lower() == b"/v1":  # refused before it was routed
            m = MODEL_IN_PATH.match(request.path.decode("latin-1"))
            labels = (self.metrics.model_label(m.group(1) if m else ""), "",
                      "predict" if request.method == "POST" else "other")
        status = 499 if request.disconnected else response.status
        seconds = _monotonic() - request.arrived
        if labels:
            self.metrics.request(*labels, status, seconds)
        if access_log.isEnabledFor(_INFO):
            access_log.info(json.dumps({
                "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()), "client": request.client,
                "method": request.method, "path": request.path.decode("latin-1")[:200], "status": status,
                "ms": round(seconds * 1e3, 3), "model": labels[0] if labels else "",
                "version": labels[1] if labels else "", "bytes_out": response.size}))
