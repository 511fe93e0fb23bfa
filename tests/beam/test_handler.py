"""KilnModelHandler in real Beam pipelines (DirectRunner), checked against TensorFlow's outputs."""

from __future__ import annotations

import numpy as np
import pytest

beam = pytest.importorskip("apache_beam")
pytest.importorskip("tensorflow")

from apache_beam.metrics.metric import MetricsFilter  # noqa: E402
from apache_beam.ml.inference.base import KeyedModelHandler, PredictionResult, RunInference  # noqa: E402
from apache_beam.testing.util import assert_that, equal_to  # noqa: E402

from kiln.beam import KilnModelHandler  # noqa: E402
from kiln.errors import InterpreterError, KilnError, ModelError, OpError, UnsupportedError  # noqa: E402


def _rows(n: int, *shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, *shape)).astype(np.float32)


def _expect_keyed(expected: dict[int, dict[str, np.ndarray]], rtol=1e-5, atol=1e-6):
    """A Beam matcher: (key, PredictionResult) pairs whose inference equals ``expected[key]``."""

    def check(results):
        got = dict(results)
        assert sorted(got) == sorted(expected), f"keys {sorted(got)} != {sorted(expected)}"
        for key, result in got.items():
            assert isinstance(result, PredictionResult)
            want = expected[key]
            assert sorted(result.inference) == sorted(want), (key, sorted(result.inference))
            for name, value in want.items():
                np.testing.assert_allclose(result.inference[name], value, rtol=rtol, atol=atol,
                                           err_msg=f"key {key}, output {name}")

    return check


def _run_keyed(handler, examples, expected, options=None, **matcher):
    """Runs (index, example) pairs through RunInference; returns the pipeline result (for metrics)."""
    pipeline = beam.Pipeline(options=options)
    keyed = pipeline | beam.Create(list(enumerate(examples)))
    assert_that(keyed | RunInference(KeyedModelHandler(handler)), _expect_keyed(expected, **matcher))
    result = pipeline.run()
    result.wait_until_finish()
    return result


def _distribution(result, name: str):
    found = result.metrics().query(MetricsFilter().with_name(name))["distributions"]
    assert found, f"no {name} metric"
    return found[0].committed


class CountingHandler(KilnModelHandler):
    """Counts model loads (the DirectRunner runs the DoFns in this process)."""

    loads = 0

    def load_model(self):
        type(self).loads += 1
        return super().load_model()


def test_single_input_rows_batched_equal_tensorflow(models):
    m = models["dense"]
    rows = _rows(40, 4)
    ref = m.reference(rows)
    expected = {i: {"output_0": ref[0][i]} for i in range(len(rows))}
    CountingHandler.loads = 0
    result = _run_keyed(CountingHandler(m.path), list(rows), expected)
    sizes = _distribution(result, "inference_request_batch_size")
    assert sizes.sum == 40 and sizes.max > 1, f"rows were not batched: {sizes}"
    assert CountingHandler.loads == 1, "the model is loaded once per worker, not per batch"


