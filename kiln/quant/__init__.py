"""Post-training quantization of a float model, above the runtime (it calibrates with it).

`params` derives scales and zero points the way TensorFlow's converter does; `weights`
(dynamic range, weight-only, float16) and `static` (calibrated int8 / 16x8 with `int16`'s
scheme; `lstm` gives fused LSTMs TF's full-integer layout) rewrite a model; `calibrate`
and `datasets` read representative data; `quantize` (api.py) is the entry point and
`QuantizationDebugger` (the `debug` subpackage) measures what a quantized model lost, op
by op. LiteRT's integer arithmetic itself is below the op records, in `kiln.kernels`.
The entry points are imported on first use.
"""

__all__ = ["MODES", "QuantizationDebugger", "quantize"]

#: Every mode `quantize` takes (here, not in api.py, so the command line's help reads them cheaply).
MODES = ("dynamic", "float16", "int8", "int16x8", "int4", "weight_only")


def __getattr__(name):
    if name == "QuantizationDebugger":
        from .debug import QuantizationDebugger

        return QuantizationDebugger
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
