"""Representative datasets from files, without TensorFlow: TFRecords, ``.npz``, Python iterables.

TensorFlow's ``TfRecordRepresentativeDatasetSaver`` writes one TFRecord file per signature; each
record is a serialized ``tensorflow.quantization.RepresentativeDataSample`` (field 2:
``map<string, TensorProto> tensor_proto_inputs``). The TFRecord framing (u64 length, masked
CRC32C of the length, payload, masked CRC32C of the payload) and the few protobuf messages are
decoded here with their CRCs checked, so ``kiln quantize --data X.tfrecord`` works without
TensorFlow and a damaged file is named with the record where it breaks.
"""

from __future__ import annotations

import os
import struct
import warnings
import zipfile
from typing import Any, Iterable, Iterator, Sized

import numpy as np

from ..paths import read_npy as read_npy_file
from .calibrate import DatasetError

#: The files a representative dataset may be, as errors list them.
FORMATS = ("kiln reads .npz (one array per input name), .npy (the one input of a single-input model) and "
           "TFRecord files of TF's RepresentativeDataSample, one sample per row or record")

#: Fewer samples than this draws a warning (the Cloud TPU inference converter's guide asks for
#: at least 200 representative samples when calibrating static-range quantization).
MIN_SAMPLES = 200
ADVICE = ("the Cloud TPU inference converter's guide recommends at least 200 representative samples for "
          "quantization; with fewer, calibration ranges may miss values seen in serving and clip them")


# -- CRC32C (Castagnoli), as TFRecord uses it ------------------------------------------------

def _crc_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    table = _TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecords(path) -> Iterator[bytes]:
    """The payloads of a TFRecord file, each frame's two CRCs verified."""
    path = os.fspath(path)
    try:
        handle = open(path, "rb")
    except OSError as exc:
        raise DatasetError(f"representative dataset {path!r} cannot be opened: {exc.strerror}") from None
    with handle:
        index = 0
        while True:
            head = handle.read(12)
            if not head:
                return
            if len(head) < 12:
                raise DatasetError(f"{path!r}, record {index}: truncated (the file ends inside a record header)"
                                   + (f"; not a TFRecord file? {FORMATS}" if index == 0 else ""))
            length, length_crc = struct.unpack("<QI", head)
            if masked_crc(head[:8]) != length_crc:
                raise DatasetError(f"{path!r}, record {index}: corrupt length (CRC mismatch); "
                                   f"not a TFRecord file, or damaged" + (f"; {FORMATS}" if index == 0 else ""))
            data = handle.read(length)
            tail = handle.read(4)
            if len(data) < length or len(tail) < 4:
                raise DatasetError(f"{path!r}, record {index}: truncated (the record holds {length} bytes, "
                                   f"the file ends after {len(data)})")
            if masked_crc(data) != struct.unpack("<I", tail)[0]:
                raise DatasetError(f"{path!r}, record {index}: corrupt data (CRC mismatch)")
            yield data
            index += 1


# -- protobuf wire format: RepresentativeDataSample / TensorProto ----------------------------

class _WireError(ValueError):
    pass


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise _WireError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise _WireError("varint too long")


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of one message; LEN values are bytes."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise _WireError("field number 0")
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + size], pos + size
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise _WireError(f"unsupported wire type {wire}")
        if pos > len(buf):
            raise _WireError("truncated field")
        yield number, wire, value


# DataType enum -> numpy dtype, and the TensorProto repeated field holding each type's values.
_DTYPES = {1: np.float32, 2: np.float64, 3: np.int32, 4: np.uint8, 5: np.int16, 6: np.int8, 7: np.object_,
           9: np.int64, 10: np.bool_, 17: np.uint16, 19: np.float16, 22: np.uint32, 23: np.uint64}
_VALUE_FIELD = {1: 5, 2: 6, 3: 7, 4: 7, 5: 7, 6: 7, 17: 7, 19: 13, 9: 10, 10: 11, 22: 16, 23: 17, 7: 8}
_PACKED = {5: "<f4", 6: "<f8", 13: None, 7: None, 10: None, 11: None, 16: None, 17: None}


