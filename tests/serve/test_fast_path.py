"""The lean request path gives exactly what the full path gives: decoded arrays (or the same error)
and answer bytes, on the requests it takes and on the ones it hands back."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.serve import tensors
from kiln.serve.jsonbody import parse_body
from kiln.serve.tensors import TensorSpec, format_response

BODIES = [
    '{"instances": [[1.5, 2]]}', '{"instances": [[1.5, 2], [3]]}', '{"instances": [[1.5, null]]}',
    '{"instances": [[1.5, "2"]]}', '{"instances": [[1e39, 1.0]]}', '{"instances": [[3.4028235e38, 1.0]]}',
    '{"instances": [[3.4028236e38, 1.0]]}', '{"instances": [[NaN, 1.0]]}', '{"instances": [[-Infinity, 1.0]]}',
    '{"inputs": [[1.5, 2.5]]}', '{"inputs": [[1.5, 2.5]], "instances": [[1.0]]}', '{"instances": [[[1.5]]]}',
    '{"instances": [[1.5, {"a": 1}]]}', '{"instances": [[1.5, [2.0]]]}', '{"instances": [[16777217, 0.5]]}',
    '{"instances": [[1, 2]]}', '{"instances": [[100000000000000000000000000000, 0.5]]}',
    '{"instances": [[-1e308, 1e308]]}', '{"instances": [[65504.0, 65519.0]]}', '{"instances": [[65520.0, 1.5]]}',
    '{"instances": [[]]}', '{"instances": [[], []]}', '{"instances": [[1.5]], "signature_name": "x"}',
    '{"instances": [{"x": [1.5]}]}', '{"instances": [' + "[" * 70 + "1.5" + "]" * 70 + "]}",
]


def _decoded(text: str, specs: dict, fast: bool, monkeypatch):
    with monkeypatch.context() as m:
        if not fast:
            m.setattr(tensors, "_plain_floats", lambda *a: None)
        try:
            feeds, fmt = tensors.parse_request(parse_body(text.encode()), specs, False)
        except Exception as exc:  # the same error, class and words, is the point
            return "error", type(exc).__name__, str(exc)
    return "ok", fmt, {n: (a.dtype.str, a.shape, a.tobytes()) for n, a in feeds.items()}


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int32])
@pytest.mark.parametrize("shape", [(-1, 2), None])
def test_plain_float_requests_decode_as_the_full_path_does(dtype, shape, monkeypatch):
    specs = {"x": TensorSpec("x", np.dtype(dtype), shape)}
    for text in BODIES:
        fast = _decoded(text, specs, True, monkeypatch)
        assert fast == _decoded(text, specs, False, monkeypatch), text
        assert fast[0] == "ok" or fast[1] == "InvalidArgument", (text, fast)  # a 400, never a 500


def test_float_texts_equal_the_one_value_rule():
    """`_float_texts` formats all values at once; `_float_text` is TF Serving's rule for one value."""
    rng = np.random.default_rng(3)
    specials = [0.0, -0.0, 1.0, -3.0, 1e-45, 3.4028235e38, 16777216.0, 0.1, 100000.0, 1e6, 1234567.0, 2.5e-5,
                np.nan, np.inf, -np.inf]
    with np.errstate(over="ignore"):
        single = np.concatenate([np.array(specials, np.float32),
                                 (rng.standard_normal(20000) * 10.0 ** rng.integers(-45, 39, 20000)).astype(np.float32)])
    double = np.concatenate([np.array(specials), rng.standard_normal(5000) * 10.0 ** rng.integers(-300, 300, 5000)])
    for flat, is_single in ((single, True), (double, False)):
        assert tensors._float_texts(flat) == [tensors._float_text(v, is_single) for v in flat.tolist()]
    assert tensors._float_texts(np.zeros(0, np.float32)) == []


