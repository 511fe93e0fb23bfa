"""What the ``kiln`` command checks before it runs anything: numeric flags in range, the paths
each subcommand reads and writes, the optional extras it needs, what ``kiln serve`` serves and
then (last: a missing model is reported as such on a busy machine) the ports it binds.

The tables name every subcommand's numeric and path flags (tests/test_cli_errors.py walks them
and refuses a numeric flag without a range), so a typo costs a one-line error in well under a
second: nothing here imports TensorFlow or the runtime.
"""

from __future__ import annotations

import math
import os
import socket

from . import extras, paths
from .errors import KilnError


class UsageError(KilnError):
    """A flag's value out of its range: a malformed command line (exit status 2, as argparse's)."""


#: (subcommand, argparse dest) -> inclusive (low, high) of a numeric flag; None: unbounded.
NUMBERS: dict[tuple[str, str], tuple[float | None, float | None]] = {
    ("run", "seed"): (0, None),               # NumPy's generators take no negative seed
    ("run", "show"): (0, None),
    ("benchmark", "runs"): (1, None),
    ("benchmark", "warmup"): (0, None),
    ("benchmark", "seed"): (0, None),
    ("quantize", "debug_target"): (0, None),
    ("serve", "port"): (0, 65535),            # TF Serving's gRPC port; 0: no gRPC
    ("serve", "rest_api_port"): (0, 65535),   # 0: no REST (both 0 is refused in `check`)
    ("serve", "file_system_poll_wait_seconds"): (0, None),
    ("serve", "rest_api_timeout_in_ms"): (1, None),
    ("serve", "rest_api_num_threads"): (0, None),
    ("serve", "grpc_max_threads"): (0, None),
    ("serve", "num_workers"): (1, 256),
    ("serve", "tensorflow_intra_op_parallelism"): (0, None),
    ("serve", "max_request_bytes"): (1, None),
    ("serve", "request_body_budget_bytes"): (1, None),
    ("serve", "max_queued_requests"): (1, None),
    ("serve", "max_connections"): (1, None),
    ("serve", "max_connections_per_client"): (1, None),
    ("serve", "http_idle_timeout_seconds"): (0.001, None),
    ("serve", "http_read_timeout_seconds"): (0.001, None),
    ("serve", "drain_timeout_seconds"): (0, None),
}

IN_FILE, IN_DIR, IN_ANY, OUT_FILE, OUT_DIR, NEW_DIR = ("file", "directory", "file or directory",
                                                        "output file", "output directory", "new directory")

#: subcommand -> {argparse dest: what kind of path it is}. ``kiln convert`` checks its output
#: (whose default comes from the source) itself, before converting.
PATHS: dict[str, dict[str, str]] = {
    "inspect": {"model": IN_FILE},
    "run": {"model": IN_FILE, "output_dir": OUT_DIR},
    "benchmark": {"model": IN_FILE},
    "xla-export": {"model": IN_FILE, "output": OUT_FILE},
    "quantize": {"model": IN_FILE, "data": IN_FILE, "output": OUT_FILE, "debug": OUT_FILE},
    "convert": {"source": IN_ANY, "output": OUT_FILE, "report_json": OUT_FILE},
    "infer-convert": {"input_model_dir": IN_DIR, "output_model_dir": NEW_DIR, "converter_options_file": IN_FILE},
    "serve": {"model_config_file": IN_FILE, "batching_parameters_file": IN_FILE,
              "monitoring_config_file": IN_FILE},
}


def _dashed(command: str, dest: str) -> str:
    """The flag as typed: kiln's own commands dash their flags, TF's (serve, infer-convert) do not."""
    return "--" + dest.replace("_", "-") if command in ("run", "benchmark", "quantize", "convert", "xla-export") else "--" + dest


def check_numbers(command: str, args) -> None:
    """Every numeric flag of ``command`` finite and in its range."""
    for (cmd, dest), (low, high) in NUMBERS.items():
        value = getattr(args, dest, None) if cmd == command else None
        if value is None:
            continue
        flag = _dashed(command, dest)
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"{flag} must be a finite number, got {value}")
        if (low is not None and value < low) or (high is not None and value > high):
            bounds = (f"from {low:g} to {high:g}" if high is not None else f"at least {low:g}")
            raise UsageError(f"{flag} must be {bounds}, got {value:g}")


def check_paths(command: str, args) -> None:
    """The paths ``command`` reads exist and are of the right kind; those it writes can be written."""
    if command == "serve" and getattr(args, "model_base_path", None) and getattr(args, "model_config_file", None):
        raise KilnError("give --model_config_file or --model_base_path, not both")  # as kiln serve says it
    for dest, kind in PATHS.get(command, {}).items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        flag = _dashed(command, dest) if dest not in ("model", "source") else dest.upper()
        if kind == IN_FILE:
            paths.readable_file(value, flag)
        elif kind == IN_DIR:
            paths.readable_dir(value, flag)
            if command == "infer-convert" and not os.path.isfile(os.path.join(value, "saved_model.pb")):
                raise paths.PathError(f"{flag} {value!r}: is not a SavedModel (it has no saved_model.pb)")
        elif kind == IN_ANY:
            if not os.path.exists(value):
                raise paths.PathError(f"{flag} {value!r}: no such file or directory")
        elif kind == OUT_FILE:
            paths.writable_file(value, flag)
        elif kind == OUT_DIR:
            paths.writable_dir(value, flag)
        elif kind == NEW_DIR:
            paths.writable_dir(value, flag, empty=True)   # missing parents are created, as #26 asks
    if command == "serve" and getattr(args, "model_base_path", None):
        base = args.model_base_path
        if os.path.exists(base) and not os.path.isdir(base):  # a missing one is waited for, as TF Serving does
            raise paths.PathError(f"--model_base_path {base!r}: is a file, not a directory of versions")


