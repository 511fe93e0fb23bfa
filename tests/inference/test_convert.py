"""kiln.inference.convert on models built in code: selection, placement, batching, output, report."""

import json
import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from kiln.errors import KilnError  # noqa: E402
from kiln.inference import convert as _convert  # noqa: E402
from kiln.inference import savedmodel, warmup  # noqa: E402

from . import models  # noqa: E402

# Part 1's subject is float32 placement and batching: these tests turn the two default-on
# optimizations of part 2 off (tests/inference/test_part2.py covers them).
PART1 = "\nbfloat16_optimization: DISABLED\nio_shape_optimization: DISABLED\n"


def convert(src, out, options=""):
    if isinstance(options, str):
        return _convert(src, out, options + PART1)
    options.bfloat16_optimization = options.io_shape_optimization = 2  # State DISABLED
    return _convert(src, out, options)


BATCH_248 = """
batch_options {
  num_batch_threads: 2
  max_batch_size: 8
  batch_timeout_micros: 1000
  allowed_batch_sizes: 2
  allowed_batch_sizes: 4
  allowed_batch_sizes: 8
}
"""


@pytest.fixture(scope="module")
def two(root):
    return models.save_two(root / "two")


@pytest.fixture(scope="module")
def toy_converted(root, toy):
    out = root / "toy_out"
    report = convert(toy, str(out), 'tpu_functions { function_alias: "tpu_func" }' + BATCH_248)
    return out, report


def _same_results(before, after, key, x):
    a = tf.saved_model.load(before).signatures[key](x=tf.constant(x))
    b = tf.saved_model.load(str(after)).signatures[key](x=tf.constant(x))
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_allclose(b[name].numpy(), a[name].numpy(), rtol=1e-5, atol=1e-6)


def _graph_nodes(model_dir):
    model = savedmodel.read(model_dir)
    return model, [(f.signature.name, n) for f in model.meta.graph_def.library.function for n in f.node_def]


# -- the original's documented examples ------------------------------------------------------

def test_toy_model_function_alias_with_batching(toy, toy_converted):
    out, report = toy_converted
    rng = np.random.default_rng(0)
    for rows in (1, 3, 7, 8):
        _same_results(toy, out, "serving_default", rng.standard_normal((rows, 4)).astype(np.float32))
    model, nodes = _graph_nodes(str(out))
    served = savedmodel.signature_function(model, "serving_default")
    batch_ops = [n for f, n in nodes if n.op == "BatchFunction" and f == served]
    assert len(batch_ops) == 1
    attrs = batch_ops[0].attr
    assert list(attrs["allowed_batch_sizes"].list.i) == [2, 4, 8]
    assert attrs["max_batch_size"].i == 8 and attrs["num_batch_threads"].i == 2
    assert attrs["batch_timeout_micros"].i == 1000 and attrs["enable_large_batch_splitting"].b
    assert attrs["shared_name"].s.startswith(b"kiln/")
    # the BatchFunction calls a wrapper whose call site is marked for XLA (a jit f alone is not compiled)
    wrapper = model.functions[attrs["f"].func.name]
    (call,) = wrapper.node_def
    assert call.attr["_XlaMustCompile"].b and "tpu_func" in call.attr["f"].func.name
    # every trace of the alias is marked, call sites included
    for name, alias in model.aliases.items():
        if alias == "tpu_func" and name in model.functions:
            assert model.functions[name].attr["_XlaMustCompile"].b
    # function_aliases are re-emitted so conversions chain
    assert set(model.aliases.values()) == {"tpu_func"}


