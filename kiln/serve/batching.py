"""Executors: server-side batching with TF Serving's parameters, and two unbatched ones.

`BatchScheduler` keeps one queue of batches per signature, as TF Serving's batching session
does. A request joins the open batch if it fits (and, unless ``pad_variable_length_inputs``,
has the same non-batch shapes); with ``enable_large_batch_splitting`` it is split to fill the
open batch first. A batch runs when it is full, when its first task has waited
``batch_timeout_micros``, or when the server drains; ``num_batch_threads`` workers run batches,
each with its own runner (interpreters are not thread-safe). The rows are padded to the next
``allowed_batch_sizes`` entry with copies of the first task's first row, and the outputs are
sliced back to each request in order. A request that would need more than
``max_enqueued_batches`` batches is refused at once (503); a request whose deadline passed is
dropped from its batch (504). Each request is answered exactly once.

One client cannot fail another's request: when a batch fails, each of its requests runs again
alone (padded with its own rows), so only the requests the model cannot run fail, each with
the error of its own run — a batch's error, which may quote any member's values, reaches no
one. `DirectExecutor` runs unbatched requests on a thread pool behind a bounded queue (full:
503 at once); `InlineExecutor` runs them on the caller's thread, for models whose call costs
less than a thread hop.
"""

from __future__ import annotations

import concurrent.futures as cf
import gc
import math
import re
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import KilnError
from .config import BatchingOptions
from .status import DeadlineExceeded, Internal, InvalidArgument, ResourceExhausted, ServeError, Unavailable

_monotonic = time.monotonic
#: observe(rows with padding, rows without, seconds): called after every backend call.
Observer = Callable[[int, int, float], None]
#: Characters of a backend's error message passed on to the client.
MESSAGE_LIMIT = 400
#: After a request with this many bytes of inputs, a pool thread makes a new runner for the next:
#: the old one's interpreters, sized for the big request, are freed instead of kept.
BIG_REQUEST_BYTES = 1 << 20


@dataclass
class Hooks:
    """Where an executor reports: backend calls, its queue depth (``set``), isolated requests (``inc``)."""

    observe: Observer | None = None
    queue: object | None = None
    isolated: object | None = None


_INDEX_ERROR = re.compile(r"\bind(ex|ices)\b|out of bounds|out of range", re.IGNORECASE)


def _suspects(text: str, inputs) -> list[str]:
    """The inputs an error can be about: for a kernel's index error, the integer inputs (a table
    lookup's ids) when there are some; else all of them."""
    names = sorted(inputs)
    if isinstance(inputs, dict) and _INDEX_ERROR.search(text):
        ints = [n for n in names if getattr(getattr(inputs[n], "dtype", None), "kind", "") in ("i", "u")]
        return ints or names
    return names


def request_error(exc: BaseException, inputs) -> ServeError:
    """The answer to a request whose own run failed: the model could not run on its inputs (400),
    naming the inputs it can be about."""
    if isinstance(exc, ServeError):
        return exc
    if isinstance(exc, MemoryError):
        return ResourceExhausted("the model ran out of memory on this request")
    text = (str(exc).strip().splitlines() or [""])[0]
    if len(text) > MESSAGE_LIMIT:
        text = text[:MESSAGE_LIMIT] + "..."
    kind = "" if isinstance(exc, KilnError) else f"{type(exc).__name__}: "
    suspects = ", ".join(repr(n) for n in _suspects(text, inputs))
    return InvalidArgument(f"the model failed on this request's input(s) {suspects}: {kind}{text}")


class Request:
    """One client request, possibly split into pieces; its future is resolved exactly once."""

    def __init__(self, key: str, rows: int, deadline: float, pieces: int = 1):
        self.key = key
        self.rows = rows
        self.deadline = deadline
        self.future: cf.Future = cf.Future()
        self.future.set_running_or_notify_cancel()  # only this class resolves it; cancel() cannot race
        self._parts: list = [None] * pieces
        self._left = pieces
        self._lock = threading.Lock()

    @property
    def done(self) -> bool:
        return self.future.done()

    def fail(self, exc: BaseException) -> bool:
        with self._lock:
            if self.future.done():
                return False
            self.future.set_exception(exc)
            return True

    def cancel(self) -> None:
        """The client gave up (timeout or disconnect): drop the pieces that have not run."""
        self.fail(DeadlineExceeded("the request was cancelled before it ran"))

    def part_done(self, index: int, outputs: dict) -> None:
        with self._lock:
            if self.future.done():
                return
            self._parts[index] = outputs
            self._left -= 1
            if self._left:
                return
            if len(self._parts) == 1:
                result = self._parts[0]
            else:
                result = {n: np.concatenate([p[n] for p in self._parts], axis=0) for n in self._parts[0]}
            self.future.set_result(result)


