"""``kiln infer-convert``: the original converter's command line, on kiln.inference.convert.

kiln's additions: ``--skip_accuracy_check`` (the ``skip_accuracy_check`` option) and
``--evaluation_data [SIGNATURE=]FILE`` (real inputs for the accuracy guard and the warm-up
records). TensorFlow's own logging is kept off the terminal: what matters is in the report, and
kiln's warnings print as one line each. Exit status: 0 converted; 1 error (nothing written);
3 converted, but a stage that can change results was applied without a measured error (the
message says which and how to measure it).
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

from ..errors import KilnError

#: exit status when the model was written but a stage's error could not be measured
NOT_MEASURED = 3


def add_parser(sub) -> None:
    """Register the subcommand (TensorFlow is imported only when it runs)."""
    p = sub.add_parser("infer-convert", help="TF2 SavedModel -> SavedModel with XLA functions and batching "
                                              "(needs TensorFlow)")
    p.add_argument("--input_model_dir", required=True, metavar="DIR", help="TF2 SavedModel to convert")
    p.add_argument("--output_model_dir", required=True, metavar="DIR",
                   help="where to write the converted SavedModel (must not exist or be empty; missing parent "
                        "directories are created)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--converter_options_string", metavar="TEXT", help="ConverterOptions as a text proto")
    group.add_argument("--converter_options_file", metavar="FILE", help="file holding the ConverterOptions text")
    p.add_argument("--evaluation_data", action="append", default=[], metavar="[SIGNATURE=]FILE",
                   help="real inputs of a signature (a TFRecord of RepresentativeDataSample or an .npz keyed by "
                        "input name), for the accuracy check and the warm-up records; repeatable")
    p.add_argument("--skip_accuracy_check", action="store_true",
                   help="apply bfloat16, quantization, batching and bucketing without measuring their error "
                        "(faster; the same as skip_accuracy_check: true in the options)")
    p.set_defaults(func=run)


def _evaluation_data(values: list[str]):
    if not values:
        return None
    out = {}
    for value in values:
        key, sep, path = value.partition("=")
        if not sep or os.path.exists(value):
            key, path = None, value
        if key in out:
            raise KilnError(f"--evaluation_data: signature {key or '(default)'!r} is given twice")
        out[key] = path
    if None in out:
        if len(out) > 1:
            raise KilnError("--evaluation_data: name the signature of every file (SIGNATURE=FILE) when giving "
                            "more than one")
        return out[None]
    return out


def _quiet_tensorflow() -> None:
    """TensorFlow's C++ log lines (CUDA probing, oneDNN notices: printed while it loads, before any
    log level applies) and Python deprecation notices say nothing the report does not. Set
    TF_CPP_MIN_LOG_LEVEL to see them."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if "tensorflow" not in sys.modules and os.environ["TF_CPP_MIN_LOG_LEVEL"] == "3":
        sys.stderr.flush()
        saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        try:
            import tensorflow  # noqa: F401
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.close(null)
    import absl.logging
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    absl.logging.set_verbosity(absl.logging.ERROR)


def run(args) -> int:
    if args.converter_options_file is not None:
        try:
            text = Path(args.converter_options_file).read_text()
        except OSError as exc:
            raise KilnError(f"--converter_options_file: cannot read {args.converter_options_file!r}: "
                            f"{exc.strerror}") from None
    else:
        text = args.converter_options_string or ""
    evaluation_data = _evaluation_data(args.evaluation_data)
    try:
        _quiet_tensorflow()
        from . import guard
        from .options import parse
        from .pipeline import convert
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in ("tensorflow", "google", "absl"):
            raise KilnError("kiln infer-convert needs TensorFlow: pip install 'kiln[tf]'") from None
        raise
    options = parse(text)
    if args.skip_accuracy_check:
        options.skip_accuracy_check = True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = convert(args.input_model_dir, args.output_model_dir, options, evaluation_data=evaluation_data)
    print(report.text)
    print(f"wrote {args.output_model_dir} (report: {Path(args.output_model_dir) / 'assets.extra' / 'kiln'})")
    status = 0
    for w in caught:
        if issubclass(w.category, guard.AccuracyNotMeasuredWarning):
            print(f"kiln infer-convert: WARNING: {w.message}", file=sys.stderr)
            status = NOT_MEASURED
        elif issubclass(w.category, UserWarning) and (f"{os.sep}kiln{os.sep}" in str(w.filename)
                                                        or w.category.__module__.startswith("kiln.")):
            print(f"kiln infer-convert: warning: {w.message}", file=sys.stderr)
    return status
