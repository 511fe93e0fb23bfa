"""Running ``kiln serve``: one worker process, or a supervisor of several sharing the ports.

A worker loads the models, then serves REST (`kiln.serve.rest` on `kiln.serve.http`, one
asyncio loop) and gRPC (`kiln.serve.grpc_service`, a thread pool) over one `Service`. Python
runs one thread at a time, so a worker uses about one core for the front end; ``--num_workers``
forks that many workers, which bind the REST and gRPC ports with SO_REUSEPORT (the kernel
spreads new connections evenly); each has its own models and batchers, and their metrics are summed on every
scrape. A worker only starts accepting once its models are loaded.

SIGTERM or SIGINT drains: stop accepting, let in-flight and queued requests finish for up to
``--drain_timeout_seconds``, answer what is left 503 / UNAVAILABLE, exit 0. The supervisor
passes the signal on, and starts a new worker when one dies unexpectedly.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

log = logging.getLogger("kiln.serve")
SWITCH_SECONDS = 0.001


@dataclass
class Options:
    """Everything a worker needs (from the command line)."""

    specs: list
    backend: str = "kiln"
    batching: object = None
    per_model_batching: bool = False
    num_threads: int | None = None
    rest_threads: int | None = None
    host: str = "127.0.0.1"
    rest_port: int = 8501
    grpc_port: int = 0
    grpc_threads: int = 16
    timeout_seconds: float = 30.0
    drain_timeout: float = 30.0
    poll_seconds: float = 1.0
    metrics_path: str | None = "/monitoring/prometheus/metrics"
    max_queued: int = 256
    limits: object = None
    num_workers: int = 1
    inline: bool = True


def listen(host: str, port: int, shared: bool = False) -> socket.socket:
    """A listening TCP socket (port 0: any free port); ``shared``: one of several workers' sockets
    on the port (SO_REUSEPORT: the kernel spreads new connections evenly over them)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if shared:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def serve(options: Options) -> int:
    """Serve until a signal; returns the exit code."""
    if options.num_workers <= 1:  # binds once the models are loaded: until then, connections are refused
        return Worker(options).run()
    return _supervise(options)


# -- one worker ----------------------------------------------------------------------------------

class Worker:
    def __init__(self, options: Options, index: int = 0):
        self.options = options
        self.rest_sock: socket.socket | None = None
        self.index = index
        self.stopping: asyncio.Event | None = None

    def run(self) -> int:
        from .budget import MemoryBudget, return_large_allocations
        from .metrics import Metrics
        from .models import ModelManager
        from .service import Service

        o = self.options
        self._blas = _cap_blas_threads(o.num_threads or 1)
        _raise_fd_limit(o.limits)
        # A thread holding the interpreter (decoding or writing a big request, a model call between NumPy
        # calls) yields it to the event loop after 1 ms instead of Python's 5: small requests do not queue
        # behind big ones for long.
        sys.setswitchinterval(SWITCH_SECONDS)
        manager = ModelManager(o.specs, o.backend, o.batching, o.num_threads, o.rest_threads,
                               Metrics(s.name for s in o.specs), o.per_model_batching, o.max_queued, o.inline)
        manager.poll_once()
        for name, why in manager.not_served().items():
            log.warning(f"model {name}: nothing served yet ({why}); still looking")
        manager.start_polling(o.poll_seconds)
        service = Service(manager, o.timeout_seconds, MemoryBudget(o.limits.body_budget_bytes))
        return_large_allocations()
        if o.rest_port:  # each worker its own socket: closed on drain, it takes no more connections
            self.rest_sock = listen(o.host, o.rest_port, shared=o.num_workers > 1)
        grpc_server = None
        if o.grpc_port:
            from .grpc_service import GrpcApi

            grpc_server = GrpcApi(service, o.limits).server(o.host, o.grpc_port, o.grpc_threads)
        try:
            loop = _new_loop()
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self._serve(service, grpc_server))
        finally:
            manager.close(drain=True, timeout=0)
        return 0

    async def _serve(self, service, grpc_server) -> None:
        from .rest import RestApi

        o = self.options
        loop = asyncio.get_running_loop()
        self.stopping = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        http = None
        if self.rest_sock is not None:
            http = RestApi(service, o.metrics_path).server(o.limits)
            await http.start(self.rest_sock)
        if self.index == 0:
            names = ",".join(service.manager.model_names())
            apis = ([f"REST on http://{o.host}:{self.rest_sock.getsockname()[1]}/v1/models/{{{names}}}"]
                    if self.rest_sock is not None else []) + ([f"gRPC on {o.host}:{o.grpc_port}"] if o.grpc_port else [])
            log.info(f"kiln serve: {' and '.join(apis)} (backend {o.backend}, batching "
                     f"{'on' if o.batching else 'off'}, {o.num_workers} worker(s))")
        await self.stopping.wait()
        log.info(f"kiln serve: worker {os.getpid()}: draining (no new connections; finishing what is in flight "
                 f"for up to {o.drain_timeout:g} s)")
        start = time.monotonic()
        service.begin_drain(o.drain_timeout)
        closing = loop.run_in_executor(None, lambda: service.manager.close(drain=True, timeout=o.drain_timeout))
        if http is not None:
            await http.drain(o.drain_timeout, f"the server shut down before the request finished (drain timeout of "
                                              f"{o.drain_timeout:g} s)")
        await asyncio.wait_for(closing, None)
        if grpc_server is not None:  # new calls were answered UNAVAILABLE meanwhile, for at least the idle grace
            from .http import DRAIN_IDLE_GRACE

            await asyncio.sleep(max(0.0, start + min(o.drain_timeout, DRAIN_IDLE_GRACE) - time.monotonic()))
            left = max(0.1, start + o.drain_timeout - time.monotonic())
            await loop.run_in_executor(None, grpc_server.stop(left).wait, left + 1)