class _Piece:
    __slots__ = ("request", "index", "inputs", "rows")

    def __init__(self, request: Request, index: int, inputs: dict, rows: int):
        self.request, self.index, self.inputs, self.rows = request, index, inputs, rows


class _Batch:
    __slots__ = ("key", "pieces", "rows", "created", "shapes")

    def __init__(self, key: str, created: float, shapes):
        self.key, self.pieces, self.rows, self.created, self.shapes = key, [], 0, created, shapes


def _inner_shapes(inputs: dict) -> tuple:
    return tuple(sorted((n, a.shape[1:]) for n, a in inputs.items()))


def batch_rows(inputs: dict) -> int:
    """The request's batch size: the equal 0th dimension of every input."""
    sizes = {n: (a.shape[0] if a.ndim else None) for n, a in inputs.items()}
    if any(s is None for s in sizes.values()):
        scalars = [n for n, s in sizes.items() if s is None]
        raise InvalidArgument("Batching input tensors must have at least one dimension; "
                              f"scalar input(s): {', '.join(scalars)}")
    if len(set(sizes.values())) > 1:
        raise InvalidArgument("Batching input tensors supplied in a given op invocation must have equal "
                              "0th-dimension size; got " + ", ".join(f"{n}: {s}" for n, s in sorted(sizes.items())))
    return next(iter(sizes.values()))


def _pad_to(arr: np.ndarray, inner: tuple) -> np.ndarray:
    """Pad the non-batch dimensions of ``arr`` up to ``inner`` with its first element."""
    if arr.shape[1:] == inner:
        return arr
    widths = [(0, 0)] + [(0, want - have) for have, want in zip(arr.shape[1:], inner)]
    fill = arr.reshape(-1)[0] if arr.size else np.zeros((), arr.dtype)
    return np.pad(arr, widths, mode="constant", constant_values=fill)


class _Queue:
    """What an executor keeps waiting (requests or request pieces), mirrored into its hooks' gauge."""

    hooks: Hooks
    _queued = 0

    @property
    def queued(self) -> int:
        return self._queued

    def _add_queued(self, delta: int) -> None:
        self._queued += delta
        if self.hooks.queue is not None:
            self.hooks.queue.set(self._queued)


