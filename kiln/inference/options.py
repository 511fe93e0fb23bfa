"""ConverterOptions: the original inference converter's option message, built at run time.

The descriptor is assembled in Python (FileDescriptorProto -> descriptor pool -> message
classes) instead of shipping protoc output, so there is no generated-code/protobuf version skew;
``external_feature_configs.quantization_options`` is TensorFlow's own ``QuantizationOptions``.
Field names and numbers follow the original so its option texts parse unchanged.
"""

from __future__ import annotations

import re
from functools import lru_cache

from ..errors import KilnError
from ..protos import add_field as _field

PACKAGE = "kiln.inference"
_QUANT_FILE = "tensorflow/compiler/mlir/quantization/tensorflow/quantization_options.proto"
# proto3 has no "unset" for scalars: 0 means TensorFlow's own default for these two.
DEFAULT_MAX_ENQUEUED_BATCHES = 10


class OptionsError(KilnError, ValueError):
    """ConverterOptions text that does not parse, or values that cannot work together."""


def _file_proto():
    from google.protobuf import descriptor_pb2 as d

    fp = d.FileDescriptorProto(name="kiln/inference/converter_options.proto", package=PACKAGE,
                               syntax="proto3", dependency=[_QUANT_FILE])
    state = fp.enum_type.add(name="State")
    for i, n in enumerate(("DEFAULT", "ENABLED", "DISABLED")):
        state.value.add(name=n, number=i)
    st = f".{PACKAGE}.State"

    tpu = fp.message_type.add(name="TpuFunction")
    tpu.oneof_decl.add(name="name")
    _field(tpu, "function_alias", 1, "string", oneof=0)
    _field(tpu, "concrete_function_name", 3, "string", oneof=0)
    _field(tpu, "jit_compile_functions", 4, "bool", oneof=0)
    _field(tpu, "signature_name", 5, "string", oneof=0)

    batch = fp.message_type.add(name="BatchOptions")
    exp = batch.nested_type.add(name="Experimental")
    exp.oneof_decl.add(name="batch_function")
    _field(exp, "function_alias", 1, "string", oneof=0)
    _field(exp, "concrete_function_name", 2, "string", oneof=0)
    _field(exp, "signature_name", 3, "string", oneof=0)
    _field(batch, "num_batch_threads", 1, "int32")
    _field(batch, "max_batch_size", 2, "int32")
    _field(batch, "batch_timeout_micros", 3, "int32")
    _field(batch, "allowed_batch_sizes", 4, "int32", label="repeated")
    _field(batch, "max_enqueued_batches", 5, "int32")
    _field(batch, "disable_large_batch_splitting", 6, "bool")
    _field(batch, "experimental", 7, "message", type_name=f".{PACKAGE}.BatchOptions.Experimental")

    bfo = fp.message_type.add(name="BFloat16OptimizationOptions")
    scope = bfo.enum_type.add(name="Scope")
    for i, n in enumerate(("DEFAULT", "TPU", "ALL")):
        scope.value.add(name=n, number=i)
    _field(bfo, "scope", 1, "enum", type_name=f".{PACKAGE}.BFloat16OptimizationOptions.Scope")
    _field(bfo, "skip_safety_checks", 2, "bool")
    _field(bfo, "filterlist", 3, "string", label="repeated")
    shard = fp.message_type.add(name="XlaShardingOptions")
    _field(shard, "num_cores_per_replica", 1, "int32")
    _field(shard, "device_assignment", 2, "int32", label="repeated")  # flattened [x, y, z, core] per core
    _field(shard, "topology", 3, "bytes")  # a serialized tensorflow.tpu.TopologyProto
    ext = fp.message_type.add(name="ExternalFeatureConfigs")
    _field(ext, "quantization_options", 1, "message", type_name=".tensorflow.quantization.QuantizationOptions")

    # kiln's own options (not in the original): bucketing of dynamic dimensions other than the batch.
    buckets = fp.message_type.add(name="DimensionBuckets")
    _field(buckets, "input", 1, "string")  # an accelerator function's input (its user-facing name)
    _field(buckets, "dimension", 2, "int32")
    _field(buckets, "sizes", 3, "int32", label="repeated")
    kexp = fp.message_type.add(name="KilnExperimental")
    _field(kexp, "dimension_buckets", 1, "message", label="repeated", type_name=f".{PACKAGE}.DimensionBuckets")
    _field(kexp, "max_batch_bucket", 2, "int32")  # batch buckets without batch_options: powers of 2 up to this
    # signature -> dataset file (TFRecord of RepresentativeDataSample, or .npz) the error measurements run on
    entry = kexp.nested_type.add(name="EvaluationDatasetsEntry")
    entry.options.map_entry = True
    _field(entry, "key", 1, "string")
    _field(entry, "value", 2, "string")
    _field(kexp, "evaluation_datasets", 3, "message", label="repeated",
           type_name=f".{PACKAGE}.KilnExperimental.EvaluationDatasetsEntry")

    opts = fp.message_type.add(name="ConverterOptions")
    _field(opts, "tpu_functions", 1, "message", label="repeated", type_name=f".{PACKAGE}.TpuFunction")
    _field(opts, "external_feature_configs", 3, "message", type_name=f".{PACKAGE}.ExternalFeatureConfigs")
    _field(opts, "batch_options", 100, "message", label="repeated", type_name=f".{PACKAGE}.BatchOptions")
    _field(opts, "io_shape_optimization", 200, "enum", type_name=st)
    _field(opts, "bfloat16_optimization", 201, "enum", type_name=st)
    _field(opts, "disable_default_optimizations", 202, "bool")
    _field(opts, "bfloat16_optimization_options", 203, "message",
           type_name=f".{PACKAGE}.BFloat16OptimizationOptions")
    _field(opts, "xla_sharding_options", 204, "message", type_name=f".{PACKAGE}.XlaShardingOptions")
    _field(opts, "experimental", 1000, "message", type_name=f".{PACKAGE}.KilnExperimental")
    # kiln's own: apply the stages that can change results without measuring their error (faster;
    # the report says nothing was measured). Top level, so `skip_accuracy_check: true` reads plainly.
    _field(opts, "skip_accuracy_check", 1001, "bool")
    return fp