def test_report_layout_and_files(toy_converted):
    out, report = toy_converted
    lines = report.text.splitlines()
    assert lines[0] == "-------- Conversion Report --------"
    assert lines[1].startswith("XLA cost of the model: ") and lines[2].startswith("CPU cost of the model: ")
    assert lines[4:8] == ["Cost breakdown", "=" * 32, "%         Cost    Name", "-" * 32]
    assert lines[8].endswith("[CPU cost]") and lines[10] == "-" * 32 and lines[12] == "Optimizations"
    (entry,) = report.functions if len(report.served_functions) == len(report.functions) else report.served_functions
    # relu(x @ w) at the smallest bucket (2 rows): dot 2*2*3*4 = 48 flops, relu 6
    assert entry.cost == 48 + 6 and entry.shapes == [[2, 4]]
    assert report.cpu_cost == 3  # the "+ 1.0" on a 1x3 output, TensorFlow's registered flops
    assert lines[1] == f"XLA cost of the model: {100 * 54 / 57:5.2f}% (54/57)"
    assert lines[2] == f"CPU cost of the model: {100 * 3 / 57:5.2f}% (3/57)"
    assert f"{100 * 54 / 57:<10.2f}{54:<8}{entry.name}" in lines
    d = report.to_dict()
    assert d["accelerator_cost"] == 54 and d["cpu_cost"] == 3 and d["cost_unit"] == "flops"
    kiln_dir = out / "assets.extra" / "kiln"
    assert json.loads((kiln_dir / "report.json").read_text()) == json.loads(report.to_json())
    assert (kiln_dir / "report.txt").read_text().strip() == report.text
    assert "tpu_func" in (kiln_dir / "converter_options.pbtxt").read_text()
    page = (kiln_dir / "report.html").read_text()
    assert "<svg" in page and "http" not in page.replace("http://www.w3.org/2000/svg", "")
    assert "Conversion Report" in page and "shared_name" in page
    sig = d["signatures"]["serving_default"]
    assert sig["placement"].startswith("XLA: ") and sig["warmup_batch_sizes"] == [2, 4, 8]


def test_warmup_records_one_per_signature_and_bucket(toy_converted):
    out, report = toy_converted
    logs = warmup.read_records(out / "assets.extra" / warmup.WARMUP_FILE)
    assert report.warmup_records == len(logs) == 3
    shapes = []
    for log in logs:
        req = log.predict_log.request
        assert req.model_spec.signature_name == "serving_default"
        proto = tf.make_tensor_proto(np.zeros(1))
        proto.ParseFromString(req.inputs["x"].SerializeToString())
        shapes.append(tuple(tf.make_ndarray(proto).shape))
    assert shapes == [(2, 4), (4, 4), (8, 4)]
    # field numbers are TF Serving's: predict_log = 6, request = 1, model_spec = 1, signature_name = 3
    raw = logs[0].SerializeToString()
    assert raw[0] == (6 << 3 | 2)


def test_two_accelerator_functions_and_signature_results(root, two):
    out = root / "two_out"
    report = convert(two, str(out), 'tpu_functions { function_alias: "func_a" }\n'
                                    'accelerator_functions { function_alias: "func_b" }')
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    _same_results(two, out, "serve_a", x)
    _same_results(two, out, "serve_b", x)
    names = [f.name for f in report.served_functions]
    assert len(names) == 2 and any("func_a" in n for n in names) and any("func_b" in n for n in names)
    assert report.cpu_cost > 0  # * 2.0, square, - 1.0 stay on the CPU
    d = report.to_dict()["signatures"]
    assert "func_a" in d["serve_a"]["placement"] and "func_b" in d["serve_b"]["placement"]


def test_concrete_function_name_and_signature_name(root, toy):
    model = savedmodel.read(toy)
    serve = savedmodel.signature_function(model, "serving_default")
    assert serve.startswith("__inference_serve_")  # the original's __inference_serve_24 style
    out = root / "toy_concrete"
    report = convert(toy, str(out), f'tpu_functions {{ concrete_function_name: "{serve}" }}')
    assert [f.name for f in report.functions] == [serve]
    _same_results(toy, out, "serving_default", np.ones((2, 4), np.float32))
    out2 = root / "toy_signature"
    report2 = convert(toy, str(out2), 'tpu_functions { signature_name: "serving_default" }')
    assert [f.name for f in report2.functions] == [serve]


def test_jit_compile_functions_selects_functions_exported_with_jit(root):
    class Jit(tf.Module):
        @tf.function(jit_compile=True)
        def fast(self, x):
            return x * 2.0

        @tf.function(input_signature=[models.SPEC])
        def serve(self, x):
            return {"y": self.fast(x) + 1.0}

    m = Jit()
    path = models.save_module(m, root / "jit", {"serving_default": m.serve.get_concrete_function()}, {})
    report = convert(path, str(root / "jit_out"), "tpu_functions { jit_compile_functions: true }")
    assert report.functions and all("fast" in f.name for f in report.functions)
    with pytest.raises(KilnError, match="no function in the model was exported with jit_compile=True"):
        convert(models.save_toy(root / "toy_nojit"), str(root / "nojit_out"),
                "tpu_functions { jit_compile_functions: true }")


def test_batching_a_signature_without_accelerator(root, toy):
    out = root / "toy_sigbatch"
    convert(toy, str(out), BATCH_248.replace("}\n", '  experimental { signature_name: "serving_default" }\n}\n', 1)
            if False else """batch_options { max_batch_size: 4 batch_timeout_micros: 100
                experimental { signature_name: "serving_default" } }""")
    _, nodes = _graph_nodes(str(out))
    (op,) = [n for _, n in nodes if n.op == "BatchFunction"]
    assert op.attr["max_batch_size"].i == 4 and op.attr["max_enqueued_batches"].i == 10
    _same_results(toy, out, "serving_default", np.ones((3, 4), np.float32))


