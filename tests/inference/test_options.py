"""ConverterOptions: a real protobuf message with the original's field names and numbers."""

import pytest

pytest.importorskip("tensorflow")

from kiln.errors import KilnError  # noqa: E402
from kiln.inference import options as opts  # noqa: E402

ORIGINAL_EXAMPLE = """
tpu_functions {
  function_alias: "tpu_func"
}
batch_options {
  num_batch_threads: 2
  max_batch_size: 8
  batch_timeout_micros: 5000
  allowed_batch_sizes: 2
  allowed_batch_sizes: 4
  allowed_batch_sizes: 8
  max_enqueued_batches: 10
}
"""


def test_field_numbers_match_the_original():
    m = opts.messages()
    fields = {f.name: f.number for f in m["ConverterOptions"].DESCRIPTOR.fields}
    assert fields == {"tpu_functions": 1, "external_feature_configs": 3, "batch_options": 100,
                      "io_shape_optimization": 200, "bfloat16_optimization": 201,
                      "disable_default_optimizations": 202, "bfloat16_optimization_options": 203,
                      "xla_sharding_options": 204, "experimental": 1000, "skip_accuracy_check": 1001}
    desc = m["ConverterOptions"].DESCRIPTOR.fields_by_name
    # the original's two optimization switches are the State enum itself: `bfloat16_optimization: DISABLED`
    assert desc["bfloat16_optimization"].enum_type.name == "State"
    assert desc["io_shape_optimization"].enum_type.name == "State"
    shard = {f.name: (f.number, f.type) for f in m["XlaShardingOptions"].DESCRIPTOR.fields}
    assert shard == {"num_cores_per_replica": (1, 5), "device_assignment": (2, 5), "topology": (3, 12)}
    bfo = m["BFloat16OptimizationOptions"].DESCRIPTOR
    assert {f.name: f.number for f in bfo.fields} == {"scope": 1, "skip_safety_checks": 2, "filterlist": 3}
    assert [v.name for v in bfo.enum_types_by_name["Scope"].values] == ["DEFAULT", "TPU", "ALL"]
    tpu = m["TpuFunction"].DESCRIPTOR
    assert {f.name: (f.number, f.containing_oneof.name) for f in tpu.fields} == {
        "function_alias": (1, "name"), "concrete_function_name": (3, "name"),
        "signature_name": (5, "name"), "jit_compile_functions": (4, "name")}
    batch = {f.name: f.number for f in m["BatchOptions"].DESCRIPTOR.fields}
    assert batch == {"num_batch_threads": 1, "max_batch_size": 2, "batch_timeout_micros": 3,
                     "allowed_batch_sizes": 4, "max_enqueued_batches": 5, "disable_large_batch_splitting": 6,
                     "experimental": 7}
    exp = m["BatchOptions"].DESCRIPTOR.nested_types_by_name["Experimental"]
    assert {f.name: f.number for f in exp.fields} == {"function_alias": 1, "concrete_function_name": 2,
                                                      "signature_name": 3}
    assert [v.name for v in m["State"].values] == ["DEFAULT", "ENABLED", "DISABLED"]


def test_quantization_options_is_tensorflows_own_message():
    from tensorflow.compiler.mlir.quantization.tensorflow import quantization_options_pb2

    parsed = opts.parse('external_feature_configs { quantization_options { '
                        'quantization_method { preset_method: METHOD_DYNAMIC_RANGE_INT8 } op_set: XLA } }')
    q = parsed.external_feature_configs.quantization_options
    assert q.DESCRIPTOR is quantization_options_pb2.QuantizationOptions.DESCRIPTOR
    assert q.op_set == quantization_options_pb2.XLA


def test_original_example_parses_and_round_trips():
    parsed = opts.parse(ORIGINAL_EXAMPLE)
    assert parsed.tpu_functions[0].function_alias == "tpu_func"
    assert list(parsed.batch_options[0].allowed_batch_sizes) == [2, 4, 8]
    again = opts.parse(opts.to_text(parsed))
    assert again == parsed
    assert opts.coerce(parsed) == parsed and opts.coerce(parsed) is not parsed


def test_accelerator_functions_is_a_synonym_of_tpu_functions():
    a = opts.parse('accelerator_functions { concrete_function_name: "__inference_serve_24" }')
    b = opts.parse('tpu_functions { concrete_function_name: "__inference_serve_24" }')
    assert a == b
    # only the field name is rewritten, never a string value or a comment
    c = opts.parse('# accelerator_functions\ntpu_functions { function_alias: "accelerator_functions" }')
    assert c.tpu_functions[0].function_alias == "accelerator_functions"


@pytest.mark.parametrize("text, where, what", [
    ("tpu_functions {\n  bogus_field: 1\n}", "line 2, column 3", 'no field named "bogus_field"'),
    ("batch_options { max_batch_size: 8 }\nwat: 1", "line 2, column 1", 'no field named "wat"'),
    ("tpu_functions { function_alias: 3 ", "line 1", "string"),
    ("batch_options { max_batch_size: \"x\" }", "line 1, column", "integer"),
])
def test_parse_errors_name_line_and_column(text, where, what):
    with pytest.raises(opts.OptionsError) as info:
        opts.parse(text)
    assert isinstance(info.value, KilnError)
    assert where in str(info.value) and what in str(info.value)


def test_two_members_of_a_oneof_are_an_error():
    with pytest.raises(opts.OptionsError, match=r'line 1, column \d+: .*another member of oneof "name"'):
        opts.parse('tpu_functions { function_alias: "a" concrete_function_name: "b" }')


@pytest.mark.parametrize("fields, message", [
    ({"max_batch_size": 0}, "max_batch_size must be > 0"),
    ({"max_batch_size": 8, "allowed_batch_sizes": [4, 2, 8]},
     "allowed_batch_sizes entries must be monotonically increasing"),
    ({"max_batch_size": 16, "allowed_batch_sizes": [2, 4, 8], "disable_large_batch_splitting": True},
     "final entry in allowed_batch_sizes must equal max_batch_size when enable_large_batch_splitting is False"),
    ({"max_batch_size": 4, "allowed_batch_sizes": [2, 8]}, "larger than max_batch_size"),
    ({"max_batch_size": 4, "batch_timeout_micros": -1}, "batch_timeout_micros must be >= 0"),
])
def test_batch_option_rules(fields, message):
    batch = opts.messages()["BatchOptions"](**fields)
    with pytest.raises(opts.OptionsError, match=message):
        opts.check_batch_options(batch, 0)


def test_batch_options_valid_with_splitting():
    batch = opts.messages()["BatchOptions"](max_batch_size=32, allowed_batch_sizes=[2, 4, 8])
    opts.check_batch_options(batch, 0)
    assert opts.batch_sizes(batch) == [2, 4, 8]


def test_coerce_rejects_other_types():
    with pytest.raises(opts.OptionsError, match="text proto string or a ConverterOptions"):
        opts.coerce(42)
