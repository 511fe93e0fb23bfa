"""Part 2 stages on models built in code: bfloat16, quantization, I/O shape buckets, sharding (#13)."""

import re
import warnings

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from kiln.errors import KilnError, UnsupportedError  # noqa: E402
from kiln.inference import convert, evaluate, savedmodel  # noqa: E402
from kiln.inference.options import OptionsError  # noqa: E402
from kiln.quant.calibrate import DatasetError  # noqa: E402

from . import models  # noqa: E402
from .test_serving import _xla_modules  # noqa: E402

TOY = 'tpu_functions { function_alias: "tpu_func" }\n'
NO_IO = "\nio_shape_optimization: DISABLED\n"
BF16, FLOAT = 14, 1


@pytest.fixture(scope="module")
def softmax(root):
    m = models.SoftmaxHead()
    return models.save_module(m, root / "softmax", {"serving_default": m.serve.get_concrete_function()},
                              {"head": m.head})


def _nodes(model_dir, function_part):
    """Nodes of the served functions (reached from a signature) whose name holds ``function_part``."""
    model = savedmodel.read(str(model_dir))
    served = set()
    for key in model.signatures:
        wrapper = savedmodel.signature_wrapper(model, key)
        served |= savedmodel.reachable(model, wrapper) | {wrapper}
    return [n for name in served if function_part in name and not name.startswith("__kiln")
            for n in model.functions[name].node_def]


def _types(nodes, op):
    return {n.attr["T"].type for n in nodes if n.op == op}


def _run(model_dir, key, **feeds):
    fn = tf.saved_model.load(str(model_dir)).signatures[key]
    return {k: v.numpy() for k, v in fn(**{n: tf.constant(v) for n, v in feeds.items()}).items()}


# -- bfloat16 ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def toy_bf16(root, toy):
    out = root / "toy_bf16"
    return out, convert(toy, str(out), TOY + NO_IO)


def test_bfloat16_is_on_by_default_and_keeps_signature_dtypes(toy, toy_bf16):
    out, report = toy_bf16
    nodes = _nodes(out, "tpu_func")
    assert _types(nodes, "MatMul") == {BF16} and _types(nodes, "Relu") == {BF16}
    assert any(n.op == "Cast" for n in nodes)
    serve = tf.saved_model.load(str(out)).signatures["serving_default"]
    assert serve.structured_input_signature[1]["x"].dtype == tf.float32
    x = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    got, want = _run(out, "serving_default", x=x)["y"], _run(toy, "serving_default", x=x)["y"]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)
    assert not np.array_equal(got, want)  # really computed in bfloat16


def _checkpoint_dtypes(model_dir):
    reader = tf.train.load_checkpoint(str(model_dir / "variables" / "variables"))
    return {k: v for k, v in reader.get_variable_to_dtype_map().items() if k != "_CHECKPOINTABLE_OBJECT_GRAPH"}


def _tf1_session_run(model_dir, key, x):
    """What TF Serving's loader does: import the graph, run the saver's restore op, run the signature."""
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as sess:
        meta = tf.compat.v1.saved_model.load(sess, ["serve"], str(model_dir))
        sig = meta.signature_def[key]
        return {name: sess.run(info.name, {sig.inputs["x"].name: x}) for name, info in sig.outputs.items()}


def test_variables_read_only_by_bfloat16_ops_are_stored_in_bfloat16(toy, toy_bf16):
    out, report = toy_bf16
    assert _checkpoint_dtypes(out) == {"w/.ATTRIBUTES/VARIABLE_VALUE": tf.bfloat16}
    assert "variables stored in bfloat16: Variable [4, 3]" in report.text
    model = savedmodel.read(str(out))
    assert [n.variable.dtype for n in model.meta.object_graph_def.nodes if n.HasField("variable")] == [BF16]
    x = np.random.default_rng(6).standard_normal((3, 4)).astype(np.float32)
    eager = _run(out, "serving_default", x=x)["y"]
    np.testing.assert_array_equal(_tf1_session_run(out, "serving_default", x)["y"], eager)
    np.testing.assert_allclose(eager, _run(toy, "serving_default", x=x)["y"], rtol=2e-2, atol=2e-2)


