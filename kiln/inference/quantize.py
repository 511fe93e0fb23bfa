"""The quantization stage: TensorFlow's SavedModel quantizer, its failures as kiln errors.

``external_feature_configs.quantization_options`` is TensorFlow's own ``QuantizationOptions``;
the engine is ``tf.quantization.experimental.quantize_saved_model`` (op set XLA by default: the
quantized dots are ``XlaDotV2`` ops, which the accelerator functions compile). Representative
datasets named by ``representative_datasets[signature].tfrecord_file_path`` are read by
``kiln.quant.datasets`` (CRCs and schema checked, a progress bar), one sample in ten (at least
one) is held out of calibration, and the report gives the quantized model's error against the
float model on those held-out samples and the size change.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import numpy as np

from ..errors import KilnError
from ..quant import datasets
from .options import OptionsError

WHERE = "external_feature_configs.quantization_options"


class QuantizationError(KilnError, RuntimeError):
    """TensorFlow's quantizer failed on the model."""


def _method(q) -> str:
    from tensorflow.compiler.mlir.quantization.tensorflow import quantization_options_pb2 as qo

    preset = q.quantization_method.preset_method
    if preset == qo.QuantizationMethod.METHOD_UNSPECIFIED:
        return "METHOD_STATIC_RANGE_INT8"
    return qo.QuantizationMethod.PresetMethod.Name(preset)


def _directory_bytes(path) -> int:
    total = 0
    for root, _, files in os.walk(path, followlinks=True):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def plan(model, q) -> dict:
    """Check the options against the model; read the representative datasets."""
    from tensorflow.compiler.mlir.quantization.tensorflow import quantization_options_pb2 as qo

    keys = list(q.signature_keys) or ["serving_default"]
    missing = [k for k in keys if k not in model.signatures]
    if missing:
        raise OptionsError(f"{WHERE}.signature_keys: {missing} not in the model's signatures "
                           f"{sorted(model.signatures)}")
    tags = set(q.tags) or {"serve"}
    have = set(model.meta.meta_info_def.tags)
    if tags != have:
        raise OptionsError(f"{WHERE}.tags {sorted(tags)} do not name the serving MetaGraph (tags {sorted(have)})")
    unknown = sorted(set(q.representative_datasets) - set(keys))
    if unknown:
        raise OptionsError(f"{WHERE}.representative_datasets: {unknown} are not among signature_keys {keys}")
    method = _method(q)
    if q.HasField("freeze_all_variables") and not q.freeze_all_variables:
        raise OptionsError(f"{WHERE}.freeze_all_variables: false is not supported: kiln grafts the quantized "
                           f"signatures into the original model, so their weights must be frozen into them "
                           f"(TensorFlow's default, true)")
    if method == "METHOD_NO_QUANTIZE":
        raise OptionsError(f"{WHERE}.quantization_method METHOD_NO_QUANTIZE: remove quantization_options instead")
    if q.op_set not in (qo.OpSet.OP_SET_UNSPECIFIED, qo.XLA):
        raise OptionsError(f"{WHERE}.op_set {qo.OpSet.Name(q.op_set)}: the inference converter places quantized "
                           f"functions on XLA; use op_set: XLA (the default)")
    samples = {}
    for key in keys:
        if key in q.representative_datasets:
            path = q.representative_datasets[key].tfrecord_file_path
            if not path:
                raise OptionsError(f"{WHERE}.representative_datasets[{key!r}] has no tfrecord_file_path")
            samples[key] = datasets.load(path, what=f"representative dataset {path!r} (signature {key!r})",
                                         progress=False)
            check_inputs(samples[key], model.meta.signature_def[key], path)
        elif method == "METHOD_STATIC_RANGE_INT8":
            raise OptionsError(f"{WHERE}: static-range int8 quantization calibrates on a representative dataset; "
                               f"add representative_datasets {{ key: {key!r} value {{ tfrecord_file_path: ... }} }}")
    return {"keys": keys, "method": method, "samples": samples}


def check_inputs(samples: list, signature_def, path: str) -> None:
    """Each sample names exactly the signature's inputs, with ranks that fit."""
    want = set(signature_def.inputs)
    for index, sample in enumerate(samples):
        if set(sample) != want:
            raise datasets.DatasetError(
                f"{path!r}, record {index}: inputs {sorted(sample)} but the signature takes {sorted(want)}")
        for name, info in signature_def.inputs.items():
            rank = None if info.tensor_shape.unknown_rank else len(info.tensor_shape.dim)
            if rank is not None and np.ndim(sample[name]) != rank:
                raise datasets.DatasetError(f"{path!r}, record {index}: input {name!r} has shape "
                                            f"{list(np.shape(sample[name]))}, the signature takes rank {rank}")


def split(samples: list) -> tuple[list, list]:
    """(calibration, held out): one sample in ten held out, at least one, none from a single sample."""
    if len(samples) < 2:
        return samples, samples
    held = max(1, len(samples) // 10)
    return samples[:-held], samples[-held:]


def quantize(model_dir, output_dir, q, calibration: dict) -> None:
    """Run TensorFlow's quantizer; its log goes nowhere, its errors become QuantizationError."""
    import tensorflow as tf
    from tensorflow.compiler.mlir.quantization.tensorflow import quantization_options_pb2 as qo

    options = qo.QuantizationOptions()
    options.CopyFrom(q)
    options.ClearField("representative_datasets")  # kiln reads the files; TF gets the samples
    if not options.op_set:
        options.op_set = qo.XLA
    dataset = {k: v for k, v in calibration.items()} or None
    try:
        with _quiet():
            tf.quantization.experimental.quantize_saved_model(str(model_dir), str(output_dir), options,
                                                              representative_dataset=dataset)
    except Exception as exc:  # noqa: BLE001 (TF raises ValueError, RuntimeError, OpError...)
        text = str(exc).strip()
        first = text.splitlines()[0] if text else type(exc).__name__
        raise QuantizationError(f"{WHERE}: TensorFlow's quantize_saved_model failed on {str(model_dir)!r}: "
                                f"{first}") from None
    if not (Path(output_dir) / "saved_model.pb").is_file():
        raise QuantizationError(f"{WHERE}: TensorFlow's quantizer wrote no saved_model.pb")


@contextlib.contextmanager
def _quiet():
    """TensorFlow's quantizer prints summary tables and logs on file descriptors 1 and 2; the report
    has the facts, and its failures come back as exceptions."""
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    try:
        with open(os.devnull, "w") as null, contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            for fd in saved:
                os.dup2(null.fileno(), fd)
            yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)


def sizes(before_dir, after_dir) -> tuple[int, int]:
    return _directory_bytes(before_dir), _directory_bytes(after_dir)