def test_existing_batch_ops_are_updated_in_place(root, toy_converted):
    first, _ = toy_converted
    out = root / "toy_rebatched"
    report = convert(str(first), str(out), "batch_options { max_batch_size: 16 allowed_batch_sizes: 16 "
                                           "disable_large_batch_splitting: true num_batch_threads: 1 }")
    _, nodes = _graph_nodes(str(out))
    ops = [n for _, n in nodes if n.op == "BatchFunction"]
    assert len(ops) == 2  # one per traced serving function, no new ones
    for op in ops:
        assert list(op.attr["allowed_batch_sizes"].list.i) == [16] and op.attr["max_batch_size"].i == 16
        assert not op.attr["enable_large_batch_splitting"].b and op.attr["num_batch_threads"].i == 1
    assert all(b["updated"] for b in report.batching) and len(report.batching) == 2
    assert len({b["shared_name"] for b in report.batching}) == 2


def test_each_batched_function_gets_its_own_shared_name(root, two):
    out = root / "two_batched"
    report = convert(two, str(out), 'tpu_functions { function_alias: "func_a" }\n'
                                    'tpu_functions { function_alias: "func_b" }' + BATCH_248)
    names = [b["shared_name"] for b in report.batching]
    assert len(names) == 4 and len(set(names)) == 4  # two traces of each function are called
    assert report.warmup_records == 6  # 2 signatures x 3 buckets


# -- errors ----------------------------------------------------------------------------------

def test_tf1_savedmodel_is_refused(root):
    path = models.save_tf1(root / "tf1")
    with pytest.raises(KilnError, match="kiln infer-convert needs a TensorFlow 2 SavedModel; .* was written by "
                                        "the TF1 SavedModel builder.*Migrate it to TF2"):
        convert(path, str(root / "tf1_out"), "")


def test_missing_model_and_tags(root):
    with pytest.raises(KilnError, match="is not a directory"):
        convert(str(root / "nowhere"), str(root / "x"), "")
    (root / "empty").mkdir()
    with pytest.raises(KilnError, match="has no saved_model.pb"):
        convert(str(root / "empty"), str(root / "x"), "")


def test_missing_serve_tag_is_named(root, toy):
    import shutil

    from tensorflow.core.protobuf import saved_model_pb2

    path = root / "toy_tags"
    shutil.copytree(toy, path)
    sm = saved_model_pb2.SavedModel()
    sm.ParseFromString((path / "saved_model.pb").read_bytes())
    sm.meta_graphs[0].meta_info_def.tags[:] = ["train"]
    (path / "saved_model.pb").write_bytes(sm.SerializeToString())
    with pytest.raises(KilnError, match=r"has no MetaGraph tagged 'serve'; its tag sets are \[\['train'\]\]"):
        convert(str(path), str(root / "tags_out"), "")


@pytest.mark.parametrize("text, message", [
    ('tpu_functions { function_alias: "nope" }', r"function_alias 'nope' does not exist; the model's function "
                                                 r"aliases are \['tpu_func'\]"),
    ('tpu_functions { concrete_function_name: "nope" }', r"concrete_function_name 'nope' does not exist; the "
                                                         r"model's concrete functions are \[.*__inference_serve_"),
    ('tpu_functions { signature_name: "nope" }', r"signature_name 'nope' does not exist; the model's signatures "
                                                 r"are \['serving_default'\]"),
    ('tpu_functions { function_alias: "tpu_func" } tpu_functions { signature_name: "serving_default" } '
     'tpu_functions { concrete_function_name: "SERVE" }', r"is selected twice: by tpu_functions\[1\] "
                                                          r"signature_name: 'serving_default' and by tpu_functions\[2\]"),
    ("batch_options { max_batch_size: 4 }", "no accelerator functions are selected"),
    ('batch_options { max_batch_size: 4 experimental { function_alias: "tpu_func" } } '
     'batch_options { max_batch_size: 8 experimental { function_alias: "tpu_func" } }',
     r"function '__inference_tpu_func_\d+' is batched twice: by batch_options\[0\] and by batch_options\[1\]"),
])
def test_selection_errors(root, toy, text, message):
    serve = savedmodel.signature_function(savedmodel.read(toy), "serving_default")
    out = root / "err_out"
    with pytest.raises(KilnError, match=message):
        convert(toy, str(out), text.replace("SERVE", serve))
    assert not out.exists() and not [p for p in root.iterdir() if "kiln-tmp" in p.name]


