"""Part 3 (#26): warm-up that cannot hurt the model, batching that cannot change results, the model kept whole."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from kiln.errors import KilnError  # noqa: E402
from kiln.inference import convert, effects, evaluate, savedmodel  # noqa: E402

from . import models  # noqa: E402

F32 = "\nbfloat16_optimization: DISABLED\nio_shape_optimization: DISABLED\n"
BF16, FLOAT = 14, 1


@pytest.fixture(scope="module")
def running_mean(root):
    return models.save_running_mean(root / "running_mean")


def _load(path):
    return tf.saved_model.load(str(path))


def _call(loaded, key, **feeds):
    return {k: v.numpy() for k, v in loaded.signatures[key](**{n: tf.constant(v) for n, v in feeds.items()}).items()}


# -- side effects -------------------------------------------------------------------------------

def test_state_changes_are_found_through_calls(running_mean):
    model = savedmodel.read(running_mean)
    found = effects.signature_effects(model)
    assert sorted(found) == ["serving_default", "set_w"]  # `state` only reads
    assert all(e.op == "AssignVariableOp" for e in found["set_w"])
    assert "on variable" in str(found["serving_default"][0]) and "body" in found["serving_default"][0].function


def test_bfloat16_keeps_a_state_update_in_float32(root, running_mean):
    """The running mean is computed from the matmul: the whole update stays float32, so the state
    after ten calls equals the float32 model's (it drifted by bfloat16 rounding per call before)."""
    out = root / "running_mean_bf16"
    report = convert(running_mean, str(out), 'tpu_functions { function_alias: "body" } '
                     "io_shape_optimization: DISABLED skip_accuracy_check: true")
    assert any("compute a state update" in c for s in report.stages for c in s.changes)
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    before, after = _load(running_mean), _load(out)
    for _ in range(10):
        want, got = _call(before, "serving_default", x=x), _call(after, "serving_default", x=x)
    np.testing.assert_allclose(_call(after, "state")["mean"], _call(before, "state")["mean"], rtol=1e-6)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-2, atol=1e-2)  # the output itself is bfloat16's


# -- the accuracy guard (item 6) -----------------------------------------------------------------

@pytest.fixture(scope="module")
def parses_strings(root):
    return models.save_parses_strings(root / "csv")


def test_guard_never_passes_silently_and_takes_real_inputs(root, parses_strings):
    from kiln.inference import AccuracyNotMeasuredWarning

    options = 'tpu_functions { function_alias: "body" } io_shape_optimization: DISABLED'
    with pytest.warns(AccuracyNotMeasuredWarning, match=r"bfloat16 on signature 'serving_default' \(the model "
                                                        r"before bfloat16 fails on generated inputs"):
        report = convert(parses_strings, str(root / "csv_generated"), options)
    assert report.unmeasured and report.to_dict()["unmeasured"][0]["stage"] == "bfloat16"
    # real inputs as an iterable of samples (the quantization dataset formats work too: see test_cli)
    samples = [{"text": models.csv_rows(2, seed)} for seed in range(6)]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", AccuracyNotMeasuredWarning)
        report = convert(parses_strings, str(root / "csv_real"), options, evaluation_data=samples)
    measured = report.accuracy["bfloat16"]["serving_default"]
    assert measured["source"] == "evaluation data" and measured["rows"] == 4 + 6  # 2-row samples stacked to 3+, 5+
    assert 0 < measured["outputs"]["y"]["max_rel"] < 2e-2 and not report.unmeasured


def test_skipping_the_guard_measures_nothing_and_says_so(root, parses_strings):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = convert(parses_strings, str(root / "csv_skip"), 'tpu_functions { function_alias: "body" } '
                         "skip_accuracy_check: true")
    assert report.accuracy == {} and report.accuracy_skipped and not report.unmeasured
    assert "error vs float32: not measured (skip_accuracy_check)" in report.text
    assert "Accuracy check: skipped" in report.text


