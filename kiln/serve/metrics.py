"""Prometheus metrics of the server, per model and version, with bounded label sets.

No client can add a series: requests name models, versions and methods the server decides
to label, and anything else is counted under ``model="(other)"``, ``version=""``,
``method="other"``; status codes are the few the server answers. A scrape renders a text
whose size depends on the served models only, off the event loop.

A request must cost little next to a model call of a few microseconds, so an answer or a
backend call only appends its latency to a list under one lock; a background thread flushes the
lists into the Prometheus metrics every `FLUSH_SECONDS` (and before every scrape), binning each
histogram's observations in one NumPy pass. A scrape sees every
answer given before it began: its own worker's at once, the other workers' after their next
flush (in multiprocess mode the scrape waits two flush periods, off the event loop).

With several worker processes (``--num_workers``) every worker writes its samples to
memory-mapped files in one directory (prometheus_client's multiprocess mode) and whichever
worker answers a scrape sums them all. ``process_*`` metrics cover the server's processes
(the workers and their supervisor) together.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client import values as _values
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

disable_created_metrics()  # no *_created series: TF Serving exports none, and they double the text

_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
OTHER_MODEL = "(other)"
#: Environment variable naming the multiprocess directory (prometheus_client's own).
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
PIDS_FILE = "pids"
#: How often the tallies are flushed into the Prometheus metrics.
FLUSH_SECONDS = 0.05
_LATENCY_BOUNDS = (*_LATENCY, float("inf"))
_SIZE_BOUNDS = (*_SIZES, float("inf"))


def _observe_many(child, bounds: tuple, values: np.ndarray) -> None:
    """Many observations of one histogram child at once (as many ``observe`` calls would add)."""
    # prometheus_client has no call to add many observations; its histogram child keeps one value
    # per bucket (non-cumulative; an observation goes to the first bound >= it) and one for the sum
    # (private names, stable since 0.1; pyproject caps prometheus-client below 1.0, tests/serve
    # pin the page)
    child._sum.inc(float(values.sum()))
    per_bucket = np.bincount(np.searchsorted(bounds, values, side="left"), minlength=len(bounds))
    for bucket, amount in zip(child._buckets, per_bucket.tolist()):
        if amount:
            bucket.inc(amount)


def use_multiprocess_dir(path: str) -> None:
    """Make this process write its samples under ``path`` (call before creating `Metrics`)."""
    os.environ[MULTIPROC_ENV] = path
    _values.ValueClass = _values.get_value_class()


class Metrics:
    """The server's metric families. ``models``: the configured model names (labelled as they are)."""

    def __init__(self, models=()):
        self.models = frozenset(models)
        self.multiprocess_dir = os.environ.get(MULTIPROC_ENV)
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ("model", "version")
        r = self.registry
        self.requests = Counter("kiln_serve_requests", "Requests answered, by method and HTTP status code "
                                "(499: the client hung up first).", ("model", "version", "method", "code"), registry=r)
        self.latency = Histogram("kiln_serve_request_latency_seconds", "Time from a request's first byte to its "
                                 "answer.", ("model", "version", "method"), buckets=_LATENCY, registry=r)
        self.backend_calls = Counter("kiln_serve_backend_calls", "Backend (interpreter or TF function) calls.",
                                     labels, registry=r)
        self.backend_latency = Histogram("kiln_serve_backend_latency_seconds", "Time of one backend call.",
                                         labels, buckets=_LATENCY, registry=r)
        self.batch_size = Histogram("kiln_serve_batch_size", "Rows per backend call, padding included.",
                                    labels, buckets=_SIZES, registry=r)
        self.padding_rows = Counter("kiln_serve_padding_rows", "Rows added to reach an allowed batch size.",
                                    labels, registry=r)
        self.retried = Counter("kiln_serve_isolated_requests", "Requests run alone after their batch failed.",
                               labels, registry=r)
        self.queue_depth = Gauge("kiln_serve_queue_depth", "Requests (or request pieces) waiting for a backend call.",
                                 labels, registry=r, multiprocess_mode="livesum")
        self.rejected = Counter("kiln_serve_rejected", "Requests refused with 503 (a full queue, the body budget, the "
                                "connection limit, shutting down).", labels, registry=r)
        self.loaded = Gauge("kiln_serve_model_version_available", "1 while the version is served.",
                            labels, registry=r, multiprocess_mode="livemax")
        self._children: dict = {}  # answer labels -> (requests child, latency child, rejected child or None)
        self._lock = threading.Lock()
        self._answers: dict = {}  # answer labels -> latencies (seconds) since the last flush
        self._calls: dict = {}    # (calls, latency, sizes, padding children) -> [(padded rows, rows, seconds)]
        _flusher.watch(self)

    # -- labels --------------------------------------------------------------------------------
    def model_label(self, name: str) -> str:
        return name if name in self.models else OTHER_MODEL

    def request(self, model: str, version: str, method: str, code: int, seconds: float) -> None:
        """Count one answer; ``model`` and ``version`` must already be labels (see `model_label`)."""
        key = (model, version, method, code)
        with self._lock:
            pending = self._answers.get(key)
            if pending is None:
                pending = self._answers[key] = []
            pending.append(seconds)

    def observer(self, model: str, version: int):
        """observe(padded rows, rows, seconds) for one version's executor."""
        children = (self.backend_calls.labels(model, str(version)), self.backend_latency.labels(model, str(version)),
                    self.batch_size.labels(model, str(version)), self.padding_rows.labels(model, str(version)))
        lock = self._lock

        def observe(padded: int, rows: int, seconds: float) -> None:
            with lock:
                pending = self._calls.get(children)
                if pending is None:
                    pending = self._calls[children] = []
                pending.append((padded, rows, seconds))

        return observe

    def _answer_children(self, key: tuple) -> tuple:
        children = self._children.get(key)
        if children is None:
            model, version, method, code = key
            children = self._children[key] = (self.requests.labels(model, version, method, str(code)),
                                              self.latency.labels(model, version, method),
                                              self.rejected.labels(model, version) if code == 503 else None)
        return children

    def flush(self) -> None:
        """Add the tallies to the Prometheus metrics (any thread), each histogram binned in one
        NumPy pass over what it observed since the last flush."""
        with self._lock:
            if not self._answers and not self._calls:
                return
            answers, self._answers = self._answers, {}
            calls, self._calls = self._calls, {}
        for key, latencies in answers.items():
            requests, latency, rejected = self._answer_children(key)
            requests.inc(len(latencies))
            if rejected is not None:
                rejected.inc(len(latencies))
            _observe_many(latency, _LATENCY_BOUNDS, np.asarray(latencies, np.float64))
        for (count, latency, sizes, padding), observed in calls.items():
            padded, rows, seconds = np.asarray(observed, np.float64).T
            count.inc(len(observed))
            _observe_many(latency, _LATENCY_BOUNDS, seconds)
            _observe_many(sizes, _SIZE_BOUNDS, padded)
            added = int((padded - rows).sum())
            if added:
                padding.inc(added)

    def queue(self, model: str, version: int):
        """The queue-depth gauge of one version (its executor sets it)."""
        return self.queue_depth.labels(model, str(version))

    def isolated(self, model: str, version: int):
        return self.retried.labels(model, str(version))

    def attach(self, model: str, version: int) -> None:
        self.loaded.labels(model, str(version)).set(1)

    def detach(self, model: str, version: int) -> None:
        self.queue_depth.labels(model, str(version)).set(0)
        self.loaded.labels(model, str(version)).set(0)

    # -- the page ------------------------------------------------------------------------------
    def render(self) -> bytes:
        """The Prometheus text: every worker's samples (multiprocess mode) and ``process_*``."""
        self.flush()
        if self.multiprocess_dir:
            time.sleep(2 * FLUSH_SECONDS)  # the other workers flush what they answered before now
            from prometheus_client.multiprocess import MultiProcessCollector

            registry = CollectorRegistry()
            MultiProcessCollector(registry, self.multiprocess_dir)
            registry.register(_ProcessCollector(self.multiprocess_dir))
            return generate_latest(registry)
        return generate_latest(self.registry) + generate_latest(_process_registry())