def test_model_shared_across_processes(models):
    """large_model=True: Beam holds the model in one process and proxies predict calls to it."""
    m = models["dense"]
    rows = _rows(10, 4, seed=11)
    ref = m.reference(rows)
    handler = KilnModelHandler(m.path, large_model=True)
    assert handler.share_model_across_processes()
    _run_keyed(handler, list(rows), {i: {"output_0": ref[0][i]} for i in range(10)})


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["multi_processing", "multi_threading"])
def test_parallel_workers(models, mode):
    """Processes: the handler is pickled to separate SDK workers, as on a distributed runner.
    Threads: two workers share one loaded model (its lock keeps their batches apart)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    m = models["dense"]
    rows = _rows(30, 4, seed=12)
    ref = m.reference(rows)
    options = PipelineOptions(direct_num_workers=2, direct_running_mode=mode)
    _run_keyed(KilnModelHandler(m.path), list(rows), {i: {"output_0": ref[0][i]} for i in range(30)}, options)


def test_multi_input_dicts_equal_tensorflow(models):
    m = models["multi"]
    a, b = _rows(12, 4, seed=1), _rows(12, 2, seed=2)
    ref = m.reference({"a": a, "b": b})
    examples = [{"a": a[i], "b": b[i]} for i in range(12)]
    expected = {i: {"output_0": ref[0][i], "output_1": ref[1][i]} for i in range(12)}
    _run_keyed(KilnModelHandler(m.path), examples, expected)


def test_unkeyed_examples_come_back_with_their_results(models):
    m = models["dense"]
    rows = _rows(6, 4, seed=3)
    ref = m.reference(rows)[0]

    def check(results):
        assert len(results) == 6
        for result in results:
            i = next(i for i in range(6) if np.array_equal(rows[i], result.example))
            np.testing.assert_allclose(result.inference["output_0"], ref[i], rtol=1e-5, atol=1e-6)
            assert result.model_id == m.path

    pipeline = beam.Pipeline()
    assert_that(pipeline | beam.Create(list(rows)) | RunInference(KilnModelHandler(m.path)), check)
    result = pipeline.run()
    result.wait_until_finish()
    # get_num_bytes feeds Beam's byte-size metric: the rows' float32 bytes
    assert _distribution(result, "inference_request_batch_byte_size").sum == rows.nbytes


def test_static_batch_one_runs_one_row_per_call(models):
    m = models["batch1"]
    handler = KilnModelHandler(m.path)
    assert handler.batch_elements_kwargs() == {"min_batch_size": 1, "max_batch_size": 1}
    rows = _rows(5, 4, seed=4)
    expected = {i: {"output_0": m.reference(rows[i:i + 1])[0][0]} for i in range(5)}
    result = _run_keyed(handler, list(rows), expected)
    assert _distribution(result, "inference_request_batch_size").max == 1


def test_static_batch_one_accepts_larger_batches_by_chunking(models):
    m = models["batch1"]
    handler = KilnModelHandler(m.path, max_batch_size=4)
    assert handler.batch_elements_kwargs() == {"min_batch_size": 1, "max_batch_size": 4}
    rows = _rows(3, 4, seed=5)
    model = handler.load_model()
    results = handler.run_inference(list(rows), model)
    for i, r in enumerate(results):
        np.testing.assert_allclose(r.inference["output_0"], m.reference(rows[i:i + 1])[0][0],
                                   rtol=1e-5, atol=1e-6)
    assert model.invocations == 3


def test_rows_of_different_lengths_run_in_groups(models):
    m = models["sequence"]
    lengths = [3, 5, 3, 7, 5]
    seqs = [_rows(n, 3, seed=10 + i) for i, n in enumerate(lengths)]
    expected = {i: {"output_0": m.reference(s[None])[0][0]} for i, s in enumerate(seqs)}
    handler = KilnModelHandler(m.path)
    model = handler.load_model()
    results = handler.run_inference(seqs, model)
    for i, r in enumerate(results):
        np.testing.assert_allclose(r.inference["output_0"], expected[i]["output_0"], rtol=1e-5, atol=1e-6)
    assert model.invocations == 3  # one call per distinct length
    _run_keyed(handler, seqs, expected)


@pytest.mark.parametrize("backend", ["litert", "xla"])
def test_other_backends_give_tensorflows_answers(models, backend):
    if backend == "xla":
        pytest.importorskip("jax")
    m = models["multi"]
    a, b = _rows(9, 4, seed=6), _rows(9, 2, seed=7)
    ref = m.reference({"a": a, "b": b})
    expected = {i: {"output_0": ref[0][i], "output_1": ref[1][i]} for i in range(9)}
    _run_keyed(KilnModelHandler(m.path, backend=backend), [{"a": a[i], "b": b[i]} for i in range(9)], expected,
               rtol=1e-4, atol=1e-5)


def test_xla_backend_pads_batches_to_powers_of_two(models):
    pytest.importorskip("jax")
    m = models["dense"]
    handler = KilnModelHandler(m.path, backend="xla")
    model = handler.load_model()
    rows = _rows(5, 4, seed=8)
    got = np.stack([r.inference["output_0"] for r in handler.run_inference(list(rows), model)])
    np.testing.assert_allclose(got, m.reference(rows)[0], rtol=1e-4, atol=1e-5)
    assert model._batch_sizes(5) == [(5, 8)]
    assert handler.batch_elements_kwargs() == {"min_batch_size": 256, "max_batch_size": 256}


def test_a_new_model_path_from_a_side_input_is_loaded(models):
    """Beam's model refresh: ModelMetadata on model_metadata_pcoll makes the handler load that model."""
    from apache_beam.ml.inference.base import ModelMetadata

    old, new = models["dense"], models["dense_retrained"]
    rows = _rows(6, 4, seed=14)
    ref = new.reference(rows)[0]
    assert not np.allclose(ref, old.reference(rows)[0])

    def check(results):
        assert len(results) == 6 and all(r.model_id == new.path for r in results), [r.model_id for r in results]
        got = {tuple(r.example): r.inference["output_0"] for r in results}
        for i, row in enumerate(rows):
            np.testing.assert_allclose(got[tuple(row)], ref[i], rtol=1e-5, atol=1e-6)

    with beam.Pipeline() as p:
        metadata = p | "Metadata" >> beam.Create([ModelMetadata(model_id=new.path, model_name="retrained")])
        results = p | beam.Create(list(rows)) | RunInference(KilnModelHandler(old.path),
                                                              model_metadata_pcoll=metadata)
        assert_that(results, check)