def test_report_columns_widen_for_large_costs():
    from kiln.inference.report import ConversionReport, FunctionEntry

    report = ConversionReport("in", "out", cpu_cost=1234)
    report.functions = [FunctionEntry("__inference_big_7", "alias", 123456789, 0, [], 1)]
    lines = report.text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("%"))
    assert lines[header] == "%         Cost       Name"
    assert lines[header + 3] == f"{100 * 123456789 / 123458023:<10.2f}123456789  __inference_big_7"
    assert len(lines[header - 1]) == len(lines[header + 1]) == len(lines[header + 4]) == 24 + 11


# -- batching: captured tensors, signature scope, sparse inputs (items 2, 9) --------------------

BATCH = "max_batch_size: 8 allowed_batch_sizes: [2, 4, 8] batch_timeout_micros: 20000 num_batch_threads: 1"


def _batch_ops(model_dir):
    model = savedmodel.read(str(model_dir))
    return model, [(f.signature.name, n) for f in model.meta.graph_def.library.function for n in f.node_def
                   if n.op == "BatchFunction"]


def test_captured_constants_and_table_defaults_are_batched(root):
    from .test_serving import _concurrent

    src = models.save_captures(root / "captures")
    out = root / "captures_batched"
    convert(src, str(out), 'tpu_functions { function_alias: "body" } '
            f'batch_options {{ {BATCH} }} batch_options {{ {BATCH} experimental {{ function_alias: "ids" }} }}' + F32)
    _, ops = _batch_ops(out)
    assert {n.attr["f"].func.name.split("_")[-2] for _, n in ops} >= {"body", "ids"}
    assert all(n.attr["Tcaptured"].list.type for _, n in ops)  # the constant / table default ride along
    before, after = _load(src).signatures["serving_default"], _load(out).signatures["serving_default"]
    rng = np.random.default_rng(1)
    feeds = [(rng.standard_normal((1 + i % 3, 4)).astype(np.float32),
              np.array([b"a", b"zz", b"c"][: 1 + i % 3], dtype=object)) for i in range(12)]
    results, errors = _concurrent(lambda f: after(x=tf.constant(f[0]), words=tf.constant(f[1])), feeds)
    assert not errors
    for (x, words), got in zip(feeds, results):
        want = before(x=tf.constant(x), words=tf.constant(words))
        np.testing.assert_allclose(got["y"].numpy(), want["y"].numpy(), rtol=1e-6)
        np.testing.assert_array_equal(got["ids"].numpy(), want["ids"].numpy())  # -1: the table's default


def test_signature_batching_leaves_other_signatures_alone(root):
    class Shared(tf.Module):
        @tf.function
        def f(self, x):
            return x * 3.0

        @tf.function(input_signature=[models.SPEC])
        def a(self, x):
            return {"y": self.f(x)}

        @tf.function(input_signature=[models.SPEC])
        def b(self, x):
            return {"y": self.f(x) + 1.0}

    m = Shared()
    a = m.a.get_concrete_function()  # one function behind two signatures (and f under a third)
    src = models.save_module(m, root / "shared", {"a": a, "b": a, "c": m.b.get_concrete_function()}, {})
    out = root / "shared_batched"
    report = convert(src, str(out), f'batch_options {{ {BATCH} experimental {{ signature_name: "a" }} }}' + F32)
    model, ops = _batch_ops(out)
    wrapper_a, wrapper_b = savedmodel.signature_wrapper(model, "a"), savedmodel.signature_wrapper(model, "b")
    under_a = savedmodel.reachable(model, wrapper_a) | {wrapper_a}
    under_b = savedmodel.reachable(model, wrapper_b) | {wrapper_b}
    assert ops and all(caller in under_a and caller not in under_b for caller, _ in ops)
    assert report.signatures["b"]["batched"] == report.signatures["c"]["batched"] == []
    assert report.signatures["a"]["batched"]
    x = np.ones((3, 4), np.float32)
    assert _call(_load(out), "b", x=x)["y"].tolist() == _call(_load(src), "b", x=x)["y"].tolist()


