"""What the ``kiln`` command checks before it runs anything: numeric flags in range, the paths
each subcommand reads and writes, the port ``kiln serve`` binds.

The tables name every subcommand's numeric and path flags (tests/test_cli_errors.py walks them
and refuses a numeric flag without a range), so a typo costs a one-line error in well under a
second: nothing here imports TensorFlow or the runtime.
"""

from __future__ import annotations

import math
import os
import socket

from . import paths
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
    ("serve", "port"): (1, 65535),
    ("serve", "rest_api_port"): (0, 65535),   # 0: not given, --port is used
    ("serve", "file_system_poll_wait_seconds"): (0, None),
    ("serve", "rest_api_timeout_in_ms"): (1, None),
    ("serve", "rest_api_num_threads"): (0, None),
    ("serve", "tensorflow_intra_op_parallelism"): (0, None),
    ("serve", "max_request_bytes"): (1, None),
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
    "quantize": {"model": IN_FILE, "data": IN_FILE, "output": OUT_FILE, "debug": OUT_FILE},
    "convert": {"source": IN_ANY, "output": OUT_FILE, "report_json": OUT_FILE},
    "infer-convert": {"input_model_dir": IN_DIR, "output_model_dir": NEW_DIR, "converter_options_file": IN_FILE},
    "serve": {"model_config_file": IN_FILE, "batching_parameters_file": IN_FILE,
              "monitoring_config_file": IN_FILE},
}


def _dashed(command: str, dest: str) -> str:
    """The flag as typed: kiln's own commands dash their flags, TF's (serve, infer-convert) do not."""
    return "--" + dest.replace("_", "-") if command in ("run", "benchmark", "quantize", "convert") else "--" + dest


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


def check_port_free(host: str, port: int) -> None:
    """Bind ``host:port`` once and let go, so a port in use or an unknown host is a one-line
    error before the server starts (the server binds it again right after)."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            probe.bind((host, port))
    except socket.gaierror as exc:
        raise KilnError(f"--rest_api_host {host!r}: unknown host ({exc.strerror})") from None
    except OSError as exc:
        raise KilnError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def check(command: str, args) -> None:
    """All of the above for one parsed command line."""
    check_numbers(command, args)
    check_paths(command, args)
    if command == "serve" and (getattr(args, "model_base_path", None) or getattr(args, "model_config_file", None)):
        check_port_free(args.rest_api_host, args.rest_api_port or args.port)