@pytest.mark.parametrize("shape", [(1, 10), (3, 1), (0, 4), (2, 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_one_2d_float_output_is_written_as_the_general_writer_writes_it(shape, dtype, monkeypatch):
    values = np.random.default_rng(4).standard_normal(shape).astype(dtype)
    for fmt in (tensors.ROW, tensors.COLUMNAR):
        direct = format_response({"y": values}, fmt)
        with monkeypatch.context() as m:
            m.setattr(tensors, "_ROWS_PER_PIECE", -1)  # no output is small enough for the direct join
            general = format_response({"y": values}, fmt)
        assert direct == general
        assert direct.startswith(b'{"predictions": [' if fmt == tensors.ROW else b'{"outputs": [')


def _mixed_float32(rng, count: int) -> np.ndarray:
    """Every kind of float32: any bit pattern (subnormals, NaN payloads, infinities, extremes), values
    whose "%g" text reads back exactly (few digits, whole numbers), and values next to those."""
    bits = rng.integers(0, 2 ** 32, count, dtype=np.uint64).astype(np.uint32).view(np.float32)
    few_digits = (rng.integers(-999999, 999999, count) * 10.0 ** rng.integers(-44, 33, count)).astype(np.float32)
    whole = rng.integers(-2 ** 24, 2 ** 24, count).astype(np.float32)
    near = np.nextafter(few_digits, np.float32(np.inf))
    return np.concatenate([bits, few_digits, whole, near])


def test_float_texts_equal_the_one_value_rule_on_every_kind_of_float():
    """The C-level choice between the short and the long text, in rows of random lengths (all short, all
    long, mixed), gives what TF Serving's one-value rule gives for every value."""
    rng = np.random.default_rng(11)
    with np.errstate(over="ignore", invalid="ignore"):
        single = _mixed_float32(rng, 25000)
        double = np.concatenate([rng.integers(0, 2 ** 63, 20000, dtype=np.int64).view(np.float64),
                                 single.astype(np.float64)])
    for flat, is_single in ((single, True), (double, False)):
        rng.shuffle(flat)
        expected = [tensors._float_text(v, is_single) for v in flat.tolist()]
        start = 0
        while start < len(flat):
            stop = start + int(rng.choice([1, 2, 10, 64, 1000]))
            assert tensors._float_texts(flat[start:stop]) == expected[start:stop]
            start = stop
        exact = flat[[t == tensors._float_text(v, is_single) and "e" not in t and len(t) < 8
                      for t, v in zip(expected, flat.tolist())]][:10]  # a row of short texts only
        assert tensors._float_texts(exact) == [tensors._float_text(v, is_single) for v in exact.tolist()]


def test_metrics_binned_at_the_flush_equal_one_observe_per_answer():
    """Answers and backend calls tallied as lists and binned in one NumPy pass give the samples that one
    prometheus_client ``observe`` per answer gives (bucket edges included)."""
    from prometheus_client import CollectorRegistry, Histogram

    from kiln.serve import metrics as metrics_module
    from kiln.serve.metrics import Metrics

    rng = np.random.default_rng(5)
    edges = np.array(metrics_module._LATENCY)
    seconds = np.concatenate([rng.exponential(0.01, 500), edges, np.nextafter(edges, 1), [0.0, 100.0]]).tolist()
    m = Metrics(["m"])
    observe = m.observer("m", 1)
    for i, s in enumerate(seconds):
        m.request("m", "1", "predict", 200 if i % 7 else 503, s)
        observe(4, 3 if i % 2 else 4, s)
    m.flush()
    reference = Histogram("ref", "", buckets=metrics_module._LATENCY, registry=CollectorRegistry())
    for s in seconds:
        reference.observe(s)

    def buckets(histogram, **labels):
        samples = {}
        for family in histogram.collect():
            for sample in family.samples:
                if all(sample.labels.get(k) == v for k, v in labels.items()):
                    samples[(sample.name.rsplit("_", 1)[-1], sample.labels.get("le"))] = sample.value
        return samples

    want = buckets(reference)
    got_answers = {k: v for k, v in buckets(m.latency, model="m", method="predict").items()}
    assert got_answers.keys() == want.keys()
    assert all(got_answers[k] == pytest.approx(want[k]) for k in want)
    got_calls = buckets(m.backend_latency, model="m")
    assert all(got_calls[k] == pytest.approx(want[k]) for k in want)
    assert m.requests.labels("m", "1", "predict", "503")._value.get() == sum(1 for i in range(len(seconds)) if not i % 7)
    assert m.padding_rows.labels("m", "1")._value.get() == sum(1 for i in range(len(seconds)) if i % 2)
    assert m.batch_size.labels("m", "1")._sum.get() == 4 * len(seconds)