def test_signature_key_picks_the_signature(two_signatures):
    v = np.array([1.5, -2.0], np.float32)
    for key, want in (("double", v * 2), ("square", v * v)):
        handler = KilnModelHandler(two_signatures, signature_key=key)
        (result,) = handler.run_inference([v], handler.load_model())
        np.testing.assert_allclose(result.inference["out"], want)
    with pytest.raises(InterpreterError, match=r"two.tflite.*has 2 signatures \['double', 'square'\]"):
        KilnModelHandler(two_signatures).batch_elements_kwargs()
    with pytest.raises(InterpreterError, match="'cube': the model has no such signature"):
        KilnModelHandler(two_signatures, signature_key="cube").load_model()


def test_batching_is_derived_then_overridable(models, tmp_path):
    path = models["dense"].path
    assert KilnModelHandler(path).batch_elements_kwargs() == {"min_batch_size": 1, "max_batch_size": 256}
    assert KilnModelHandler(path, min_batch_size=8, max_batch_duration_secs=2).batch_elements_kwargs() == {
        "min_batch_size": 8, "max_batch_size": 256, "max_batch_duration_secs": 2}
    assert KilnModelHandler(models["batch1"].path, min_batch_size=4).batch_elements_kwargs() == {
        "min_batch_size": 4, "max_batch_size": 4}
    with pytest.raises(UnsupportedError, match="min_batch_size 9 > max_batch_size 3"):
        KilnModelHandler(path, min_batch_size=9, max_batch_size=3).batch_elements_kwargs()


def test_large_rows_get_smaller_batches(tmp_path):
    import keras

    import kiln

    big = keras.Sequential([keras.Input((512, 512), name="image"), keras.layers.GlobalAveragePooling1D()])
    path = tmp_path / "big.tflite"
    path.write_bytes(kiln.TFLiteConverter.from_keras_model(big).convert())
    # one row is 1 MiB of float32: 32 MiB of input per batch
    assert KilnModelHandler(str(path)).batch_elements_kwargs()["max_batch_size"] == 32


def test_handler_reports_to_beam(models):
    handler = KilnModelHandler(models["multi"].path, model_copies=2)
    assert handler.get_metrics_namespace() == "BeamML_Kiln"
    assert handler.share_model_across_processes() and handler.model_copies() == 2
    assert not KilnModelHandler(models["dense"].path).share_model_across_processes()
    batch = [{"a": np.zeros(4, np.float32), "b": np.zeros(2, np.float32)}] * 3
    assert handler.get_num_bytes(batch) == 3 * (16 + 8)


# -- errors -------------------------------------------------------------------------------------

def test_bad_path_fails_while_the_pipeline_is_built(tmp_path):
    missing = str(tmp_path / "nope.tflite")
    with pytest.raises(ModelError, match="cannot read the model .*nope.tflite"):
        with beam.Pipeline() as p:
            _ = p | beam.Create([np.zeros(4, np.float32)]) | RunInference(KilnModelHandler(missing))
    garbage = tmp_path / "garbage.tflite"
    garbage.write_bytes(b"this is not a flatbuffer")
    with pytest.raises(ModelError, match="garbage.tflite"):
        KilnModelHandler(str(garbage)).load_model()