def _shape(buf: bytes) -> list[int]:
    dims = []
    for number, wire, value in _fields(buf):
        if number == 2 and wire == 2:
            size = 0
            for n, w, v in _fields(value):
                if n == 1 and w == 0:
                    size = v - (1 << 64) if v >= 1 << 63 else v
            dims.append(size)
        elif number == 3 and wire == 0 and value:
            raise _WireError("tensor shape of unknown rank")
    if any(d < 0 for d in dims):
        raise _WireError(f"tensor shape {dims} is not fully defined")
    return dims


def tensor_from_proto(buf: bytes) -> np.ndarray:
    """A serialized ``tensorflow.TensorProto`` as a numpy array."""
    dtype_enum, dims, content, ints, raw = 0, [], None, [], []
    field_of_values = None
    for number, wire, value in _fields(buf):
        if number == 1 and wire == 0:
            dtype_enum = value
            field_of_values = _VALUE_FIELD.get(value)
        elif number == 2 and wire == 2:
            dims = _shape(value)
        elif number == 4 and wire == 2:
            content = value
        elif number >= 5:
            raw.append((number, wire, value))
    if dtype_enum not in _DTYPES:
        raise _WireError(f"unsupported tensor dtype enum {dtype_enum}")
    dtype = np.dtype(_DTYPES[dtype_enum])
    count = int(np.prod(dims, dtype=np.int64))
    if content is not None and dtype != np.object_:
        if len(content) != count * dtype.itemsize:
            raise _WireError(f"tensor_content holds {len(content)} bytes, shape {dims} of {dtype} needs "
                             f"{count * dtype.itemsize}")
        return np.frombuffer(content, dtype=dtype.newbyteorder("<")).astype(dtype).reshape(dims)
    for number, wire, value in raw:
        if number != field_of_values:
            continue
        if dtype == np.object_:
            ints.append(bytes(value))
        elif wire == 2 and _PACKED.get(number):
            ints.extend(np.frombuffer(value, dtype=_PACKED[number]).tolist())
        elif wire == 2:
            pos = 0
            while pos < len(value):
                v, pos = _varint(value, pos)
                ints.append(v)
        elif wire == 5:
            ints.append(struct.unpack("<f", value)[0])
        elif wire == 1:
            ints.append(struct.unpack("<d", value)[0])
        else:
            ints.append(value)
    if dtype == np.float16:  # half_val holds the float16 bit patterns as ints
        values = np.array(ints, dtype=np.uint16).view(np.float16)
    elif dtype.kind in "iu" and ints:
        values = np.array([v - (1 << 64) if v >= 1 << 63 else v for v in ints], dtype=np.int64).astype(dtype)
    else:
        values = np.array(ints, dtype=dtype)
    if values.size == count:
        return values.reshape(dims)
    if values.size == 1 and count:  # a splat: one value stands for all
        return np.full(dims, values[0], dtype=dtype)
    if values.size == 0:
        return np.zeros(dims, dtype=dtype)
    raise _WireError(f"tensor holds {values.size} values, shape {dims} needs {count}")


def parse_sample(buf: bytes) -> dict[str, np.ndarray]:
    """A serialized RepresentativeDataSample as {input name: array}."""
    sample = {}
    for number, wire, value in _fields(buf):
        if number != 2 or wire != 2:
            raise _WireError(f"unexpected field {number} (wire type {wire}); a RepresentativeDataSample has "
                             f"only tensor_proto_inputs (field 2)")
        key, tensor = None, None
        for n, w, v in _fields(value):
            if n == 1 and w == 2:
                key = bytes(v).decode("utf-8")
            elif n == 2 and w == 2:
                tensor = v
        if key is None or tensor is None:
            raise _WireError("a tensor_proto_inputs entry without a key or a value")
        sample[key] = tensor_from_proto(tensor)
    if not sample:
        raise _WireError("an empty sample (no tensor_proto_inputs)")
    return sample


def read_tfrecord(path) -> Iterator[dict[str, np.ndarray]]:
    """Samples ({input name: array}) of a TFRecord of RepresentativeDataSample records."""
    for index, record in enumerate(tfrecords(path)):
        try:
            yield parse_sample(record)
        except (_WireError, UnicodeDecodeError, ValueError) as exc:
            raise DatasetError(f"{os.fspath(path)!r}, record {index}: not a RepresentativeDataSample "
                               f"({exc})") from None