class BatchScheduler(_Queue):
    """Batches concurrent requests of one model version (one queue per signature)."""

    def __init__(self, options: BatchingOptions, new_runner: Callable, observe: Observer | None = None,
                 name: str = "model", warmup: Callable | None = None, hooks: Hooks | None = None):
        """``warmup(runner)``, when given, runs in every worker before it takes requests."""
        self.options = options
        self._warmup = warmup
        self.name = name
        self.hooks = hooks or Hooks(observe)
        self._cond = threading.Condition()
        self._queues: dict[str, deque] = {}
        self._closing = False
        self.calls = 0
        self._limit = options.execution_limit
        self._threads = []
        ready = []
        errors = []
        for i in range(options.num_batch_threads):
            t = threading.Thread(target=self._worker, args=(new_runner, ready, errors), daemon=True,
                                 name=f"kiln-batch-{name}-{i}")
            t.start()
            self._threads.append(t)
        with self._cond:
            self._cond.wait_for(lambda: len(ready) + len(errors) == len(self._threads), timeout=600)
        if errors:
            self.close(drain=False)
            raise errors[0]

    # -- submitting ----------------------------------------------------------------------------

    def submit(self, key: str, inputs: dict, deadline: float) -> Request:
        rows = batch_rows(inputs)
        opts = self.options
        if rows > opts.max_batch_size:
            raise InvalidArgument(f"Task size {rows} is larger than maximum input batch size {opts.max_batch_size}")
        if rows == 0:
            raise InvalidArgument("the request has zero rows; nothing to batch")
        shapes = _inner_shapes(inputs)
        with self._cond:
            if self._closing:
                raise Unavailable("the server is shutting down; the request was not accepted")
            queue = self._queues.setdefault(key, deque())
            open_batch = queue[-1] if queue else None
            room = 0
            if open_batch is not None and (opts.pad_variable_length_inputs or open_batch.shapes == shapes):
                room = self._limit - open_batch.rows
            if opts.enable_large_batch_splitting:
                first = min(room, rows)
                new = math.ceil((rows - first) / self._limit)
            else:
                first = rows if rows <= room else 0
                new = 0 if first else 1
            if len(queue) + new > opts.max_enqueued_batches:
                raise Unavailable(f"The batch scheduling queue to which this task was submitted is full; currently "
                                  f"{len(queue)} batches enqueued and max_enqueued_batches is "
                                  f"{opts.max_enqueued_batches} (model {self.name}, signature {key!r})")
            sizes = ([first] if first else []) + [min(self._limit, rows - first - i * self._limit) for i in range(new)]
            request = Request(key, rows, deadline, len(sizes))
            now = time.monotonic()
            start = 0
            for index, size in enumerate(sizes):
                part = inputs if len(sizes) == 1 else {n: a[start:start + size] for n, a in inputs.items()}
                start += size
                if index == 0 and first:
                    batch = open_batch
                else:
                    batch = _Batch(key, now, shapes)
                    queue.append(batch)
                batch.pieces.append(_Piece(request, index, part, size))
                batch.rows += size
            self._add_queued(len(sizes))
            # Workers sleep until the oldest batch is due; they need waking only when a batch is new
            # (its due time) or full, not for every request that joins an open batch.
            if new or (open_batch is not None and open_batch.rows >= self._limit):
                self._cond.notify_all()
        return request

    # -- workers -------------------------------------------------------------------------------

    def _ready(self, now: float):
        """The oldest batch that may run now, and the time the next one becomes ready."""
        best, wake = None, None
        timeout = self.options.batch_timeout_micros / 1e6
        for queue in self._queues.values():
            if not queue:
                continue
            batch = queue[0]
            full = len(queue) > 1 or batch.rows >= self._limit
            due = batch.created + timeout
            if full or due <= now or self._closing:
                if best is None or batch.created < best[1].created:
                    best = (queue, batch)
            elif wake is None or due < wake:
                wake = due
        return best, wake

    def _worker(self, new_runner, ready, errors) -> None:
        try:
            runner = new_runner()
            if self._warmup is not None:
                self._warmup(runner)
        except Exception as exc:  # reported by the constructor
            with self._cond:
                errors.append(exc)
                self._cond.notify_all()
            return
        with self._cond:
            ready.append(True)
            self._cond.notify_all()
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    best, wake = self._ready(now)
                    if best is not None:
                        queue, batch = best
                        queue.popleft()
                        self._add_queued(-len(batch.pieces))
                        break
                    if self._closing and not any(self._queues.values()):
                        return
                    self._cond.wait(None if wake is None else max(wake - now, 0.0))
            self._run(batch, runner)

    def _run(self, batch: _Batch, runner) -> None:
        now = time.monotonic()
        live = []
        for piece in batch.pieces:
            if piece.request.done:
                continue
            if piece.request.deadline <= now:
                piece.request.fail(DeadlineExceeded("Deadline exceeded while the request waited for its batch"))
                continue
            live.append(piece)
        if not live:
            return
        try:
            outputs = self._call(runner, batch.key, live)
        except Exception as exc:
            if isinstance(exc, Internal) or len(live) == 1:
                for piece in live:
                    piece.request.fail(request_error(exc, piece.inputs))
                return
            if self.hooks.isolated is not None:
                self.hooks.isolated.inc(len(live))
            for piece in live:  # each alone: only the requests the model cannot run fail
                self._run_alone(piece, batch.key, runner)
            return
        start = 0
        for piece in live:
            piece.request.part_done(piece.index, {n: o[start:start + piece.rows] for n, o in outputs.items()})
            start += piece.rows

    def _run_alone(self, piece: _Piece, key: str, runner) -> None:
        if piece.request.done:
            return
        try:
            outputs = self._call(runner, key, [piece])
        except Exception as exc:
            piece.request.fail(request_error(exc, piece.inputs))
            return
        piece.request.part_done(piece.index, {n: o[:piece.rows] for n, o in outputs.items()})

    def _call(self, runner, key: str, pieces: list) -> dict:
        """One backend call on ``pieces``' rows (padded): the checked outputs."""
        feeds, rows, padded = self._assemble(pieces)
        start = time.perf_counter()
        outputs = runner(key, feeds)
        seconds = time.perf_counter() - start
        with self._cond:
            self.calls += 1
        if self.hooks.observe is not None:
            self.hooks.observe(padded, rows, seconds)
        checked = {}
        for name, out in outputs.items():
            out = np.asarray(out)
            if out.ndim == 0 or out.shape[0] != padded:
                raise Internal(f"Batched output tensor's 0th dimension does not equal the sum of the 0th "
                               f"dimension sizes of the input tensors (output {name!r}: "
                               f"{out.shape[0] if out.ndim else 'a scalar'}, batch {padded})")
            checked[name] = out
        return checked

    def _assemble(self, pieces: list) -> tuple[dict, int, int]:
        names = list(pieces[0].inputs)
        rows = sum(p.rows for p in pieces)
        padded = self.options.padded_size(rows)
        feeds = {}
        for n in names:
            arrays = [p.inputs[n] for p in pieces]
            if self.options.pad_variable_length_inputs and len({a.shape[1:] for a in arrays}) > 1:
                ranks = {a.ndim for a in arrays}
                if len(ranks) > 1:
                    raise InvalidArgument(f"input '{n}': requests in one batch differ in rank; cannot pad")
                inner = tuple(max(dims) for dims in zip(*(a.shape[1:] for a in arrays)))
                arrays = [_pad_to(a, inner) for a in arrays]
            if padded > rows:
                arrays.append(np.repeat(arrays[0][:1], padded - rows, axis=0))
            feeds[n] = arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)
        return feeds, rows, padded

    # -- shutting down -------------------------------------------------------------------------

    def close(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop taking requests; run what is queued (``drain``, for up to ``timeout`` s) and fail
        the rest (503); wait for the workers."""
        with self._cond:
            self._closing = True
            if not drain:
                self._fail_queued("the model version was unloaded")
            self._cond.notify_all()
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self._threads:
            t.join(None if deadline is None else max(deadline - time.monotonic(), 0))
        with self._cond:
            self._fail_queued("the server shut down before the request ran (drain timeout)")

    def _fail_queued(self, message: str) -> None:
        for queue in self._queues.values():
            for batch in queue:
                for piece in batch.pieces:
                    piece.request.fail(Unavailable(message))
            queue.clear()
        self._add_queued(-self._queued)


class DirectExecutor(_Queue):
    """Runs every request on its own (no batching): a thread pool, one runner per thread, behind
    a queue of at most ``max_queued`` requests (more: 503 at once)."""

    def __init__(self, new_runner: Callable, threads: int, observe: Observer | None = None,
                 shared_runner: bool = False, name: str = "model", max_queued: int = 256,
                 hooks: Hooks | None = None):
        self._new_runner = new_runner
        self._shared = new_runner() if shared_runner else None
        self._local = threading.local()
        self._pool = cf.ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"kiln-run-{name}")
        self.hooks = hooks or Hooks(observe)
        self.max_queued = max_queued
        self.name = name
        self._lock = threading.Lock()
        self._waiting: set[Request] = set()
        self._closing = False
        self.calls = 0

    def submit(self, key: str, inputs: dict, deadline: float) -> Request:
        first = next(iter(inputs.values()), None)
        rows = first.shape[0] if first is not None and first.ndim else 1
        request = Request(key, rows, deadline)
        with self._lock:
            if self._closing:
                raise Unavailable("the server is shutting down; the request was not accepted")
            if self._queued >= self.max_queued:
                raise Unavailable(f"the queue of model {self.name} is full ({self.max_queued} requests wait for a "
                                  "worker thread); retry later")
            self._add_queued(1)
            self._waiting.add(request)
        self._pool.submit(self._run, request, inputs)
        return request

    def _runner(self):
        if self._shared is not None:
            return self._shared
        runner = getattr(self._local, "runner", None)
        if runner is None:
            runner = self._local.runner = self._new_runner()
        return runner

    def _run(self, request: Request, inputs: dict) -> None:
        with self._lock:
            self._add_queued(-1)
            self._waiting.discard(request)
        run_request(request, inputs, self._runner, self.hooks, self)
        if self._shared is None and sum(getattr(a, "nbytes", 0) for a in inputs.values()) >= BIG_REQUEST_BYTES:
            self._local.runner = None  # with the interpreters it keeps per batch size, sized for this request

    def close(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop taking requests; run what waits (``drain``, for up to ``timeout`` s), fail the rest (503)."""
        with self._lock:
            self._closing = True
        if drain:
            deadline = None if timeout is None else time.monotonic() + timeout
            while self._queued and (deadline is None or time.monotonic() < deadline):
                time.sleep(0.005)
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            waiting, self._waiting = list(self._waiting), set()
        message = "the server shut down before the request ran" + (" (drain timeout)" if drain else "")
        for request in waiting:
            request.fail(Unavailable(message))


class InlineExecutor:
    """Runs each request at once on the submitting thread (the event loop, a gRPC thread), with
    that thread's runner: for models whose call costs less than handing it to another thread.
    A request of more than ``max_rows`` rows goes to ``larger`` (a `DirectExecutor`), so a big
    one never holds the event loop."""

    def __init__(self, new_runner: Callable, name: str = "model", hooks: Hooks | None = None,
                 max_rows: int = 1 << 30, larger: "DirectExecutor | None" = None):
        self.max_rows = max_rows
        self.larger = larger
        self._new_runner = new_runner
        self._local = threading.local()
        self.hooks = hooks or Hooks()
        self.name = name
        self._closing = False
        self._lock = threading.Lock()
        self.calls = 0

    def _call(self):
        """This thread's runner, as its ``run`` method (a runner's ``__call__`` only forwards to it)."""
        runner = self._new_runner()
        self._local.call = getattr(runner, "run", runner)
        return self._local.call

    def submit(self, key: str, inputs: dict, deadline: float) -> "Request | Finished":
        if self._closing:
            raise Unavailable("the server is shutting down; the request was not accepted")
        for first in inputs.values():
            rows = first.shape[0] if first.ndim else 1
            break
        else:
            rows = 1
        if rows > self.max_rows and self.larger is not None:
            return self.larger.submit(key, inputs, deadline)
        try:
            return Finished(self.run(key, inputs, rows, deadline), None, deadline)
        except ServeError as exc:
            return Finished(None, exc, deadline)

    def run(self, key: str, inputs: dict, rows: int, deadline: float) -> dict:
        """The outputs of a request of ``rows`` rows (at most ``max_rows``: the caller checked), run at
        once on this thread; raises the request's `ServeError`. `submit` without the `Finished`."""
        if self._closing:
            raise Unavailable("the server is shutting down; the request was not accepted")
        start = _monotonic()
        if deadline <= start:
            raise DeadlineExceeded("Deadline exceeded before the request could run")
        call = getattr(self._local, "call", None) or self._call()
        try:
            outputs = call(key, inputs)
        except Exception as exc:
            raise request_error(exc, inputs) from None
        self.calls += 1
        if self.hooks.observe is not None:
            self.hooks.observe(rows, rows, _monotonic() - start)
        return outputs

    @property
    def queued(self) -> int:
        return self.larger.queued if self.larger is not None else 0

    def close(self, drain: bool = True, timeout: float | None = None) -> None:
        self._closing = True
        if self.larger is not None:
            self.larger.close(drain, timeout)


class CollectingRunner:
    """A kiln runner keeps an interpreter per input shape, the 8 used last; one it drops stays alive
    in reference cycles, its buffers sized for its batch, until Python's collector runs, which it
    seldom does for a few objects that hold much memory (warming up 128 allowed batch sizes once
    held 9 GB). This wrapper mirrors that cache and collects after each interpreter dropped (a
    full collection costs ~10 ms, about what making the next interpreter does)."""

    __slots__ = ("runner", "recent")
    CACHE = 8

    def __init__(self, runner):
        self.runner, self.recent = runner, {}

    def run(self, key: str, feeds: dict) -> dict:
        shapes = (key, *(a.shape for a in feeds.values()))
        recent = self.recent
        if shapes in recent:
            recent[shapes] = recent.pop(shapes)  # the most recent last
        else:
            recent[shapes] = None
            if len(recent) > self.CACHE:
                del recent[next(iter(recent))]
                gc.collect()
        return self.runner.run(key, feeds)

    __call__ = run


class Finished:
    """A request answered on the submitting thread: `Request`'s interface without a future to wait on."""

    __slots__ = ("_outputs", "_error", "deadline")
    done = True

    def __init__(self, outputs: dict | None, error: BaseException | None, deadline: float):
        self._outputs, self._error, self.deadline = outputs, error, deadline

    @property
    def future(self) -> "Finished":
        return self

    def result(self, timeout: float | None = None) -> dict:
        if self._error is not None:
            raise self._error
        return self._outputs

    def cancel(self) -> None:
        """Nothing left to cancel."""

    def fail(self, exc: BaseException) -> bool:
        return False


def run_request(request: Request, inputs: dict, runner: Callable, hooks: Hooks, owner) -> None:
    """Run one unbatched request with ``runner()``'s runner and resolve it."""
    if request.done:
        return
    if request.deadline <= time.monotonic():
        request.fail(DeadlineExceeded("Deadline exceeded while the request waited for a worker"))
        return
    try:
        start = time.perf_counter()
        outputs = runner()(request.key, inputs)
        seconds = time.perf_counter() - start
        with owner._lock:
            owner.calls += 1
        if hooks.observe is not None:
            hooks.observe(request.rows, request.rows, seconds)
    except Exception as exc:
        request.fail(request_error(exc, inputs))
        return
    request.part_done(0, outputs)