def test_batching_a_sparse_input_names_it(root):
    m = models.Sparse()
    src = models.save_module(m, root / "sparse", {"serving_default": m.serve.get_concrete_function()},
                             {"body": m.body})
    with pytest.raises(KilnError, match=r"cannot batch function '__inference_body_\d+': input 'x' is a SparseTensor; "
                                        r"BatchFunction batches dense tensors along dimension 0 only"):
        convert(src, str(root / "sparse_out"), f'batch_options {{ {BATCH} experimental {{ function_alias: "body" '
                f"}} }}" + F32)


# -- placement (item 7) ---------------------------------------------------------------------------

def test_a_selected_function_may_call_another_directly(root):
    m = models.DirectCall()
    src = models.save_module(m, root / "direct", {"serving_default": m.serve.get_concrete_function()},
                             {"inner": m.inner, "outer": m.outer})
    out = root / "direct_out"
    report = convert(src, str(out), 'tpu_functions { function_alias: "outer" } tpu_functions { function_alias: '
                     '"inner" } bfloat16_optimization: DISABLED')
    entries = {f.name.split("_")[-2]: f for f in report.served_functions}
    assert set(entries) == {"outer", "inner"}  # inner also runs on its own, from the CPU part
    assert entries["inner"].compiled_into == [entries["outer"].name]
    x = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    got, want = _call(_load(out), "serving_default", x=x), _call(_load(src), "serving_default", x=x)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-6)
    model = savedmodel.read(str(out))
    outer = next(n for n in report.functions if n.name.startswith("__inference_outer"))
    inner_calls = [n for n in model.functions[outer.name].node_def if n.op in savedmodel.CALL_OPS]
    assert inner_calls and all(n.attr["_XlaMustCompile"].b for n in inner_calls)  # not routed through padding


def test_a_shape_computed_outside_is_diagnosed_as_not_constant(root):
    m = models.ShapeFromInput()
    src = models.save_module(m, root / "shape", {"serving_default": m.serve.get_concrete_function()},
                             {"body": m.body})
    with pytest.raises(KilnError, match=r"input 1 of node 'Reshape' \(Reshape\) must be a compile-time constant "
                                        r"\(a shape, axis or size\).*Its value comes from input\(s\) 'n'") as info:
        convert(src, str(root / "shape_out"), 'tpu_functions { function_alias: "body" }')
    assert "cannot be compiled by XLA" not in str(info.value) and not (root / "shape_out").exists()


# -- quantization keeps the model whole (item 4) --------------------------------------------------

@pytest.fixture(scope="module")
def jit_two(root):
    return models.save_jit_two_signatures(root / "jit_two")


QUANT = ("external_feature_configs { quantization_options { quantization_method { preset_method: "
         "METHOD_DYNAMIC_RANGE_INT8 } op_set: XLA min_num_elements_for_weights: 256 } }")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_quantization_keeps_signatures_aliases_and_jit_marks(root, jit_two):
    out = root / "jit_two_int8"
    report = convert(jit_two, str(out), 'tpu_functions { function_alias: "body" } ' + QUANT + F32)
    model = savedmodel.read(str(out))
    assert sorted(model.signatures) == ["other", "serving_default"]
    # the alias names existing functions, among them the quantized twin: int8 dots, still marked for XLA
    named = [n for n, a in model.aliases.items() if a == "body"]
    assert named and all(n in model.functions for n in named)
    twins = [n for n in named if n.startswith("__kiln_int8_")]
    assert twins and all(model.functions[n].attr["_XlaMustCompile"].b for n in twins)
    assert any(node.op == "XlaDotV2" for n in twins for node in model.functions[n].node_def)
    # head had no alias: it survives as a function (its twin) and keeps its jit mark
    heads = [n for n in model.functions if n.startswith("__kiln_int8_") and "head" in n]
    assert heads and all(model.functions[n].attr["_XlaMustCompile"].b for n in heads)
    assert any(e.name in twins and e.served for e in report.functions)
    x = np.random.default_rng(3).standard_normal((5, 64)).astype(np.float32)
    before, after = _load(jit_two), _load(out)
    np.testing.assert_array_equal(_call(after, "other", x=x)["z"], _call(before, "other", x=x)["z"])  # not listed
    want, got = _call(before, "serving_default", x=x)["y"], _call(after, "serving_default", x=x)["y"]
    assert 0 < np.max(np.abs(got - want)) < 0.05 * np.max(np.abs(want))
    assert "kept in float32 (not in signature_keys): other" in report.text
    # the twins are selected by jit_compile_functions and by the original's concrete name too
    report2 = convert(jit_two, str(root / "jit_two_int8_jit"), "tpu_functions { jit_compile_functions: true } "
                      + QUANT + F32)
    assert {e.name for e in report2.served_functions} >= set(twins) | set(heads)