@lru_cache(maxsize=None)
def messages() -> dict:
    """Message classes by short name ("ConverterOptions", "BatchOptions", ...), built once."""
    from google.protobuf import descriptor_pool, message_factory
    from tensorflow.compiler.mlir.quantization.tensorflow import quantization_options_pb2  # noqa: F401 (registers)

    pool = descriptor_pool.Default()
    try:
        fd = pool.FindFileByName("kiln/inference/converter_options.proto")
    except KeyError:
        fd = pool.Add(_file_proto()) and pool.FindFileByName("kiln/inference/converter_options.proto")
    out = {}
    for name, desc in fd.message_types_by_name.items():
        out[name] = message_factory.GetMessageClass(desc)
    out["State"] = fd.enum_types_by_name["State"]
    return out


def ConverterOptions(**fields):  # noqa: N802 (reads like the message class it returns)
    return messages()["ConverterOptions"](**fields)


# `accelerator_functions` is kiln's neutral name for `tpu_functions`: rewrite the field name
# (outside strings and comments) before text_format sees it.
_SYNONYM = re.compile(r'("(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|#[^\n]*)|\baccelerator_functions\b')


# kiln 0.1 wrote the two State options as messages (`bfloat16_optimization { state: DISABLED }`);
# the original's enum form is `bfloat16_optimization: DISABLED`. Both parse.
_STATE_MESSAGE = re.compile(r"\b(io_shape_optimization|bfloat16_optimization)\s*:?\s*\{\s*state\s*:\s*(\w+)\s*\}")


def _rewrite_synonyms(text: str) -> str:
    text = _SYNONYM.sub(lambda m: m.group(1) or "tpu_functions", text)
    return _STATE_MESSAGE.sub(r"\1: \2", text)


