"""Shared vocabulary of the LiteRT schema: tensor types, activations, padding, operator codes,
and the fields of every builtin options table with their defaults.

The numbers are the schema's own (schema.fbs), read through the `tflite` bindings so that
kiln and the files it reads can never disagree.
"""

from __future__ import annotations

import enum
import functools
import importlib
import inspect
import re
from dataclasses import dataclass

import flatbuffers
import numpy as np
from tflite.BuiltinOperator import BuiltinOperator as _BuiltinOperator
from tflite.BuiltinOptions import BuiltinOptions as _BuiltinOptions



@functools.cache
def _bfloat16() -> np.dtype:
    """NumPy's bfloat16 from ml_dtypes (it ships with TensorFlow and JAX, not with the runtime),
    else its raw bits as uint16. Imported on first use: it costs a third of a second of CPU,
    which every `kiln` command would pay for a type few models hold."""
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - depends on the environment
        return np.dtype(np.uint16)
    return np.dtype(ml_dtypes.bfloat16)


class DType(enum.IntEnum):
    """Tensor element types, numbered as in the LiteRT schema (TensorType)."""

    FLOAT32 = 0
    FLOAT16 = 1
    INT32 = 2
    UINT8 = 3
    INT64 = 4
    STRING = 5
    BOOL = 6
    INT16 = 7
    COMPLEX64 = 8
    INT8 = 9
    FLOAT64 = 10
    COMPLEX128 = 11
    UINT64 = 12
    RESOURCE = 13
    VARIANT = 14
    UINT32 = 15
    UINT16 = 16
    INT4 = 17
    BFLOAT16 = 18

    @property
    def numpy(self) -> np.dtype:
        """The NumPy dtype that holds this type's elements (int4 is stored one per int8)."""
        return _bfloat16() if self is DType.BFLOAT16 else _TO_NUMPY[self]

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize

    @property
    def is_float(self) -> bool:
        return self in (DType.FLOAT32, DType.FLOAT16, DType.FLOAT64, DType.BFLOAT16)

    @classmethod
    def from_numpy(cls, dtype) -> "DType":
        dt = np.dtype(dtype)
        try:
            return _FROM_NUMPY[dt]
        except KeyError:
            if dt.kind in ("U", "S", "O"):
                return cls.STRING
            if dt.name == "bfloat16" and dt == _bfloat16():
                return cls.BFLOAT16
            raise ValueError(f"no LiteRT tensor type for numpy dtype {dt}") from None


_TO_NUMPY = {
    DType.FLOAT32: np.dtype(np.float32),
    DType.FLOAT16: np.dtype(np.float16),
    DType.INT32: np.dtype(np.int32),
    DType.UINT8: np.dtype(np.uint8),
    DType.INT64: np.dtype(np.int64),
    DType.STRING: np.dtype(np.object_),
    DType.BOOL: np.dtype(np.bool_),
    DType.INT16: np.dtype(np.int16),
    DType.COMPLEX64: np.dtype(np.complex64),
    DType.INT8: np.dtype(np.int8),
    DType.FLOAT64: np.dtype(np.float64),
    DType.COMPLEX128: np.dtype(np.complex128),
    DType.UINT64: np.dtype(np.uint64),
    DType.RESOURCE: np.dtype(np.int32),
    DType.VARIANT: np.dtype(np.object_),
    DType.UINT32: np.dtype(np.uint32),
    DType.UINT16: np.dtype(np.uint16),
    DType.INT4: np.dtype(np.int8),
}
_FROM_NUMPY = {
    np.dtype(np.float32): DType.FLOAT32,
    np.dtype(np.float16): DType.FLOAT16,
    np.dtype(np.int32): DType.INT32,
    np.dtype(np.uint8): DType.UINT8,
    np.dtype(np.int64): DType.INT64,
    np.dtype(np.bool_): DType.BOOL,
    np.dtype(np.int16): DType.INT16,
    np.dtype(np.complex64): DType.COMPLEX64,
    np.dtype(np.int8): DType.INT8,
    np.dtype(np.float64): DType.FLOAT64,
    np.dtype(np.complex128): DType.COMPLEX128,
    np.dtype(np.uint64): DType.UINT64,
    np.dtype(np.uint32): DType.UINT32,
    np.dtype(np.uint16): DType.UINT16,
}


