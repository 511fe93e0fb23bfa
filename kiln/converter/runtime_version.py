"""Minimum LiteRT runtime version per (builtin op, version), and the model's minimum.

The data follows TensorFlow's runtime_version.cc: ``RUNTIME_VERSIONS[op][v - 1]`` is the first
runtime release that runs version ``v`` of ``op`` (None where that version is not listed).
Ops missing from the table do not raise the model's minimum. The model's minimum is the
largest of its ops' versions, compared component-wise as integers, written as 16 bytes
padded with NULs into the ``min_runtime_version`` metadata.
"""

from __future__ import annotations

from typing import Iterable

from ..ir import Model

_ = None
RUNTIME_VERSIONS: dict[str, tuple[str | None, ...]] = {
    "AVERAGE_POOL_2D": ("1.5.0", "1.14.0", "2.3.0"),
    "BATCH_MATMUL": ("2.3.0", "2.3.0", "2.4.0", "2.5.0"),
    "BROADCAST_TO": (_, "2.5.0", "2.5.0"),
    "CONV_2D": ("1.5.0", "1.14.0", "1.14.0", "2.3.0", "2.4.0", "2.9.0", "2.11.0", "2.15.0"),
    "DEPTHWISE_CONV_2D": ("1.5.0", "1.12.0", "1.14.0", "2.2.0", "2.3.0", "2.3.0", "2.11.0"),
    "ADD": ("1.5.0", "1.14.0", "2.4.0", "2.6.0", "2.13.0"),
    "ADD_N": ("1.14.0",),
    "SPACE_TO_BATCH_ND": ("1.6.0", "1.14.0", "2.3.0", "2.12.0"),
    "SUB": ("1.6.0", "1.14.0", "2.3.0", "2.4.0", "2.4.0"),
    "DENSIFY": ("2.2.0",),
    "DIV": ("1.6.0", "2.3.0"),
    "BATCH_TO_SPACE_ND": ("1.6.0", "1.14.0", "2.3.0", "2.12.0"),
    "CAST": ("1.5.0", "2.7.0", "2.8.0", "2.9.0", "2.12.0", "2.15.0"),
    "CONCATENATION": ("1.5.0", "1.14.0", "2.3.0", "2.14.0"),
    "DEPTH_TO_SPACE": ("2.1.0", "2.5.0"),
    "EMBEDDING_LOOKUP": ("1.13.0", "1.14.0", "1.14.0", "2.18.0"),
    "EMBEDDING_LOOKUP_SPARSE": ("1.5.0",),
    "FAKE_QUANT": ("1.5.0", "1.10.0"),
    "FULLY_CONNECTED": ("1.5.0", "1.10.0", "1.14.0", "1.14.0", "2.0.0", "2.1.0", "2.3.0", "2.3.0", "2.3.0",
                        "2.11.0", "2.15.0", "2.17.0", "2.18.0"),
    "GATHER": ("1.6.0", "1.14.0", "1.15.0", "2.4.0", "2.5.0", "2.13.0", "2.15.0"),
    "GATHER_ND": ("1.14.0", "2.3.0", "2.5.0", "2.13.0", "2.16.0"),
    "HASHTABLE_LOOKUP": ("1.5.0",),
    "SVDF": ("1.5.0", "1.14.0", "2.2.0", "2.3.0"),
    "L2_NORMALIZATION": ("1.5.0", "1.14.0"),
    "L2_POOL_2D": ("1.5.0",),
    "LOCAL_RESPONSE_NORMALIZATION": ("1.5.0",),
    "MAX_POOL_2D": ("1.5.0", "1.14.0", "2.3.0"),
    "MAXIMUM": ("1.14.0", "1.14.0", "2.3.0", "2.3.0"),
    "MINIMUM": ("1.14.0", "1.14.0", "2.3.0", "2.3.0"),
    "MUL": ("1.5.0", "1.14.0", "1.15.0", "2.3.0", "2.6.0", "2.11.0", "2.13.0"),
    "NON_MAX_SUPPRESSION_V4": ("2.1.0",),
    "NON_MAX_SUPPRESSION_V5": ("2.1.0",),
    "PAD": ("1.5.0", "1.14.0", "2.4.0", "2.6.0"),
    "TILE": ("1.10.1", "2.2.0", "2.8.0"),
    "PADV2": ("1.9.0", "1.14.0", "2.4.0", "2.6.0"),
    "RESHAPE": ("1.5.0",),
    "SOFTMAX": ("1.5.0", "1.14.0", "2.3.0"),
    "SPACE_TO_DEPTH": ("1.5.0", "1.14.0"),
    "TRANSPOSE": ("1.6.0", "1.14.0", "1.15.0", "2.3.0", "2.4.0", "2.12.0"),
    "LSTM": ("1.7.0", "1.10.0", "1.14.0", "2.3.0"),
    "UNIDIRECTIONAL_SEQUENCE_LSTM": ("1.13.1", "1.14.0", "2.3.0", "2.12.0"),
    "BIDIRECTIONAL_SEQUENCE_LSTM": ("1.14.0", "1.14.0", "1.14.0"),
    "BIDIRECTIONAL_SEQUENCE_RNN": ("1.14.0", "1.14.0", "2.3.0"),
    "MEAN": ("1.6.0", "1.14.0", "2.4.0"),
    "SUM": ("1.10.0", "1.15.0"),
    "REDUCE_MAX": ("1.11.0", "1.14.0", "2.5.0"),
    "REDUCE_MIN": ("1.11.0", "1.14.0", "2.5.0"),
    "REDUCE_PROD": ("1.11.0", "2.6.0"),
    "REDUCE_ANY": ("1.11.0",),
    "RELU6": ("1.5.0", "1.14.0", "2.5.0"),
    "RESIZE_BILINEAR": ("1.7.0", "1.14.0", "2.2.0", "2.5.0"),
    "RESIZE_NEAREST_NEIGHBOR": ("1.13.1", "1.14.0", "2.3.0", "2.4.0"),
    "RNN": ("1.5.0", "1.14.0", "2.3.0"),
    "SKIP_GRAM": ("1.5.0",),
    "SQUEEZE": ("1.6.0", "2.5.0"),
    "SPLIT": ("1.5.0", "1.14.0", "1.14.0", "2.3.0"),
    "SPLIT_V": ("1.13.1", "2.3.0"),
    "STRIDED_SLICE": ("1.6.0", "1.14.0", "2.1.0", "2.2.0", "2.5.0", "2.6.0", "2.14.0", "2.14.0"),
    "TOPK_V2": ("1.7.0", "1.14.0", "2.13.0"),
    "ARG_MAX": ("1.9.0", "1.14.0", "2.9.0"),
    "ARG_MIN": ("1.9.0", "1.14.0", "2.9.0"),
    "TRANSPOSE_CONV": ("1.9.0", "2.2.0", "2.3.0", "2.13.0", "2.15.0"),
    "SPARSE_TO_DENSE": ("1.9.0", "1.14.0", "1.15.0"),
    "EXPAND_DIMS": ("1.10.0",),
    "PACK": ("1.11.0", "1.14.0", "2.3.0", "2.13.0"),
    "SHAPE": ("1.10.0",),
    "SLICE": ("1.14.0", "1.14.0", "1.14.0", "2.4.0", "2.5.0", "2.14.0"),
    "TANH": ("1.14.0", "1.14.0", "2.3.0"),
    "ONE_HOT": ("1.11.0",),
    "UNPACK": ("1.11.0", "1.14.0", "2.2.0", "2.3.0"),
    "LEAKY_RELU": ("1.13.1", "2.3.0"),
    "LOGISTIC": ("1.14.0", "1.14.0", "2.3.0"),
    "LOG_SOFTMAX": ("1.14.0", "1.14.0"),
    "LSH_PROJECTION": ("1.5.0",),
    "SQUARED_DIFFERENCE": ("1.13.1", "2.5.0"),
    "MIRROR_PAD": ("1.13.1", "2.3.0", "2.12.0"),
    "UNIQUE": ("1.14.0",),
    "UNIDIRECTIONAL_SEQUENCE_RNN": ("1.14.0", "1.14.0", "2.3.0"),
    "WHERE": ("1.14.0", "2.8.0"),
    "DEQUANTIZE": ("1.13.1", "1.14.0", "1.15.0", "2.2.0", "2.7.0", "2.18.0"),
    "REVERSE_SEQUENCE": ("1.14.0",),
    "EQUAL": ("1.14.0", "1.14.0", "2.3.0", "2.13.0"),
    "NOT_EQUAL": ("1.14.0", "1.14.0", "2.3.0"),
    "GREATER": ("1.14.0", "1.14.0"),
    "GREATER_EQUAL": ("1.14.0", "1.14.0", "2.13.0"),
    "LESS": ("1.14.0", "1.14.0", "2.13.0"),
    "LESS_EQUAL": ("1.14.0", "1.14.0"),
    "SCATTER_ND": ("2.1.0",),
    "SEGMENT_SUM": ("2.2.0",),
    "SELECT": ("1.14.0", "1.14.0", "2.12.0", "2.12.0"),
    "SELECT_V2": ("2.2.0", "2.12.0"),
    "IF": ("1.15.0",),
    "FLOOR_DIV": ("1.14.0", "1.14.0", "2.13.0"),
    "FLOOR": ("1.9.0",),
    "CEIL": ("1.14.0",),
    "MATRIX_DIAG": ("1.14.0",),
    "MATRIX_SET_DIAG": ("1.14.0",),
    "ELU": ("1.14.0",),
    "QUANTIZE": ("1.14.0", "1.15.0", "2.7.0"),
    "ROUND": ("1.14.0",),
    "RELU": ("1.5.0", "2.1.0", "2.5.0"),
    "RELU_N1_TO_1": ("1.5.0",),
    "RELU_0_TO_1": ("2.10.0",),
    "PRELU": ("1.8.0",),
    "EXP": ("1.7.0", "2.12.0"),
    "COS": ("1.14.0",),
    "NEG": ("1.9.0",),
    "POW": ("1.10.0",),
    "LOGICAL_OR": ("1.11.0",),
    "LOGICAL_AND": ("1.11.0",),
    "LOGICAL_NOT": ("1.11.0",),
    "FLOOR_MOD": ("1.13.0", "2.13.0"),
    "RANGE": ("1.13.0", "2.14.0"),
    "SIN": ("1.9.0",),
    "LOG": ("1.14.0", "2.15.0"),
    "SQRT": ("1.10.0",),
    "RSQRT": ("1.10.0", "2.5.0", "2.15.0"),
    "SQUARE": ("1.12.0",),
    "ZEROS_LIKE": ("1.12.0",),
    "ABS": ("1.13.0", "2.4.0", "2.5.0", "2.6.0", "2.12.0"),
    "HARD_SWISH": ("1.15.0",),
    "FILL": ("1.13.0", "2.3.0", "2.5.0", "2.12.0"),
    "REVERSE_V2": ("1.14.0", "2.2.0", "2.5.0"),
    "RANK": ("1.14.0",),
    "WHILE": ("1.15.0",),
    "CUMSUM": ("2.4.0",),
    "CALL_ONCE": ("2.5.0",),
    "RFFT2D": ("2.5.0",),
    "CONV_3D": ("2.5.0",),
    "IMAG": ("2.5.0",),
    "REAL": ("2.5.0",),
    "COMPLEX_ABS": ("2.5.0",),
    "HASHTABLE": ("2.5.0",),
    "HASHTABLE_FIND": ("2.5.0",),
    "HASHTABLE_IMPORT": ("2.5.0",),
    "HASHTABLE_SIZE": ("2.5.0",),
    "REDUCE_ALL": ("2.6.0",),
    "CONV_3D_TRANSPOSE": ("2.6.0",),
    "VAR_HANDLE": ("2.6.0",),
    "READ_VARIABLE": ("2.6.0",),
    "ASSIGN_VARIABLE": ("2.6.0",),
    "BROADCAST_ARGS": ("2.6.0",),
    "RANDOM_STANDARD_NORMAL": ("2.8.0",),
    "BUCKETIZE": ("2.8.0",),
    "RANDOM_UNIFORM": ("2.8.0",),
    "MULTINOMIAL": ("2.8.0",),
    "GELU": ("2.9.0", "2.9.0"),
    "DYNAMIC_UPDATE_SLICE": ("2.9.0", "2.17.0"),
    "UNSORTED_SEGMENT_PROD": ("2.10.0",),
    "UNSORTED_SEGMENT_MAX": ("2.10.0",),
    "UNSORTED_SEGMENT_MIN": ("2.11.0",),
    "UNSORTED_SEGMENT_SUM": ("2.10.0",),
    "ATAN2": ("2.10.0",),
    "SIGN": ("2.11.0", "2.12.0"),
    "BITCAST": ("2.13.0",),
    "BITWISE_XOR": ("2.13.0",),
    "RIGHT_SHIFT": ("2.13.0",),
    "STABLEHLO_SCATTER": ("2.15.0",),
    "DILATE": ("2.15.0",),
    "STABLEHLO_RNG_BIT_GENERATOR": ("2.15.0",),
    "REDUCE_WINDOW": ("2.15.0",),
    "STABLEHLO_GATHER": ("2.16.0",),
    "STABLEHLO_ADD": ("2.16.0",),
    "STABLEHLO_MULTIPLY": ("2.16.0",),
    "STABLEHLO_REDUCE_WINDOW": ("2.16.0",),
    "STABLEHLO_MAXIMUM": ("2.16.0",),
    "STABLEHLO_MINIMUM": ("2.16.0",),
    "STABLEHLO_PAD": ("2.16.0",),
    "STABLEHLO_COMPOSITE": ("2.17.0",),
    "STABLEHLO_AND": ("2.17.0",),
    "STABLEHLO_SHIFT_LEFT": ("2.17.0",),
    "STABLEHLO_CBRT": ("2.17.0",),
    "STABLEHLO_CASE": ("2.17.0",),
}
del _


def op_runtime_version(op_type: str, version: int) -> str | None:
    """First runtime release that runs ``version`` of ``op_type`` (None if not listed)."""
    versions = RUNTIME_VERSIONS.get(op_type)
    if versions is None or not 1 <= version <= len(versions):
        return None
    return versions[version - 1]


def _key(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("."))


def max_version(versions: Iterable[str]) -> str:
    """The largest version string, comparing components as integers ("" when none)."""
    best = ""
    for v in versions:
        if not best or _key(v) > _key(best):
            best = v
    return best


def model_runtime_version(model: Model) -> str:
    """The model's minimum runtime version: the max over its builtin ops ("" if none listed)."""
    found = (op_runtime_version(op.op_type, op.version) for _, _, op in model.operators() if op.op_type != "CUSTOM")
    return max_version(v for v in found if v)


def min_runtime_version_bytes(version: str) -> bytes:
    """The 16-byte, NUL-padded ``min_runtime_version`` metadata value."""
    raw = version.encode("ascii")
    if len(raw) >= 16:
        return b"\0" * 16
    return raw + b"\0" * (16 - len(raw))