def check_serve_port_flags(args) -> None:
    """TF Serving's ports: ``--port`` (gRPC) and ``--rest_api_port`` (REST), 0 turning one off.
    At least one is on, and they differ."""
    if not args.port and not args.rest_api_port:
        raise UsageError("--port and --rest_api_port are both 0: there is nothing to serve on")
    if args.port and args.port == args.rest_api_port:
        raise UsageError(f"--port (gRPC) and --rest_api_port (REST) are both {args.port}: give them different ports")


def check_serve_ports(args) -> None:
    """Each port kiln serve listens on can be bound now."""
    for port in (args.port, args.rest_api_port):
        if port:
            check_port_free(args.host, port)


def check_port_free(host: str, port: int) -> None:
    """Bind ``host:port`` once and let go, so a port in use or an unknown host is a one-line
    error before the server starts (the server binds it again right after)."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            probe.bind((host, port))
    except socket.gaierror as exc:
        raise KilnError(f"--host {host!r}: unknown host ({exc.strerror})") from None
    except OSError as exc:
        raise KilnError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def _quantize_combinations(args) -> None:
    from .quant.cli import CALIBRATED

    if args.mode not in CALIBRATED:   # the options only calibration reads
        idle = [f"--{kind}-type {value}" for kind, value in (("input", args.input_type), ("output", args.output_type))
                if value != "float32"]
        if args.integer_only:
            idle.append("--integer-only")
        if args.data and not args.debug:
            idle.append("--data")
        if idle:
            raise UsageError(f"{', '.join(idle)}: only the calibrated modes ({', '.join(CALIBRATED)}) take "
                             f"{'it' if len(idle) == 1 else 'them'}; --mode {args.mode} keeps float inputs and outputs")
    elif not args.data:
        raise UsageError(f"--mode {args.mode} needs --data (the representative dataset: FILE.npz, FILE.npy or "
                         "FILE.tfrecord)")
    needs = {"--allow-integer-samples": ("--data", args.allow_integer_samples and not args.data),
             "--debug": ("--data", args.debug and not args.data),
             "--debug-target": ("--debug REPORT.html", args.debug_target is not None and not args.debug),
             "--debug-runner": ("--debug REPORT.html", args.debug_runner != "kiln" and not args.debug)}
    for flag, (other, missing) in needs.items():
        if missing:
            raise UsageError(f"{flag} needs {other}")


def check_combinations(command: str, args) -> None:
    """Options the rest of the command line would silently ignore: refused, naming them."""
    if command == "quantize":
        _quantize_combinations(args)
    if command == "convert" and os.path.isfile(args.source):
        idle = [flag for flag, value in (("--signature-keys", args.signature_keys), ("--tags", args.tags)) if value]
        if idle:
            raise UsageError(f"{' and '.join(idle)} pick from a SavedModel directory; {args.source!r} is a Keras file "
                             "(one model, no signatures or tags)")


def check_extras(command: str, args) -> None:
    """The optional extras (kiln.extras) this command line needs, before anything imports them."""
    if command in ("convert", "infer-convert"):
        extras.require("tf", "")
    if getattr(args, "delegate", None) == "xla" or command == "xla-export":
        extras.require("xla", "--delegate xla" if command != "xla-export" else "")
    if command != "serve":
        return
    needs = ["prometheus_client"]
    if args.rest_api_port:
        needs.append("httptools")
    if args.port:
        needs += ["h2", "hpack"]
    if args.port or args.model_config_file or args.batching_parameters_file or args.monitoring_config_file:
        needs.append("google.protobuf")   # gRPC's messages; the text-proto config files
    extras.require("serve", "", tuple(needs))
    if args.backend in ("xla", "tf"):
        extras.require(args.backend, f"--backend {args.backend}")


def check_serve_setup(args) -> None:
    """What kiln serve would serve: every model's base path a directory, the config files read."""
    from .serve import config

    if args.model_config_file:
        specs = config.read_model_config(args.model_config_file)
    else:
        specs = [config.ModelSpec(args.model_name, args.model_base_path)]
    for spec in specs:
        if not os.path.isdir(spec.base_path):
            raise paths.PathError(f"model {spec.name!r}: base path {spec.base_path!r} is not a directory")
    if args.batching_parameters_file:
        config.read_batching_parameters(args.batching_parameters_file)
    if args.monitoring_config_file:
        config.read_monitoring_config(args.monitoring_config_file)


def check(command: str, args) -> None:
    """All of the above for one parsed command line, ports last."""
    check_numbers(command, args)
    if command == "serve":
        check_serve_port_flags(args)
    check_combinations(command, args)
    check_paths(command, args)
    check_extras(command, args)
    if command == "serve" and (getattr(args, "model_base_path", None) or getattr(args, "model_config_file", None)):
        check_serve_setup(args)
        check_serve_ports(args)