class _Flusher:
    """One daemon thread flushing every live `Metrics` of the process every `FLUSH_SECONDS`."""

    def __init__(self):
        self._live: weakref.WeakSet = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = None
        self._failed = False

    def watch(self, metrics: Metrics) -> None:
        with self._lock:
            self._live.add(metrics)
            if self._thread is None or self._pid != os.getpid():  # a forked worker starts its own
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, daemon=True, name="kiln-metrics-flush")
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(FLUSH_SECONDS)
            for metrics in list(self._live):
                try:
                    metrics.flush()
                except Exception:  # a failed flush must not stop the thread; said once
                    if not self._failed:
                        self._failed = True
                        logging.getLogger("kiln.serve").exception("metrics: flushing the request tallies failed")


_flusher = _Flusher()


def _process_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(_ProcessCollector(None))
    return registry


class _ProcessCollector:
    """``process_*`` metrics summed over the server's processes (read from /proc)."""

    def __init__(self, directory: str | None):
        self.directory = directory

    def _pids(self) -> list[int]:
        pids = {os.getpid()}
        if self.directory:
            try:
                with open(os.path.join(self.directory, PIDS_FILE)) as f:
                    pids.update(int(p) for p in f.read().split())
            except (OSError, ValueError):
                pass
        return sorted(pids)

    def collect(self):
        ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        try:
            with open("/proc/stat") as f:
                boot = next(float(line.split()[1]) for line in f if line.startswith("btime"))
        except (OSError, StopIteration, ValueError):
            return []
        cpu = rss = vms = fds = 0.0
        start = None
        for pid in self._pids():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                cpu += (int(fields[11]) + int(fields[12])) / ticks
                vms += int(fields[20])
                rss += int(fields[21]) * page
                started = boot + int(fields[19]) / ticks
                start = started if start is None else min(start, started)
                fds += len(os.listdir(f"/proc/{pid}/fd"))
            except (OSError, ValueError, IndexError):
                continue
        out = [CounterMetricFamily("process_cpu_seconds", "User and system CPU time of the server's processes.",
                                   value=cpu),
               GaugeMetricFamily("process_resident_memory_bytes", "Resident memory of the server's processes.",
                                 value=rss),
               GaugeMetricFamily("process_virtual_memory_bytes", "Virtual memory of the server's processes.",
                                 value=vms),
               GaugeMetricFamily("process_open_fds", "Open file descriptors of the server's processes.", value=fds),
               GaugeMetricFamily("process_start_time_seconds", "Start time of the server's oldest process, seconds "
                                 "since the epoch.", value=start if start is not None else time.time())]
        try:
            import resource

            out.append(GaugeMetricFamily("process_max_fds", "Open file descriptors allowed per process.",
                                         value=resource.getrlimit(resource.RLIMIT_NOFILE)[0]))
        except (ImportError, OSError, ValueError):
            pass
        return out