def test_nested_accelerator_functions_error(root):
    path = models.save_nested(root / "nested")
    with pytest.raises(KilnError) as info:
        convert(path, str(root / "nested_out"), 'tpu_functions { function_alias: "outer" }\n'
                                                'tpu_functions { function_alias: "inner" }')
    text = str(info.value)
    assert text.startswith('Unable to place both "__inference_outer_') and "on the accelerator because" in text
    assert 'indirectly calls "__inference_inner_' in text
    assert text.endswith("This behavior is unsupported because it can cause invalid graphs to be generated.")


def test_xla_uncompilable_op_is_named_at_conversion(root):
    path = models.save_strings(root / "strings")
    out = root / "strings_out"
    with pytest.raises(KilnError, match=r"accelerator function '__inference_parse_\d+': op\(s\) AsString, "
                                        r"StringToNumber cannot be compiled by XLA.*TensorFlow said: .*XLA_\w+_JIT"):
        convert(path, str(out), 'tpu_functions { function_alias: "parse" }')
    assert not out.exists()
    with pytest.raises(KilnError, match=r"accelerator function '__inference_takes_strings_\d+': input 's' is a "
                                        r"string tensor, which XLA cannot take"):
        convert(path, str(out), 'tpu_functions { function_alias: "takes_strings" }')
    assert not out.exists()


def test_unbatchable_inputs(root):
    path = models.save_unbatchable(root / "unbatchable")
    with pytest.raises(KilnError, match=r"cannot batch function '__inference_scalar_\d+': Batching input tensors "
                                        r"must have at least one dimension.\nBelow are the input tensors: \n - k "
                                        r"has shape \[\]"):
        convert(path, str(root / "ub1"), 'batch_options { max_batch_size: 4 experimental { function_alias: '
                                         '"scalar" } }')
    with pytest.raises(KilnError, match=r"cannot batch function '__inference_fixed_\d+': input 'x' has shape "
                                        r"\[3, 4\] with a fixed 0th dimension"):
        convert(path, str(root / "ub2"), 'batch_options { max_batch_size: 4 experimental { function_alias: '
                                         '"fixed" } }')


def test_output_dir_must_be_new_or_empty(root, toy):
    busy = root / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("x")
    with pytest.raises(KilnError, match="already exists and is not an empty directory"):
        convert(toy, str(busy), "")
    assert os.listdir(busy) == ["keep.txt"]
    empty = root / "empty_out"
    empty.mkdir()
    convert(toy, str(empty), "")
    assert (empty / "saved_model.pb").is_file()


def test_model_without_signatures_is_refused(root):
    class NoSignatures(tf.Module):
        @tf.function(input_signature=[models.SPEC])
        def f(self, x):
            return x + 1.0

    path = root / "nosig"
    tf.saved_model.save(NoSignatures(), str(path), signatures={})
    with pytest.raises(KilnError, match="has no serving signatures"):
        convert(str(path), str(root / "nosig_out"), "")


def test_batching_inside_an_accelerator_function_is_refused(root, toy):
    serve = savedmodel.signature_function(savedmodel.read(toy), "serving_default")
    with pytest.raises(KilnError, match=r"cannot batch '__inference_tpu_func_\d+' inside '__inference_serve_\d+', "
                                        r"which runs on the accelerator .*BatchFunction runs on the CPU"):
        convert(toy, str(root / "nested_batch"), f'tpu_functions {{ concrete_function_name: "{serve}" }} '
                                                 'batch_options { max_batch_size: 4 experimental { '
                                                 'function_alias: "tpu_func" } }')


def test_options_as_a_message(root, toy):
    from kiln.inference import ConverterOptions, parse_options

    options = ConverterOptions()
    options.tpu_functions.add(function_alias="tpu_func")
    options.batch_options.add(max_batch_size=4, allowed_batch_sizes=[2, 4], batch_timeout_micros=10)
    assert options == parse_options('accelerator_functions { function_alias: "tpu_func" } '
                                    "batch_options { max_batch_size: 4 allowed_batch_sizes: [2, 4] "
                                    "batch_timeout_micros: 10 }")
    out = root / "toy_message"
    report = convert(toy, str(out), options)
    assert report.to_dict()["signatures"]["serving_default"]["warmup_batch_sizes"] == [2, 4]
    _same_results(toy, out, "serving_default", np.ones((4, 4), np.float32))