# -- batching cannot change results unchecked (item 3) -------------------------------------------

def _one(m, root, name, fn="body", key="serving_default", serve="serve"):
    return models.save_module(m, root / name, {key: getattr(m, serve).get_concrete_function()},
                              {fn: getattr(m, fn)})


def test_outputs_that_are_not_batch_major_are_refused_at_conversion(root):
    m = models.NotBatchMajor()
    src = models.save_module(m, root / "not_batch_major", {"serve_flat": m.serve_flat.get_concrete_function(),
                                                           "serve_total": m.serve_total.get_concrete_function()},
                             {"flat": m.flat, "total": m.total})
    for fn, shape in (("flat", r"\[12\]"), ("total", r"\[4\]")):
        with pytest.raises(KilnError, match=rf"cannot batch function '__inference_{fn}_\d+': output 0 \('identity'\) "
                                            rf"has shape {shape} for 3 input rows; BatchFunction splits its outputs "
                                            rf"by rows"):
            convert(src, str(root / "nbm_out"), f'batch_options {{ {BATCH} experimental {{ function_alias: "{fn}" '
                    "} } skip_accuracy_check: true" + F32)
    assert not (root / "nbm_out").exists()


def test_a_refused_output_is_named_by_its_key(root):
    """The function returns {"rows": ..., "total": ...}: the error names 'total', as its author wrote it."""
    src = _one(models.RowsAndTotal(), root, "rows_and_total")
    with pytest.raises(KilnError, match=r"cannot batch function '__inference_body_\d+': output 'total' \(tensor "
                                        r"'identity_1'\) has shape \[4\] for 3 input rows"):
        convert(src, str(root / "rt_out"), f'batch_options {{ {BATCH} experimental {{ function_alias: "body" }} }} '
                "skip_accuracy_check: true" + F32)


def test_a_dimension_0_known_only_at_run_time_is_measured(root):
    src = _one(models.FiltersRows(), root, "filters")
    with pytest.raises(evaluate.StageError, match=r"batching: signature 'serving_default' fails after the stage on "
                                                  r"inputs the model before it runs: .*0th dimension"):
        convert(src, str(root / "filters_out"), f'batch_options {{ {BATCH} experimental {{ function_alias: "body" '
                "} }" + F32)


def test_batching_a_function_that_mixes_rows_is_refused_with_the_measured_error(root):
    src = _one(models.MixesRows(), root, "mixes_batched", fn="center")
    with pytest.raises(evaluate.StageError, match=r"batching: concurrent requests merged and padded as BatchFunction "
                                                  r"does change output 'y' of signature 'serving_default' \(max "
                                                  r"relative error [\d.e-]+.*mixes rows"):
        convert(src, str(root / "mixes_batched_out"), f'batch_options {{ {BATCH} experimental {{ function_alias: '
                '"center" } }' + F32)
    assert not (root / "mixes_batched_out").exists()


def test_batching_a_function_whose_state_changes_results_is_refused(root, running_mean):
    with pytest.raises(evaluate.StageError, match=r"change output 'y' of signature 'serving_default'.*keeps state "
                                                  r"\(AssignVariableOp on variable"):
        convert(running_mean, str(root / "running_mean_batched"), 'tpu_functions { function_alias: "body" } '
                f"batch_options {{ {BATCH} }}" + F32)


