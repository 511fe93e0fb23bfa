"""What the REST and gRPC front ends share: versions, input checks, deadlines, drain, metrics.

A request's deadline is ``--rest_api_timeout_in_ms`` from its arrival (the first byte of an
HTTP request, the start of a gRPC call; a gRPC client's own deadline when sooner), whatever
happened before its turn. When the server drains, in-flight requests may finish until the
drain deadline; then they are answered 503 / UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import math
import time

from .backends import check_feeds
from .budget import MemoryBudget
from .batching import Request
from .metrics import OTHER_MODEL
from .models import ModelManager, ServedVersion
from .status import ServeError, Unavailable


class Service:
    """The shared request path over one `ModelManager`."""

    def __init__(self, manager: ModelManager, timeout_seconds: float = 30.0, budget: MemoryBudget | None = None):
        self.manager = manager
        self.budget = budget or MemoryBudget(256 << 20)  # the worker's, shared by REST and gRPC
        self.metrics = manager.metrics
        self.timeout = timeout_seconds
        self.draining = False
        self.drain_deadline = math.inf

    def begin_drain(self, timeout: float) -> None:
        self.draining = True
        self.drain_deadline = time.monotonic() + timeout

    def submit(self, served: ServedVersion, signature, feeds: dict, arrived: float,
               deadline: float | None = None, ticket=None) -> Request:
        """Check ``feeds`` and hand them to the version's executor (answers may already be in). A large
        request's ``ticket`` claims the model's tensors for its rows in the memory budget first."""
        check_feeds(signature, feeds)
        if self.draining:
            raise Unavailable("the server is shutting down; the request was not accepted")
        if ticket is not None and served.row_work and feeds:
            first = next(iter(feeds.values()))
            rows = first.shape[0] if first.ndim else 1
            ticket.claim(rows * served.row_work, f"the model's tensors for {rows} rows")
        limit = arrived + self.timeout
        return served.executor.submit(signature.key, feeds, limit if deadline is None else min(limit, deadline))

    async def outputs(self, job: Request, cancel_hook=None) -> dict:
        """The job's outputs, awaited until its deadline (then 504)."""
        if not job.done:
            if cancel_hook is not None:
                cancel_hook(job.cancel)
            try:
                await asyncio.wait_for(asyncio.wrap_future(job.future), max(job.deadline - time.monotonic(), 0))
            except asyncio.TimeoutError:
                job.cancel()  # resolves it with DeadlineExceeded unless the answer won the race
            except ServeError:
                pass  # raised again by result()
        return job.future.result()

    def labels(self, name: str, served: ServedVersion | None) -> tuple[str, str]:
        """(model, version) labels: configured names only, versions only once resolved."""
        model = self.metrics.model_label(name)
        return model, (str(served.version) if served is not None and model != OTHER_MODEL else "")