def test_unknown_backend_and_inference_args_are_refused(models):
    with pytest.raises(UnsupportedError, match="backend 'tpu' is not one of"):
        KilnModelHandler(models["dense"].path, backend="tpu")
    handler = KilnModelHandler(models["dense"].path)
    with pytest.raises(UnsupportedError, match=r"inference_args \['temperature'\]"):
        handler.run_inference([np.zeros(4, np.float32)], handler.load_model(), {"temperature": 1.0})


@pytest.mark.parametrize("example, message", [
    (np.zeros(4, np.float64), r"batch element 1, input 'x': expected dtype float32, got float64"),
    (["a", "b", "c", "d"], r"batch element 1, input 'x': expected dtype float32, got <U1"),
    (np.zeros(5, np.float32), r"batch element 1, input 'x': expected shape \(4,\) .*got \(5,\)"),
    (np.zeros((1, 4), np.float32), r"batch element 1, input 'x': expected shape \(4,\) .*got \(1, 4\)"),
    ({"y": np.zeros(4, np.float32)}, r"batch element 1: the model's inputs are \['x'\]; unknown \['y'\]; missing"),
    ([[1.0, 2.0], [3.0]], r"batch element 1, input 'x': cannot read it as an array"),
])
def test_bad_examples_name_the_input_and_element(models, example, message):
    handler = KilnModelHandler(models["dense"].path)
    with pytest.raises(InterpreterError, match=message):
        handler.run_inference([np.zeros(4, np.float32), example], handler.load_model())


def test_multi_input_model_needs_a_dict(models):
    handler = KilnModelHandler(models["multi"].path)
    with pytest.raises(InterpreterError, match=r"batch element 0: the model has 2 inputs \['a', 'b'\]; pass a dict"):
        handler.run_inference([np.zeros(4, np.float32)], handler.load_model())


