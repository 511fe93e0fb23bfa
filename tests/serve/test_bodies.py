"""Issue #31 (6): large bodies are read in chunks whatever their layout (rows of objects as well as
columns), give exactly what the plain reader gives, and no body, however malformed or deeply
nested, gets anything but a 400 with a JSON error."""

from __future__ import annotations

import json

import numpy as np
import requests

from kiln.serve import jsonbody
from kiln.serve.jsonbody import parse_body, parse_text
from kiln.serve.status import ServeError
from kiln.serve.tensors import TensorSpec, parse_request

from .conftest import rows

F32 = np.dtype(np.float32)
TWO = {"a": TensorSpec("a", F32, (-1, 4)), "b": TensorSpec("b", F32, (-1, 2))}


def _cases():
    """(document text, specs): valid and invalid, each large enough for several chunks of 4 KiB."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((600, 4)).astype(np.float32)
    objects = [{"a": r.tolist(), "b": r[:2].tolist()} for r in x]
    one = {"x": TensorSpec("x", F32, (-1, 4))}
    out = [({"instances": objects}, TWO), ({"inputs": {"a": x.tolist(), "b": x[:, :2].tolist()}}, TWO),
           ({"instances": x.tolist()}, one), ({"inputs": x.tolist()}, one),
           ({"instances": objects[:-1] + [{"a": [1, 2, 3], "b": [1, 2]}]}, TWO),
           ({"instances": objects + [[1, 2, 3, 4]]}, TWO), ({"instances": [[1, 2, 3, 4]] + objects}, TWO),
           ({"instances": x.tolist()[:-1] + [[1, 2, "3", 4]]}, one), ({"instances": x.tolist() + [[1, 2, 3]]}, one),
           ({"instances": x.tolist() + [[1, True, 3, 4]]}, one), ({"inputs": x.tolist() + [[1, 2, [3], 4]]}, one),
           ({"instances": x.astype(float).tolist() + [[1e39, 2, 3, 4]]}, one),
           ({"instances": [rng.standard_normal((40, 40)).tolist() for _ in range(3)]},
            {"x": TensorSpec("x", F32, (-1, 40, 40))}),  # rows larger than a chunk
           ({"instances": [{"a": rng.standard_normal((40, 40)).tolist(), "b": [1.0, 2.0]}] * 2},
            {"a": TensorSpec("a", F32, (-1, 40, 40)), "b": TensorSpec("b", F32, (-1, 2))}),
           ({"instances": ["s\"\\%d" % i for i in range(2000)]}, {"x": TensorSpec("x", np.dtype(object), (-1,))}),
           ({"instances": [{"b64": "AAAA"}] * 1000}, {"x": TensorSpec("x", np.dtype(object), (-1,))}),
           ({"instances": [[True, False]] * 2000}, {"x": TensorSpec("x", np.dtype(np.bool_), (-1, 2))}),
           ({"instances": [[1, 2 ** 40]] * 1000}, {"x": TensorSpec("x", np.dtype(np.int32), (-1, 2))}),
           ({"instances": [[1, 2 ** 70]] * 1000}, {"x": TensorSpec("x", np.dtype(np.float64), (-1, 2))}),
           ({"instances": [[]] * 5000}, {"x": TensorSpec("x", F32, (-1, 0))}),
           ({"signature_name": "x" * 9000, "instances": x.tolist()}, one)]
    texts = [(json.dumps(doc).encode(), specs) for doc, specs in out]
    texts.append((texts[2][0].replace(b"0.", b"NaN, 0.", 3), one))  # NaN: the json module's reading
    texts.append((texts[2][0][:-10], one))  # cut short
    texts.append((texts[2][0].replace(b"], [", b"], , [", 1), one))
    texts.append((texts[2][0].replace(b"]]}", b"]],}"), one))
    texts.append((texts[0][0].replace(b'"b": ', b'"b" ', 1), TWO))
    return texts


def _decoded(text: bytes, specs: dict, large: bool):
    try:
        doc = parse_body(text) if large else parse_text(text)
        feeds, fmt = parse_request(doc, specs, b"true" in text or b"false" in text)
    except ServeError as exc:
        return "error", type(exc).__name__, str(exc) if large or "Parse error" not in str(exc) else "Parse error"
    return "ok", fmt, {n: (a.dtype.str, a.shape, a.tobytes() if a.dtype != object else a.tolist())
                       for n, a in feeds.items()}


def test_a_large_body_read_in_chunks_gives_what_the_plain_reader_gives(monkeypatch):
    monkeypatch.setattr(jsonbody, "CHUNK", 4096)
    for text, specs in _cases():
        assert len(text) > 3 * 4096
        large, plain = _decoded(text, specs, True), _decoded(text, specs, False)
        if plain[:2] == ("error", "InvalidArgument") and plain[2] == "Parse error":
            assert large[:2] == plain[:2] and "Parse error" in large[2], (large, text[:100])
        else:
            assert large == plain, (text[:100], large[:3] if large[0] == "error" else "ok", plain[:3])


DEEP = [b"[" * d + b"1" + b"]" * d for d in (65, 990, 1023, 5000)] + \
       [b'{"a":' * d + b"1" + b"}" * d for d in (65, 990, 1023, 5000)] + \
       [b'[{"a":' * d + b"1" + b"}]" * d for d in (40, 495, 600)]


def _malformed() -> list[bytes]:
    bodies = []
    for deep in DEEP:
        bodies += [b'{"instances": %s}' % deep, b'{"inputs": [%s]}' % deep, b'{"inputs": {"a": [%s], "b": [[1, 2]]}}' % deep,
                   b'{"instances": [[1, %s, 3, 4]]}' % deep, b'{"instances": [{"a": %s, "b": [1, 2]}]}' % deep,
                   b'{"signature_name": %s, "inputs": [1]}' % deep, deep, b"[" * len(deep)]
    for number in (b"1e400", b"-1e400", b"1" + b"0" * 5000, b"0x10", b"01", b"1.", b".5", b"+1", b"--1"):
        bodies += [b'{"instances": [[%s, 2, 3, 4]]}' % number, b'{"inputs": {"a": [[%s, 2, 3, 4]], "b": [[1, 2]]}}' % number]
    for value in (b'[[1, "a", 3, 4]]', b'[[1, null, 3, 4]]', b'[[1, true, 3, 4]]', b'[[1, {}, 3, 4]]', b"[[1, 2, 3, 4], [1, 2]]",
                  b"[[], []]", b"[]", b"[[]]", b"[{}]", b"{}", b"[[1, 2, 3, 4], 5]", b'"x"', b"[[1e39, 1, 2, 3]]"):
        bodies += [b'{"instances": %s}' % value, b'{"inputs": %s}' % value, b'{"inputs": {"a": %s, "b": [[1, 2]]}}' % value]
    bodies += [b"\xff\xfe\x00", b'{"instances": ["\xff"]}', b'{"inputs": "\xc3\x28"}', b"", b"  ", b"null", b"{",
               b'{"instances": [[1, 2, 3, 4]]}\x00']
    big = json.dumps({"instances": [{"a": r.tolist(), "b": r[:2].tolist()} for r in rows(6000)]}).encode()
    bodies += [big[:-1000], big.replace(b"]}, {", b"]}, {{", 1), big[:-2] + b"," + b"[" * 100_000 + b"]}",
               big[:-2] + b', {"a": %s, "b": [1, 2]}]}' % DEEP[-1], big[:1] + b" " * 300_000 + big[1:200] + b"]}"]
    return bodies


def test_no_malformed_body_gets_anything_but_a_400(serve, models):
    server = serve("--model_base_path", str(models["two_tfl"]), "--model_name", "two", "--access_log", "false")
    codes = {}
    with requests.Session() as s:
        for body in _malformed():
            for large in (False, True):  # as sent, and grown past a chunk by spaces after the first brace
                data = body[:1] + b" " * 300_000 + body[1:] if large and body[:1] == b"{" else body
                r = s.post(server.url + "/v1/models/two:predict", data=data, timeout=60)
                codes[r.status_code] = codes.get(r.status_code, 0) + 1
                assert r.status_code == 400 and r.headers["content-type"] == "application/json", (body[:120], r.text[:300])
                assert r.json()["error"] and "Traceback" not in r.text
    print(f"{sum(codes.values())} malformed bodies: {codes}")
    assert server.metric("kiln_serve_requests_total", code="500") == 0


def test_a_megabyte_of_rows_to_a_two_input_model_is_read_as_its_columns_are(serve, models, reference):
    """Issue #31: 1.1 MB of `instances` (one object per row) was refused ("about 270001 JSON values")
    while the same data as columns passed; TF Serving takes both."""
    server = serve("--model_base_path", str(models["two_tfl"]), "--model_name", "two", "--access_log", "false")
    a, b = rows(12_000, seed=1), rows(12_000, 2, seed=2)
    body = json.dumps({"instances": [{"a": x.tolist(), "b": y.tolist()} for x, y in zip(a, b)]}).encode()
    assert len(body) > 1_100_000
    by_rows = server.post("/v1/models/two:predict", data=body)
    assert by_rows.status_code == 200, by_rows.text[:300]
    by_columns = server.post("/v1/models/two:predict", data=json.dumps({"inputs": {"a": a.tolist(), "b": b.tolist()}}))
    assert by_columns.status_code == 200, by_columns.text[:300]
    got = by_rows.json()["predictions"]
    columns = by_columns.json()["outputs"]
    assert len(got) == 12_000
    for name in ("scores", "doubled"):
        np.testing.assert_array_equal(np.float32([row[name] for row in got]), np.float32(columns[name]))
    np.testing.assert_allclose(np.float32(columns["scores"]), reference(models["two_sm"] / "1", a=a, b=b)["scores"],
                               rtol=1e-5, atol=1e-5)