def read_npz(path) -> Iterator[dict[str, np.ndarray]]:
    """Samples of an ``.npz`` whose arrays, keyed by input name, hold one sample per leading index."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise DatasetError(f"representative dataset {path!r} does not exist")
    try:
        data = np.load(path, allow_pickle=False)
        arrays = {name: data[name] for name in data.files}
    except (OSError, ValueError, EOFError) as exc:
        raise DatasetError(f"representative dataset {path!r} cannot be read as .npz: {exc}") from None
    if not arrays:
        raise DatasetError(f"representative dataset {path!r} holds no arrays")
    counts = {name: (len(a) if a.ndim else -1) for name, a in arrays.items()}
    if len(set(counts.values())) != 1 or -1 in counts.values():
        raise DatasetError(f"representative dataset {path!r}: every array needs the same leading sample "
                           f"count, got {counts}")
    for i in range(next(iter(counts.values()))):
        yield {name: a[i:i + 1] for name, a in arrays.items()}


def read_npy(path) -> Iterator[np.ndarray]:
    """Samples of a single-input model from an ``.npy`` array, one sample per leading index."""
    array = read_npy_file(path, "representative dataset")
    if array.ndim == 0:
        raise DatasetError(f"representative dataset {os.fspath(path)!r}: a scalar; the first axis must count "
                           "the samples")
    for i in range(len(array)):
        yield array[i:i + 1]


def _rows(f) -> int | None:
    """The leading dimension in the header of the .npy array open in ``f``."""
    major, _ = np.lib.format.read_magic(f)
    read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
    shape = read_header(f)[0]
    return int(shape[0]) if shape else None


def sample_count(source) -> int | None:
    """How many samples ``source`` holds, where that is known without reading them: a sized
    collection's length, an .npz's or .npy's leading dimension (from an array header); else None."""
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        try:
            if path.endswith(".npy"):
                with open(path, "rb") as f:
                    return _rows(f)
            if not path.endswith(".npz"):
                return None
            with zipfile.ZipFile(path) as archive:
                name = next((n for n in archive.namelist() if n.endswith(".npy")), None)
                if name is None:
                    return None
                with archive.open(name) as f:
                    return _rows(f)
        except (OSError, ValueError, zipfile.BadZipFile):  # read() reports what is wrong with it
            return None
    if isinstance(source, Sized) and not isinstance(source, (dict, bytes)):
        return len(source)
    return None


def read(source) -> Iterator[dict[str, np.ndarray]]:
    """Samples from an ``.npz`` path, an ``.npy`` path (arrays, for a single-input model), a
    TFRecord path (any other name, as TF's dataset saver names them), or an iterable of dicts."""
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not os.path.exists(path):
            raise DatasetError(f"representative dataset {path!r} does not exist")
        if path.endswith(".npy"):
            return read_npy(path)
        return read_npz(path) if path.endswith(".npz") else read_tfrecord(path)
    if callable(source):
        source = source()
    if isinstance(source, dict) or not isinstance(source, Iterable):
        raise DatasetError(f"representative dataset: expected a file path or an iterable of "
                           f"{{input name: array}} samples, got {type(source).__name__}")
    return _checked(source)


def _checked(source: Iterable) -> Iterator[dict[str, np.ndarray]]:
    for index, sample in enumerate(source):
        if not isinstance(sample, dict):
            raise DatasetError(f"representative dataset, sample {index}: expected a dict of input name -> "
                               f"array, got {type(sample).__name__}")
        yield {str(k): np.asarray(v) for k, v in sample.items()}


def load(source, *, what: str = "representative dataset", progress: bool = True,
         min_samples: int = MIN_SAMPLES) -> list[dict[str, np.ndarray]]:
    """Every sample of ``source`` in a list, with a progress bar and the small-dataset warning."""
    iterator = read(source)
    if progress:
        try:
            from tqdm.auto import tqdm

            iterator = tqdm(iterator, desc=f"reading {what}", unit="sample", leave=False)
        except ImportError:  # tqdm is optional
            pass
    out = list(iterator)
    if not out:
        raise DatasetError(f"{what}: no samples")
    if len(out) < min_samples:
        warnings.warn(f"{what}: only {len(out)} samples; {ADVICE}", UserWarning, stacklevel=2)
    return out


def by_signature(files: dict, **kwargs) -> dict[str, list[dict[str, np.ndarray]]]:
    """``{signature key: path or iterable}`` -> ``{signature key: samples}``."""
    return {key: load(src, what=f"representative dataset for signature {key!r}", **kwargs)
            for key, src in files.items()}
