"""The request reader must read every document exactly as the json module does (within its limits)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from kiln.serve import jsonbody
from kiln.serve.status import InvalidArgument

DOCUMENTS = [
    b'{"instances": [[1.5, -0.0, 5e-324, 2.2250738585072011e-308, 1E5, 3]]}',
    b'{"instances": [[NaN, Infinity, -Infinity]]}',  # orjson refuses these; TF Serving accepts them
    b'{"inputs": [123456789012345678901234567890, -9223372036854775809, 18446744073709551615]}',
    b'{"inputs": ["\\ud800", "caf\\u00e9"]}',
    '\ufeff{"inputs": [1]}'.encode("utf-8"),
    '{"inputs": ["é"]}'.encode("utf-16"),
    b'{"a": 1, "a": 2}',
    b'  {"inputs": {"x": [[1, 2]], "y": [true, false, null]}}  \n',
]


@pytest.mark.parametrize("text", DOCUMENTS)
def test_documents_read_as_json_reads_them(text):
    got, want = jsonbody.parse_body(text), json.loads(text)
    assert repr(got) == repr(want)  # repr tells int from float and -0.0 from 0.0; NaN compares by text


def test_integers_beyond_64_bits_stay_exact_integers():
    doc = jsonbody.parse_body(b'{"inputs": [123456789012345678901234567890]}')
    assert type(doc["inputs"][0]) is int and doc["inputs"][0] == 123456789012345678901234567890


def test_random_floats_read_back_bit_exact():
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2 ** 63, 4000, dtype=np.int64).view(np.float64)
    values = [v for v in bits.tolist() if math.isfinite(v)]
    texts = [repr(v) for v in values] + ["%.9g" % v for v in values] + ["%.3e" % v for v in values]
    doc = jsonbody.parse_body(("{\"inputs\": [" + ", ".join(texts) + "]}").encode())
    assert doc["inputs"] == [float(t) for t in texts]


@pytest.mark.parametrize("text, message", [
    (b'{"instances": [[1, 2]', "JSON Parse error"),
    (b"", "The document is empty"),
    (b"[1, 2]", "Is not object"),
    (b'{"inputs": [1]} trailing', "JSON Parse error: Extra data"),
    (b"\xff\xfe\xfd", "JSON Parse error"),
    (b"[" * 100_000 + b"]" * 100_000, "JSON Parse error"),
    (b'{"inputs": [1e400]}', "Number too big to be stored in double"),  # TF Serving's words; json reads inf
    (b'{"inputs": [-1e400]}', "Number too big to be stored in double"),
    (b'{"inputs": [' + b"7" * 5000 + b"]}", "an integer of 5000 digits"),
])
def test_bad_documents_get_json_parse_errors(text, message):
    with pytest.raises(InvalidArgument, match=message):
        jsonbody.parse_body(text)
