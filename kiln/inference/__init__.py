"""kiln's inference converter: TF2 SavedModel -> SavedModel with functions on XLA and in-graph batching.

The open counterpart of the Cloud TPU inference converter (its option texts work unchanged), with
its optimizations as measured pipeline stages: int8 quantization, bfloat16, I/O shape buckets.
Needs TensorFlow (``pip install 'kiln[tf]'``), imported only when a function here is called.
"""

from __future__ import annotations


def convert(input_model_dir, output_model_dir, options=None, *, evaluation_data=None):
    """Convert a SavedModel; ``options`` is a ConverterOptions text proto or message. Returns the report.

    ``evaluation_data``: real inputs for the accuracy guard and the warm-up records, ``{signature: a
    TFRecord of RepresentativeDataSample, an .npz, or an iterable of {input: array}}`` (one source
    alone stands for the only signature, or ``serving_default``). A stage applied without a measured
    error warns with ``AccuracyNotMeasuredWarning`` (unless ``skip_accuracy_check`` is set); converted
    functions slower than the input's on this machine warn with ``SlowerOnThisMachineWarning``."""
    from .. import extras

    extras.require("tf", "kiln.inference.convert")
    from .pipeline import convert as _convert

    return _convert(input_model_dir, output_model_dir, options, evaluation_data=evaluation_data)


def __getattr__(name):
    # the warning classes live with what raises them; importing them needs no TensorFlow
    if name == "AccuracyNotMeasuredWarning":
        from .guard import AccuracyNotMeasuredWarning

        return AccuracyNotMeasuredWarning
    if name == "SlowerOnThisMachineWarning":
        from .latency import SlowerOnThisMachineWarning

        return SlowerOnThisMachineWarning
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def ConverterOptions(**fields):  # noqa: N802
    """A new ConverterOptions message (the class is built at run time; see options.py)."""
    from .options import ConverterOptions as _make

    return _make(**fields)


def parse_options(text: str):
    """Parse a ConverterOptions text proto (``accelerator_functions`` = ``tpu_functions``)."""
    from .options import parse

    return parse(text)


__all__ = ["convert", "ConverterOptions", "parse_options", "AccuracyNotMeasuredWarning", "SlowerOnThisMachineWarning"]
