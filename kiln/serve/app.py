"""The HTTP side: TF Serving's REST routes on Starlette, plus metrics, health and access logs.

Routes (``model_servers/http_rest_api_util.cc``, matched case-insensitively):
``POST /v1/models/NAME[/versions/N | /labels/L]:predict`` and
``GET /v1/models/NAME[/versions/N | /labels/L][/metadata]``. Every error is
``{"error": "<message>"}`` with the HTTP status of its TF Serving code; nothing a client sends
produces a traceback in the answer. Access logs are one JSON object per line on the
``kiln.serve.access`` logger.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from . import backends
from .models import ModelManager
from .status import InvalidArgument, ServeError, Unimplemented
from .tensors import format_response, parse_request

try:  # the fast JSON reader of the serve extra; json alone gives the same answers, slower
    import orjson
except ImportError:  # pragma: no cover - orjson is in the serve extra
    orjson = None

PREDICT_PATH = re.compile(r"/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:(classify|regress|predict)",
                          re.IGNORECASE)
STATUS_PATH = re.compile(r"/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?(?:/(metadata))?",
                         re.IGNORECASE)
JSON_TYPE = "application/json"
#: Bodies up to this size are decoded on the event loop (about a millisecond for a 32x32x3 image);
#: larger ones in one worker-thread hop, so a big request does not stall every other connection.
INLINE_BODY_BYTES = 256 << 10
#: Outputs up to this many elements are written on the event loop, larger ones in a worker thread.
INLINE_OUTPUT_ELEMENTS = 16384
_DIGITS_ONLY = bytes(48 if 48 <= i <= 57 else 32 for i in range(256))  # digits kept, the rest blanked
access_log = logging.getLogger("kiln.serve.access")
log = logging.getLogger("kiln.serve")


@dataclass
class Settings:
    """Per-server limits: request body size and the per-request deadline."""

    max_body_bytes: int = 64 << 20
    timeout_seconds: float = 30.0
    metrics_path: str | None = "/monitoring/prometheus/metrics"  # None: no metrics route


def _json(payload: dict | str, status: int = 200) -> Response:
    text = payload if isinstance(payload, str) else json.dumps(payload, indent=1)
    return Response(text, status_code=status, media_type=JSON_TYPE)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise InvalidArgument(f"request body of {int(declared)} bytes is larger than the limit of {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise InvalidArgument(f"request body is larger than the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _parse_json(body: bytes) -> dict:
    if not body.strip():
        raise InvalidArgument("JSON Parse error: The document is empty")
    doc = _fast_json(body)
    if doc is None:
        try:
            doc = json.loads(body)
        except UnicodeDecodeError as exc:
            raise InvalidArgument(f"JSON Parse error: Invalid encoding in string at offset: {exc.start}") from None
        except json.JSONDecodeError as exc:
            raise InvalidArgument(f"JSON Parse error: {exc.msg} at offset: {exc.pos}") from None
        except RecursionError:
            raise InvalidArgument("JSON Parse error: the document is nested too deeply") from None
    if not isinstance(doc, dict):
        raise InvalidArgument(f"JSON Value: {json.dumps(doc)[:120]} Is not object")
    return doc


def _fast_json(body: bytes):
    """orjson's reading of ``body`` where it is the same as json's, else None.

    orjson refuses NaN, Infinity, out-of-range exponents, lone surrogates and non-UTF-8 text (json
    accepts them or gives the error message the tests pin), and reads integers beyond 64 bits as
    floats; for those documents json decides.
    """
    if orjson is None or b"0" * 19 in body.translate(_DIGITS_ONLY):
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def _decode(text: bytes, held):
    """Body text to (signature, feeds, format) on the version ``held`` (or the error acquiring it
    gave), in TF Serving's order of checks: the JSON, then the model and version, then the
    signature and its inputs."""
    body = _parse_json(text)
    signature_name = body.get("signature_name", "")
    if not isinstance(signature_name, str):
        raise InvalidArgument("'signature_name' key must be a string value.")
    if isinstance(held, ServeError):
        raise held
    signature = backends.signature(held.loaded, signature_name)
    may_hold_bools = b"true" in text or b"false" in text
    feeds, fmt = parse_request(body, signature.inputs, may_hold_bools)
    return signature, feeds, fmt


async def _cancel_on_disconnect(request: Request, job) -> None:
    """A client that hangs up gives up its request: it is dropped from its batch, not run."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel()
            return


class _Labels:
    """What a request was about (model, version, method), for the access log and the metrics."""

    def __init__(self):
        self.model, self.version, self.method = "", "", ""


