"""Request bodies to JSON documents, with numeric arrays read straight into NumPy.

A JSON reader builds a Python object per number (32 bytes or more for a float whose text
took ~10), so a 60 MiB body of numbers would take gigabytes. Here a large body's numeric
arrays — maximal runs of numbers, brackets and commas outside strings — are validated and
parsed in fixed-size chunks with NumPy (each number's text checked against JSON's grammar,
the brackets against a rectangular shape) into one float64 array each, and only the rest
of the document (keys, strings, small values) goes to the JSON reader; `NumericArray` stands
in for each array. What a decoded body may cost is bounded: the JSON reader is only given
documents whose count of values is small for their size, nesting is limited, integers may
not have more than `MAX_INT_DIGITS` digits and numbers must fit a double (TF Serving: "Number
too big to be stored in double"). Small bodies take the plain reader (orjson; ``json`` for
what orjson refuses), which is faster for them.
"""

from __future__ import annotations

import json
import math
import os
import re

import numpy as np

from .status import InvalidArgument

try:  # the fast JSON reader of the serve extra; json alone gives the same answers, slower
    import orjson
except ImportError:  # pragma: no cover - orjson is in the serve extra
    orjson = None

#: Bodies from this size on have their numeric arrays read by NumPy.
FAST_BODY_BYTES = 256 << 10
#: A numeric array this long (in characters) is worth reading by NumPy.
FAST_ARRAY_CHARS = 256
#: Largest document (after numeric arrays are taken out) the JSON reader gets in any case; past it,
#: only documents with at most one value per `BYTES_PER_VALUE` bytes.
READER_FREE_BYTES = 1 << 20
BYTES_PER_VALUE = 64
MAX_INT_DIGITS = 1000
MAX_DEPTH = 64  # deeper nesting than any tensor has dimensions (NumPy allows 64)
CHUNK = 256 << 10

_DIGITS_ONLY = bytes(48 if 48 <= i <= 57 else 32 for i in range(256))  # digits kept, the rest blanked
_RUN = re.compile(rb"\[[0-9eE+\-. \t\n\r\[\],NaIfinty]{%d,}" % (FAST_ARRAY_CHARS - 1))
_ESCAPED_QUOTES = re.compile(rb'(\\+)"')
_TO_SPACE = bytes.maketrans(b"[]", b"  ")

# character classes of numeric-array text
_BAD, _DIGIT, _MINUS, _PLUS, _DOT, _EXP, _SPACE, _OPEN, _CLOSE, _COMMA, _LETTER = range(11)
_CLASS = np.zeros(256, np.uint8)
_CLASS[list(b"0123456789")] = _DIGIT
_CLASS[ord("-")], _CLASS[ord("+")], _CLASS[ord(".")] = _MINUS, _PLUS, _DOT
_CLASS[list(b"eE")] = _EXP
_CLASS[list(b" \t\n\r")] = _SPACE
_CLASS[ord("[")], _CLASS[ord("]")], _CLASS[ord(",")] = _OPEN, _CLOSE, _COMMA
_CLASS[list(b"NaIfinty")] = _LETTER


class NumericArray:
    """A rectangular JSON array of numbers, read as float64 ``values`` of the array's shape.

    ``float_syntax``: some number was written with a fraction or exponent (or as NaN or
    Infinity); ``int_mask``: which numbers were written as integers, when some were and some
    were not (None: all alike); ``first_token`` and ``first_float_token``: the text of the first
    number and of the first one with float syntax (for error messages).
    """

    __slots__ = ("values", "float_syntax", "int_mask", "first_token", "first_float_token")

    def __init__(self, values: np.ndarray, float_syntax: bool, first_token: str | None, first_float: str | None,
                 int_mask: np.ndarray | None = None):
        self.values = values
        self.float_syntax = float_syntax
        self.int_mask = int_mask
        self.first_token = first_token
        self.first_float_token = first_float

    def written_as_int(self) -> np.ndarray | bool:
        """Per value (flat) or for all: written without fraction or exponent."""
        return self.int_mask if self.int_mask is not None else not self.float_syntax

    @property
    def shape(self) -> tuple:
        return self.values.shape

    def tolist(self):
        """Python numbers as the JSON reader would give them (ints where written as ints)."""
        if not self.float_syntax and np.all(np.abs(self.values) <= 2 ** 53):
            return self.values.astype(np.int64).tolist()
        return self.values.tolist()