def test_report_gives_the_measured_bfloat16_error(toy, toy_bf16):
    out, report = toy_bf16
    measured = report.accuracy["bfloat16"]["serving_default"]
    assert measured["source"] == "generated inputs"
    model = savedmodel.read(toy)
    samples = evaluate.generated_inputs(model.meta.signature_def["serving_default"])
    want = evaluate.compare(evaluate.run(toy, "serving_default", samples),
                            evaluate.run(str(out), "serving_default", samples))["y"]
    got = measured["outputs"]["y"]
    # the report's reference is the float32 model already on XLA: within float32 rounding of TF's own
    assert got["max_abs"] > 0 and got["max_abs"] == pytest.approx(want["max_abs"], rel=1e-4)
    assert got["max_rel"] == pytest.approx(want["max_rel"], rel=1e-4)
    assert f"max abs error {got['max_abs']:.3g}" in report.text
    assert report.to_dict()["accuracy"]["bfloat16"]["serving_default"]["outputs"]["y"]["max_abs"] == got["max_abs"]
    assert "Accuracy of each optimization" in report.to_html()


def test_errors_measured_on_an_evaluation_dataset(root, toy):
    path = root / "eval.npz"
    np.savez(path, x=np.random.default_rng(7).standard_normal((12, 4)).astype(np.float32))
    report = convert(toy, str(root / "evalset"), TOY + NO_IO +
                     f'experimental {{ evaluation_datasets {{ key: "serving_default" value: "{path}" }} }}')
    measured = report.accuracy["bfloat16"]["serving_default"]
    assert measured["source"] == "evaluation data" and measured["rows"] == 8  # batches of 3 and 5 rows
    assert "8 rows of evaluation data" in report.text
    with pytest.raises(OptionsError, match=r"evaluation_datasets: \['serve'\] are not signatures of the model"):
        convert(toy, str(root / "evalset_bad"), TOY + 'experimental { evaluation_datasets { key: "serve" '
                f'value: "{path}" }} }}')


@pytest.mark.parametrize("text, on", [
    ("bfloat16_optimization: DISABLED", False),
    ("disable_default_optimizations: true", False),
    ("disable_default_optimizations: true bfloat16_optimization: ENABLED", True),
    ("bfloat16_optimization { state: DISABLED }", False),  # kiln 0.1's message form still parses
])
def test_bfloat16_switches(root, toy, text, on):
    out = root / f"sw_{abs(hash(text))}"
    report = convert(toy, str(out), TOY + NO_IO + text)
    assert _types(_nodes(out, "tpu_func"), "MatMul") == ({BF16} if on else {FLOAT})
    stage = next(s for s in report.stages if s.name == "bfloat16")
    assert stage.changes[0].startswith("skipped") != on


def test_scope_all_converts_cpu_functions_too(root, toy):
    out = root / "scope_all"
    convert(toy, str(out), TOY + NO_IO + "bfloat16_optimization_options { scope: ALL }")
    assert _types(_nodes(out, "serve"), "AddV2") == {BF16}
    out2 = root / "scope_default"
    convert(toy, str(out2), TOY + NO_IO + "bfloat16_optimization_options { scope: TPU }")
    assert _types(_nodes(out2, "serve"), "AddV2") == {FLOAT}


def test_filterlist_keeps_ops_in_float32(root, toy):
    out = root / "filter"
    report = convert(toy, str(out), TOY + NO_IO + 'bfloat16_optimization_options { filterlist: "MatMul" }')
    nodes = _nodes(out, "tpu_func")
    assert _types(nodes, "MatMul") == {FLOAT} and _types(nodes, "Relu") == {BF16}
    assert _checkpoint_dtypes(out) == {"w/.ATTRIBUTES/VARIABLE_VALUE": tf.float32}  # a float32 MatMul reads it
    line = next(s for s in report.stages if s.name == "bfloat16").changes[0]
    assert "kept float32: " in line and "MatMul" in line.split("kept float32: ")[1]