def test_lossless_casts_and_python_numbers_are_accepted(models):
    m = models["dense"]
    handler = KilnModelHandler(m.path)
    ints = np.array([1, -2, 3, 0], np.int16)  # int16 -> float32 loses nothing
    floats = [0.5, -1.25, 2.0, 3.5]  # a Python list takes the input's dtype
    results = handler.run_inference([ints, floats], handler.load_model())
    ref = m.reference(np.array([ints, floats], np.float32))[0]
    for result, want in zip(results, ref):
        np.testing.assert_allclose(result.inference["output_0"], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("value, message", [
    ([1, 2], None),
    ([1, 300], "values out of the range of int8"),
    ([1.0, 2.0], "expected dtype int8, got float64"),
    (np.array([1, 2], np.int32), "expected dtype int8, got int32"),
    ("ab", "expected dtype int8, got <U2"),
    (None, "expected dtype int8, got object"),
])
def test_integer_inputs_take_only_what_fits(value, message):
    from kiln.beam.model import TensorSpec, check_value

    spec = TensorSpec("q", np.dtype(np.int8), (-1, 2))
    if message is None:
        assert check_value(spec, (2,), value, "here").dtype == np.int8
    else:
        with pytest.raises(InterpreterError, match=f"here: {message}"):
            check_value(spec, (2,), value, "here")


def test_a_bad_element_fails_the_pipeline_with_the_kiln_error(models):
    rows = [np.zeros(4, np.float32), np.zeros(4, np.float64)]
    with pytest.raises(KilnError, match="dense.tflite.*input 'x': expected dtype float32, got float64"):
        with beam.Pipeline() as p:
            _ = p | beam.Create(rows) | RunInference(KilnModelHandler(models["dense"].path))


def test_exception_handling_routes_bad_batches_aside(models):
    m = models["dense"]
    good = _rows(4, 4, seed=9)
    examples = [*good, np.zeros(3, np.float32)]
    handler = KilnModelHandler(m.path, max_batch_size=1)  # one example per batch: only the bad one fails

    def check_failed(failed):
        assert len(failed) == 1, failed
        (batch, (error_type, message, _traceback)), = failed  # Beam's dead letter: (batch, exception info)
        assert len(batch) == 1 and batch[0].shape == (3,), batch
        assert error_type is InterpreterError and "input 'x': expected shape (4,)" in message, message

    with beam.Pipeline() as p:
        main, other = (p | beam.Create(examples) | RunInference(handler).with_exception_handling())
        assert_that(main | beam.Map(lambda r: r.inference["output_0"].shape), equal_to([(3,)] * 4), label="good")
        assert_that(other.failed_inferences, check_failed, label="failed")


def test_inputs_without_a_shared_batch_dimension_run_one_example_per_call(unbatched):
    handler = KilnModelHandler(unbatched)
    assert handler.batch_elements_kwargs() == {"min_batch_size": 1, "max_batch_size": 1}
    v = np.array([1.0, -2.0, 0.5], np.float32)
    examples = [{"x": np.float32(2.0), "v": v}, {"x": np.float32(-1.0), "v": v}]
    model = handler.load_model()
    got = [r.inference["scaled"] for r in handler.run_inference(examples, model)]
    np.testing.assert_array_equal(got, [v * 2, -v])
    assert model.invocations == 2


@pytest.mark.parametrize("backend", ["kiln", "litert"])
def test_a_model_without_signatures_runs_its_main_subgraph(models, no_signatures, backend):
    handler = KilnModelHandler(no_signatures, backend=backend)
    spec = handler.spec()
    assert spec.from_subgraph and len(spec.inputs) == 1 and len(spec.outputs) == 1
    rows = _rows(5, 4, seed=13)
    model = handler.load_model()
    results = handler.run_inference(list(rows[:2]), model) + handler.run_inference(list(rows[2:]), model)
    got = np.stack([r.inference[next(iter(spec.outputs))] for r in results])
    np.testing.assert_allclose(got, models["dense"].reference(rows)[0], rtol=1e-5, atol=1e-6)


def test_threads_sharing_one_model_get_their_own_answers(models):
    """Beam shares a loaded model between a worker's threads: concurrent batches must not mix."""
    from concurrent.futures import ThreadPoolExecutor

    m = models["dense"]
    handler = KilnModelHandler(m.path)
    model = handler.load_model()
    batches = [_rows(n, 4, seed=20 + n) for n in (1, 3, 5, 7, 2, 6)]
    refs = [m.reference(b)[0] for b in batches]

    def run(i):
        for _ in range(15):
            got = np.stack([r["output_0"] for r in model.predict(list(batches[i]))])
            np.testing.assert_allclose(got, refs[i], rtol=1e-5, atol=1e-6)

    with ThreadPoolExecutor(len(batches)) as pool:
        for future in [pool.submit(run, i) for i in range(len(batches))]:
            future.result()


def test_an_output_without_the_batch_dimension(batch_total):
    """Batches of one give each example the whole output; larger batches are refused, saying why."""
    rows = [np.array([1.0, 2.0], np.float32), np.array([3.0, -1.0], np.float32)]
    handler = KilnModelHandler(batch_total, max_batch_size=1)
    model = handler.load_model()
    for row in rows:
        (result,) = handler.run_inference([row], model)
        np.testing.assert_allclose(result.inference["total"], row.sum())
        np.testing.assert_allclose(result.inference["doubled"], row * 2)
    with pytest.raises(OpError, match=r"output 'total' has shape \(\): .*not the batch of 2 rows.*max_batch_size=1"):
        handler.run_inference(rows, model)


def test_streaming_pipeline_with_a_batch_duration(models):
    """The same handler in a streaming pipeline (TestStream); BatchElements flushes by time there."""
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.test_stream import TestStream

    m = models["dense"]
    rows = _rows(6, 4, seed=15)
    ref = m.reference(rows)[0]
    stream = TestStream().advance_watermark_to(0)
    for i, row in enumerate(rows):
        stream = stream.add_elements([beam.window.TimestampedValue((i, row), i)])
    stream = stream.advance_watermark_to_infinity()
    handler = KeyedModelHandler(KilnModelHandler(m.path, max_batch_duration_secs=1))
    with beam.Pipeline(options=PipelineOptions(streaming=True)) as p:
        assert_that(p | stream | RunInference(handler), _expect_keyed({i: {"output_0": ref[i]} for i in range(6)}))