def test_state_that_does_not_change_results_is_noted(root):
    m = models.Counting()
    src = models.save_module(m, root / "counting", {"serving_default": m.serve.get_concrete_function(),
                                                    "stats": m.stats.get_concrete_function()}, {"body": m.body})
    report = convert(src, str(root / "counting_out"), f'tpu_functions {{ function_alias: "body" }} batch_options '
                     f"{{ {BATCH} }}" + F32)
    stage = next(s for s in report.stages if s.name == "batch in the graph")
    assert any("keeps state (AssignAddVariableOp on variable" in c and "once per batch" in c for c in stage.changes)
    assert report.accuracy["batching"]["serving_default"]["outputs"]["y"]["max_rel"] < 1e-6


# -- sequence buckets in front of the batch op (item 5) --------------------------------------------

def test_mixed_length_concurrent_requests_with_buckets_succeed_and_equal_the_original(root):
    """Lengths 5, 11, 7, 20 and 16 arrive together: each is padded to its bucket (8, 16, or beyond: unbatched)
    before the batch op, so every BatchFunction queue holds one length and concatenation never fails."""
    from .test_serving import _concurrent

    src = _one(models.Sequence(), root, "seq", fn="tokens")
    out = root / "seq_batched"
    report = convert(src, str(out), 'tpu_functions { function_alias: "tokens" } bfloat16_optimization: DISABLED '
                     f"batch_options {{ {BATCH} }} "
                     'experimental { dimension_buckets { input: "x" dimension: 1 sizes: [8, 16] } }')
    (entry,) = [b for b in report.io_shapes if b["call_sites"]][:1]
    assert entry["dimension_buckets"] == {"x[1]": [8, 16]} and entry["wrapper"].startswith("__kiln_routed_")
    queues = {b["shared_name"] for b in report.batching}
    assert any(q.endswith("/8") for q in queues) and any(q.endswith("/16") for q in queues)
    before, after = _load(src).signatures["serving_default"], _load(out).signatures["serving_default"]
    rng = np.random.default_rng(0)
    feeds = [rng.standard_normal((1 + i % 2, (5, 11, 7, 20, 16)[i % 5], 4)).astype(np.float32) for i in range(15)]
    results, errors = _concurrent(lambda x: after(x=tf.constant(x))["y"].numpy(), feeds)
    assert errors == []
    for x, got in zip(feeds, results):
        np.testing.assert_allclose(got, before(x=tf.constant(x))["y"].numpy(), rtol=1e-6, atol=1e-6)


# -- warm-up records that cannot hurt the model (item 1) ------------------------------------------

def _replay(model_dir, loaded):
    """Run every warm-up record through ``loaded`` as TF Serving does at load; the signatures replayed."""
    from kiln.inference import warmup

    keys = []
    for log in warmup.read_records(model_dir / "assets.extra" / warmup.WARMUP_FILE):
        req = log.predict_log.request
        feeds = {}
        for name, proto in req.inputs.items():
            tensor = tf.make_tensor_proto(np.zeros(1))
            tensor.ParseFromString(proto.SerializeToString())
            feeds[name] = tf.constant(tf.make_ndarray(tensor))
        loaded.signatures[req.model_spec.signature_name](**feeds)  # raises if a record fails
        keys.append(req.model_spec.signature_name)
    return keys


def test_warmup_never_calls_a_state_changing_signature(root, running_mean):
    out = root / "running_mean_warm"
    report = convert(running_mean, str(out), 'tpu_functions { function_alias: "body" } skip_accuracy_check: true')
    skipped = {s["signature"]: s["why"] for s in report.warmup["skipped"]}
    assert set(skipped) == {"serving_default", "set_w"}
    assert "AssignVariableOp on variable" in skipped["set_w"] and "replays warm-up" in skipped["set_w"]
    assert "no records for 'set_w': it changes state" in report.text
    x = np.random.default_rng(4).standard_normal((3, 4)).astype(np.float32)
    fresh, replayed = _load(out), _load(out)
    assert set(_replay(out, replayed)) == {"state"}
    want, got = _call(fresh, "serving_default", x=x), _call(replayed, "serving_default", x=x)
    np.testing.assert_array_equal(got["y"], want["y"])
    np.testing.assert_array_equal(_call(replayed, "state")["w"], _call(fresh, "state")["w"])