def test_filterlist_names_must_be_op_types(root, toy):
    with pytest.raises(OptionsError, match=r"filterlist: 'Matmul' is not a TensorFlow op type \(did you mean "
                                           r"'MatMul'\?\)"):
        convert(toy, str(root / "badfilter"), TOY + 'bfloat16_optimization_options { filterlist: "Matmul" }')


def test_softmax_feeding_the_output_and_deny_list_stay_float32(root, softmax):
    out = root / "softmax_out"
    report = convert(softmax, str(out), 'tpu_functions { function_alias: "head" }' + NO_IO)
    nodes = _nodes(out, "head")
    assert _types(nodes, "MatMul") == {BF16} and _types(nodes, "Abs") == {BF16}
    assert _types(nodes, "Softmax") == {FLOAT} and _types(nodes, "Exp") == {FLOAT}
    assert any("kept float32 (feed a signature output)" in c for s in report.stages for c in s.changes)
    x = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(_run(out, "serving_default", x=x)["p"].sum(axis=1), 1.0, rtol=1e-5)


def test_model_with_bfloat16_ops_is_refused_unless_safety_checks_are_skipped(root):
    m = models.HasBFloat16()
    path = models.save_module(m, root / "hasbf16", {"serving_default": m.serve.get_concrete_function()},
                              {"body": m.body})
    with pytest.raises(KilnError, match=r"already holds bfloat16 ops \(.*body.*MatMul\).*skip_safety_checks"):
        convert(path, str(root / "hasbf16_out"), 'tpu_functions { function_alias: "body" }')
    assert not (root / "hasbf16_out").exists()
    report = convert(path, str(root / "hasbf16_ok"), 'tpu_functions { function_alias: "body" }'
                     ' bfloat16_optimization_options { skip_safety_checks: true }')
    assert "skip_safety_checks" in next(s for s in report.stages if s.name == "bfloat16").changes[0]


# -- I/O shape buckets ------------------------------------------------------------------------

def test_compile_count_stays_at_the_number_of_buckets(root, toy):
    out = root / "buckets"
    report = convert(toy, str(out), TOY + "bfloat16_optimization: DISABLED experimental { max_batch_bucket: 8 }")
    (entry,) = [b for b in report.io_shapes if b["call_sites"]][:1]
    assert entry["batch_buckets"] == [1, 2, 4, 8] and entry["max_compiles"] == 4
    assert report.signatures["serving_default"]["warmup_batch_sizes"] == [1, 2, 4, 8]
    x = np.random.default_rng(3).standard_normal((6, 4)).astype(np.float32)
    np.testing.assert_allclose(_run(out, "serving_default", x=x)["y"], _run(toy, "serving_default", x=x)["y"],
                               rtol=1e-6)
    calls = [["serving_default", n] for n in (1, 2, 3, 4, 5, 6, 7, 8, 3, 6, 1)]
    names, texts = _xla_modules(out, calls, root / "dump_buckets")
    rows = sorted({int(re.search(r"ENTRY[^\n]*?\([\w.]+: f32\[(\d+),4\]", t).group(1)) for t in texts})
    assert len(texts) == 4 and rows == [1, 2, 4, 8], (names, rows)


def test_batched_functions_take_their_buckets_from_batch_function(root, toy):
    out = root / "buckets_batched"
    report = convert(toy, str(out), TOY + "bfloat16_optimization: DISABLED batch_options { max_batch_size: 8 "
                     "allowed_batch_sizes: [2, 4, 8] batch_timeout_micros: 100 }")
    entries = [b for b in report.io_shapes if b["call_sites"]]
    assert entries and all(b["wrapper"] == "(BatchFunction)" and b["batch_buckets"] == [2, 4, 8] for b in entries)
    assert not [n for n in savedmodel.read(str(out)).functions if n.startswith("__kiln_bucketed_")]


