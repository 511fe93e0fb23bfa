"""The conversion pipeline: named stages assembled from `ConversionOptions`.

    import -> optimise [-> quantize] -> version -> metadata -> write

Each stage reads and extends one `Conversion` (the functions, the IR model, the bytes) and
fills its part of the `ConversionReport`; the pipeline times every stage and lists it in the
report. What the options ask for decides which stages are assembled (quantization is one),
so a new step of the conversion is a stage here, not a keyword argument in every signature.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..errors import ConversionError
from ..format import write_model
from ..ir import Model
from ..passes import AssignVersions, PassManager, optimization_passes
from .importer import Importer
from .keras.lstm_loop import fuse_lstm_loop
from .legalize import EMITTERS
from .legalize.control import emit_function_op
from .legalize.patterns import match_patterns
from .metadata import write_metadata
from .options import ConversionOptions, OpsSet
from .report import ConversionReport
from .scope import Legalization
from .tfutil import clear_function_cache, tf
from .variables import mark_mutable_variables


@dataclass
class FunctionSpec:
    """One signature to convert: key, concrete function, user-facing input/output names."""

    key: str
    function: object
    input_names: list[str]
    output_names: list[str]


@dataclass
class Conversion:
    """What the stages share: the input, the model as it is built, the result and the report."""

    specs: list[FunctionSpec]
    options: ConversionOptions
    report: ConversionReport = field(default_factory=ConversionReport)
    model: Model | None = None
    data: bytes | None = None


@dataclass(frozen=True)
class Stage:
    """A named step of the conversion."""

    name: str
    run: Callable[[Conversion], None]


def legalization() -> Legalization:
    """kiln's legalisation tables: TF op emitters, TF-level patterns, function calls (fused
    or inlined) and the Keras 3 LSTM loop recogniser."""
    return Legalization(EMITTERS, match_patterns, emit_function_op, loop_fusions=(fuse_lstm_loop,))


# -- the stages ------------------------------------------------------------------------------------

def import_functions(conv: Conversion) -> None:
    """TensorFlow functions -> one IR model (one subgraph per signature), fusions included."""
    options = conv.options
    importer = Importer(legalization(), allow_custom_ops=options.allow_custom_ops,
                        enable_resource_variables=options.enable_resource_variables)
    for spec in conv.specs:
        mark_mutable_variables(importer, spec.function)
    for spec in conv.specs:
        importer.import_signature(spec.key, spec.function, spec.input_names, spec.output_names)
    importer.finish_variables()
    importer.check_supported()
    conv.model = importer.model
    stats, report = importer.stats, conv.report
    report.decisions.extend(stats.tracer.decisions)
    report.custom_ops = dict(stats.custom)
    report.tf_ops = dict(sorted(stats.tf_ops.items()))
    report.lowered = {k: sorted(v) for k, v in sorted(stats.lowered.items())}


def optimise(conv: Conversion) -> None:
    """The optimisation passes, run to a fixed point."""
    manager = PassManager(optimization_passes(), check=conv.options.verify_passes)
    manager.run(conv.model)
    conv.report.passes = dict(manager.stats.changes)
    conv.report.decisions.extend(manager.tracer.decisions)


def quantization_plan(options: ConversionOptions) -> dict:
    """The `kiln.quant.quantize_model` arguments TF's converter would pick for ``options``.

    As TF 2.21: float16 when ``supported_types`` is float16 alone; full integer when a
    representative dataset is given (integer-only when ``supported_ops`` is just
    TFLITE_BUILTINS_INT8 or ``supported_types`` is int8); 16x8 when ``supported_ops`` holds
    EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8 (integer-only unless
    TFLITE_BUILTINS is there too); dynamic range otherwise.

    Raises:
      ConversionError: integer-only or integer I/O without a dataset (TF's message), 16x8
        with int8/uint8 I/O, or quantization options without ``optimizations``.
    """
    types = set(options.supported_types) - {"float32"}
    io_types = {options.inference_input_type, options.inference_output_type}
    int16 = OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8
    if not options.optimizations:
        raise ConversionError("quantization options (" + "; ".join(options.quantization) + ") need "
                              "optimizations=[Optimize.DEFAULT]")
    if int16 in options.supported_ops or "int16" in io_types:
        return _plan_16x8(options, io_types, int16)
    integer_only = options.supported_ops == {OpsSet.TFLITE_BUILTINS_INT8} or types == {"int8"}
    integer_io = io_types != {"float32"}
    if types == {"float16"} and not integer_only:
        return {"mode": "float16"}
    if options.representative_dataset is None:
        if integer_only or integer_io:
            raise ConversionError("For full integer quantization, a `representative_dataset` must be specified.")
        return {"mode": "dynamic"}
    return {"mode": "int8", "representative_dataset": options.representative_dataset,
            "allow_integer_samples": options.allow_integer_samples, "integer_only": integer_only, "inference_input_type": options.inference_input_type,
            "inference_output_type": options.inference_output_type}


def _plan_16x8(options: ConversionOptions, io_types: set[str], int16: OpsSet) -> dict:
    if int16 not in options.supported_ops:
        raise ConversionError("int16 inference types need supported_ops "
                              "EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8 (16x8 quantization)")
    if not io_types <= {"float32", "int16"}:
        raise ConversionError("16x8 quantization: inference_input_type and inference_output_type must be "
                              f"tf.float32 or tf.int16, got {options.inference_input_type} / "
                              f"{options.inference_output_type}")
    if options.representative_dataset is None:
        raise ConversionError("For full integer quantization, a `representative_dataset` must be specified.")
    return {"mode": "int16x8", "representative_dataset": options.representative_dataset,
            "allow_integer_samples": options.allow_integer_samples,
            "integer_only": OpsSet.TFLITE_BUILTINS not in options.supported_ops,
            "inference_input_type": options.inference_input_type,
            "inference_output_type": options.inference_output_type}


def quantize_stage(options: ConversionOptions) -> Stage:
    """Post-training quantization of the optimised model (kiln.quant), as TF's converter
    would do it for ``options``; what it did goes to ``report.quantization``."""
    plan = quantization_plan(options)

    def quantize(conv: Conversion) -> None:
        from ..quant.api import quantize_model

        done = quantize_model(conv.model, **plan, denylist=options.denylist)
        conv.report.quantization = {"mode": done.mode, "quantized": len(done.quantized),
                                    "kept_float": [f"{op} '{name}': {why}" for op, name, why in done.kept_float]}

    return Stage("quantize", quantize)


def assign_versions(conv: Conversion) -> None:
    """Every operator at the lowest version its features need."""
    versions = AssignVersions()
    versions.run(conv.model)
    conv.report.missing_records = sorted(versions.missing)


def add_metadata(conv: Conversion) -> None:
    """min_runtime_version and CONVERSION_METADATA."""
    conv.report.min_runtime_version = write_metadata(
        conv.model, tf_version=tf().__version__, model_type=conv.options.model_type,
        model_hash=model_hash(conv.specs), allow_custom_ops=conv.options.allow_custom_ops,
        with_conversion_metadata=conv.options.conversion_metadata)


def write(conv: Conversion) -> None:
    """The IR model -> .tflite bytes."""
    conv.data = write_model(conv.model)
    conv.report.size = len(conv.data)
    conv.report.record_model(conv.model)


def model_hash(specs: list[FunctionSpec]) -> int:
    """A 64-bit fingerprint of the source functions (for CONVERSION_METADATA)."""
    h = hashlib.blake2b(digest_size=8)
    for spec in specs:
        h.update(spec.key.encode())
        for op in spec.function.graph.get_operations():
            h.update(op.type.encode())
            h.update(op.name.encode())
    return int.from_bytes(h.digest(), "little")


# -- the pipeline --------------------------------------------------------------------------------

class Pipeline:
    """Stages run in order over one `Conversion`; each one's time goes into the report."""

    def __init__(self, stages: Sequence[Stage]):
        self.stages = tuple(stages)

    @classmethod
    def from_options(cls, options: ConversionOptions) -> "Pipeline":
        """The stages ``options`` ask for.

        Raises:
          ConversionError: quantization options kiln cannot honour
            (see `quantization_plan`), before anything runs.
        """
        stages = [Stage("import", import_functions), Stage("optimise", optimise)]
        if options.quantization:
            stages.append(quantize_stage(options))
        stages += [Stage("version", assign_versions), Stage("metadata", add_metadata), Stage("write", write)]
        return cls(stages)

    @property
    def names(self) -> list[str]:
        return [stage.name for stage in self.stages]

    def run(self, specs: list[FunctionSpec], options: ConversionOptions,
            report: ConversionReport | None = None) -> Conversion:
        """Run every stage; the `Conversion` holds the model, the bytes (after "write") and
        the report with ``stages`` = [(name, seconds)] of the stages that ran."""
        conv = Conversion(list(specs), options, report if report is not None else ConversionReport())
        conv.report.stages = []
        start = time.perf_counter()
        try:
            for stage in self.stages:
                t0 = time.perf_counter()
                stage.run(conv)
                conv.report.stages.append((stage.name, time.perf_counter() - t0))
        finally:
            clear_function_cache()
        conv.report.seconds = time.perf_counter() - start
        return conv