def test_string_inputs_get_real_values_or_no_record(root, parses_strings):
    options = 'tpu_functions { function_alias: "body" } skip_accuracy_check: true'
    report = convert(parses_strings, str(root / "csv_warm_none"), options)
    assert report.warmup_records == 0
    (skip,) = report.warmup["skipped"]
    assert skip["signature"] == "serving_default" and "fails on the input model" in skip["why"]
    assert "it holds empty strings for ['text']: no real samples to take values from; give --evaluation_data" in \
        skip["why"]
    out = root / "csv_warm_real"
    samples = [{"text": models.csv_rows(1, seed)} for seed in range(4)]
    report = convert(parses_strings, str(out), options, evaluation_data=samples)
    assert report.warmup_records == 7 and report.warmup["real_inputs"] == ["serving_default"]  # buckets 1..64
    loaded = _load(out)
    assert _replay(out, loaded) == ["serving_default"] * 7
    text = models.csv_rows(2, 9)
    np.testing.assert_allclose(_call(loaded, "serving_default", text=text)["y"],
                               _call(_load(parses_strings), "serving_default", text=text)["y"], rtol=2e-2, atol=2e-2)


def test_a_record_that_fails_on_the_model_is_not_written(root):
    """Zeros are not valid for every model: a record the input model refuses is dropped, with the reason."""
    class NeedsPositive(tf.Module):
        @tf.function(input_signature=[models.SPEC])
        def serve(self, x):
            tf.debugging.assert_positive(x, message="inputs must be positive")
            return {"y": tf.math.log(x)}

    m = NeedsPositive()
    src = models.save_module(m, root / "positive", {"serving_default": m.serve.get_concrete_function()}, {})
    report = convert(src, str(root / "positive_out"), "skip_accuracy_check: true")
    assert report.warmup_records == 0
    assert "record fails on the input model: assertion failed: [inputs must be positive" in report.warmup["skipped"][0]["why"]


# -- latency before/after on the converting machine (item 8) --------------------------------------

def test_report_gives_the_latency_of_each_placed_function_before_and_after(root, parses_strings):
    report = convert(parses_strings, str(root / "csv_latency"), 'tpu_functions { function_alias: "body" } '
                     "skip_accuracy_check: true")
    (name,) = [f.name for f in report.served_functions]
    t = report.latency[name]
    assert t["rows"] == 16 and t["before_ms"] > 0 and t["after_ms"] > 0 and t["first_call_after_ms"] > 0
    assert f"{name} at 16 rows: {t['before_ms']:.3f} ms -> {t['after_ms']:.3f} ms" in report.text
    assert "Latency on this machine (" in report.text and report.machine in report.text
    assert set(report.timings) >= {"quantize", "bfloat16", "batch in the graph", "I/O shapes", "costs", "latency",
                                   "warm-up records"}
    page = report.to_html()
    assert "<h2>Latency on this machine</h2>" in page and f"<td>{t['after_ms']}</td>" in page
    assert "Accuracy check skipped" in page and "<h2>Conversion time (seconds)</h2>" in page


def test_slower_is_flagged_only_beyond_ten_percent():
    import kiln.inference
    from kiln.inference import latency

    assert kiln.inference.SlowerOnThisMachineWarning is latency.SlowerOnThisMachineWarning

    assert latency.slower({"f": {"before_ms": 1.0, "after_ms": 1.05}}) is None
    assert latency.slower({"f": {"before_ms": 1.0, "after_ms": 3.0}, "g": {"rows": 1, "error": "x"}}) == 3.0
    assert latency.slower({}) is None


# -- a whole model through every part-3 behaviour --------------------------------------------------