def test_sequence_dimension_buckets(root):
    m = models.Sequence()
    path = models.save_module(m, root / "seq", {"serving_default": m.serve.get_concrete_function()},
                              {"tokens": m.tokens})
    out = root / "seq_out"
    report = convert(path, str(out), 'tpu_functions { function_alias: "tokens" } bfloat16_optimization: DISABLED '
                     'experimental { max_batch_bucket: 4 dimension_buckets { input: "x" dimension: 1 '
                     'sizes: 8 sizes: 16 } }')
    (entry,) = [b for b in report.io_shapes if b["call_sites"]][:1]
    assert entry["dimension_buckets"] == {"x[1]": [8, 16]} and entry["max_compiles"] == 3 * 2
    for shape in ((2, 5, 4), (3, 11, 4), (1, 20, 4)):
        x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
        got = _run(out, "serving_default", x=x)["y"]
        assert got.shape == shape[:2] + (2,)
        np.testing.assert_allclose(got, _run(path, "serving_default", x=x)["y"], rtol=1e-6)
    with pytest.raises(OptionsError, match=r"no accelerator function has an input 'tokens_in'; their inputs are "
                                           r"\['x'\]"):
        convert(path, str(root / "seq_bad"), 'tpu_functions { function_alias: "tokens" } experimental { '
                'dimension_buckets { input: "tokens_in" dimension: 1 sizes: 8 } }')
    with pytest.raises(OptionsError, match=r"dimension 2 of input 'x' .* is fixed \(4\)"):
        convert(path, str(root / "seq_bad"), 'tpu_functions { function_alias: "tokens" } experimental { '
                'dimension_buckets { input: "x" dimension: 2 sizes: 8 } }')
    with pytest.raises(OptionsError, match=r"sizes must be positive and increasing, got \[16, 8\]"):
        convert(path, str(root / "seq_bad"), 'tpu_functions { function_alias: "tokens" } experimental { '
                'dimension_buckets { input: "x" dimension: 1 sizes: 16 sizes: 8 } }')
    assert not (root / "seq_bad").exists()


# -- sharding -----------------------------------------------------------------------------------

def _topology(mesh, coords, tasks=1, per_task=None):
    from tensorflow.core.protobuf.tpu import topology_pb2

    topo = topology_pb2.TopologyProto(mesh_shape=mesh, num_tasks=tasks,
                                      num_tpu_devices_per_task=per_task or len(coords) // 4,
                                      device_coordinates=coords)
    return "".join(f"\\{b:03o}" for b in topo.SerializeToString())


PF_1X2X1 = _topology([1, 2, 1, 1], [0, 0, 0, 0, 0, 1, 0, 0]) if tf else None


@pytest.mark.parametrize("text, error, message", [
    ("num_cores_per_replica: 2", OptionsError, r"num_cores_per_replica 2 > 1 needs topology"),
    ("num_cores_per_replica: -1", OptionsError, r"must be >= 0, got -1"),
    ('num_cores_per_replica: 2 topology: "\\377\\377"', OptionsError, r"not a serialized tensorflow.tpu.TopologyProto"),
    (f'num_cores_per_replica: 2 topology: "{_topology([1, 2, 1], [0, 0, 0, 0, 0, 1, 0, 0])}"', OptionsError,
     r"mesh_shape must hold 4 positive sizes"),
    ("num_cores_per_replica: 2 topology: "
     f'"{_topology([1, 2, 1, 1], [0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0], per_task=2)}"',
     OptionsError, r"device_coordinates must hold 4 values for each of the 2 devices"),
    (f'num_cores_per_replica: 2 topology: "{_topology([1, 2, 1, 1], [0, 0, 0, 0, 0, 2, 0, 0])}"', OptionsError,
     r"\[0, 2, 0, 0\] lies outside mesh_shape"),
    (f'num_cores_per_replica: 4 topology: "{PF_1X2X1}"', OptionsError, r"more than the topology's 2 devices"),
    (f'num_cores_per_replica: 2 topology: "{PF_1X2X1}" device_assignment: [0, 0, 0, 0]', OptionsError,
     r"device_assignment must hold \[x, y, z, core\] for each of the 2 core\(s\) per replica \(8 values\), got 4"),
    (f'num_cores_per_replica: 2 topology: "{PF_1X2X1}" device_assignment: [0, 0, 0, 0, 0, 0, 0, 1]', OptionsError,
     r"\[\[0, 0, 0, 1\]\] not in the topology's device_coordinates"),
    (f'num_cores_per_replica: 2 topology: "{PF_1X2X1}" device_assignment: [0, 0, 0, 0, 0, 0, 0, 0]', OptionsError,
     r"lists a device twice"),
    (f'num_cores_per_replica: 2 topology: "{PF_1X2X1}"', UnsupportedError,
     r"needs XLA SPMD over 2 TPU cores; .* this process has 0 TPU core\(s\) \(devices: CPU\)"),
])
def test_sharding_option_errors(root, toy, text, error, message):
    out = root / "shard_err"
    with pytest.raises(error, match=message):
        convert(toy, str(out), TOY + f"xla_sharding_options {{ {text} }}")
    assert not out.exists()


