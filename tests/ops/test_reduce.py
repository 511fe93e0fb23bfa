"""Reductions, ARG_MAX/ARG_MIN, TOPK_V2 and CUMSUM against LiteRT."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import ops
from kiln.errors import OpError
from kiln.ir import QuantParams
from kiln.schema import DType
from tests.harness import Const, check_op
from tests.ops.test_elementwise import (
    check_builtin, ir_op, kernel_call, rand, rand_int,
)

F32, I32, I64 = np.float32, np.int32, np.int64
REDUCERS = ["MEAN", "SUM", "REDUCE_PROD", "REDUCE_MAX", "REDUCE_MIN"]
AXES = [[0], [1], [-1], [0, 2], [2, 0, -1], [1, 1], [0, 1, 2]]


def axes(values):
    return np.array(values, I32)


def data(op, shape, dtype, seed=0):
    if dtype == F32:
        scale = 0.7 if op == "REDUCE_PROD" else 3
        return rand(*shape, seed=seed, scale=scale)
    lo, hi = (-3, 4) if op == "REDUCE_PROD" else (-50, 50)
    return rand_int(*shape, seed=seed, lo=lo, hi=hi, dtype=dtype)


@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("ax", AXES, ids=str)
@pytest.mark.parametrize("op", REDUCERS)
def test_reducers_float(op, ax, keep):
    x = data(op, (3, 4, 5), F32)
    check_op(op, [x, Const(axes(ax))], options={"keep_dims": keep})


@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("dtype", [I32, I64])
@pytest.mark.parametrize("op", REDUCERS)
def test_reducers_int(op, dtype, keep):
    x = data(op, (3, 4, 5), dtype)
    for ax in ([1], [0, 2], [-1, 0]):
        check_op(op, [x, Const(axes(ax))], options={"keep_dims": keep})


@pytest.mark.parametrize("op", REDUCERS)
def test_reducers_rank4_spatial(op):
    """The [1, 2] reduction of NHWC tensors (global pooling) LiteRT special-cases."""
    x = data(op, (2, 5, 6, 3), F32)
    for keep in (False, True):
        check_op(op, [x, Const(axes([1, 2]))], options={"keep_dims": keep})


@pytest.mark.parametrize("op", REDUCERS + ["REDUCE_ANY"])
def test_reducers_dynamic_scalar_and_empty_axes(op):
    x = data(op, (3, 4, 5), F32)
    if op == "REDUCE_ANY":
        x = x > 1
    check_op(op, [x, axes([2, 0])], options={"keep_dims": False})
    check_op(op, [x, Const(np.array(-2, I32))], options={"keep_dims": True})
    for keep in (False, True):  # no axes: the identity
        check_op(op, [x, axes([])], options={"keep_dims": keep})


def test_mean_int_truncates_toward_zero():
    x = np.array([[-1, -2], [1, 2], [-3, 0], [5, 6], [-7, -7]], I32)
    out = check_op("MEAN", [x, Const(axes([1]))])[0]
    np.testing.assert_array_equal(out, [-1, 1, -1, 5, -7])


@pytest.mark.parametrize("op", ["REDUCE_MAX", "REDUCE_MIN"])
def test_max_min_nan_fold_order(op):
    """LiteRT keeps a NaN only if nothing follows it in row-major order."""
    x = np.array([[5, np.nan, 1], [np.nan, np.nan, 2], [1, 2, np.nan], [-np.inf, -np.inf, 3],
                  [np.inf, np.nan, -1], [-np.inf, -np.inf, -np.inf], [np.inf, np.inf, np.inf]],
                 F32)
    check_builtin(op, [x, Const(axes([1]))])
    z = np.array([[[5, np.nan], [1, 2]], [[np.nan, 7], [3, np.nan]]], F32)
    for ax in ([0, 2], [2, 0], [0], [1], [0, 1, 2]):
        check_builtin(op, [z, Const(axes(ax))])
        check_builtin(op, [z, Const(axes(ax))], builtin=False)
    w = rand(2, 3, 4, 5)
    w[0, 1, 2, 3] = w[1, 2, 3, 4] = w[1, 0, 0, 0] = np.nan
    check_builtin(op, [w, Const(axes([1, 2]))])


def test_empty_reductions():
    empty = np.zeros((3, 0), F32)
    for op in REDUCERS:
        check_builtin(op, [empty, Const(axes([1]))])
    for op in ("REDUCE_MAX", "REDUCE_MIN", "SUM", "REDUCE_PROD"):
        check_builtin(op, [np.zeros((3, 0), I32), Const(axes([1]))])
    check_builtin("REDUCE_ANY", [np.zeros((3, 0), bool), Const(axes([1]))])
    check_builtin("REDUCE_ALL", [np.zeros((3, 0), bool), Const(axes([1]))])


@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("op", ["REDUCE_ANY", "REDUCE_ALL"])
def test_any_all(op, keep):
    x = rand(3, 4, 5) > 0.8 if op == "REDUCE_ANY" else rand(3, 4, 5) > -1.5
    for ax in ([1], [0, 2], [-1]):
        check_op(op, [x, Const(axes(ax))], options={"keep_dims": keep})


def test_axis_out_of_range():
    x = rand(2, 3)
    record, call = kernel_call("SUM", [x, axes([2])])
    with pytest.raises(OpError, match="out of range"):
        record.kernel(call, x, axes([2]))


# -- ARG_MAX / ARG_MIN ----------------------------------------------------------------------

@pytest.mark.parametrize("out", [I32, I64])
@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize("op", ["ARG_MAX", "ARG_MIN"])
def test_arg_max_min(op, axis, out):
    x = np.round(rand(3, 4, 5), 1).astype(F32)  # rounding makes ties
    opts = {"output_type": DType.from_numpy(out)}
    check_op(op, [x, Const(axes([axis]))], options=opts, out_dtypes=[np.dtype(out)])
    check_op(op, [x, Const(np.array(axis, I64))], options=opts, out_dtypes=[np.dtype(out)])
    check_op(op, [x, axes([axis])], options=opts, out_dtypes=[np.dtype(out)])


@pytest.mark.parametrize("dtype", [I32, np.uint8, np.int8, np.bool_])
@pytest.mark.parametrize("op", ["ARG_MAX", "ARG_MIN"])
def test_arg_max_min_types(op, dtype):
    x = rand_int(4, 6, lo=0, hi=3).astype(dtype)
    check_op(op, [x, Const(axes([1]))], out_dtypes=[np.dtype(I32)],
             options={"output_type": DType.INT32})


@pytest.mark.parametrize("op", ["ARG_MAX", "ARG_MIN"])
def test_arg_max_min_nan(op):
    y = np.array([[np.nan, 1, 5, 5], [1, np.nan, 5, 5], [-np.inf, np.nan, -np.inf, -5],
                  [3, 3, 3, 3], [2, np.nan, np.inf, np.nan]], F32)
    check_op(op, [y, Const(axes([1]))], out_dtypes=[np.dtype(I32)],
             options={"output_type": DType.INT32})


def test_arg_max_output_type_from_options_when_output_is_not_an_index():
    x = rand(2, 3)
    record, call = kernel_call("ARG_MAX", [x, axes([1])], options={"output_type": DType.INT32},
                               out_dtypes=[F32])
    assert record.kernel(call, x, axes([1])).dtype == I32


# -- TOPK_V2 --------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [0, 1, 3, 6])
@pytest.mark.parametrize("dtype", [F32, I32, I64, np.uint8, np.int8])
def test_top_k(dtype, k):
    x = rand_int(2, 3, 6, lo=0, hi=5).astype(dtype) if dtype != F32 else \
        np.round(rand(2, 3, 6), 1).astype(F32)
    check_op("TOPK_V2", [x, Const(np.array(k, I32))], out_dtypes=[np.dtype(dtype), np.dtype(I32)])


def test_top_k_ties_and_nan():
    t = np.array([[1, 3, 3, 2, 3, 0], [5, 5, 5, 5, 5, 5], [np.nan, 1, -np.inf, 2, np.nan, -np.inf],
                  [-0.0, 0.0, -0.0, 0.0, 1, np.inf]], F32)
    out = check_builtin("TOPK_V2", [t, Const(np.array(4, I32))],
                        out_dtypes=[np.dtype(F32), np.dtype(I32)])
    np.testing.assert_array_equal(out[1][0], [1, 2, 4, 3])
    check_builtin("TOPK_V2", [t, Const(np.array(6, I32))],
                  out_dtypes=[np.dtype(F32), np.dtype(I32)], builtin=False)


def test_top_k_int_extremes():
    x = np.array([[np.iinfo(I32).min, 0, np.iinfo(I32).max, np.iinfo(I32).min]], I32)
    check_op("TOPK_V2", [x, Const(np.array(4, I32))], out_dtypes=[np.dtype(I32), np.dtype(I32)])


def test_top_k_bad_k():
    x = rand(2, 3)
    record, call = kernel_call("TOPK_V2", [x, np.array(4, I32)], out_dtypes=[F32, I32])
    with pytest.raises(OpError, match="k=4"):
        record.kernel(call, x, np.array(4, I32))


# -- CUMSUM ---------------------------------------------------------------------------------

@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("axis", [0, 1, -1, -3])
@pytest.mark.parametrize("dtype", [F32, I32, I64])
def test_cumsum(dtype, axis, exclusive, reverse):
    x = rand(3, 4, 5) if dtype == F32 else rand_int(3, 4, 5, dtype=dtype)
    opts = {"exclusive": exclusive, "reverse": reverse}
    check_op("CUMSUM", [x, Const(np.array(axis, I32))], options=opts)


def test_cumsum_dynamic_axis():
    check_op("CUMSUM", [rand(4, 3), np.array(1, I32)], options={"exclusive": True})


# -- quantized operands and versions --------------------------------------------------------

Q = QuantParams(scale=[0.5], zero_point=[1])


@pytest.mark.parametrize("op", ["MEAN", "SUM", "REDUCE_PROD", "CUMSUM"])
def test_quantized_inputs_are_refused(op):
    x = np.array([[1, 2], [3, 4]], np.int8)
    ax = np.array([1], I32) if op != "CUMSUM" else np.array(1, I32)
    record, call = kernel_call(op, [x, ax], quant={0: Q}, out_quant=Q)
    with pytest.raises(OpError, match="quantized kernel not implemented yet"):
        record.kernel(call, x, ax)


def test_order_only_reductions_accept_shared_quantization():
    x = np.array([[1, -2], [3, 4]], np.int8)
    record, call = kernel_call("REDUCE_MAX", [x, axes([1])], quant={0: Q}, out_quant=Q)
    np.testing.assert_array_equal(record.kernel(call, x, axes([1])), [1, 4])
    record, call = kernel_call("ARG_MAX", [x, axes([1])], quant={0: Q}, out_dtypes=[I32])
    np.testing.assert_array_equal(record.kernel(call, x, axes([1])), [0, 1])


F, I8, I16 = DType.FLOAT32, DType.INT8, DType.INT16


@pytest.mark.parametrize("op_type,dtype,expected", [
    ("MEAN", F, 1), ("MEAN", I8, 2), ("MEAN", I16, 3), ("REDUCE_MAX", I16, 3),
    ("REDUCE_MIN", I8, 2), ("SUM", I8, 2), ("SUM", I16, 1), ("REDUCE_PROD", I16, 2),
    ("REDUCE_PROD", I8, 2), ("ARG_MAX", DType.BOOL, 3), ("ARG_MIN", I8, 2),
    ("REDUCE_ANY", DType.BOOL, 1), ("CUMSUM", F, 1), ("TOPK_V2", I8, 2), ("TOPK_V2", I16, 3),
])
def test_version_rules(op_type, dtype, expected):
    op = ir_op(op_type, [(dtype, (2, 2)), (DType.INT32, (1,))],
               [(dtype, (2,)), (DType.INT32, (2,))])
    assert ops.require(op_type).version(op) == expected
