"""`kiln.quantize`: post-training quantization of any float .tflite model."""

from __future__ import annotations

import os
from typing import Iterable

from ..errors import KilnError, UnsupportedError
from ..format import read_model, write_model
from ..ir import Model
from .static import quantize_int8
from .weights import MIN_WEIGHT_ELEMENTS, quantize_dynamic_range, quantize_float16

MODES = ("dynamic", "float16", "int8", "int16x8", "weight_only")


def _load(model) -> Model:
    if isinstance(model, Model):
        return model
    if isinstance(model, (bytes, bytearray, memoryview)):
        return read_model(bytes(model))
    if isinstance(model, (str, os.PathLike)):
        return read_model(os.fspath(model))
    raise KilnError(f"quantize: expected .tflite bytes, a path or a kiln Model, got {type(model).__name__}")


def quantize(model, mode: str = "dynamic", *, representative_dataset=None,
             denylist: Iterable[str] = (), min_elements: int = MIN_WEIGHT_ELEMENTS,
             integer_only: bool = False, inference_input_type: str = "float32",
             inference_output_type: str = "float32", progress: bool = True) -> bytes:
    """Quantize a float .tflite (bytes, path or Model) and return the new .tflite bytes.

    Modes: ``dynamic`` (int8 weights, float activations, as TF's ``Optimize.DEFAULT``
    without a dataset), ``float16`` (float16 constants) and ``int8`` (full integer with
    calibration on ``representative_dataset``; ``integer_only`` refuses ops without an
    int8 kernel instead of keeping them float; I/O types float32, int8 or uint8).
    ``denylist`` names op types or output tensor names to keep float.
    """
    if mode not in MODES:
        raise KilnError(f"quantize: unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    ir = _load(model)
    if mode == "dynamic":
        quantize_dynamic_range(ir, min_elements=min_elements, denylist=frozenset(denylist))
    elif mode == "float16":
        quantize_float16(ir)
    elif mode == "int8":
        if representative_dataset is None:
            raise KilnError("quantize: mode 'int8' needs a representative_dataset to calibrate on")
        quantize_int8(ir, representative_dataset, integer_only=integer_only, input_type=inference_input_type,
                      output_type=inference_output_type, denylist=denylist, progress=progress)
    else:
        raise UnsupportedError(f"quantize: mode {mode!r} is not implemented yet "
                               "(available: dynamic, float16, int8)")
    return write_model(ir)