def test_one_core_per_replica_is_replication(root, toy):
    report = convert(toy, str(root / "shard_one"), TOY + NO_IO + "bfloat16_optimization: DISABLED "
                     f'xla_sharding_options {{ num_cores_per_replica: 1 topology: "{PF_1X2X1}" }}')
    (line,) = next(s for s in report.stages if s.name == "sharding").changes
    assert line.startswith("replication: num_cores_per_replica 1") and "2 devices validated" in line


# -- quantization -------------------------------------------------------------------------------

def _mlp(root):
    m = models.Mlp()
    return models.save_module(m, root / "mlp", {"serving_default": m.serve.get_concrete_function()},
                              {"body": m.body})


@pytest.fixture(scope="module")
def mlp(root):
    return _mlp(root)


@pytest.fixture(scope="module")
def mlp_samples():
    rng = np.random.default_rng(5)
    return [{"x": rng.standard_normal((1, 64)).astype(np.float32)} for _ in range(30)]


@pytest.fixture(scope="module")
def tfrecord(root, mlp_samples):
    path = root / "rep.tfrecord"
    tf.quantization.experimental.TfRecordRepresentativeDatasetSaver(
        path_map={"serving_default": str(path)}).save({"serving_default": mlp_samples})
    return path


def _quant(method, dataset=None):
    text = f"quantization_method {{ preset_method: {method} }} op_set: XLA"
    if dataset:
        text += (f' representative_datasets {{ key: "serving_default" value {{ tfrecord_file_path: "{dataset}" }} }}')
    return ('tpu_functions { function_alias: "body" } '
            f"external_feature_configs {{ quantization_options {{ {text} }} }}")


def _xla_dots(model_dir):
    model = savedmodel.read(str(model_dir))
    return [n for f in model.functions.values() for n in f.node_def if n.op == "XlaDotV2"]


@pytest.mark.parametrize("kind", ["tfrecord", "npz"])
def test_static_range_int8_with_a_representative_dataset(root, mlp, mlp_samples, tfrecord, kind):
    path = tfrecord
    if kind == "npz":
        path = root / "rep.npz"
        np.savez(path, x=np.concatenate([s["x"] for s in mlp_samples]))
    out = root / f"q_static_{kind}"
    with pytest.warns(UserWarning, match=r"only 30 samples; .*at least 200 representative samples"):
        report = convert(mlp, str(out), _quant("METHOD_STATIC_RANGE_INT8", path))
    assert _xla_dots(out), "TensorFlow's quantizer wrote no XlaDotV2"
    q = report.quantization
    assert q["calibration_samples"] == {"serving_default": 27} and q["held_out_samples"] == {"serving_default": 3}
    measured = report.accuracy["quantization"]["serving_default"]
    assert measured["source"] == "held-out representative samples" and measured["rows"] == 3
    x = mlp_samples[-1]["x"]
    err = np.max(np.abs(_run(out, "serving_default", x=x)["y"] - _run(mlp, "serving_default", x=x)["y"]))
    assert 0 < err <= measured["outputs"]["y"]["max_abs"] + 1e-6
    assert measured["outputs"]["y"]["max_rel"] < 0.1
    assert report.signatures["serving_default"]["placement"].startswith("XLA: ")
    bf16 = next(s for s in report.stages if s.name == "bfloat16").changes[0]
    assert bf16.startswith("skipped: the model is int8-quantized")  # unless bfloat16_optimization: ENABLED


