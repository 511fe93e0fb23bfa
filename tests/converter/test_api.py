"""The TFLiteConverter API: construction, option validation, quantization modes, report,
signatures and metadata."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import kiln  # noqa: E402
from kiln.errors import ConversionError, UnsupportedError  # noqa: E402
from tests.converter import zoo  # noqa: E402


@pytest.fixture(scope="module")
def tf():
    return zoo._tf()


@pytest.fixture(scope="module")
def dense_model():
    import keras

    m = keras.Sequential([keras.Input((4,), name="x"), keras.layers.Dense(3, activation="relu"),
                          keras.layers.Dense(2)])
    zoo.randomize(m)
    return m


@pytest.fixture(scope="module")
def square_fn(tf):
    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="values")])
    def square(values):
        return values * values + 1.0

    return square.get_concrete_function()


def test_public_names():
    assert kiln.TFLiteConverter.__name__ == "TFLiteConverter"
    assert {o.name for o in kiln.Optimize} >= {"DEFAULT", "OPTIMIZE_FOR_SIZE", "OPTIMIZE_FOR_LATENCY"}
    assert {o.name for o in kiln.OpsSet} >= {"TFLITE_BUILTINS", "SELECT_TF_OPS", "TFLITE_BUILTINS_INT8"}


def test_defaults_like_tf(dense_model):
    c = kiln.TFLiteConverter.from_keras_model(dense_model)
    assert c.allow_custom_ops is False
    assert c.optimizations == set()
    assert c.representative_dataset is None
    assert c.target_spec.supported_ops == {kiln.OpsSet.TFLITE_BUILTINS}
    assert c.target_spec.supported_types == set()
    assert c.inference_input_type is None and c.inference_output_type is None
    assert c.experimental_enable_resource_variables is True
    assert c.report is None


def test_keras_signature_and_report(dense_model):
    c = kiln.TFLiteConverter.from_keras_model(dense_model)
    data = c.convert()
    assert isinstance(data, bytes) and data[4:8] == b"TFL3"
    r = c.report
    assert r.op_counts == {"FULLY_CONNECTED": 2}
    assert r.op_versions == [("FULLY_CONNECTED", 1)]
    assert r.size == len(data) and r.seconds > 0 and r.subgraphs == 1
    assert r.min_runtime_version == "1.5.0"
    assert "FULLY_CONNECTED x2" in r.summary() and "size" in str(r)
    interp = kiln.Interpreter(model_content=data)
    assert interp.get_signature_list() == {"serving_default": {"inputs": ["x"], "outputs": ["output_0"]}}
    details = interp.get_input_details()[0]
    assert list(details["shape"]) == [1, 4] and list(details["shape_signature"]) == [-1, 4]


def test_concrete_function_names_and_dynamic_batch(square_fn):
    data = kiln.TFLiteConverter.from_concrete_functions([square_fn]).convert()
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=data)
    assert interp.get_signature_list() == {"serving_default": {"inputs": ["values"], "outputs": ["output_0"]}}
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    out = interp.get_signature_runner()(values=x)["output_0"]
    np.testing.assert_allclose(out, x * x + 1)


def test_multiple_functions_get_their_own_signatures(tf):
    @tf.function(input_signature=[tf.TensorSpec([2], tf.float32, name="a")])
    def double(a):
        return a * 2.0

    @tf.function(input_signature=[tf.TensorSpec([2], tf.float32, name="b")])
    def negate(b):
        return -b

    data = kiln.TFLiteConverter.from_concrete_functions(
        [double.get_concrete_function(), negate.get_concrete_function()]).convert()
    interp = kiln.Interpreter(model_content=data)
    sigs = interp.get_signature_list()
    assert set(sigs) == {"double", "negate"}
    np.testing.assert_allclose(interp.get_signature_runner("negate")(b=np.ones(2, np.float32))["output_0"], [-1, -1])


def test_no_functions_is_an_error():
    with pytest.raises(ConversionError, match="No ConcreteFunction"):
        kiln.TFLiteConverter.from_concrete_functions([])


def test_not_a_concrete_function():
    with pytest.raises(ConversionError, match="ConcreteFunctions"):
        kiln.TFLiteConverter.from_concrete_functions([lambda x: x])


def test_saved_model_bad_signature_key():
    path = zoo.sm_variables().obj
    with pytest.raises(ConversionError, match="Invalid signature key 'nope'"):
        kiln.TFLiteConverter.from_saved_model(path, signature_keys=["nope"])


def test_saved_model_missing_dir(tmp_path):
    with pytest.raises(ConversionError, match="cannot load SavedModel"):
        kiln.TFLiteConverter.from_saved_model(str(tmp_path / "absent"))


def _configured(model, setting):
    c = kiln.TFLiteConverter.from_keras_model(model)
    for key, value in setting.items():
        if key in ("supported_types", "supported_ops"):
            setattr(c.target_spec, key, value)
        else:
            setattr(c, key, value)
    return c


def _calibration():
    return (np.random.default_rng(i).normal(size=(1, 4)).astype(np.float32) for i in range(8))


@pytest.mark.parametrize("setting, mode, io_type", [
    ({"optimizations": {kiln.Optimize.DEFAULT}}, "dynamic", "FLOAT32"),
    ({"optimizations": [kiln.Optimize.OPTIMIZE_FOR_SIZE]}, "dynamic", "FLOAT32"),
    ({"optimizations": {kiln.Optimize.DEFAULT}, "supported_types": {"float16"}}, "float16", "FLOAT32"),
    ({"optimizations": {kiln.Optimize.DEFAULT}, "representative_dataset": lambda: ([x] for x in _calibration())},
     "int8", "FLOAT32"),
    ({"optimizations": {kiln.Optimize.DEFAULT}, "representative_dataset": lambda: ([x] for x in _calibration()),
      "supported_ops": {kiln.OpsSet.TFLITE_BUILTINS_INT8}, "inference_input_type": np.int8,
      "inference_output_type": np.int8}, "int8", "INT8"),
    ({"optimizations": {kiln.Optimize.DEFAULT}, "representative_dataset": lambda: ([x] for x in _calibration()),
      "supported_ops": {kiln.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8},
      "inference_input_type": np.int16, "inference_output_type": np.int16}, "int16x8", "INT16"),
])
def test_quantization_modes_follow_tf(dense_model, setting, mode, io_type):
    c = _configured(dense_model, setting)
    model = kiln.read_model(c.convert())
    assert c.report.quantization["mode"] == mode
    assert "quantize" in [name for name, _ in c.report.stages]
    assert model.main.inputs[0].dtype.name == io_type
    types = {t.dtype.name for t in model.main.tensors}
    assert {"dynamic": "FLOAT32", "float16": "FLOAT16", "int8": "INT8", "int16x8": "INT16"}[mode] in types


@pytest.mark.parametrize("setting, error, match", [
    ({"supported_ops": {kiln.OpsSet.TFLITE_BUILTINS_INT8}}, ConversionError, "need optimizations"),
    ({"optimizations": {kiln.Optimize.DEFAULT}, "supported_ops": {kiln.OpsSet.TFLITE_BUILTINS_INT8}},
     ConversionError, "a `representative_dataset` must be specified"),
    ({"optimizations": {kiln.Optimize.DEFAULT}, "inference_input_type": np.int8}, ConversionError,
     "a `representative_dataset` must be specified"),
    ({"optimizations": {kiln.Optimize.DEFAULT},
      "supported_ops": {kiln.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8}},
     ConversionError, "a `representative_dataset` must be specified"),
])
def test_quantization_options_kiln_cannot_honour_are_refused(dense_model, setting, error, match):
    with pytest.raises(error, match=match):
        _configured(dense_model, setting).convert()


def test_tf_enums_are_accepted(dense_model, tf):
    c = kiln.TFLiteConverter.from_keras_model(dense_model)
    c.optimizations = [tf.lite.Optimize.DEFAULT]
    c.convert()
    assert c.report.quantization["mode"] == "dynamic"
    c.optimizations = set()
    c.target_spec.supported_ops = {tf.lite.OpsSet.TFLITE_BUILTINS}
    c.target_spec.supported_types = {tf.float32}
    c.inference_input_type = tf.float32
    assert c.convert()


@pytest.mark.parametrize("setting, error, match", [
    ({"optimizations": {"TURBO"}}, ConversionError, "optimizations holds the string 'TURBO'; use one of kiln.Optimize"),
    ({"supported_ops": {"GPU_OPS"}}, ConversionError, "target_spec.supported_ops holds the string 'GPU_OPS'"),
    ({"supported_ops": {kiln.OpsSet.SELECT_TF_OPS}}, UnsupportedError, "SELECT_TF_OPS"),
    ({"inference_input_type": np.int8}, ConversionError, "must be tf.float32 unless"),
    ({"inference_output_type": np.int32}, ConversionError, "Unsupported inference_output_type value 'tf.int32'"),
    ({"representative_dataset": [1, 2]}, ConversionError, "not a callable"),
])
def test_invalid_options(dense_model, setting, error, match):
    c = kiln.TFLiteConverter.from_keras_model(dense_model)
    for key, value in setting.items():
        if key in ("supported_types", "supported_ops"):
            setattr(c.target_spec, key, value)
        else:
            setattr(c, key, value)
    with pytest.raises(error, match=match):
        c.convert()


def test_metadata(dense_model):
    import tflite

    data = kiln.TFLiteConverter.from_keras_model(dense_model).convert()
    model = kiln.read_model(data)
    assert model.metadata["min_runtime_version"] == b"1.5.0" + b"\0" * 11
    fb = tflite.Model.GetRootAsModel(data, 0)
    assert fb.Version() == 3
    # CONVERSION_METADATA parses as the schema TF uses (environment + options tables).
    from flatbuffers.table import Table

    raw = model.metadata["CONVERSION_METADATA"]
    root = Table(raw, int.from_bytes(raw[:4], "little"))
    env_off = root.Offset(4)
    assert env_off
    env = Table(raw, root.Indirect(root.Pos + env_off))
    version = env.String(env.Pos + env.Offset(4)).decode()
    assert version == zoo._tf().__version__
    assert env.Get(__import__("flatbuffers").number_types.Int32Flags, env.Pos + env.Offset(8)) == 2  # KERAS_MODEL


def test_tf_keras_outputs_by_layer_name():
    import tf_keras

    m = tf_keras.Sequential([tf_keras.layers.InputLayer((3,), name="inp"), tf_keras.layers.Dense(2, name="logits")])
    data = kiln.TFLiteConverter.from_keras_model(m).convert()
    assert kiln.Interpreter(model_content=data).get_signature_list() == {
        "serving_default": {"inputs": ["inp"], "outputs": ["logits"]}}


def test_model_attribute_holds_the_ir(dense_model):
    c = kiln.TFLiteConverter.from_keras_model(dense_model)
    c.convert()
    assert c.model is not None and c.model.signatures[0].key == "serving_default"


@pytest.mark.parametrize("length", [1, 3, 9])
def test_two_dynamic_dims_resize_at_run_time(length):
    case = zoo.case("k3_dynamic_sequence")
    model = case.source.obj
    x = np.random.default_rng(length).standard_normal((3, length, 8)).astype(np.float32)
    expected = np.asarray(model(x, training=False))
    from ai_edge_litert.interpreter import Interpreter

    for interp in (Interpreter(model_content=case.kiln_model), kiln.Interpreter(model_content=case.kiln_model)):
        out = interp.get_signature_runner()(tokens=x)["output_0"]
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


# -- attribute names and types: nothing is silently ignored ----------------------------------------

def test_a_misspelt_attribute_is_refused_with_the_nearest_name(dense_model):
    c = kiln.TFLiteConverter.from_keras_model(dense_model)
    with pytest.raises(AttributeError, match="has no attribute 'optimisations'.*did you mean 'optimizations'"):
        c.optimisations = [kiln.Optimize.DEFAULT]
    with pytest.raises(ConversionError, match="did you mean 'supported_ops'"):
        c.target_spec.supported_opps = {kiln.OpsSet.TFLITE_BUILTINS}
    with pytest.raises(ConversionError, match="did you mean '_experimental_disable_per_channel'"):
        c._experimental_disable_per_chanel = True
    with pytest.raises(AttributeError,
                       match="the attributes kiln honours are allow_custom_ops, allow_integer_samples, denylist, exclude_conversion_metadata"):
        c.zzz = 1


@pytest.mark.parametrize("setting, match", [
    ({"optimizations": ["DEFAULT"]},
     r"optimizations holds the string 'DEFAULT'; use kiln.Optimize.DEFAULT or tf.lite.Optimize.DEFAULT"),
    ({"optimizations": "DEFAULT"}, r"optimizations must be a set of Optimize values.*accepted values: DEFAULT, "),
    ({"optimizations": kiln.OpsSet.TFLITE_BUILTINS}, "optimizations must be a set of Optimize values"),
    ({"optimizations": [kiln.OpsSet.TFLITE_BUILTINS]}, "optimizations holds <OpsSet.TFLITE_BUILTINS"),
    ({"supported_ops": ["TFLITE_BUILTINS_INT8"]}, "use kiln.OpsSet.TFLITE_BUILTINS_INT8 or tf.lite.OpsSet"),
    ({"supported_types": "float16"}, "target_spec.supported_types must be a set, got 'float16'"),
    ({"allow_custom_ops": "False"}, r"allow_custom_ops must be True or False, got 'False' \(str\)"),
    ({"exclude_conversion_metadata": None}, "exclude_conversion_metadata must be True or False"),
])
def test_option_types_are_checked(dense_model, setting, match):
    c = _configured(dense_model, setting)
    with pytest.raises(ValueError, match=match):  # a ConversionError is a ValueError, as TF raises them
        c.convert()


def test_tf_enums_and_dataset_wrapper_are_accepted(dense_model, tf):
    c = kiln.TFLiteConverter.from_keras_model(dense_model)
    c.optimizations = {tf.lite.Optimize.DEFAULT}
    c.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    c.representative_dataset = tf.lite.RepresentativeDataset(lambda: ([x] for x in _calibration()))
    c.allow_custom_ops = np.bool_(False)
    model = kiln.read_model(c.convert())
    assert c.report.quantization["mode"] == "int8" and model.main.inputs[0].dtype.name == "FLOAT32"


def test_tf_options_kiln_ignores_warn_once_per_convert(dense_model):
    from kiln.converter.attributes import CONVERTER_IGNORED, IgnoredOptionWarning

    c = kiln.TFLiteConverter.from_keras_model(dense_model)
    assert c.experimental_new_converter is True and c._experimental_disable_per_channel is False  # TF's defaults
    c.experimental_new_converter = True     # TF's default: what kiln does anyway, no warning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c.convert()
    assert not [w for w in caught if issubclass(w.category, IgnoredOptionWarning)]
    c._experimental_disable_per_channel = True
    c.target_spec.experimental_select_user_tf_ops.add("MyOp")   # changed in place: still seen
    c.ir_dump_dir = "/tmp/x"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c.convert()
    texts = sorted(str(w.message) for w in caught if issubclass(w.category, IgnoredOptionWarning))
    assert len(texts) == 3
    assert texts[0].startswith("TFLiteConverter._experimental_disable_per_channel = True is ignored: kiln "
                               "quantizes convolution and FULLY_CONNECTED weights per channel")
    assert texts[1].startswith("TFLiteConverter.ir_dump_dir = '/tmp/x' is ignored: an MLIR debugging option")
    assert texts[2].startswith("TFLiteConverter.target_spec.experimental_select_user_tf_ops = {'MyOp'} is ignored")
    assert all(w.filename == __file__ for w in caught)   # points at the user's convert() call
    # Every attribute in the table exists on TF's converter with that default.
    import tensorflow as tf_module

    theirs = tf_module.lite.TFLiteConverter.from_keras_model(dense_model)
    for name, (default, _) in CONVERTER_IGNORED.items():
        assert getattr(theirs, name) == default, name


def test_exclude_conversion_metadata_as_tf(dense_model, tf):
    def keys(converter):
        converter.exclude_conversion_metadata = True
        return sorted(kiln.read_model(converter.convert()).metadata)

    theirs = keys(tf.lite.TFLiteConverter.from_keras_model(dense_model))
    assert keys(kiln.TFLiteConverter.from_keras_model(dense_model)) == theirs == ["min_runtime_version"]
    default = kiln.TFLiteConverter.from_keras_model(dense_model).convert()
    assert "CONVERSION_METADATA" in kiln.read_model(default).metadata


def test_saved_model_dir_is_recorded(tmp_path, tf):
    module = tf.Module()
    module.f = tf.function(lambda x: x + 1.0, input_signature=[tf.TensorSpec([2], tf.float32)])
    tf.saved_model.save(module, str(tmp_path), signatures=module.f.get_concrete_function())
    assert kiln.TFLiteConverter.from_saved_model(str(tmp_path)).saved_model_dir == str(tmp_path)
