"""Errors of the server, each carrying TensorFlow Serving's status code and its HTTP mapping.

TF Serving answers every failure as ``{"error": "<message>"}`` with an HTTP status chosen from
the canonical code (``model_servers/http_server.cc``); the classes below are those codes.
"""

from __future__ import annotations

from ..errors import KilnError


class ServeError(KilnError):
    """A request the server answers with an error instead of outputs.

    A subclass names its canonical code and HTTP status in its class line.
    """

    code = "INTERNAL"
    http_status = 500

    def __init_subclass__(cls, code: str | None = None, http_status: int | None = None, **kwargs):
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.code, cls.http_status = code, http_status


class InvalidArgument(ServeError, ValueError, code="INVALID_ARGUMENT", http_status=400):
    """Bad input: malformed JSON, wrong dtype, shape or name (HTTP 400)."""


class NotFound(ServeError, LookupError, code="NOT_FOUND", http_status=404):
    """Unknown model, version or signature (HTTP 404)."""


class ResourceExhausted(ServeError, code="RESOURCE_EXHAUSTED", http_status=429):
    """A request larger than the server accepts (HTTP 429)."""


class TooLarge(ResourceExhausted, code="RESOURCE_EXHAUSTED", http_status=413):
    """A request larger than the server can ever hold (HTTP 413)."""


class Unavailable(ServeError, code="UNAVAILABLE", http_status=503):
    """Overloaded (a full batch queue) or shutting down (HTTP 503)."""


class DeadlineExceeded(ServeError, TimeoutError, code="DEADLINE_EXCEEDED", http_status=504):
    """The request's deadline passed before its outputs were ready (HTTP 504)."""


class Unimplemented(ServeError, NotImplementedError, code="UNIMPLEMENTED", http_status=501):
    """A TF Serving method kiln does not serve (HTTP 501)."""


class Internal(ServeError, RuntimeError):
    """The backend failed on input the server had accepted (HTTP 500, message only)."""