@pytest.mark.parametrize("method", ["METHOD_DYNAMIC_RANGE_INT8", "METHOD_STATIC_RANGE_WEIGHT_ONLY_INT8"])
def test_dynamic_range_and_weight_only(root, mlp, method):
    out = root / f"q_{method}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = convert(mlp, str(out), _quant(method))
    assert report.quantization["method"] == method
    assert report.quantization["bytes_after"] != report.quantization["bytes_before"]
    measured = report.accuracy["quantization"]["serving_default"]
    assert measured["source"] == "generated inputs" and 0 < measured["outputs"]["y"]["max_rel"] < 0.1


@pytest.mark.filterwarnings("ignore:.*representative samples")
def test_quantization_errors(root, mlp, tfrecord):
    with pytest.raises(OptionsError, match=r"static-range int8 quantization calibrates on a representative dataset"):
        convert(mlp, str(root / "qe"), _quant("METHOD_STATIC_RANGE_INT8"))
    with pytest.raises(OptionsError, match=r"signature_keys: \['nope'\] not in the model's signatures"):
        convert(mlp, str(root / "qe"), _quant("METHOD_DYNAMIC_RANGE_INT8").replace("op_set: XLA",
                                                                                  'op_set: XLA signature_keys: "nope"'))
    with pytest.raises(OptionsError, match=r"op_set UNIFORM_QUANTIZED: .* use op_set: XLA"):
        convert(mlp, str(root / "qe"), _quant("METHOD_DYNAMIC_RANGE_INT8").replace("XLA", "UNIFORM_QUANTIZED"))
    damaged = root / "damaged.tfrecord"
    data = bytearray(tfrecord.read_bytes())
    data[40] ^= 0xFF
    damaged.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=r"damaged.tfrecord', record 0: corrupt data \(CRC mismatch\)"):
        convert(mlp, str(root / "qe"), _quant("METHOD_STATIC_RANGE_INT8", damaged))
    wrong = root / "wrong.npz"
    np.savez(wrong, z=np.zeros((4, 64), np.float32))
    with pytest.raises(DatasetError, match=r"wrong.npz', record 0: inputs \['z'\] but the signature takes \['x'\]"):
        convert(mlp, str(root / "qe"), _quant("METHOD_STATIC_RANGE_INT8", wrong))
    with pytest.raises(DatasetError, match=r"missing.tfrecord' does not exist"):
        convert(mlp, str(root / "qe"), _quant("METHOD_STATIC_RANGE_INT8", root / "missing.tfrecord"))
    assert not (root / "qe").exists()


def test_convert_stays_the_function_after_a_call(root, toy):
    """Importing the pipeline module must not rebind kiln.inference.convert to a module."""
    import kiln.inference

    convert(toy, str(root / "twice_1"), TOY + NO_IO)
    assert callable(kiln.inference.convert)
    kiln.inference.convert(toy, str(root / "twice_2"), TOY + NO_IO)


def test_a_stage_whose_model_fails_is_an_error_not_a_written_model(root, toy):
    """evaluate.measure: the model after a stage failing where the one before runs is a StageError."""

    class Fails(tf.Module):
        @tf.function(input_signature=[models.SPEC])
        def serve(self, x):
            return {"y": tf.debugging.assert_all_finite(tf.math.log(x), "log of a negative input")[:, :3]}

    m = Fails()
    broken = models.save_module(m, root / "fails", {"serving_default": m.serve.get_concrete_function()}, {})
    sig = savedmodel.read(toy).meta.signature_def["serving_default"]
    inputs = {"serving_default": (evaluate.generated_inputs(sig), "generated")}
    with pytest.raises(evaluate.StageError, match=r"bfloat16: signature 'serving_default' fails after the stage on "
                                                  r"inputs the model before it runs: .*log of a negative input.*; "
                                                  r"try this"):
        evaluate.measure(toy, broken, inputs, "bfloat16", "try this")
    # the other way round: the model before cannot run these inputs, so nothing is measured
    measured, _ = evaluate.measure(broken, toy, inputs, "bfloat16", "try this")
    assert "log of a negative input" in measured["serving_default"]["error"]


