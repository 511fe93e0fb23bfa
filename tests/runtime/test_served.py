"""`kiln.runtime.open`: one model on every backend, by signature, checked against TensorFlow."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import kiln.runtime as runtime
from kiln.errors import KilnError, ModelError, UnsupportedError
from kiln.runtime.served import SignatureNotFound

tf = pytest.importorskip("tensorflow")


class Two(tf.Module):
    """Two signatures; one indexes a 10-row table with its integer input (through a reshape)."""

    def __init__(self):
        self.w = tf.Variable(tf.reshape(tf.range(12, dtype=tf.float32), [4, 3]) / 10.0)
        self.table = tf.Variable(tf.reshape(tf.range(20, dtype=tf.float32), [10, 2]))

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def dense(self, x):
        return {"y": tf.tanh(tf.matmul(x, self.w))}

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int32, name="ids")])
    def lookup(self, ids):
        return {"rows": tf.gather(self.table, tf.reshape(ids, [-1]))}


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    import kiln

    folder = tmp_path_factory.mktemp("served")
    module = Two()
    tf.saved_model.save(module, str(folder / "sm"), signatures={
        "serving_default": module.dense.get_concrete_function(), "lookup": module.lookup.get_concrete_function()})
    data = kiln.TFLiteConverter.from_saved_model(str(folder / "sm"), signature_keys=["serving_default", "lookup"]).convert()
    (folder / "version").mkdir()
    (folder / "version" / "model.tflite").write_bytes(data)
    loaded = tf.saved_model.load(str(folder / "sm"))
    return {"dir": folder / "version", "file": folder / "version" / "model.tflite", "bytes": data,
            "saved_model": folder / "sm", "tf": loaded.signatures}


@pytest.mark.parametrize("backend", ["kiln", "litert", "xla", "tf"])
def test_every_backend_runs_the_signatures_as_tensorflow_does(two, backend):
    if backend == "xla":
        pytest.importorskip("jax")
    model = runtime.open(two["saved_model"] if backend == "tf" else two["dir"], backend)
    assert model.backend == backend and model.kind == ("savedmodel" if backend == "tf" else "tflite")
    assert sorted(model.signatures) == ["lookup", "serving_default"]
    dense = model.signature()
    assert dense.key == "serving_default" and dense.batched and dense.fixed_batch is None
    assert dense.inputs["x"].dtype == np.float32 and dense.inputs["x"].shape == (-1, 4)
    runner = model.new_runner()
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    want = two["tf"]["serving_default"](x=tf.constant(x))["y"].numpy()
    for rows in (3, 1, 3):  # a batch size seen before, and one that is not
        got = runner.run("serving_default", {"x": x[:rows]})
        np.testing.assert_allclose(got["y"], want[:rows], rtol=1e-5, atol=1e-6)
    ids = np.array([[1, 9, 0], [2, 2, 3]], np.int32)
    got = runner("lookup", {"ids": ids})["rows"]
    np.testing.assert_array_equal(got, two["tf"]["lookup"](ids=tf.constant(ids))["rows"].numpy())


def test_outputs_are_the_callers_not_the_interpreters(two):
    runner = runtime.open(two["bytes"]).new_runner()
    first = runner.run("serving_default", {"x": np.ones((2, 4), np.float32)})["y"]
    kept = first.copy()
    runner.run("serving_default", {"x": np.full((2, 4), -3.0, np.float32)})
    np.testing.assert_array_equal(first, kept)


def test_index_ranges_come_from_the_table_the_model_indexes(two):
    model = runtime.open(two["file"])
    spec = model.signatures["lookup"].inputs["ids"]
    assert spec.index_range == (0, 10)
    assert spec.out_of_range(np.array([[0, 9, 3]])) is None
    assert spec.out_of_range(np.array([[0, 10, -1]])) == 10
    assert model.signatures["serving_default"].inputs["x"].index_range is None


def test_signatures_are_picked_by_key_with_errors_that_list_them(two):
    model = runtime.open(two["file"])
    assert model.signature("lookup").key == "lookup"
    with pytest.raises(SignatureNotFound, match=r"'nope': the model has no such signature .*'lookup'"):
        model.signature("nope")
    with pytest.raises(SignatureNotFound):
        model.new_runner().run("nope", {})
    with pytest.raises(KilnError, match=r"missing \['x'\], unknown \['z'\]"):
        model.new_runner().run("serving_default", {"z": np.zeros((1, 4), np.float32)})


def test_each_thread_gets_its_own_runner_and_its_own_answers(two):
    model = runtime.open(two["file"])
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((2, 4)).astype(np.float32) for _ in range(4)]
    want = [two["tf"]["serving_default"](x=tf.constant(x))["y"].numpy() for x in xs]
    errors = []

    def work(i):
        runner = model.new_runner()
        for _ in range(50):
            got = runner.run("serving_default", {"x": xs[i]})["y"]
            if not np.allclose(got, want[i], rtol=1e-5, atol=1e-6):
                errors.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_a_model_without_signatures_is_served_by_tensor_names(tmp_path):
    import kiln

    module = tf.Module()
    module.f = tf.function(lambda v: {"out": v * 2.0}, input_signature=[tf.TensorSpec([None, 2], tf.float32)])
    data = kiln.TFLiteConverter.from_concrete_functions([module.f.get_concrete_function()], module).convert()
    ir = kiln.read_model(data)
    ir.signatures.clear()
    model = runtime.open(kiln.write_model(ir))
    (signature,) = model.signatures.values()
    assert signature.from_subgraph and signature.key == "serving_default"
    name = next(iter(signature.inputs))
    out = model.new_runner().run(signature.key, {name: np.ones((3, 2), np.float32)})
    np.testing.assert_array_equal(next(iter(out.values())), np.full((3, 2), 2.0))


def test_what_cannot_be_opened_says_why(two, tmp_path):
    with pytest.raises(UnsupportedError, match="unknown backend 'gpu'"):
        runtime.open(two["file"], "gpu")
    with pytest.raises(UnsupportedError, match="backend 'tf' runs SavedModels"):
        runtime.open(two["file"], "tf")
    with pytest.raises(UnsupportedError, match="a SavedModel runs on backend 'tf'"):
        runtime.open(two["saved_model"], "kiln")
    with pytest.raises(ModelError, match="no such file"):
        runtime.open(tmp_path / "missing.tflite")
    with pytest.raises(ModelError, match="neither a SavedModel"):
        runtime.open(tmp_path)
    with pytest.raises(ModelError):
        runtime.open(b"not a model")


def test_the_runtime_opens_models_without_importing_tensorflow(two):
    import subprocess
    import sys

    code = (f"import sys, kiln.runtime as r; m = r.open({str(two['file'])!r}); "
            "assert 'tensorflow' not in sys.modules and 'jax' not in sys.modules, 'imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_xla_backend_compiles_the_batch_buckets_once_when_it_loads(two):
    """open(batch_sizes=...) (kiln serve's allowed_batch_sizes): the xla backend's interpreter
    compiles every bucket when it first allocates, and later batches pad up to them."""
    pytest.importorskip("jax")
    from jax import monitoring
    from jax._src.dispatch import BACKEND_COMPILE_EVENT

    seen = []
    monitoring.register_event_duration_secs_listener(
        lambda event, secs, **kw: seen.append(event) if event == BACKEND_COMPILE_EVENT else None)
    runner = runtime.open(two["dir"], "xla", batch_sizes=[4, 8]).new_runner()
    x = np.random.default_rng(1).standard_normal((8, 4)).astype(np.float32)
    want = two["tf"]["serving_default"](x=tf.constant(x))["y"].numpy()
    np.testing.assert_allclose(runner.run("serving_default", {"x": x[:3]})["y"], want[:3], rtol=1e-5, atol=1e-6)
    at_load = len(seen)
    assert at_load >= 2  # both buckets
    for rows in (1, 4, 6, 8, 2):
        got = runner.run("serving_default", {"x": x[:rows]})["y"]
        np.testing.assert_allclose(got, want[:rows], rtol=1e-5, atol=1e-6)
    assert len(seen) == at_load, "every batch ran on a bucket compiled at load"
