"""Shared vocabulary of the LiteRT schema: tensor types, activations, padding, operator codes.

The numbers are the schema's own (schema.fbs), read through the `tflite` bindings so that
kiln and the files it reads can never disagree.
"""

from __future__ import annotations

import enum

import numpy as np
from tflite.BuiltinOperator import BuiltinOperator as _BuiltinOperator
from tflite.BuiltinOptions import BuiltinOptions as _BuiltinOptions

try:  # bfloat16 is optional: ml_dtypes ships with TensorFlow and JAX, not with the runtime.
    import ml_dtypes as _ml_dtypes

    _BF16 = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    _BF16 = np.dtype(np.uint16)


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
        return _TO_NUMPY[self]

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
    DType.BFLOAT16: _BF16,
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
if _BF16 != np.dtype(np.uint16):
    _FROM_NUMPY[_BF16] = DType.BFLOAT16


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