class Activation(enum.IntEnum):
    """Fused activation functions (ActivationFunctionType)."""

    NONE = 0
    RELU = 1
    RELU_N1_TO_1 = 2
    RELU6 = 3
    TANH = 4
    SIGN_BIT = 5


class Padding(enum.IntEnum):
    SAME = 0
    VALID = 1


class MirrorPadMode(enum.IntEnum):
    REFLECT = 0
    SYMMETRIC = 1


#: Builtin operator name -> code, e.g. "CONV_2D" -> 3 (BuiltinOperator in the schema).
BUILTIN_CODES: dict[str, int] = {
    k: v for k, v in vars(_BuiltinOperator).items() if not k.startswith("_") and isinstance(v, int)
}
#: Builtin operator code -> name.
BUILTIN_NAMES: dict[int, str] = {v: k for k, v in BUILTIN_CODES.items()}
#: Options table name -> BuiltinOptions union tag, e.g. "Conv2DOptions" -> 1.
OPTIONS_TAGS: dict[str, int] = {
    k: v for k, v in vars(_BuiltinOptions).items() if not k.startswith("_") and isinstance(v, int)
}
OPTIONS_NAMES: dict[int, str] = {v: k for k, v in OPTIONS_TAGS.items()}

#: First code that does not fit the deprecated int8 `deprecated_builtin_code` field.
PLACEHOLDER_FOR_GREATER_OP_CODES = 127


# -- builtin options tables, as the bindings define them ----------------------------------

_VECTOR_TYPE = re.compile(
    r"def (\w+)AsNumpy\(self\):(?:(?!\bdef ).)*?GetVectorAsNumpy\(flatbuffers\.number_types\.(\w+)Flags", re.S
)

_NP_FLAGS = {
    "Int8": np.int8, "Uint8": np.uint8, "Int16": np.int16, "Uint16": np.uint16, "Int32": np.int32,
    "Uint32": np.uint32, "Int64": np.int64, "Uint64": np.uint64, "Float32": np.float32,
    "Float64": np.float64, "Bool": np.bool_,
}
_STRING = re.compile(r"def (\w+)\(self\):(?:(?!\bdef ).)*?self\._tab\.String\(", re.S)
#: Marker "element type" of string fields (VarHandleOptions.container, ...).
STRING = np.dtype("O")