def test_padding_that_changes_results_is_refused(root):
    m = models.MixesRows()
    path = models.save_module(m, root / "mixes", {"serving_default": m.serve.get_concrete_function()},
                              {"center": m.center})
    with pytest.raises(evaluate.StageError, match=r"I/O shapes: padding to buckets changes output 'y' of signature "
                                                  r"'serving_default' .*mixes rows.*io_shape_optimization: DISABLED"):
        convert(path, str(root / "mixes_out"), 'tpu_functions { function_alias: "center" } experimental { '
                'max_batch_bucket: 16 }')
    assert not (root / "mixes_out").exists()
    convert(path, str(root / "mixes_ok"), 'tpu_functions { function_alias: "center" } io_shape_optimization: DISABLED')


@pytest.mark.parametrize("quant, message", [
    ('quantization_method { preset_method: METHOD_DYNAMIC_RANGE_INT8 } tags: "train"',
     r"tags \['train'\] do not name the serving MetaGraph \(tags \['serve'\]\)"),
    ('quantization_method { preset_method: METHOD_DYNAMIC_RANGE_INT8 } representative_datasets { key: "other" '
     'value { tfrecord_file_path: "x" } }', r"representative_datasets: \['other'\] are not among signature_keys"),
    ("quantization_method { preset_method: METHOD_NO_QUANTIZE }", r"METHOD_NO_QUANTIZE: remove quantization_options"),
    ("quantization_method { preset_method: METHOD_DYNAMIC_RANGE_INT8 } freeze_all_variables: false",
     r"freeze_all_variables: false is not supported"),
    ('representative_datasets { key: "serving_default" value { } }', r"\['serving_default'\] has no tfrecord_file_path"),
])
def test_quantization_option_errors(root, mlp, quant, message):
    with pytest.raises(OptionsError, match=message):
        convert(mlp, str(root / "qo"), f"external_feature_configs {{ quantization_options {{ {quant} }} }}")
    assert not (root / "qo").exists()


def test_max_batch_bucket_must_be_positive(root, toy):
    with pytest.raises(OptionsError, match=r"experimental.max_batch_bucket must be > 0, got -4"):
        convert(toy, str(root / "mbb"), TOY + "experimental { max_batch_bucket: -4 }")


@pytest.mark.slow
def test_keras_text_classifier_defaults_and_a_pooled_sequence_bucket(root):
    """Keras ops (FusedBatchNormV3, Erfc, Conv2D, LayerNorm, ResourceGather) through bfloat16 + buckets;
    bucketing the sequence of a model that mean-pools over it is refused, not served changed."""
    path = models.save_keras_text_classifier(root / "keras_text")
    out = root / "keras_text_out"
    report = convert(path, str(out), 'tpu_functions { function_alias: "body" }')
    nodes = _nodes(out, "body")
    assert _types(nodes, "Conv2D") == {BF16} and _types(nodes, "Softmax") == {FLOAT}
    ids = np.random.default_rng(8).integers(0, 50, (3, 11)).astype(np.int32)
    got, want = _run(out, "serving_default", ids=ids)["p"], _run(path, "serving_default", ids=ids)["p"]
    np.testing.assert_allclose(got, want, atol=1e-2)
    assert report.accuracy["bfloat16"]["serving_default"]["outputs"]["p"]["max_abs"] < 1e-2
    with pytest.raises(evaluate.StageError, match=r"padding to buckets changes output 'p'"):
        convert(path, str(root / "keras_text_seq"), 'tpu_functions { function_alias: "body" } bfloat16_optimization: '
                'DISABLED experimental { dimension_buckets { input: "ids" dimension: 1 sizes: [8, 16, 32] } }')
