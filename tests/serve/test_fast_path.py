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