def snake(camel: str) -> str:
    """"DilationWFactor" -> "dilation_w_factor"."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", camel).lower()


@dataclass(frozen=True)
class OptionField:
    name: str          # snake_case, the IR's key
    camel: str         # accessor name in the bindings
    vector: np.dtype | None  # element type for vector fields (STRING for strings), None for scalars


@dataclass(frozen=True)
class OptionsLayout:
    table: str
    module: object
    fields: tuple[OptionField, ...]


@functools.lru_cache(maxsize=None)
def options_layout(table: str) -> OptionsLayout:
    """Field layout of options table ``table`` (e.g. "Conv2DOptions"), from the bindings."""
    module = importlib.import_module(f"tflite.{table}")
    source = inspect.getsource(module)
    vector_types = {m.group(1): np.dtype(_NP_FLAGS[m.group(2)]) for m in _VECTOR_TYPE.finditer(source)}
    vector_types.update({m.group(1): STRING for m in _STRING.finditer(source)})
    fields = []
    for m in re.finditer(rf"def {table}Add(\w+)\(builder, \w+\):\s*\n\s*builder\.Prepend(\w+)Slot\(", source):
        camel, kind = m.group(1), m.group(2)
        if kind == "UOffsetTRelative":
            if camel not in vector_types:
                continue  # nested tables / strings: no builtin options table uses them
            fields.append(OptionField(snake(camel), camel, vector_types[camel]))
        else:
            fields.append(OptionField(snake(camel), camel, None))
    return OptionsLayout(table, module, tuple(fields))


@functools.lru_cache(maxsize=None)
def _empty_table(table: str) -> tuple[bytes, int]:
    lay = options_layout(table)
    b = flatbuffers.Builder(0)
    getattr(lay.module, f"{table}Start")(b)
    b.Finish(getattr(lay.module, f"{table}End")(b))
    buf = bytes(b.Output())
    return buf, flatbuffers.encode.Get(flatbuffers.packer.uoffset, buf, 0)


def options_defaults(table: str) -> dict:
    """{field: default} of options table ``table``: what the bindings read from an empty table."""
    buf, pos = _empty_table(table)
    return decode_options(table, buf, pos)


def decode_options(table: str, buf, pos: int) -> dict:
    """Read the options table at ``pos`` of ``buf`` into a dict {field: value}."""
    lay = options_layout(table)
    obj = getattr(lay.module, table)()
    obj.Init(buf, pos)
    out = {}
    for f in lay.fields:
        if f.vector is STRING:
            raw = getattr(obj, f.camel)()
            out[f.name] = raw.decode("utf-8", "replace") if raw is not None else ""
        elif f.vector is not None:
            arr = getattr(obj, f.camel + "AsNumpy")()
            out[f.name] = tuple(arr.tolist()) if isinstance(arr, np.ndarray) else ()
        else:
            out[f.name] = getattr(obj, f.camel)()
    return out


# -- the fused sequence LSTMs' operand layout ----------------------------------------------------

@dataclass(frozen=True)
class LstmLayout:
    """Operand positions of one direction of a fused sequence LSTM (the schema's order).

    ``UNIDIRECTIONAL_LSTM`` is UNIDIRECTIONAL_SEQUENCE_LSTM's 24 operands; the 48 of
    BIDIRECTIONAL_SEQUENCE_LSTM are ``BIDIRECTIONAL_LSTM_FW`` and ``..._BW`` plus
    ``BIDIRECTIONAL_LSTM_AUX_INPUT``. Gates are in LiteRT's order: input, forget, cell,
    output; an absent optional operand (CIFG's input gate, peepholes, projection) is -1 in
    the file and None in the IR.
    """

    input_weights: tuple[int, int, int, int]
    recurrent_weights: tuple[int, int, int, int]
    peepholes: tuple[int, int, int]          # cell_to_{input, forget, output}
    biases: tuple[int, int, int, int]
    projection_weights: int
    projection_bias: int
    output_state: int
    cell_state: int
    layer_norm: tuple[int, ...] = ()         # only the unidirectional op has them
    aux_weights: tuple[int, ...] = ()        # only the bidirectional op has them
    input: int = 0

    @property
    def weights(self) -> tuple[int, ...]:
        """Every weight-like operand (all but the input and the states)."""
        return (*self.input_weights, *self.recurrent_weights, *self.peepholes, *self.biases,
                self.projection_weights, self.projection_bias, *self.layer_norm, *self.aux_weights)

    @property
    def matrices(self) -> tuple[int, ...]:
        """The weight matrices a quantizer makes int8 (gates, peepholes, projection)."""
        return (*self.input_weights, *self.recurrent_weights, *self.peepholes, self.projection_weights,
                *self.aux_weights)

    @property
    def states(self) -> tuple[int, int]:
        return self.output_state, self.cell_state


def _lstm_direction(base: int, output_state: int, cell_state: int, **extra) -> LstmLayout:
    """The layout of a direction whose input_to_input_weights operand sits at ``base``."""
    return LstmLayout(
        input_weights=(base, base + 1, base + 2, base + 3),
        recurrent_weights=(base + 4, base + 5, base + 6, base + 7),
        peepholes=(base + 8, base + 9, base + 10),
        biases=(base + 11, base + 12, base + 13, base + 14),
        projection_weights=base + 15,
        projection_bias=base + 16,
        output_state=output_state,
        cell_state=cell_state,
        **extra,
    )


UNIDIRECTIONAL_LSTM = _lstm_direction(1, 18, 19, layer_norm=(20, 21, 22, 23))
BIDIRECTIONAL_LSTM_FW = _lstm_direction(1, 35, 36, aux_weights=(40, 41, 42, 43))
BIDIRECTIONAL_LSTM_BW = _lstm_direction(18, 37, 38, aux_weights=(44, 45, 46, 47))
BIDIRECTIONAL_LSTM_AUX_INPUT = 39
