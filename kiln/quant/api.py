"""`kiln.quantize`: post-training quantization of any float .tflite model (and the
converter's quantize stage, which calls `quantize_model` on its IR)."""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from typing import Iterable

from ..errors import KilnError
from ..format import read_model, write_model
from ..ir import Model
from ..schema import BUILTIN_CODES
from . import MODES
from .int16 import quantize_int16x8
from .static import quantize_int4_weights, quantize_int8
from .weights import (
    MIN_WEIGHT_ELEMENTS,
    quantize_dynamic_range,
    quantize_float16,
    quantize_weight_only,
)


@dataclass
class QuantizationReport:
    """What a quantization did: the mode, (op, tensor) pairs quantized, ops kept float
    (op, tensor, reason), and ops rewritten to an integer equivalent (op, tensor)."""

    mode: str
    quantized: list[tuple[str, str]] = field(default_factory=list)
    kept_float: list[tuple[str, str, str]] = field(default_factory=list)
    #: (op type, output name) rewritten to an integer equivalent in integer-only mode
    rewritten: list[tuple[str, str]] = field(default_factory=list)


def _load(model) -> Model:
    if isinstance(model, Model):
        return model
    if isinstance(model, (bytes, bytearray, memoryview)):
        return read_model(bytes(model))
    if isinstance(model, (str, os.PathLike)):
        return read_model(os.fspath(model))
    raise KilnError(f"quantize: expected .tflite bytes, a path or a kiln Model, got {type(model).__name__}")


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise KilnError(f"quantize: unknown mode {mode!r}; choose one of {', '.join(MODES)}")


def check_denylist(model: Model, denylist: Iterable[str], mode: str) -> frozenset[str]:
    """The denylist as a set, every entry an op type or an op's output tensor name of ``model``
    (a builtin op type the model lacks is allowed: one denylist may serve several models).

    A name that matches nothing would silently quantize what the user meant to keep float, so
    it is an error naming the closest candidates.
    """
    if isinstance(denylist, str):
        raise KilnError(f"quantize: denylist must be a list of op types or tensor names, got the string "
                        f"{denylist!r}; write [{denylist!r}]")
    names = frozenset(denylist)
    if not names:
        return names
    if mode == "float16":
        raise KilnError("quantize: mode 'float16' keeps every op float already; it takes no denylist")
    known = {op.op_type for sg in model.subgraphs for op in sg.operators}
    known |= {t.name for sg in model.subgraphs for op in sg.operators for t in op.outputs if t is not None}
    for name in sorted(names):
        if not isinstance(name, str):
            raise KilnError(f"quantize: denylist entries are op types or tensor names (strings), got {name!r}")
        if name not in known and name not in BUILTIN_CODES:
            close = difflib.get_close_matches(name, sorted(known), n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise KilnError(f"quantize: denylist entry {name!r} is neither an op type nor an op's output tensor "
                            f"in the model{hint}")
    return names


def quantize_model(model: Model, mode: str = "dynamic", *, representative_dataset=None,
                   denylist: Iterable[str] = (), min_elements: int = MIN_WEIGHT_ELEMENTS,
                   integer_only: bool = False, inference_input_type: str = "float32",
                   inference_output_type: str = "float32", progress: bool = True,
                   allow_integer_samples: bool = False) -> QuantizationReport:
    """Quantize an IR model in place (see `quantize` for the modes)."""
    _check_mode(mode)
    denied = check_denylist(model, denylist, mode)
    if mode == "dynamic":
        done = quantize_dynamic_range(model, min_elements=min_elements, denylist=denied)
        return QuantizationReport(mode, done.quantized, done.skipped)
    if mode == "float16":
        return QuantizationReport(mode, quantize_float16(model).quantized)
    if mode == "weight_only":
        done = quantize_weight_only(model, min_elements=min_elements, denylist=denied)
        return QuantizationReport(mode, done.quantized, done.skipped)
    if representative_dataset is None:
        raise KilnError(f"quantize: mode {mode!r} needs a representative_dataset to calibrate on")
    static = {"int8": quantize_int8, "int16x8": quantize_int16x8, "int4": quantize_int4_weights}[mode]
    done = static(model, representative_dataset, integer_only=integer_only, input_type=inference_input_type,
                  output_type=inference_output_type, denylist=denied, progress=progress,
                  allow_integer_samples=allow_integer_samples)
    return QuantizationReport(mode, done.quantized, done.float_ops, done.rewritten)


def quantize(model, mode: str = "dynamic", *, representative_dataset=None,
             denylist: Iterable[str] = (), min_elements: int = MIN_WEIGHT_ELEMENTS,
             integer_only: bool = False, inference_input_type: str = "float32",
             inference_output_type: str = "float32", progress: bool = True,
             allow_integer_samples: bool = False) -> bytes:
    """Quantize a float .tflite (bytes, path or Model) and return the new .tflite bytes.

    Modes: ``dynamic`` (int8 weights, float activations, as TF's ``Optimize.DEFAULT``
    without a dataset), ``float16`` (float16 constants), ``weight_only`` (kiln's extension:
    int8 weights behind DEQUANTIZE, float compute) and ``int8`` (full integer with
    calibration on ``representative_dataset``: a TF-style callable, an iterable of samples
    or a file: .npz, .npy (a single-input model), TF's TFRecord; ``integer_only`` refuses ops
    without an int8 kernel instead of keeping them float; I/O types float32, int8 or uint8) and ``int16x8`` (the same with int16
    activations and int64 biases; I/O types float32 or int16), ``int4`` (kiln's extension:
    ``int8`` with int4 per-channel FULLY_CONNECTED / CONV_2D / DEPTHWISE_CONV_2D weights,
    which LiteRT's int8 x int4 kernels run; docs/int4_weights.md). ``denylist`` names op types or output tensor names to keep float.

    Samples must have the model's input dtypes: integer samples for a float input (raw uint8
    images for a model that takes normalised floats) raise a `DatasetError` naming the input,
    the sample and the dtype, unless ``allow_integer_samples`` says their values are meant.
    """
    _check_mode(mode)
    ir = _load(model)
    # A quantized model states the runtime its integer ops need, as TF's quantized models do;
    # the writer computes the value from the rewritten ops and their versions.
    ir.metadata.setdefault("min_runtime_version", b"\0" * 16)
    quantize_model(ir, mode, representative_dataset=representative_dataset, denylist=denylist,
                   min_elements=min_elements, integer_only=integer_only,
                   inference_input_type=inference_input_type, inference_output_type=inference_output_type,
                   progress=progress, allow_integer_samples=allow_integer_samples)
    return write_model(ir)
