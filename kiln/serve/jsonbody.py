"""Request bodies to JSON documents, with the big tensor values of large bodies left to be read in chunks.

A JSON reader builds a Python object per number (32 bytes or more for a float whose text took
~10), so a 60 MiB body would take gigabytes if read whole. A large body is walked instead: one
vectorized pass per value finds its structure (strings, nesting, the separators of its
elements), small values are read at once, and every array value larger than `CHUNK` stays a
`Span` of the body, which `kiln.serve.tensors` reads a chunk of elements at a time (each chunk by
the JSON reader, written into the tensor at once), so what a body costs besides its tensors is a
chunk's Python objects, whatever its layout: rows of objects, columns, strings. Nesting is
limited, integers may not have more than `MAX_INT_DIGITS` digits and numbers must fit a double
(TF Serving: "Number too big to be stored in double"). Small bodies take the plain reader
(orjson; ``json`` for what orjson refuses).
"""

from __future__ import annotations

import json
import math
import re
import reprlib

import numpy as np

from .status import InvalidArgument

try:  # the fast JSON reader of the serve extra; json alone gives the same answers, slower
    import orjson
except ImportError:  # pragma: no cover - orjson is in the serve extra
    orjson = None

#: Values larger than this (bytes of text) are walked and read in chunks of about this size.
CHUNK = 256 << 10
MAX_INT_DIGITS = 1000
MAX_DEPTH = 64  # deeper nesting than any tensor has dimensions (NumPy allows 64)

#: Digits as "0", what may lead into digits of a float ("." and exponents) as "x", the rest blanked: an
#: integer of 19 digits or more (which orjson would read as a float) shows as a blank and 19 zeros.
_DIGITS_ONLY = bytes(48 if 48 <= i <= 57 else 120 if i in b".eE" else 32 for i in range(256))
_SPACE = b" \t\n\r"
_SCALAR = re.compile(rb'"(?:[^"\\]|\\.)*"|[^,\]}\s]*', re.DOTALL)  # a string, or up to the next delimiter


def parse_body(body) -> dict:
    """The request document; in a large body, array values larger than `CHUNK` are `Span`s."""
    if len(body) > CHUNK:
        view = memoryview(body)
        start = _skip_space(view, 0)
        if start == len(view):
            raise InvalidArgument("JSON Parse error: The document is empty")
        if view[start] != 123:  # "{"
            raise InvalidArgument(f"JSON Value: {bytes(view[start:start + 120]).decode('utf-8', 'replace')}... Is "
                                  "not object")
        doc, end = _object(view, start, 0)
        if _skip_space(view, end) != len(view):
            raise InvalidArgument(f"JSON Parse error: Extra data at offset: {_skip_space(view, end)}")
        return doc
    text = bytes(body)
    try:
        doc = parse_text(text)
    except InvalidArgument:
        if not text.strip():
            raise InvalidArgument("JSON Parse error: The document is empty") from None
        raise
    if not isinstance(doc, dict):
        raise InvalidArgument(f"JSON Value: {quoted(doc)} Is not object")
    return doc


def quoted(value, limit: int = 120) -> str:
    """A JSON value as an error message quotes it: its text, cut at ``limit`` characters (a
    document nested past Python's recursion limit is shown by `reprlib`, which stops at 6 levels)."""
    try:
        text = json.dumps(value, allow_nan=True, default=lambda o: f"[{o.first_token}, ...]")
    except RecursionError:
        text = reprlib.repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


# -- the JSON reader -----------------------------------------------------------------------------

def _checked_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise InvalidArgument(f"JSON Parse error: an integer of {len(text.lstrip('-'))} digits; at most "
                              f"{MAX_INT_DIGITS} are read")
    return int(text)


def _checked_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise InvalidArgument("JSON Parse error: Number too big to be stored in double")
    return value


def parse_text(text: bytes):
    """orjson's reading where it equals json's, else json's (with the number limits)."""
    if orjson is not None and b" " + b"0" * 19 not in b" " + text.translate(_DIGITS_ONLY):
        # orjson refuses NaN, Infinity, out-of-range exponents, lone surrogates and non-UTF-8 text
        # (json accepts them or gives the message the tests pin) and reads integers beyond 64 bits
        # as floats; for those documents json decides.
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    try:
        return json.loads(text, parse_int=_checked_int, parse_float=_checked_float)
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"JSON Parse error: Invalid encoding in string at offset: {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"JSON Parse error: {exc.msg} at offset: {exc.pos}") from None
    except RecursionError:
        raise InvalidArgument("JSON Parse error: the document is nested too deeply") from None


# -- large bodies --------------------------------------------------------------------------------