def _cap_blas_threads(n: int):
    """Cap NumPy's BLAS at ``n`` threads in this worker (kept for its life). A worker already runs
    requests side by side; BLAS threads spinning up per tiny product only take cores from them
    (a small MLP served 1.6x faster with 1 than with 2 on a 2-core machine)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl is in the serve extra
        return None
    return threadpool_limits(limits=n, user_api="blas")


def _raise_fd_limit(limits) -> None:
    """Raise this worker's open-file limit to its hard limit (a soft limit of 1024 would refuse
    connections before --max_connections); where even that is short, hold fewer connections."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Windows
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    spare = 256  # models, gRPC, metrics files, the event loop
    if soft != resource.RLIM_INFINITY and limits.max_connections > soft - spare:
        log.warning(f"kiln serve: {soft} open files allowed per process (ulimit -n): holding at most "
                    f"{max(soft - spare, 16)} HTTP connections, not --max_connections {limits.max_connections}")
        limits.max_connections = max(soft - spare, 16)


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is in the serve extra (not on Windows)
        return asyncio.new_event_loop()


# -- several workers -----------------------------------------------------------------------------

def _end_with(supervisor: int) -> None:
    """The worker gets SIGTERM (a drain) when its supervisor ends, even by SIGKILL, so no worker
    outlives it holding the ports (Linux's PR_SET_PDEATHSIG; elsewhere only the check below)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass
    if os.getppid() != supervisor:  # it ended before the line above took effect
        os._exit(1)


def _supervise(options: Options) -> int:
    from .metrics import PIDS_FILE, use_multiprocess_dir

    directory = tempfile.mkdtemp(prefix="kiln-serve-metrics-")
    workers: dict[int, int] = {}  # pid -> index
    stopping = threading.Event()
    codes = []

    supervisor = os.getpid()

    def start(index: int) -> None:
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                _end_with(supervisor)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                use_multiprocess_dir(directory)
                code = Worker(options, index).run()
            except BaseException:
                log.exception(f"kiln serve: worker {index} failed")
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        workers[pid] = index
        with open(os.path.join(directory, PIDS_FILE), "w") as f:
            f.write(" ".join(str(p) for p in [os.getpid(), *workers]))

    def forward(sig, frame) -> None:
        stopping.set()
        for pid in list(workers):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        for index in range(options.num_workers):
            start(index)
        restarts: list[float] = []
        while workers:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            except InterruptedError:  # pragma: no cover - PEP 475 retries
                continue
            index = workers.pop(pid, None)
            if index is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(pid, directory)
            if stopping.is_set():
                codes.append(code)
                continue
            now = time.monotonic()
            restarts = [t for t in restarts if now - t < 60] + [now]
            log.error(f"kiln serve: worker {index} (pid {pid}) exited with {code}"
                      + ("; starting another" if len(restarts) <= 5 else "; too many failures, stopping"))
            if len(restarts) > 5:
                forward(signal.SIGTERM, None)
                codes.append(code or 1)
                continue
            start(index)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return max(codes, default=0)
