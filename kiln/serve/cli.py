"""``kiln serve``: TensorFlow Serving's REST and gRPC APIs for .tflite models and SavedModels.

Flags keep TF Serving's names (``--model_base_path``, ``--model_name``, ``--port`` for gRPC,
``--rest_api_port``, ``--enable_batching``, ``--batching_parameters_file``,
``--model_config_file``, ``--file_system_poll_wait_seconds``, ``--rest_api_timeout_in_ms``,
``--grpc_max_threads``), so a TF Serving command line carries over; kiln's own flags bound
what a request may cost (docs/serving.md). Wired into the ``kiln`` command by kiln/cli.py
through `add_parser`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys


def _bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``serve`` subcommand."""
    from ..runtime.served import BACKENDS

    p = subparsers.add_parser(
        "serve", help="serve models over TensorFlow Serving's REST and gRPC APIs (with request batching)",
        description="Serve .tflite models and SavedModels with TensorFlow Serving's REST API. A model "
                    "directory holds numeric version subdirectories; the newest is served and new versions "
                    "are picked up while serving.")
    p.add_argument("--model_base_path", metavar="DIR", help="directory of numeric version subdirectories")
    p.add_argument("--model_name", default="default", help="name the model is served under (default: default)")
    p.add_argument("--model_config_file", metavar="FILE", help="ModelServerConfig text proto for several models")
    p.add_argument("--port", type=int, default=8500,
                   help="gRPC port (TF Serving's PredictionService and ModelService; 0: no gRPC; default 8500)")
    p.add_argument("--rest_api_port", type=int, default=8501,
                   help="REST port (0: no REST; default 8501, where TF Serving has REST off unless given)")
    p.add_argument("--host", "--rest_api_host", dest="host", default="127.0.0.1",
                   help="address both APIs bind (default 127.0.0.1, local only; 0.0.0.0 for every interface)")
    p.add_argument("--backend", choices=BACKENDS, default="kiln",
                   help="runtime for .tflite models (SavedModels always run on TensorFlow; default kiln)")
    p.add_argument("--enable_batching", type=_bool, nargs="?", const=True, default=False,
                   help="batch concurrent requests on the server")
    p.add_argument("--batching_parameters_file", metavar="FILE",
                   help="BatchingParameters text proto (implies --enable_batching)")
    p.add_argument("--enable_per_model_batching_parameters", type=_bool, nargs="?", const=True, default=False,
                   help="with batching on, a version batches with its own batching_params.pbtxt (and not at "
                        "all without one); only num_batch_threads comes from the server's parameters")
    p.add_argument("--monitoring_config_file", metavar="FILE",
                   help="MonitoringConfig text proto: prometheus_config { enable path } (default: metrics on at "
                        "/monitoring/prometheus/metrics)")
    p.add_argument("--file_system_poll_wait_seconds", type=float, default=1.0,
                   help="seconds between looks for new versions; 0 looks once (default 1)")
    p.add_argument("--rest_api_timeout_in_ms", type=int, default=30000, help="per-request deadline (default 30000)")
    p.add_argument("--rest_api_num_threads", type=int, default=0,
                   help="worker threads per worker process for unbatched requests (default: the number of CPU cores)")
    p.add_argument("--grpc_max_threads", type=int, default=0,
                   help="gRPC handler threads per worker process (default: 4 per CPU core, as TF Serving)")
    p.add_argument("--num_workers", type=int, default=1,
                   help="worker processes sharing the ports, each with its own models and batchers (default 1)")
    p.add_argument("--tensorflow_intra_op_parallelism", type=int, default=0,
                   help="threads per interpreter and for NumPy's BLAS in each worker (0: the backend's default "
                        "threads, BLAS capped at 1)")
    p.add_argument("--max_request_bytes", type=int, default=64 << 20,
                   help="largest request body accepted (default 64 MiB); larger ones get 400")
    p.add_argument("--request_body_budget_bytes", type=int, default=256 << 20,
                   help="bytes of request bodies a worker holds at once; a request past it gets 503 (default 256 MiB)")
    p.add_argument("--max_queued_requests", type=int, default=256,
                   help="unbatched requests a model version queues per worker; more get 503 at once (default 256)")
    p.add_argument("--max_connections", type=int, default=1024,
                   help="open HTTP connections per worker; requests on more get 503 (default 1024)")
    p.add_argument("--max_connections_per_client", type=int, default=256,
                   help="open HTTP connections per worker from one client address; past it the client's longest "
                        "idle one is closed, or the new one refused (default 256)")
    p.add_argument("--http_idle_timeout_seconds", type=float, default=60.0,
                   help="an HTTP connection without a request in progress is closed after this (default 60)")
    p.add_argument("--http_read_timeout_seconds", type=float, default=30.0,
                   help="a request must arrive whole within this from its first byte, else 408 (default 30)")
    p.add_argument("--drain_timeout_seconds", type=float, default=30.0,
                   help="on SIGTERM, how long in-flight requests may take to finish; the rest get 503 (default 30)")
    p.add_argument("--access_log", type=_bool, nargs="?", const=True, default=False,
                   help="one JSON line per request on stderr (default false, as TF Serving, which has none)")
    p.set_defaults(func=run)
    return p