class Span:
    """An array value of a large body not read yet: ``view[start:end]`` (brackets included)."""

    __slots__ = ("view", "start", "end")

    def __init__(self, view: memoryview, start: int, end: int):
        self.view, self.start, self.end = view, start, end

    def chunks(self):
        """(start, end, count): runs of consecutive elements, ``view[start:end]`` (no brackets) of about
        `CHUNK` bytes, or of one element when that one alone is larger; their counts add up to the
        array's length."""
        view, begin, count = self.view, self.start + 1, 0
        for at, seen in _separators(view, self.start, last_only=True)[0]:
            if at - begin > CHUNK and seen - count > 1:  # the first element spans chunks: it goes alone
                first = _skip_space(view, begin)
                cut = _skip_space(view, _value_end(view, first))
                yield first, cut, 1
                begin, count = cut + 1, count + 1
            yield begin, at, seen - count
            begin, count = at + 1, seen
        if bytes(view[begin:self.end - 1]).strip():
            yield begin, self.end - 1, 1
        elif count:
            raise InvalidArgument(f"JSON Parse error: a value is missing at offset: {self.end - 1}")

    def read(self, start: int, end: int, count: int, depth: int = 1):
        """A run of `chunks` as a list of its elements (one large element read as `_value` reads it)."""
        if end - start <= CHUNK or count > 1:
            return parse_text(b"[%b]" % self.view[start:end])
        first = _skip_space(self.view, start)
        return [_value(self.view, first, len(bytes(self.view[first:end]).rstrip()) + first, depth)]

    def __repr__(self) -> str:
        return f"[{bytes(self.view[self.start + 1:self.start + 40]).decode('utf-8', 'replace')}, ...]"


def _skip_space(view: memoryview, at: int) -> int:
    n = len(view)
    while at < n and view[at] in _SPACE:
        at += 1
    return at


def _value_end(view: memoryview, start: int) -> int:
    """Where the value that starts at ``start`` ends (an array or object: after its closing bracket)."""
    if view[start] in (91, 123):
        return _separators(view, start, last_only=True)[1]
    return _SCALAR.match(view.obj, start).end()


def _value(view: memoryview, start: int, end: int, depth: int):
    """The value at ``view[start:end]``: read at once when small; an array larger than `CHUNK` as a
    `Span`; an object larger than that with its members read the same way."""
    if end - start <= CHUNK or view[start] not in (91, 123):
        return parse_text(bytes(view[start:end]))
    if depth > MAX_DEPTH:
        raise InvalidArgument(f"JSON Parse error: the document is nested deeper than {MAX_DEPTH} levels")
    return Span(view, start, end) if view[start] == 91 else _object(view, start, depth)[0]


def _object(view: memoryview, start: int, depth: int) -> tuple[dict, int]:
    """The object opening at ``start``, its members read by `_value`, and where it ends."""
    out, begin = {}, start + 1
    found, end = _separators(view, start, last_only=False)
    marks = [at for at, _ in found] + [end - 1]
    if len(marks) % 2:
        raise InvalidArgument(f"JSON Parse error: Expecting property name at offset: {marks[-2] + 1}")
    for colon, comma in zip(marks[::2], marks[1::2]):
        if view[colon] != 58 or view[comma] not in (44, 125):
            raise InvalidArgument(f"JSON Parse error: Expecting ':' delimiter at offset: {colon}")
        key = parse_text(bytes(view[begin:colon]))
        if not isinstance(key, str):
            raise InvalidArgument(f"JSON Parse error: Expecting property name enclosed in double quotes at offset: "
                                  f"{begin}")
        first = _skip_space(view, colon + 1)
        last = len(bytes(view[first:comma]).rstrip()) + first
        out[key] = _value(view, first, last, depth + 1)
        begin = comma + 1
    return out, end


def _separators(view: memoryview, start: int, last_only: bool, stop: int | None = None):
    """([(offset, elements before it)], end) for the array or object opening at ``start``: the commas
    and colons directly inside it (strings and nested values skipped), or with ``last_only`` the last
    of each `CHUNK` of text; ``end`` is the offset after its closing bracket. One vectorized pass
    per `CHUNK`: quotes not escaped toggle "in a string", brackets outside strings move the depth."""
    n = len(view) if stop is None else stop
    depth, in_string, slashes, seen, found = 0, 0, 0, 0, []
    for at in range(start, n, CHUNK):
        c = np.frombuffer(view[at:min(at + CHUNK, n)], np.uint8)
        quote = c == 34
        backslash = c == 92
        if slashes or backslash.any():  # a quote after an odd run of backslashes is escaped
            index = np.arange(len(c))
            last_other = np.maximum.accumulate(np.where(backslash, -1, index))  # -1: backslashes since the start
            before = np.empty(len(c), np.int64)  # backslashes right before each character
            before[0] = slashes
            before[1:] = index[:-1] - last_other[:-1] + np.where(last_other[:-1] < 0, slashes, 0)
            quote &= before % 2 == 0
            slashes = int(before[-1] + 1) if backslash[-1] else 0
        outside = (np.cumsum(quote, dtype=np.int64) + in_string) % 2 == 0
        outside &= ~quote
        step = ((c == 91) | (c == 123)).astype(np.int8)
        step -= (c == 93) | (c == 125)
        step *= outside
        level = np.cumsum(step, dtype=np.int64)
        level += depth
        if level.max(initial=0) > MAX_DEPTH + 2:
            raise InvalidArgument(f"JSON Parse error: the document is nested deeper than {MAX_DEPTH} levels")
        closed = np.flatnonzero(level <= 0)
        limit = closed[0] if closed.size else len(c)
        marks = np.flatnonzero(((c[:limit] == 44) | (c[:limit] == 58)) & outside[:limit] & (level[:limit] == 1))
        if last_only:
            if marks.size:
                found.append((at + int(marks[-1]), seen + marks.size))
        else:
            found += [(at + int(m), seen + i + 1) for i, m in enumerate(marks.tolist())]
        seen += marks.size
        if closed.size:
            return found, at + int(closed[0]) + 1
        depth, in_string = int(level[-1]), (int(np.count_nonzero(quote)) + in_string) % 2
    if stop is not None:
        return found, n
    raise InvalidArgument(f"JSON Parse error: an array or object opening at offset {start} is not closed")
