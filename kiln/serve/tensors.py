"""TF Serving's JSON tensor encoding (``util/json_tensor.cc``): requests in, responses out.

Requests come as ``instances`` (row format: one element per batch row, objects when there are
several inputs) or ``inputs`` (columnar: one value, or an object by input name). Strings go as
JSON strings or ``{"b64": ...}``. Responses mirror the request's format; the output name is left
out when there is exactly one output, and outputs whose name ends in ``_bytes`` come back as
``{"b64": ...}``. Floats are written as TF Serving writes them: the shortest text that reads back
as the same float32, NaN and (-)Infinity as bare words.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import math
import re
import struct
from operator import eq

import numpy as np

from ..runtime.served import TensorSpec
from .budget import CLAIM
from .jsonbody import MAX_DEPTH, Span, quoted
from .status import InvalidArgument

ROW, COLUMNAR = "row", "columnar"

_DT_NAMES = {
    np.dtype(np.float32): "DT_FLOAT", np.dtype(np.float64): "DT_DOUBLE", np.dtype(np.float16): "DT_HALF",
    np.dtype(np.int8): "DT_INT8", np.dtype(np.int16): "DT_INT16", np.dtype(np.int32): "DT_INT32",
    np.dtype(np.int64): "DT_INT64", np.dtype(np.uint8): "DT_UINT8", np.dtype(np.uint16): "DT_UINT16",
    np.dtype(np.uint32): "DT_UINT32", np.dtype(np.uint64): "DT_UINT64", np.dtype(np.bool_): "DT_BOOL",
    np.dtype(object): "DT_STRING", np.dtype(np.bytes_): "DT_STRING",
}


def shape_text(spec: TensorSpec) -> str:
    """A signature shape as TF Serving prints it: ``[-1,4]``, ``[?]`` for any rank."""
    return "[?]" if spec.shape is None else "[" + ",".join(str(d) for d in spec.shape) + "]"


def dtype_name(dtype) -> str:
    dtype = np.dtype(dtype)
    if dtype.kind in "OSU":
        return "DT_STRING"
    return _DT_NAMES.get(dtype, f"DT_INVALID({dtype.name})")


def _json_type(value) -> str:
    if value is None:
        return "Null"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (int, float)):
        return "Number"
    return {dict: "Object", list: "Array", str: "String"}.get(type(value), type(value).__name__)


def _is_b64(value) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


def _shape_of(value) -> list[int]:
    """The dense shape read down the first elements, as GetDenseTensorShape does."""
    shape = []
    while isinstance(value, list):
        shape.append(len(value))
        if not value:
            break
        value = value[0]
    if len(shape) > MAX_DEPTH:
        raise InvalidArgument(f"the request nests lists {len(shape)} deep; tensors have at most {MAX_DEPTH} dimensions")
    return shape


def _strings(value, name: str, offset: int = 0):
    """A nested list of str / {"b64"} leaves as a numpy object array of bytes."""
    def leaf(v):
        if isinstance(v, str):
            return v.encode("utf-8")
        if _is_b64(v):
            try:
                return base64.b64decode(v["b64"], validate=True)
            except (binascii.Error, ValueError):
                raise InvalidArgument(f"input '{name}': Unable to base64 decode {quoted(v)}") from None
        if isinstance(v, dict):
            raise InvalidArgument(f"input '{name}': JSON Value: {quoted(v)} not formatted correctly for base64 data")
        raise InvalidArgument(f"input '{name}': JSON Value: {quoted(v)} Type: {_json_type(v)} is not of "
                              f"expected type: DT_STRING")

    shape = _shape_of(value)
    flat: list = []

    def walk(v, level):
        if level == len(shape):
            if isinstance(v, list):
                raise InvalidArgument(f"input '{name}': the list is ragged: {_ragged_detail(value, offset)}")
            flat.append(leaf(v))
            return
        if not isinstance(v, list) or len(v) != shape[level]:
            raise InvalidArgument(f"input '{name}': the list is ragged: {_ragged_detail(value, offset)}")
        for x in v:
            walk(x, level + 1)

    walk(value, 0)
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(shape)


def _first_bad_leaf(value, accept, depth: int = 0):
    if depth > MAX_DEPTH:
        return (value,)
    if isinstance(value, list):
        for v in value:
            bad = _first_bad_leaf(v, accept, depth + 1)
            if bad is not None:
                return bad
        return None
    return None if accept(value) else (value,)


def _ragged_detail(value, offset: int = 0) -> str | None:
    """Where a nested list stops being rectangular (for the error message); None if it is rectangular.
    ``offset``: the index of its first element in the whole list (of which it is a run)."""
    expected = _shape_of(value)

    def walk(v, level, path):
        if level > MAX_DEPTH:
            return f"lists nested deeper than {MAX_DEPTH} at {path}"
        if level == len(expected):
            return None if not isinstance(v, list) else f"a list at {path or 'the top'} deeper than rank {level}"
        if not isinstance(v, list):
            return f"a value at {path or 'the top'} where a list of size {expected[level]} was expected"
        if len(v) != expected[level]:
            return f"a list of size {len(v)} at {path or 'the top'}, expected size {expected[level]}"
        for i, x in enumerate(v):
            found = walk(x, level + 1, f"{path}[{i + (offset if not level else 0)}]")
            if found:
                return found
        return None

    return walk(value, 0, "")


def to_array(value, spec: TensorSpec, may_hold_bools: bool = True, offset: int = 0) -> np.ndarray:
    """One JSON value as a numpy array of ``spec``'s dtype, with TF Serving's type rules.

    numpy reads ``[1, true]`` as numbers; when the request text may hold booleans
    (``may_hold_bools``), numeric inputs are scanned for them.
    """
    name, dtype = spec.name, spec.dtype
    if isinstance(value, Span):
        return _chunked(value, lambda items, at, bools: {name: to_array(items, spec, bools, at)}, None)[name]
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (Span, dict)) and not _is_b64(value[0]):
        return to_array(value[0], spec, may_hold_bools)[None]  # one large row of a large body
    if dtype.kind in "OSU":
        return _strings(value, name, offset)
    if len(_shape_of(value)) > MAX_DEPTH:  # refused before NumPy walks it
        raise InvalidArgument(f"input '{name}': lists nested deeper than {MAX_DEPTH}")
    try:
        arr = np.array(value)
    except (ValueError, TypeError):
        raise InvalidArgument(f"input '{name}': the list is ragged: {_ragged_detail(value, offset) or 'mixed nesting'}") from None
    kind = dtype.kind
    if arr.dtype == object:
        ragged = _ragged_detail(value, offset)
        if ragged:
            raise InvalidArgument(f"input '{name}': the list is ragged: {ragged}")
        bad = _first_bad_leaf(value, lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
                              and abs(v) <= 2 ** 63)
        shown = bad[0] if bad else value
        if isinstance(shown, int) and not isinstance(shown, bool):
            raise InvalidArgument(f"input '{name}': Cannot convert JSON value: {shown} to {dtype_name(spec.dtype)} without "
                                  f"loss of precision.")
        raise InvalidArgument(f"input '{name}': JSON Value: {quoted(shown)} Type: {_json_type(shown)} is not of "
                              f"expected type: {dtype_name(spec.dtype)}")

    def fail(accept):
        bad = _first_bad_leaf(value, accept)
        shown = bad[0] if bad else value
        raise InvalidArgument(f"input '{name}': JSON Value: {quoted(shown)} Type: {_json_type(shown)} is not "
                              f"of expected type: {dtype_name(spec.dtype)}")

    if kind in "iuf" and may_hold_bools and arr.dtype.kind != "b":
        if _first_bad_leaf(value, lambda v: not isinstance(v, bool)) is not None:
            fail(lambda v: not isinstance(v, bool))
    if kind == "f":
        if arr.dtype.kind not in "iuf":
            fail(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool))
        if arr.dtype.kind == "b":
            fail(lambda v: not isinstance(v, bool))
        if arr.dtype.kind in "iu" and arr.size:  # JSON integers: exact only up to the mantissa (IsLosslessDecimal)
            limit = (1 << np.finfo(dtype).nmant + 1) - 1
            big = arr.reshape(-1)[np.abs(arr.reshape(-1).astype(np.float64)) > limit]
            if big.size:
                raise InvalidArgument(f"input '{name}': Cannot convert JSON value: {int(big[0])} to {dtype.name} "
                                      f"without loss of precision.")
        with np.errstate(over="ignore"):
            out = arr.astype(dtype)
        if np.isfinite(out).all():  # the common case: nothing overflowed, one pass
            return out
        finite_in = np.isfinite(arr.astype(np.float64))
        if np.any(finite_in & ~np.isfinite(out)):
            big = arr[finite_in & ~np.isfinite(out)].reshape(-1)[0]
            raise InvalidArgument(f"input '{name}': Cannot convert JSON value: {float(big)!r} to {dtype.name} without "
                                  f"loss of precision.")
        return out
    if kind in "iu":
        if arr.dtype.kind not in "iu" or arr.dtype.kind == "b":
            fail(lambda v: isinstance(v, int) and not isinstance(v, bool))
        info = np.iinfo(dtype)
        if arr.size and (arr.min() < info.min or arr.max() > info.max):
            raise InvalidArgument(f"input '{name}': a value is out of the range of {dtype_name(spec.dtype)} "
                                  f"[{info.min}, {info.max}]")
        return arr.astype(dtype)
    if kind == "b":
        if arr.dtype.kind != "b":
            fail(lambda v: isinstance(v, bool))
        return arr
    raise InvalidArgument(f"input '{name}': inputs of type {dtype_name(spec.dtype)} cannot be given in JSON")


def _chunked(span: Span, convert, key: str | None) -> dict[str, np.ndarray]:
    """A large array value read a run of elements at a time (`Span.chunks`): ``convert(elements,
    offset, may hold bools)`` gives the run's arrays by input name, written at once into arrays of
    the whole length (allocated by the first run), so the elements' Python objects never outlive
    their run. Whether a run may hold booleans is looked up in its own text (not the body's)."""
    runs = list(span.chunks())
    total = sum(count for _, _, count in runs)
    out, at, text = {}, 0, span.view.obj
    for start, end, count in runs:
        bools = count > 1 and (text.find(b"true", start, end) >= 0 or text.find(b"false", start, end) >= 0)
        for name, part in convert(span.read(start, end, count), at, bools or count == 1).items():
            whole = out.get(name)
            if whole is None:
                shape = (total, *part.shape[1:])
                claim = CLAIM.get()
                if claim is not None:  # the worker's memory budget, before the allocation
                    claim(math.prod(shape) * (part.dtype.itemsize if part.dtype.kind != "O" else 64),
                          f"tensor with shape{list(shape)} and type {dtype_name(part.dtype)} for input '{name}'")
                whole = out[name] = np.empty(shape, part.dtype)
            elif part.shape[1:] != whole.shape[1:]:
                detail = f"Expecting shape {_fmt(whole.shape[1:])} but got: {_fmt(part.shape[1:])}"
                raise InvalidArgument(f"input '{name}': Failed to process element: {at} of '{key}' list. Error: {detail}"
                                      if key else f"input '{name}': the list is ragged: element {at}: {detail}")
            whole[at:at + count] = part
        at += count
    return out


def check_shape(arr: np.ndarray, spec: TensorSpec, what: str = "") -> None:
    """Rank and known dimensions must match the signature."""
    want = spec.shape
    if want is None:
        return
    if arr.ndim == len(want):
        for w, g in zip(want, arr.shape):
            if w != g and w >= 0:
                break
        else:
            return
    got = "[" + ",".join(str(d) for d in arr.shape) + "]"
    raise InvalidArgument(f"input '{spec.name}'{what}: expected shape {shape_text(spec)} "
                          f"({dtype_name(spec.dtype)}), got {got}")


def parse_request(body: dict, specs: dict[str, TensorSpec],
                  may_hold_bools: bool = True) -> tuple[dict[str, np.ndarray], str]:
    """``instances`` or ``inputs`` of a parsed request body as arrays by input name, and the format.

    ``may_hold_bools=False`` (the request text has no ``true``/``false``) skips a scan. Shapes
    are checked against the signature by `kiln.serve.backends.check_feeds`, for every API.
    """
    if not may_hold_bools and len(specs) == 1:
        plain = _plain_floats(body, specs)
        if plain is not None:
            return plain
    has_instances, has_inputs = "instances" in body, "inputs" in body
    if has_instances and has_inputs:
        raise InvalidArgument("Not formatted correctly expecting only one of 'inputs' or 'instances' keys to exist")
    if not has_instances and not has_inputs:
        raise InvalidArgument("Missing 'inputs' or 'instances' key")
    if has_instances:
        return _rows(body["instances"], specs, may_hold_bools), ROW
    return _columns(body["inputs"], specs, may_hold_bools), COLUMNAR


def _plain_floats(body: dict, specs: dict[str, TensorSpec]):
    """The common request in one NumPy call (see `plain_float_feed`), for a single float input."""
    (name, spec), = specs.items()
    if spec.dtype.kind != "f":
        return None
    return plain_float_feed(body, name, spec.dtype)


def plain_float_feed(body: dict, name: str, dtype: np.dtype):
    """({name: array}, format) for nested lists of numbers, at least one written as a float, for a
    float input of ``dtype``; None when the request is anything else or would fail, and the full
    path then decides (and words the error). Gives what the full path gives: a list that NumPy
    reads as float64 is rectangular and holds only numbers (no bools: the caller saw no
    ``true``/``false`` in the text), and the full path only casts it, refusing what overflows."""
    value = body.get("instances")
    if value is None or "inputs" in body:
        value = body.get("inputs")
        if value is None or "instances" in body:
            return None
        fmt = COLUMNAR
    else:
        fmt = ROW
    if value.__class__ is not list or not value or value[0].__class__ is not list:
        return None
    try:
        arr = _as_array(value)
    except (ValueError, TypeError, OverflowError):
        return None
    if arr.dtype != _FLOAT64 or not arr.size:
        return None
    largest = _LARGEST.get(dtype)
    if largest is None or not (_largest_of(arr, None) <= largest and _smallest_of(arr, None) >= -largest):
        # (NaN fails both)
        return None
    return {name: arr.astype(dtype)}, fmt


_as_array, _largest_of, _smallest_of, _FLOAT64 = np.array, np.maximum.reduce, np.minimum.reduce, np.dtype(np.float64)
#: The largest finite value of each float dtype: a float64 array within it casts without overflow.
_LARGEST = {np.dtype(t): float(np.finfo(t).max) for t in (np.float16, np.float32, np.float64)}


def _rows(instances, specs, may_hold_bools, offset: int = 0) -> dict[str, np.ndarray]:
    if isinstance(instances, Span):  # a large body's rows, read a run at a time
        kinds = []

        def run(rows, at, bools):
            kinds.append(isinstance(rows[0], dict) and not _is_b64(rows[0]))
            if kinds[-1] != kinds[0]:
                got, want = ("object", "value/list") if kinds[-1] else ("list", "object")
                raise InvalidArgument(f"Expecting {want} but got {got} at item {at} of input list")
            return _rows(rows, specs, bools, at)

        return _chunked(instances, run, "instances")
    if not isinstance(instances, list):
        raise InvalidArgument("Excepting 'instances' to be an list/array")
    if not instances:
        raise InvalidArgument("No values in 'instances' array")
    names = sorted(specs)
    objects = isinstance(instances[0], dict) and not _is_b64(instances[0])
    if not objects and len(specs) > 1:
        raise InvalidArgument("instances is a plain list, but expecting list of objects as multiple input "
                              f"tensors required as per tensorinfo_map (inputs: {', '.join(names)})")
    if not objects:
        try:  # rows of one input: read at once when they are well formed (the loop below words the errors)
            return {names[0]: to_array(instances, specs[names[0]], may_hold_bools, offset)}
        except InvalidArgument:
            pass
    per_input: dict[str, list] = {n: [] for n in (names if objects else names[:1])}
    for i, item in enumerate(instances):
        is_object = isinstance(item, dict) and not _is_b64(item)
        if objects != is_object:
            got, want = ("object", "value/list") if is_object else ("list", "object")
            raise InvalidArgument(f"Expecting {want} but got {got} at item {i + offset} of input list")
        if objects:
            if set(item) != set(names):
                unknown = sorted(set(item) - set(names))
                detail = (f"does not have named input: {unknown[0]}" if unknown
                          else f"keys must be equal to: {','.join(names)}")
                raise InvalidArgument(f"Failed to process element: {i + offset} of 'instances' list. JSON object: "
                                      f"{detail}")
            for n in names:
                per_input[n].append(item[n])
        else:
            per_input[names[0]].append(item)
    out = {}
    for n, items in per_input.items():
        spec = specs[n]
        first = _shape_of(items[0])
        for i, item in enumerate(items):
            if _shape_of(item) != first:
                raise InvalidArgument(f"input '{n}': Failed to process element: {i + offset} of 'instances' list. Error: "
                                      f"Expecting shape {_fmt(first)} but got: {_fmt(_shape_of(item))}")
        out[n] = to_array(items, spec, may_hold_bools)
    return out


def _fmt(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _columns(inputs, specs, may_hold_bools) -> dict[str, np.ndarray]:
    names = sorted(specs)
    if isinstance(inputs, Span) or not isinstance(inputs, dict) or _is_b64(inputs):
        if len(specs) > 1:
            raise InvalidArgument("inputs is a plain value/list, but expecting an object as multiple input tensors "
                                  f"required as per tensorinfo_map (inputs: {', '.join(names)})")
        inputs = {names[0]: inputs}
    out = {}
    for n in names:
        if n not in inputs:
            raise InvalidArgument(f"Missing named input: {n} in 'inputs' object.")
        out[n] = to_array(inputs[n], specs[n], may_hold_bools)
    unknown = sorted(set(inputs) - set(names))
    if unknown:
        raise InvalidArgument(f"'inputs' object has unknown input(s) {unknown}; the signature's inputs are {names}")
    return out


# -- responses ---------------------------------------------------------------------------------

_F32 = struct.Struct("<f")


def _float_texts(flat: np.ndarray) -> list[str]:
    """TF Serving's WriteDecimal: "%g" if it reads back exactly, else max_digits10 digits; '.0' on whole numbers;
    NaN and (-)Infinity as bare words (see `_float_joined`)."""
    texts = _float_joined(flat).split(",")
    texts.pop()
    return texts


def _float_joined(flat: np.ndarray) -> str:
    """The texts of `_float_texts`, each followed by a comma. All values at once, without a Python step per
    value: one `%` operation per precision, one read-back (rounded to float32 as the value was, in one
    `struct` pack), the texts picked by C-level comparisons, '.0' added by one regular-expression pass where
    some text is a whole number (found by deleting digits and signs: its text becomes empty)."""
    single = flat.dtype == np.float32
    every = tuple(flat.tolist())
    count = len(every)
    if not count:
        return ""
    joined = ("%g," * count) % every
    short = joined[:-1].split(",")
    try:
        if single:
            packing = _f32s(count)
            back = packing.unpack(packing.pack(*map(float, short)))
        else:
            back = tuple(map(float, short))
    except OverflowError:  # a short text past float32's range: the one-value rule decides
        return ",".join([_float_text(v, single) for v in every]) + ","
    if back != every:  # (a NaN never compares equal: it takes the longer text, the same word)
        longer = (("%.9g," if single else "%.17g,") * count) % every
        if any(map(eq, back, every)):
            # (longer, short)[read back exactly]: the short text where it reads back, else the longer one
            joined = ",".join(map(tuple.__getitem__, zip(longer[:-1].split(","), short), map(eq, back, every))) + ","
        else:
            joined = longer
    if "n" in joined:  # nan or inf: the words, one value at a time
        texts = joined.split(",")
        return ",".join([t if "." in t or "e" in t else (t + ".0" if "n" not in t else _float_text(float(t), single))
                         for t in texts[:count]]) + ","
    stripped = joined.encode().translate(None, b"0123456789-")
    if stripped[:1] == b"," or b",," in stripped:
        return _WHOLE.sub(_point_zero, joined)
    return joined


@functools.lru_cache(maxsize=64)
def _f32s(count: int) -> struct.Struct:
    """The packing of ``count`` float32s (made once per count: most answers have the same few lengths)."""
    return struct.Struct(f"={count}f")


#: A text of `_float_texts` that is a whole number (no '.', no exponent).
_WHOLE = re.compile(r"(?<![^,])-?[0-9]+(?=,)")


def _point_zero(match: re.Match) -> str:
    """(A function, not a template: ``re.sub`` with a template runs Python code on every call.)"""
    return match[0] + ".0"


def _float_text(value: float, single: bool) -> str:
    """One value's text (see `_float_texts`), NaN and (-)Infinity as bare words."""
    if value != value:
        return "NaN"
    if value in (math.inf, -math.inf):
        return "-Infinity" if value < 0 else "Infinity"
    text = "%g" % value
    try:
        exact = (_F32.unpack(_F32.pack(float(text)))[0] if single else float(text)) == value
    except OverflowError:
        exact = False
    if not exact:
        text = "%.*g" % (9 if single else 17, value)
    if "." not in text and "e" not in text:
        text += ".0"
    return text


def _leaf_texts(arr: np.ndarray, as_bytes: bool) -> list[str]:
    flat = arr.reshape(-1)
    kind = arr.dtype.kind
    if kind == "f":
        return _float_texts(flat if arr.dtype != np.float16 else flat.astype(np.float32))
    if kind == "b":
        return ["true" if v else "false" for v in flat.tolist()]
    if kind in "iu":
        return [str(v) for v in flat.tolist()]
    if kind in "OSU":
        out = []
        for v in flat.tolist():
            data = v.encode("utf-8") if isinstance(v, str) else bytes(v)
            if as_bytes:
                out.append('{"b64": "' + base64.b64encode(data).decode("ascii") + '"}')
            else:
                out.append(json.dumps(data.decode("utf-8", errors="replace")))
        return out
    raise InvalidArgument(f"Failed to write JSON value for tensor type: {arr.dtype.name}")


def _nest(texts: list[str], shape: tuple, start: int = 0) -> str:
    if not shape:
        return texts[start]
    if len(shape) == 1:
        return "[" + ", ".join(texts[start:start + shape[0]]) + "]"
    step = int(np.prod(shape[1:], dtype=np.int64))
    return "[" + ", ".join(_nest(texts, shape[1:], start + i * step) for i in range(shape[0])) + "]"


def _is_bytes_output(name: str, arr: np.ndarray) -> bool:
    return arr.dtype.kind in "OSU" and name.endswith("_bytes")


#: Rows written per piece of a response: a large answer never exists as one Python string per value.
_ROWS_PER_PIECE = 2048


def _row_texts(a: np.ndarray, as_bytes: bool, start: int, stop: int) -> list[str]:
    """The JSON text of rows ``start:stop`` of ``a`` (one string per row)."""
    part = a[start:stop]
    texts = _leaf_texts(part, as_bytes)
    if part.ndim == 2:
        width = part.shape[1]
        return ["[" + ", ".join(texts[i * width:(i + 1) * width]) + "]" for i in range(part.shape[0])]
    step = int(np.prod(a.shape[1:], dtype=np.int64))
    return [_nest(texts, a.shape[1:], i * step) for i in range(part.shape[0])]


def _pieces(a: np.ndarray, as_bytes: bool, rows: int):
    """Row texts of ``a`` in pieces of ``rows`` rows (at least one element per piece)."""
    for start in range(0, a.shape[0], rows):
        yield _row_texts(a, as_bytes, start, start + rows)


def format_response(outputs: dict[str, np.ndarray], fmt: str) -> bytes:
    """The JSON text TF Serving answers for these outputs in the request's format."""
    pieces = answer_pieces(outputs, fmt)
    return pieces if pieces.__class__ is bytes else b"".join(pieces)


def answer_pieces(outputs: dict[str, np.ndarray], fmt: str) -> bytes | list[bytes]:
    """`format_response`'s text, a large one as the pieces it is written in, a few thousand rows
    each: sent as they are, never joined (a join would copy the whole answer in one call that
    holds the interpreter)."""
    if not outputs:
        raise InvalidArgument("Cannot convert empty tensor map to JSON")
    if len(outputs) == 1:  # the common answer, one 2-D float output: the texts joined directly
        for a in outputs.values():
            break
        if a.__class__ is np.ndarray and a.ndim == 2 and a.dtype.kind == "f" and a.size <= _ROWS_PER_PIECE * 16:
            flat = a.reshape(-1) if a.dtype != np.float16 else a.reshape(-1).astype(np.float32)
            if a.shape[0] == 1:  # (texts hold no commas)
                rows = "[" + _float_joined(flat)[:-1].replace(",", ", ") + "]"
            else:
                width = a.shape[1]
                texts = _float_texts(flat)
                rows = ", ".join(["[" + ", ".join(texts[i:i + width]) + "]" for i in range(0, width * a.shape[0], width)]
                                 if width else ["[]"] * a.shape[0])
            return (('{"predictions": [' if fmt != COLUMNAR else '{"outputs": [') + rows + "]}").encode()
    names = sorted(outputs)
    arrays = {n: np.asarray(outputs[n]) for n in names}
    out: list[bytes] = []
    if fmt == COLUMNAR:
        out.append(b'{"outputs": ' if len(names) == 1 else b'{"outputs": {')
        for k, n in enumerate(names):
            a = arrays[n]
            if len(names) > 1:
                out.append((", " if k else "").encode() + json.dumps(n).encode() + b": ")
            if a.ndim == 0:
                out.append(_leaf_texts(a, _is_bytes_output(n, a))[0].encode())
                continue
            rows = max(1, _ROWS_PER_PIECE * 16 // max(int(np.prod(a.shape[1:], dtype=np.int64)), 1))
            out.append(b"[")
            for i, piece in enumerate(_pieces(a, _is_bytes_output(n, a), rows)):
                out.append(((", " if i else "") + ", ".join(piece)).encode())
            out.append(b"]")
        out.append(b"}" if len(names) == 1 else b"}}")
        return out
    batch = None
    for n, a in arrays.items():
        if a.ndim == 0:
            raise InvalidArgument(f"Tensor name: {n} has no shape information ")
        if batch is not None and a.shape[0] != batch:
            raise InvalidArgument(f"Tensor name: {n} has inconsistent batch size: {a.shape[0]} expecting: {batch}")
        batch = a.shape[0]
    out.append((b'{"predictions": ['))
    width = max(sum(int(np.prod(a.shape[1:], dtype=np.int64)) for a in arrays.values()), 1)
    rows = max(1, _ROWS_PER_PIECE * 16 // width)
    keys = {n: json.dumps(n) + ": " for n in names}
    for start in range(0, batch, rows):
        texts = {n: _row_texts(a, _is_bytes_output(n, a), start, start + rows) for n, a in arrays.items()}
        if len(names) == 1:
            items = texts[names[0]]
        else:
            items = ["{" + ", ".join(keys[n] + texts[n][i] for n in names) + "}" for i in range(len(texts[names[0]]))]
        out.append((((", " if start else "") + ", ".join(items)).encode()))
    out.append((b"]}"))
    return out