def parse_body(body) -> dict:
    """The request document; numeric arrays of large bodies as `NumericArray`."""
    if len(body) >= FAST_BODY_BYTES:
        if not bytes(body[:4096]).strip() and not bytes(body).strip():
            raise InvalidArgument("JSON Parse error: The document is empty")
        doc = _parse_large(body)
    else:
        text = bytes(body)
        try:
            doc = parse_text(text)
        except InvalidArgument:
            if not text.strip():
                raise InvalidArgument("JSON Parse error: The document is empty") from None
            raise
    if not isinstance(doc, dict):
        shown = json.dumps(doc, default=lambda o: f"[{o.first_token}, ...]")[:120]
        raise InvalidArgument(f"JSON Value: {shown} Is not object")
    return doc


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
    if orjson is not None and b"0" * 19 not in text.translate(_DIGITS_ONLY):
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

def _inside_string(body, position: int) -> bool:
    quotes = body.count(b'"', 0, position)
    if body.find(b"\\", 0, position) >= 0:
        quotes -= sum(1 for m in _ESCAPED_QUOTES.finditer(body, 0, position) if len(m.group(1)) % 2)
    return quotes % 2 == 1


def _parse_large(body) -> dict:
    view = memoryview(body)
    nonce = os.urandom(6).hex()
    pieces, arrays, last = [], [], 0
    for match in _RUN.finditer(body):
        start = match.start()
        if start < last or _inside_string(body, start):
            continue
        end = _array_end(view[start:match.end()])
        if end is None:
            continue
        array = read_numeric(view[start:start + end])
        if array is None:
            continue
        pieces += [bytes(view[last:start]), b'"\\u0000kiln%s:%d"' % (nonce.encode(), len(arrays))]
        arrays.append(array)
        last = start + end
    if not arrays:
        return _parse_read_limited(bytes(body))
    pieces.append(bytes(view[last:]))
    doc = _parse_read_limited(b"".join(pieces))
    marker = f"\x00kiln{nonce}:"
    return _put_back(doc, marker, arrays, 0)


def _parse_read_limited(text: bytes):
    if len(text) > READER_FREE_BYTES:
        values = text.count(b",") + text.count(b":") + 1
        if values * BYTES_PER_VALUE > len(text):
            raise InvalidArgument(
                f"the request body holds about {values} JSON values besides plain numeric arrays; a body over "
                f"{READER_FREE_BYTES >> 20} MiB may hold at most one per {BYTES_PER_VALUE} bytes (send numbers "
                "as nested arrays of numbers, or fewer, longer strings)")
    return parse_text(text)


