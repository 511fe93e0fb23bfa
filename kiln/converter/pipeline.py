"""The conversion pipeline: import -> optimisation passes -> versions -> metadata -> bytes."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

from ..ir import Model
from ..passes import AssignVersions, PassManager, optimization_passes
from .importer import Importer
from .keras.lstm_loop import fuse_lstm_loop
from .legalize import EMITTERS
from .legalize.control import emit_function_op
from .legalize.patterns import match_patterns
from .metadata import ModelType, write_metadata
from .report import ConversionReport
from .scope import Legalization
from .variables import mark_mutable_variables


@dataclass
class FunctionSpec:
    """One signature to convert: key, concrete function, user-facing input/output names."""

    key: str
    function: object
    input_names: list[str]
    output_names: list[str]


def legalization() -> Legalization:
    """kiln's legalisation tables: TF op emitters, TF-level patterns, function calls (fused
    or inlined) and the Keras 3 LSTM loop recogniser."""
    return Legalization(EMITTERS, match_patterns, emit_function_op, loop_fusions=(fuse_lstm_loop,))


def build_model(specs: list[FunctionSpec], *, allow_custom_ops: bool = False,
                enable_resource_variables: bool = True, check: bool = False,
                report: ConversionReport | None = None) -> Model:
    """Import ``specs`` into one IR model and optimise it (no metadata, not written)."""
    from .tfutil import clear_function_cache

    report = report if report is not None else ConversionReport()
    start = time.perf_counter()
    try:
        model = _build(specs, allow_custom_ops, enable_resource_variables, check, report, start)
    finally:
        clear_function_cache()
    return model


def _build(specs, allow_custom_ops, enable_resource_variables, check, report, start) -> Model:
    importer = Importer(legalization(), allow_custom_ops=allow_custom_ops, enable_resource_variables=enable_resource_variables)
    for spec in specs:
        mark_mutable_variables(importer, spec.function)
    for spec in specs:
        importer.import_signature(spec.key, spec.function, spec.input_names, spec.output_names)
    importer.finish_variables()
    importer.check_supported()
    model = importer.model
    mid = time.perf_counter()
    manager = PassManager(optimization_passes(), check=check)
    manager.run(model)
    versions = AssignVersions()
    versions.run(model)
    end = time.perf_counter()
    stats = importer.stats
    report.import_seconds = mid - start
    report.pass_seconds = end - mid
    report.fused = list(stats.fused)
    report.not_fused = list(stats.not_fused)
    report.custom_ops = dict(stats.custom)
    report.tf_ops = dict(sorted(stats.tf_ops.items()))
    report.missing_records = sorted(versions.missing)
    report.passes = dict(manager.stats.changes)
    return model


def model_hash(specs: list[FunctionSpec]) -> int:
    """A 64-bit fingerprint of the source functions (for CONVERSION_METADATA)."""
    h = hashlib.blake2b(digest_size=8)
    for spec in specs:
        h.update(spec.key.encode())
        for op in spec.function.graph.get_operations():
            h.update(op.type.encode())
            h.update(op.name.encode())
    return int.from_bytes(h.digest(), "little")


def convert(specs: list[FunctionSpec], *, model_type: ModelType, allow_custom_ops: bool = False,
            enable_resource_variables: bool = True, check: bool = False,
            report: ConversionReport | None = None) -> tuple[bytes, Model, ConversionReport]:
    """Convert to .tflite bytes; returns (bytes, IR model, report)."""
    from ..format import write_model
    from .tfutil import tf

    report = report if report is not None else ConversionReport()
    start = time.perf_counter()
    model = build_model(specs, allow_custom_ops=allow_custom_ops,
                        enable_resource_variables=enable_resource_variables, check=check, report=report)
    report.min_runtime_version = write_metadata(
        model, tf_version=tf().__version__, model_type=model_type, model_hash=model_hash(specs),
        allow_custom_ops=allow_custom_ops)
    w0 = time.perf_counter()
    data = write_model(model)
    end = time.perf_counter()
    report.write_seconds = end - w0
    report.seconds = end - start
    report.size = len(data)
    report.record_model(model)
    return data, model, report
