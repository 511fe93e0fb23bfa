"""TF Serving's gRPC messages, built from descriptors, and tensors to and from ``TensorProto``.

``tensorflow-serving-api`` ships the real classes but imports all of TensorFlow, which a server
of ``.tflite`` models should not need. The messages here have TF Serving's package, names and
field numbers (enums as their varint), so they are wire-identical with its clients
(``tests/serve/test_grpc.py`` checks every field against ``tensorflow-serving-api``). They live
in a private descriptor pool, so they never clash with TensorFlow's in one process.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..protos import add_field as _field
from .budget import CLAIM
from .status import InvalidArgument

_FILE = "kiln/serve/tf_serving_apis.proto"

#: TensorFlow's DataType numbers and the NumPy dtypes kiln serves.
DTYPES = {1: np.dtype(np.float32), 2: np.dtype(np.float64), 3: np.dtype(np.int32), 4: np.dtype(np.uint8),
          5: np.dtype(np.int16), 6: np.dtype(np.int8), 7: np.dtype(object), 9: np.dtype(np.int64),
          10: np.dtype(np.bool_), 17: np.dtype(np.uint16), 19: np.dtype(np.float16), 22: np.dtype(np.uint32),
          23: np.dtype(np.uint64)}
DT_OF = {dtype: number for number, dtype in DTYPES.items()}
#: Which repeated field of TensorProto holds values of each DataType.
_VALUE_FIELD = {1: "float_val", 2: "double_val", 3: "int_val", 4: "int_val", 5: "int_val", 6: "int_val",
                7: "string_val", 9: "int64_val", 10: "bool_val", 17: "int_val", 19: "half_val", 22: "uint32_val",
                23: "uint64_val"}
STATES = {"UNKNOWN": 0, "START": 10, "LOADING": 20, "AVAILABLE": 30, "UNLOADING": 40, "END": 50}
ERROR_CODES = {"OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4,
               "NOT_FOUND": 5, "RESOURCE_EXHAUSTED": 8, "FAILED_PRECONDITION": 9, "UNIMPLEMENTED": 12,
               "INTERNAL": 13, "UNAVAILABLE": 14}


def _map(parent, owner: str, name: str, number: int, key: str, value: str, value_type: str | None = None):
    """Add map field ``name`` to message ``parent`` (full name ``owner``), as protoc lays it out."""
    entry = parent.nested_type.add(name="".join(p.capitalize() for p in name.split("_")) + "Entry")
    entry.options.map_entry = True
    _field(entry, "key", 1, key)
    _field(entry, "value", 2, value, type_name=value_type)
    _field(parent, name, number, "message", label="repeated", type_name=f".{owner}.{entry.name}")


def _file_proto():
    from google.protobuf import descriptor_pb2 as d

    fp = d.FileDescriptorProto(name=_FILE, package="tensorflow", syntax="proto3",
                               dependency=["google/protobuf/wrappers.proto", "google/protobuf/any.proto"])
    shape = fp.message_type.add(name="TensorShapeProto")
    dim = shape.nested_type.add(name="Dim")
    _field(dim, "size", 1, "int64")
    _field(dim, "name", 2, "string")
    _field(shape, "dim", 2, "message", label="repeated", type_name=".tensorflow.TensorShapeProto.Dim")
    _field(shape, "unknown_rank", 3, "bool")

    tensor = fp.message_type.add(name="TensorProto")
    _field(tensor, "dtype", 1, "int32")
    _field(tensor, "tensor_shape", 2, "message", type_name=".tensorflow.TensorShapeProto")
    _field(tensor, "version_number", 3, "int32")
    _field(tensor, "tensor_content", 4, "bytes")
    for name, number, kind in (("half_val", 13, "int32"), ("float_val", 5, "float"), ("double_val", 6, "double"),
                               ("int_val", 7, "int32"), ("string_val", 8, "bytes"), ("scomplex_val", 9, "float"),
                               ("int64_val", 10, "int64"), ("bool_val", 11, "bool"), ("dcomplex_val", 12, "double"),
                               ("uint32_val", 16, "uint32"), ("uint64_val", 17, "uint64")):
        _field(tensor, name, number, kind, label="repeated")

    info = fp.message_type.add(name="TensorInfo")
    info.oneof_decl.add(name="encoding")
    _field(info, "name", 1, "string", oneof=0)
    _field(info, "dtype", 2, "int32")
    _field(info, "tensor_shape", 3, "message", type_name=".tensorflow.TensorShapeProto")

    sig = fp.message_type.add(name="SignatureDef")
    _map(sig, "tensorflow.SignatureDef", "inputs", 1, "string", "message", ".tensorflow.TensorInfo")
    _map(sig, "tensorflow.SignatureDef", "outputs", 2, "string", "message", ".tensorflow.TensorInfo")
    _field(sig, "method_name", 3, "string")
    _map(sig, "tensorflow.SignatureDef", "defaults", 4, "string", "message", ".tensorflow.TensorProto")
    return fp


def _serving_file_proto():
    from google.protobuf import descriptor_pb2 as d

    fp = d.FileDescriptorProto(name="kiln/serve/tf_serving_service.proto", package="tensorflow.serving",
                               syntax="proto3", dependency=[_FILE, "google/protobuf/wrappers.proto",
                                                            "google/protobuf/any.proto"])
    spec = fp.message_type.add(name="ModelSpec")
    spec.oneof_decl.add(name="version_choice")
    _field(spec, "name", 1, "string")
    _field(spec, "version", 2, "message", type_name=".google.protobuf.Int64Value", oneof=0)
    _field(spec, "version_label", 4, "string", oneof=0)
    _field(spec, "signature_name", 3, "string")
    model_spec = ".tensorflow.serving.ModelSpec"

    request = fp.message_type.add(name="PredictRequest")
    _field(request, "model_spec", 1, "message", type_name=model_spec)
    _map(request, "tensorflow.serving.PredictRequest", "inputs", 2, "string", "message", ".tensorflow.TensorProto")
    _field(request, "output_filter", 3, "string", label="repeated")
    response = fp.message_type.add(name="PredictResponse")
    _field(response, "model_spec", 2, "message", type_name=model_spec)
    _map(response, "tensorflow.serving.PredictResponse", "outputs", 1, "string", "message", ".tensorflow.TensorProto")

    sdm = fp.message_type.add(name="SignatureDefMap")
    _map(sdm, "tensorflow.serving.SignatureDefMap", "signature_def", 1, "string", "message", ".tensorflow.SignatureDef")
    meta_request = fp.message_type.add(name="GetModelMetadataRequest")
    _field(meta_request, "model_spec", 1, "message", type_name=model_spec)
    _field(meta_request, "metadata_field", 2, "string", label="repeated")
    meta_response = fp.message_type.add(name="GetModelMetadataResponse")
    _field(meta_response, "model_spec", 1, "message", type_name=model_spec)
    _map(meta_response, "tensorflow.serving.GetModelMetadataResponse", "metadata", 2, "string", "message", ".google.protobuf.Any")

    status = fp.message_type.add(name="StatusProto")
    _field(status, "error_code", 1, "int32")
    _field(status, "error_message", 2, "string")
    status_request = fp.message_type.add(name="GetModelStatusRequest")
    _field(status_request, "model_spec", 1, "message", type_name=model_spec)
    version_status = fp.message_type.add(name="ModelVersionStatus")
    _field(version_status, "version", 1, "int64")
    _field(version_status, "state", 2, "int32")
    _field(version_status, "status", 3, "message", type_name=".tensorflow.serving.StatusProto")
    status_response = fp.message_type.add(name="GetModelStatusResponse")
    _field(status_response, "model_version_status", 1, "message", label="repeated",
           type_name=".tensorflow.serving.ModelVersionStatus")
    return fp


@lru_cache(maxsize=None)
def messages() -> dict:
    """Message classes by short name, built once in a private pool."""
    from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, message_factory, wrappers_pb2

    pool = descriptor_pool.DescriptorPool()
    for module in (wrappers_pb2, any_pb2):
        proto = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(proto)
        pool.Add(proto)
    pool.Add(_file_proto())
    pool.Add(_serving_file_proto())
    out = {}
    for name in (_FILE, "kiln/serve/tf_serving_service.proto"):
        for short, desc in pool.FindFileByName(name).message_types_by_name.items():
            out[short] = message_factory.GetMessageClass(desc)
    return out


# -- tensors -------------------------------------------------------------------------------------

def to_array(proto, name: str, max_bytes: int) -> np.ndarray:
    """A TensorProto as an array (its values, or ``tensor_content``), never larger than ``max_bytes``."""
    dtype = DTYPES.get(proto.dtype)
    if dtype is None:
        raise InvalidArgument(f"input '{name}': tensors of DataType {proto.dtype} are not served")
    if proto.tensor_shape.unknown_rank:
        raise InvalidArgument(f"input '{name}': the tensor's shape has unknown rank")
    shape = tuple(int(d.size) for d in proto.tensor_shape.dim)
    if any(d < 0 for d in shape):
        raise InvalidArgument(f"input '{name}': negative dimension in shape {list(shape)}")
    size = 1
    for d in shape:
        size *= d
    if size * (8 if dtype.kind == "O" else dtype.itemsize) > max_bytes:
        raise InvalidArgument(f"input '{name}': a tensor of shape {list(shape)} is larger than the limit of "
                              f"{max_bytes} bytes")
    claim = CLAIM.get()
    if claim is not None:  # the worker's memory budget, before the allocation
        claim(size * (64 if dtype.kind == "O" else dtype.itemsize),
              f"tensor with shape{list(shape)} and type {dtype.name} for input '{name}'")
    if proto.tensor_content:
        if dtype.kind == "O":
            raise InvalidArgument(f"input '{name}': string tensors go in string_val, not tensor_content")
        if len(proto.tensor_content) != size * dtype.itemsize:
            raise InvalidArgument(f"input '{name}': tensor_content holds {len(proto.tensor_content)} bytes, shape "
                                  f"{list(shape)} of {dtype.name} needs {size * dtype.itemsize}")
        # (a view of the bytes when they are already in the native order: no second copy)
        return np.frombuffer(proto.tensor_content, dtype.newbyteorder("<")).astype(dtype, copy=False).reshape(shape)
    values = getattr(proto, _VALUE_FIELD[proto.dtype])
    if dtype.kind == "O":
        flat = np.empty(len(values), dtype=object)
        flat[:] = list(values)
    elif proto.dtype == 19:
        flat = np.array(values, np.int64).astype(np.uint16).view(np.float16)
    else:
        flat = np.array(values, dtype=dtype)
    if flat.size == size:
        return flat.reshape(shape)
    if flat.size == 0:
        return np.full(shape, b"", dtype=object) if dtype.kind == "O" else np.zeros(shape, dtype)
    if flat.size == 1:  # TensorFlow's rule: one value fills the tensor
        return np.full(shape, flat[0], dtype=dtype)
    raise InvalidArgument(f"input '{name}': {flat.size} values given for shape {list(shape)} ({size} elements)")


def from_array(array: np.ndarray, proto) -> None:
    """Fill the TensorProto ``proto`` with ``array`` (numbers in ``tensor_content``)."""
    array = np.asarray(array)
    if array.dtype.kind in "SU":
        array = array.astype(object)
    number = DT_OF.get(array.dtype)
    if number is None:
        raise InvalidArgument(f"an output of dtype {array.dtype} cannot be sent in a TensorProto")
    proto.dtype = number
    for d in array.shape:
        proto.tensor_shape.dim.add(size=int(d))
    if array.dtype.kind == "O":
        proto.string_val.extend(v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in array.reshape(-1))
    else:
        proto.tensor_content = np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()