def _specs(args):
    from .config import ConfigError, ModelSpec, read_model_config

    if args.model_config_file:
        if args.model_base_path:
            raise ConfigError("give --model_config_file or --model_base_path, not both")
        return read_model_config(args.model_config_file)
    if not args.model_base_path:
        raise ConfigError("kiln serve needs --model_base_path DIR (or --model_config_file FILE)")
    return [ModelSpec(args.model_name, args.model_base_path)]


def _setup_logging(access: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    for name, level in (("kiln.serve", logging.INFO), ("kiln.serve.access", logging.INFO if access else logging.WARNING)):
        logger = logging.getLogger(name)
        logger.setLevel(level)
    root = logging.getLogger("kiln.serve")
    if not root.handlers:
        root.addHandler(handler)
    root.propagate = False


def _positive(args, *names) -> None:
    from .config import ConfigError

    for name in names:
        if getattr(args, name) <= 0:
            raise ConfigError(f"--{name} must be positive, got {getattr(args, name)}")


def run(args) -> int:
    from .config import (PROMETHEUS_PATH, BatchingOptions, ConfigError, read_batching_parameters,
                         read_monitoring_config)
    from .http import Limits
    from .server import Options, serve

    _setup_logging(args.access_log)
    _positive(args, "rest_api_timeout_in_ms", "max_request_bytes", "request_body_budget_bytes", "max_queued_requests",
              "max_connections", "max_connections_per_client", "http_idle_timeout_seconds", "http_read_timeout_seconds", "num_workers")
    if args.drain_timeout_seconds < 0:
        raise ConfigError("--drain_timeout_seconds must be >= 0")
    if not args.rest_api_port and not args.port:
        raise ConfigError("--port and --rest_api_port are both 0: there is nothing to serve on")
    batching = None
    if args.batching_parameters_file:
        batching = read_batching_parameters(args.batching_parameters_file)
    elif args.enable_batching:
        batching = BatchingOptions()
    metrics_path = read_monitoring_config(args.monitoring_config_file) if args.monitoring_config_file else PROMETHEUS_PATH
    limits = Limits(max_body_bytes=args.max_request_bytes, body_budget_bytes=args.request_body_budget_bytes,
                    max_connections=args.max_connections, max_connections_per_client=args.max_connections_per_client,
                    idle_timeout=args.http_idle_timeout_seconds,
                    read_timeout=args.http_read_timeout_seconds)
    options = Options(_specs(args), args.backend, batching, args.enable_per_model_batching_parameters,
                      args.tensorflow_intra_op_parallelism or None, args.rest_api_num_threads or None, args.host,
                      args.rest_api_port, args.port, args.grpc_max_threads or 4 * (os.cpu_count() or 1),
                      args.rest_api_timeout_in_ms / 1e3, args.drain_timeout_seconds, args.file_system_poll_wait_seconds,
                      metrics_path, args.max_queued_requests, limits, args.num_workers)
    code = serve(options)
    logging.getLogger("kiln.serve").info("kiln serve: stopped")
    # Every request is answered. A backend call the drain timeout cut off may still be running in
    # a worker thread, and TensorFlow's interpreter-exit teardown takes seconds with nothing left to
    # do: leave now, so the drain timeout is the whole wait.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