def create_app(manager: ModelManager, settings: Settings | None = None) -> Starlette:
    """The ASGI app serving ``manager``'s models."""
    settings = settings or Settings()
    metrics = manager.metrics
    state = {"draining": False}

    async def predict(request: Request, served: _Labels, groups) -> Response:
        name, version, label, method = groups
        served.model, served.method = name, method.lower()
        if served.method != "predict":
            raise Unimplemented(f"kiln serve answers :predict; :{served.method} is not served")
        text = await _read_body(request, settings.max_body_bytes)
        try:
            handle = manager.acquire(name, int(version) if version else None, label)
            served.version = str(handle.version)
        except ServeError as exc:
            handle = exc
        try:
            if len(text) <= INLINE_BODY_BYTES:
                signature, feeds, fmt = _decode(text, handle)
            else:
                signature, feeds, fmt = await run_in_threadpool(_decode, text, handle)
            job = handle.executor.submit(signature.key, feeds, time.monotonic() + settings.timeout_seconds)
            watcher = asyncio.ensure_future(_cancel_on_disconnect(request, job))
            try:
                await asyncio.wait_for(asyncio.wrap_future(job.future), settings.timeout_seconds)
            except asyncio.TimeoutError:
                job.cancel()  # resolves the future with DeadlineExceeded unless the answer won the race
            except ServeError:
                pass  # raised again by result() below
            finally:
                watcher.cancel()
            outputs = job.future.result()
        finally:
            if not isinstance(handle, ServeError):
                manager.release(handle)
        if sum(getattr(o, "size", 1) for o in outputs.values()) <= INLINE_OUTPUT_ELEMENTS:
            return _json(format_response(outputs, fmt))
        return _json(await run_in_threadpool(format_response, outputs, fmt))

    async def model_get(request: Request, served: _Labels, groups) -> Response:
        name, version, label, sub = groups
        if not name:
            raise InvalidArgument("Missing model name in request.")
        served.model, served.method = name, (sub or "status").lower()
        version = int(version) if version else None
        if served.method == "metadata":
            return _json(manager.metadata(name, version, label))
        return _json(manager.status(name, version, label))

    async def v1(request: Request) -> Response:
        start = time.perf_counter()
        served = _Labels()
        path = request.url.path
        try:
            if request.method == "POST" and (m := PREDICT_PATH.fullmatch(path)):
                response = await predict(request, served, m.groups())
            elif request.method == "GET" and (m := STATUS_PATH.fullmatch(path)):
                response = await model_get(request, served, m.groups())
            else:
                raise InvalidArgument(f"Malformed request: {request.method} {path}")
        except ServeError as exc:
            response = _json({"error": str(exc)}, exc.http_status)
        except ClientDisconnect:
            response = _json({"error": "the client disconnected"}, 400)
        except Exception as exc:  # a bug must not leak a traceback to the client
            log.exception(f"{request.method} {path} failed")
            response = _json({"error": f"Internal: {type(exc).__name__}: {exc}"}, 500)
        seconds = time.perf_counter() - start
        if served.model:
            metrics.requests.labels(served.model, served.version, served.method, str(response.status_code)).inc()
            metrics.latency.labels(served.model, served.version, served.method).observe(seconds)
            if response.status_code == 503:
                metrics.rejected.labels(served.model, served.version).inc()
        if access_log.isEnabledFor(logging.INFO):
            access_log.info(json.dumps({
                "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()), "client": request.client.host
                if request.client else "", "method": request.method, "path": path, "status": response.status_code,
                "ms": round(seconds * 1e3, 3), "model": served.model, "version": served.version,
                "bytes_out": len(response.body)}))
        return response

    async def metrics_route(request: Request) -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def healthz(request: Request) -> Response:
        return _json({"status": "ok"})

    async def readyz(request: Request) -> Response:
        if state["draining"]:
            return _json({"status": "draining"}, 503)
        if not manager.ready:
            return _json({"status": "loading", "models": manager.model_names()}, 503)
        return _json({"status": "ready", "models": manager.model_names()})

    async def not_found(request: Request) -> Response:
        return _json({"error": f"Malformed request: {request.method} {request.url.path}"}, 404)

    routes = [
        Route("/v1/{rest:path}", v1, methods=["GET", "POST"]),
        Route("/v1", v1, methods=["GET", "POST"]),
        *([Route(settings.metrics_path, metrics_route, methods=["GET"])] if settings.metrics_path else []),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/{rest:path}", not_found, methods=["GET", "POST", "PUT", "DELETE", "PATCH"]),
    ]
    app = Starlette(routes=routes)
    app.state.serve = state
    return app