def _put_back(value, marker: str, arrays: list, depth: int):
    if depth > MAX_DEPTH:
        raise InvalidArgument(f"JSON Parse error: the document is nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, str) and value.startswith(marker):
        return arrays[int(value[len(marker):])]
    if isinstance(value, dict):
        return {k: _put_back(v, marker, arrays, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_put_back(v, marker, arrays, depth + 1) for v in value]
    return value


def _array_end(run: memoryview) -> int | None:
    """Length of the bracketed array ``run`` starts with (None: it does not close within ``run``)."""
    depth = 0
    for offset in range(0, len(run), CHUNK):
        c = np.frombuffer(run[offset:offset + CHUNK], np.uint8)
        step = (c == 91).astype(np.int8) - (c == 93).astype(np.int8)
        level = np.cumsum(step, dtype=np.int64) + depth
        if level.max(initial=0) > MAX_DEPTH:
            return None
        closed = np.flatnonzero(level == 0)
        if closed.size:
            return offset + int(closed[0]) + 1
        depth = int(level[-1])
    return None


def read_numeric(region: memoryview) -> NumericArray | None:
    """``region`` (``[`` ... ``]``) as a `NumericArray`, or None when it is not a rectangular array of
    JSON numbers (the JSON reader then decides). Raises for a number beyond a double's range."""
    n = len(region)
    skeleton, chunks, int_parts, letters, words, float_chars = [], [], [], 0, 0, 0
    first_token = first_float = None
    prev_class = (_SPACE, _SPACE)
    start = 0
    while start < n:
        stop = min(start + CHUNK, n)
        if stop < n:  # end the chunk after a comma, so no number is cut in two
            cut = bytes(region[start:stop]).rfind(b",")
            if cut <= 0:
                return None  # a number of a quarter megabyte: not for this reader
            stop = start + cut + 1
        text = bytes(region[start:stop])
        cls = _CLASS[np.frombuffer(text, np.uint8)]
        nxt = np.empty_like(cls)
        nxt[:-1] = cls[1:]
        nxt[-1] = _CLASS[region[stop]] if stop < n else _SPACE
        prv = np.empty_like(cls)
        prv[0] = prev_class[1]
        prv[1:] = cls[:-1]
        prv2 = np.empty_like(cls)  # two characters back
        prv2[0] = prev_class[0]
        prv2[1:] = prv[:-1]
        prev_class = (cls[-2] if len(cls) > 1 else prev_class[1], cls[-1])
        sep = cls >= _SPACE
        sep &= cls != _LETTER
        prev_sep = (prv >= _SPACE) & (prv != _LETTER)
        digit_next = nxt == _DIGIT
        bad = cls == _BAD
        bad |= (cls == _PLUS) & ~((prv == _EXP) & digit_next)
        bad |= (cls == _MINUS) & ~((prev_sep | (prv == _EXP)) & (digit_next | (nxt == _LETTER)))
        bad |= (cls == _DOT) & ~((prv == _DIGIT) & digit_next)
        bad |= (cls == _EXP) & ~((prv == _DIGIT) & (digit_next | (nxt == _PLUS) | (nxt == _MINUS)))
        after_sign = (prv == _MINUS) & (prv2 >= _SPACE) & (prv2 != _LETTER)  # "-" opening a number
        bad |= (cls == _DIGIT) & (np.frombuffer(text, np.uint8) == 48) & (prev_sep | after_sign) & digit_next
        if bad.any():
            return None
        starts = ~sep & prev_sep
        keep = starts | (cls >= _OPEN) & (cls <= _COMMA)
        raw = np.frombuffer(text, np.uint8)
        skeleton.append(np.where(starts, np.uint8(48), raw)[keep].tobytes())
        count = int(np.count_nonzero(starts))
        chunk_letters = int(np.count_nonzero(cls == _LETTER))
        if chunk_letters:
            nans, infs = text.count(b"NaN"), text.count(b"Infinity")
            if chunk_letters != 3 * nans + 8 * infs:
                return None
            letters += chunk_letters
            words += nans + infs
        floaty = (cls == _DOT) | (cls == _EXP) | (cls == _LETTER)
        dots = int(np.count_nonzero(floaty))
        if dots and first_float is None:
            first_float = _token_at(text, int(np.flatnonzero(floaty)[0]))
        float_chars += dots
        if count and first_token is None:
            first_token = _token_at(text, int(np.flatnonzero(starts)[0]))
        if count:
            try:
                values = np.fromstring(text.translate(_TO_SPACE), dtype=np.float64, sep=",")
            except ValueError:
                return None
            if values.size != count:
                return None
            chunks.append(values)
            written_int = np.ones(count, bool)
            if dots:
                written_int[np.cumsum(starts)[floaty] - 1] = False
            int_parts.append(written_int)
        start = stop
    shape = _shape_of_skeleton(b"".join(skeleton))
    if shape is None:
        return None
    values = np.concatenate(chunks) if len(chunks) > 1 else (chunks[0] if chunks else np.zeros(0))
    if not np.isfinite(values).all() and int(np.count_nonzero(~np.isfinite(values))) != words:
        raise InvalidArgument("JSON Parse error: Number too big to be stored in double")
    int_mask = None
    if float_chars and int_parts:
        int_mask = np.concatenate(int_parts)
        if not int_mask.any():
            int_mask = None
    return NumericArray(values.reshape(shape), bool(float_chars), first_token, first_float, int_mask)


def _shape_of_skeleton(s: bytes) -> tuple | None:
    """The shape of a rectangular array from its skeleton (numbers as ``0``), or None."""
    rank = len(s) - len(s.lstrip(b"["))
    if rank == 0 or rank > MAX_DEPTH:
        return None
    dims = [0] * rank
    end = s.find(b"]", rank - 1)
    if end < 0:
        return None
    content = s[rank:end]
    dims[-1] = len(content.split(b",")) if content else 0
    child = end - (rank - 1) + 1
    for level in range(rank - 2, -1, -1):
        close = s.find(b"]" * (rank - level), level)
        if close < 0:
            return None
        span = close + (rank - level) - level
        inner = span - 2
        dims[level] = (inner + 1) // (child + 1) if inner > 0 else 0
        child = span
    expected = b"0"
    for d in reversed(dims):
        expected = b"[" + b",".join([expected] * d) + b"]"
    return tuple(dims) if expected == s else None


def _token_at(text: bytes, at: int) -> str:
    seps = b" \t\n\r[],"
    begin = at
    while begin > 0 and text[begin - 1] not in seps:
        begin -= 1
    end = at
    while end < len(text) and text[end] not in seps:
        end += 1
    return text[begin:end].decode("ascii", "replace")