@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_keras_encoder_with_two_signatures_end_to_end(root):
    """Masked tf_keras encoder, jit-compiled, two signatures: real inputs, batching with sequence buckets in
    front of the batch op, concurrent mixed lengths equal to the original, warm-up that replays cleanly."""
    from .test_serving import _concurrent

    src = models.save_keras_encoder(root / "encoder")
    samples = models.token_samples(12)
    out = root / "encoder_out"
    report = convert(src, str(out), 'tpu_functions { function_alias: "encoder" } '
                     f"batch_options {{ {BATCH} }} experimental {{ "
                     'dimension_buckets { input: "ids" dimension: 1 sizes: [8, 16] } '
                     'dimension_buckets { input: "mask" dimension: 1 sizes: [8, 16] } }',
                     evaluation_data={"serving_default": samples, "encode": samples})
    assert not report.unmeasured and {"bfloat16", "batching", "io_shapes"} <= set(report.accuracy)
    assert all(m["source"] == "evaluation data" for stage in report.accuracy.values() for m in stage.values())
    before, after = _load(src), _load(out)
    assert set(_replay(out, _load(out))) == {"serving_default", "encode"}
    rng = np.random.default_rng(5)
    feeds = []
    for i in range(8):
        n = (5, 11, 7, 20)[i % 4]
        feeds.append({"ids": rng.integers(1, 100, (1 + i % 2, n)).astype(np.int32),
                      "mask": np.ones((1 + i % 2, n), np.int32)})
    for key, name in (("serving_default", "logits"), ("encode", "hidden")):
        results, errors = _concurrent(lambda f, key=key: after.signatures[key](**{k: tf.constant(v)
                                                                                  for k, v in f.items()}), feeds)
        assert errors == []
        for f, got in zip(feeds, results):
            want = before.signatures[key](**{k: tf.constant(v) for k, v in f.items()})[name].numpy()
            np.testing.assert_allclose(got[name].numpy(), want, atol=0.05 * np.max(np.abs(want)))  # bfloat16


def test_a_very_slow_function_is_timed_by_its_first_call_only():
    """A first call over latency.SLOW seconds (int8 convolutions on XLA's CPU backend took 64 s) is the
    measurement, so timing never costs minutes; the report says so."""
    from kiln.inference.report import ConversionReport

    report = ConversionReport("in", "out", machine="cpu", latency={"f": {
        "rows": 16, "before_ms": 80.0, "after_ms": 64000.0, "first_call_before_ms": 80.0,
        "first_call_after_ms": 64000.0, "first_call_only": True}})
    assert "f at 16 rows: first calls only (too slow to repeat): 80 ms -> 64000 ms with compilation (800.00x slower)" \
        in report.text


def test_a_state_update_computed_in_another_function_stays_float32_too(root):
    class NestedUpdate(tf.Module):
        def __init__(self):
            self.w = tf.Variable(tf.reshape(tf.range(12, dtype=tf.float32), [4, 3]) / 10.0)
            self.mean = tf.Variable(tf.zeros([3]))

        @tf.function
        def moving(self, y):
            return 0.9 * self.mean + 0.1 * tf.reduce_mean(y, axis=0)

        @tf.function
        def body(self, x):
            y = tf.matmul(x, self.w)
            self.mean.assign(self.moving(y))
            return y

        @tf.function(input_signature=[models.SPEC])
        def serve(self, x):
            return {"y": self.body(x)}

        @tf.function(input_signature=[])
        def state(self):
            return {"mean": self.mean.read_value()}

    m = NestedUpdate()
    src = models.save_module(m, root / "nested_update", {"serving_default": m.serve.get_concrete_function(),
                                                         "state": m.state.get_concrete_function()}, {"body": m.body})
    out = root / "nested_update_bf16"
    convert(src, str(out), 'tpu_functions { function_alias: "body" } io_shape_optimization: DISABLED '
            "skip_accuracy_check: true")
    x = np.random.default_rng(6).standard_normal((5, 4)).astype(np.float32)
    before, after = _load(src), _load(out)
    for _ in range(10):
        _call(before, "serving_default", x=x), _call(after, "serving_default", x=x)
    np.testing.assert_allclose(_call(after, "state")["mean"], _call(before, "state")["mean"], rtol=1e-6)