def parse(text: str):
    """Parse the text-proto ``text`` into a ConverterOptions; errors name line and column."""
    from google.protobuf import text_format

    msg = messages()["ConverterOptions"]()
    try:
        text_format.Parse(_rewrite_synonyms(text), msg)
    except text_format.ParseError as exc:
        where = f"line {exc.GetLine()}, column {exc.GetColumn()}" if exc.GetLine() else "?"
        detail = str(exc).split(" : ", 1)[-1]
        raise OptionsError(f"converter options, {where}: {detail}") from None
    return msg


def coerce(options):
    """A ConverterOptions from a text proto, a ConverterOptions message, or None (defaults)."""
    cls = messages()["ConverterOptions"]
    if options is None:
        return cls()
    if isinstance(options, str):
        return parse(options)
    if hasattr(options, "DESCRIPTOR") and options.DESCRIPTOR.full_name == cls.DESCRIPTOR.full_name:
        copy = cls()
        copy.CopyFrom(options)
        return copy
    raise OptionsError(f"options must be a text proto string or a ConverterOptions message, "
                       f"not {type(options).__name__}")


def to_text(options) -> str:
    from google.protobuf import text_format

    return text_format.MessageToString(options)


def check_batch_options(batch, index: int) -> None:
    """The kernel's own rules (batch_kernels.cc), checked at conversion instead of at serving."""
    where = f"batch_options[{index}]"
    if batch.max_batch_size <= 0:
        raise OptionsError(f"{where}: max_batch_size must be > 0, got {batch.max_batch_size}")
    if batch.batch_timeout_micros < 0:
        raise OptionsError(f"{where}: batch_timeout_micros must be >= 0, got {batch.batch_timeout_micros}")
    if batch.num_batch_threads < 0:
        raise OptionsError(f"{where}: num_batch_threads must be >= 0 (0: TensorFlow's adaptive "
                           f"scheduler), got {batch.num_batch_threads}")
    if batch.max_enqueued_batches < 0:
        raise OptionsError(f"{where}: max_enqueued_batches must be >= 0, got {batch.max_enqueued_batches}")
    sizes = list(batch.allowed_batch_sizes)
    if any(s <= 0 for s in sizes):
        raise OptionsError(f"{where}: allowed_batch_sizes must be positive, got {sizes}")
    if any(b <= a for a, b in zip(sizes, sizes[1:])):
        raise OptionsError(f"{where}: allowed_batch_sizes entries must be monotonically increasing "
                           f"(got {sizes})")
    if sizes and batch.disable_large_batch_splitting and sizes[-1] != batch.max_batch_size:
        raise OptionsError(f"{where}: final entry in allowed_batch_sizes must equal max_batch_size when "
                           f"enable_large_batch_splitting is False (disable_large_batch_splitting: true; "
                           f"got {sizes[-1]} and max_batch_size {batch.max_batch_size})")
    if sizes and sizes[-1] > batch.max_batch_size:
        raise OptionsError(f"{where}: the last allowed_batch_sizes entry {sizes[-1]} is larger than "
                           f"max_batch_size {batch.max_batch_size}")


def batch_sizes(batch) -> list[int]:
    """The execution batch sizes a batch op can run with (its warm-up and compile buckets)."""
    return list(batch.allowed_batch_sizes) or [batch.max_batch_size]


def enabled(options, name: str) -> bool:
    """Whether a default-on optimization (``io_shape_optimization``, ``bfloat16_optimization``) runs:
    ENABLED always, DISABLED never, DEFAULT unless ``disable_default_optimizations``."""
    state = state_name(options, name)
    if state == "ENABLED":
        return True
    if state == "DISABLED":
        return False
    return not options.disable_default_optimizations


def disabled_by(options, name: str) -> str | None:
    """Why a default-on optimization does not run ("<name>: DISABLED" or
    "disable_default_optimizations: true"), None when it runs (`enabled`)."""
    if enabled(options, name):
        return None
    return f"{name}: DISABLED" if state_name(options, name) == "DISABLED" else "disable_default_optimizations: true"


def state_name(options, name: str) -> str:
    return messages()["State"].values_by_number[getattr(options, name)].name
