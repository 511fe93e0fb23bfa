"""Indexing ops (slices, gathers, scatters, lookups ...) against LiteRT, over parameter sweeps."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.errors import OpError
from kiln.ir import QuantParams
from tests.harness import Const, check_op, run_kiln, single_op_model
from tests.ops.test_shape import (
    DTYPES, RNG, check_both_fail, check_quant, i32, kernel_call, rand, version_of,
)

# -- SLICE ------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape,begin,size", [
    ((5,), (1,), (3,)), ((5,), (0,), (-1,)), ((3, 4), (1, 0), (2, 4)), ((3, 4), (2, 1), (-1, -1)),
    ((2, 3, 4), (0, 1, 2), (2, 2, 2)), ((2, 3, 4, 5), (1, 0, 3, 1), (1, 3, -1, 3)),
    ((2, 3, 2, 3, 2), (1, 1, 0, 2, 1), (1, -1, 2, 1, 1)), ((3, 4), (1, 1), (0, 2)),
])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.bool_, np.int8])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_slice(shape, begin, size, dtype, index_dtype):
    check_op("SLICE", [rand(shape, dtype), Const(np.array(begin, index_dtype)),
                       Const(np.array(size, index_dtype))])


def test_slice_dynamic_and_errors():
    """A size running past the end fails (XNNPACK clamps float32 ones; the builtin kernel fails)."""
    check_op("SLICE", [rand((3, 4)), i32(1, 2), i32(2, -1)])
    check_both_fail("SLICE", [rand((3, 4), np.int32), Const(i32(2, 0)), Const(i32(2, 1))],
                    out_shapes=[(2, 1)], out_dtypes=[np.int32])
    with pytest.raises(OpError, match="do not fit"):
        kernel_call("SLICE", [rand((3, 4)), i32(-1, 0), i32(1, 1)])


@pytest.mark.parametrize("dtype,rank,expected", [
    (np.float32, 4, 1), (np.int8, 2, 2), (np.int16, 2, 4), (np.float32, 5, 5), (np.float16, 2, 8),
])
def test_slice_version(dtype, rank, expected):
    assert version_of("SLICE", [(dtype, (1,) * rank), (np.int32, (rank,)), (np.int32, (rank,))]) == expected


# -- STRIDED_SLICE ---------------------------------------------------------------------------

def check_builtin(op_type, inputs, options=None):
    """Compare with LiteRT's builtin kernel, without the default XNNPACK delegate.

    XNNPACK (applied by default to float32 STRIDED_SLICE) reads end == 0 as "to the end",
    unlike the builtin kernel and TensorFlow (x[0:0] is empty); kiln follows the builtin
    kernel. Empty results are compared by shape (LiteRT's Python API cannot fetch them).
    """
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    model = single_op_model(op_type, inputs, options=options)
    feeds = [np.asarray(x) for x in inputs if not isinstance(x, Const)]
    it = Interpreter(model_content=model,
                     experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    for d, x in zip(it.get_input_details(), feeds):
        it.resize_tensor_input(d["index"], x.shape)
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), feeds):
        it.set_tensor(d["index"], x)
    it.invoke()
    detail = it.get_output_details()[0]
    actual = run_kiln(model, feeds)[0]
    assert actual.shape == tuple(detail["shape"]), f"{actual.shape} != {tuple(detail['shape'])}"
    if actual.size:
        np.testing.assert_array_equal(actual, it.get_tensor(detail["index"]))
    return actual


def _random_spec(rng, shape):
    """Random begin/end/strides/masks that LiteRT defines (no out-of-range shrink index)."""
    begin, end, strides = [], [], []
    begin_mask = end_mask = shrink = 0
    for d, dim in enumerate(shape):
        stride = int(rng.choice([-3, -2, -1, 1, 1, 2, 3]))
        b = int(rng.integers(-dim - 2, dim + 3))
        e = int(rng.integers(-dim - 2, dim + 3))
        if rng.random() < 0.2:
            begin_mask |= 1 << d
        if rng.random() < 0.2:
            end_mask |= 1 << d
        if rng.random() < 0.2 and not begin_mask >> d & 1:
            stride, b = 1, int(rng.integers(-dim, dim))
            shrink |= 1 << d
        begin.append(b)
        end.append(e)
        strides.append(stride)
    return begin, end, strides, {"begin_mask": begin_mask, "end_mask": end_mask, "shrink_axis_mask": shrink}


@pytest.mark.parametrize("seed", range(60))
def test_strided_slice_random(seed):
    rng = np.random.default_rng(seed)
    shape = tuple(int(v) for v in rng.integers(1, 6, size=int(rng.integers(1, 5))))
    b, e, s, opts = _random_spec(rng, shape)
    check_builtin("STRIDED_SLICE", [rand(shape), Const(i32(*b)), Const(i32(*e)), Const(i32(*s))], options=opts)


@pytest.mark.parametrize("seed", range(10))
def test_strided_slice_dynamic_indices(seed):
    rng = np.random.default_rng(100 + seed)
    shape = tuple(int(v) for v in rng.integers(1, 5, size=3))
    b, e, s, opts = _random_spec(rng, shape)
    check_builtin("STRIDED_SLICE", [rand(shape, np.int32), i32(*b), i32(*e), Const(i32(*s))], options=opts)


@pytest.mark.parametrize("shape,begin,end,strides,opts", [
    # ellipsis in front, middle and back
    ((2, 3, 4), (0, 1), (0, 3), (1, 1), {"ellipsis_mask": 1}),
    ((2, 3, 4, 5), (1, 0, 2), (2, 0, 4), (1, 1, 1), {"ellipsis_mask": 2}),
    ((2, 3, 4), (1, 0), (2, 0), (1, 1), {"ellipsis_mask": 2}),
    ((2, 3, 4), (0, 1, 0), (1, 2, 0), (1, 1, 1), {"ellipsis_mask": 4, "shrink_axis_mask": 1}),
    ((2, 3, 4), (0, -1), (0, 0), (1, 1), {"ellipsis_mask": 1, "shrink_axis_mask": 2}),
    # new axes
    ((2, 3), (0, 0, 0), (0, 2, 3), (1, 1, 1), {"new_axis_mask": 1}),
    ((2, 3), (0, 0, 0), (2, 0, 3), (1, 1, 1), {"new_axis_mask": 2}),
    ((2, 3), (0, 0, 0, 0), (2, 0, 3, 0), (1, 1, 1, 1), {"new_axis_mask": 10}),
    ((2, 3, 4), (0, 0, 1), (0, 0, 3), (1, 1, 1), {"ellipsis_mask": 1, "new_axis_mask": 2}),
    # tf.newaxis together with masks
    ((3, 4), (0, 1, 0), (0, 3, 4), (1, 1, -1), {"new_axis_mask": 1, "end_mask": 4, "begin_mask": 4}),
    # whole-axis masks, negative strides, shrink everything
    ((4, 5), (0, 0), (0, 0), (-1, -2), {"begin_mask": 3, "end_mask": 3}),
    ((4, 5), (-1, 2), (0, 0), (1, 1), {"shrink_axis_mask": 3}),
    ((2, 3, 4, 5, 2), (0, 1, 0, 1, 0), (2, 3, 4, 5, 2), (1, 1, 2, 2, 1), {}),
    ((2, 3, 4), (1,), (2,), (1,), {}),
])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_])
def test_strided_slice_masks(shape, begin, end, strides, opts, dtype):
    check_builtin("STRIDED_SLICE", [rand(shape, dtype), Const(i32(*begin)), Const(i32(*end)), Const(i32(*strides))],
             options=opts)


@pytest.mark.parametrize("shape,begin,size,strides", [
    ((5,), (1,), (3,), (1,)), ((5,), (-4,), (2,), (1,)), ((4, 6), (1, 0), (2, 3), (1, 2)),
    ((4, 6), (0, 1), (4, 5), (2, 1)), ((3, 4), (2, 3), (1, 1), (1, 1)),
])
def test_strided_slice_offset(shape, begin, size, strides):
    """offset=True: end holds the slice length from begin (version 8).

    (LiteRT sizes the output in Prepare from the end tensor, so it must be constant there.)
    """
    out = check_op("STRIDED_SLICE", [rand(shape), i32(*begin), Const(i32(*size)), Const(i32(*strides))],
                   options={"offset": True})[0]
    assert out.ndim == len(shape)


def test_strided_slice_errors():
    with pytest.raises(OpError, match="non-zero"):
        kernel_call("STRIDED_SLICE", [rand((3,)), i32(0), i32(3), i32(0)])
    with pytest.raises(OpError, match="shrink index"):
        kernel_call("STRIDED_SLICE", [rand((3,)), i32(5), i32(6), i32(1)], {"shrink_axis_mask": 1})
    with pytest.raises(OpError, match="runs past"):
        kernel_call("STRIDED_SLICE", [rand((3,)), i32(2), i32(3), i32(1)], {"offset": True})


@pytest.mark.parametrize("dtype,rank,opts,expected", [
    (np.float32, 4, {}, 1), (np.int8, 2, {}, 2), (np.bool_, 2, {}, 3), (np.float32, 5, {}, 4),
    (np.float32, 2, {"ellipsis_mask": 1}, 6), (np.float32, 2, {"new_axis_mask": 2}, 6),
    (np.float32, 2, {"offset": True}, 8),
])
def test_strided_slice_version(dtype, rank, opts, expected):
    inputs = [(dtype, (1,) * rank)] + [(np.int32, (rank,))] * 3
    assert version_of("STRIDED_SLICE", inputs, opts) == expected


# -- GATHER / GATHER_ND ------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
@pytest.mark.parametrize("idx_shape", [(), (4,), (2, 3)])
@pytest.mark.parametrize("idx_dtype", [np.int32, np.int64, np.int16])
def test_gather(axis, idx_shape, idx_dtype):
    x = rand((3, 4, 5))
    idx = RNG.integers(0, x.shape[axis], size=idx_shape).astype(idx_dtype)
    check_op("GATHER", [x, Const(idx)], options={"axis": axis})


@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_dtypes_dynamic_indices(dtype):
    check_op("GATHER", [rand((4, 3), dtype), i32(3, 0, 0, 2)], options={"axis": 0})


@pytest.mark.parametrize("params_shape,idx_shape,axis,batch_dims", [
    ((2, 5), (2, 3), 1, 1), ((2, 3, 5), (2, 4), 2, 1), ((2, 3, 5, 2), (2, 3, 4), 2, 2),
    ((2, 3, 5), (2, 3, 2), 1, 1), ((2, 3, 5), (2, 4), 1, -1), ((2, 3, 4), (2, 3), 2, 2),
])
def test_gather_batch_dims(params_shape, idx_shape, axis, batch_dims):
    x = rand(params_shape)
    idx = RNG.integers(0, params_shape[axis], size=idx_shape).astype(np.int32)
    check_op("GATHER", [x, Const(idx)], options={"axis": axis, "batch_dims": batch_dims})


@pytest.mark.parametrize("bad", [-1, 4])
def test_gather_bad_index(bad):
    check_both_fail("GATHER", [rand((4, 3)), i32(0, bad)], options={"axis": 0},
                    out_shapes=[(2, 3)], out_dtypes=[np.float32])


@pytest.mark.parametrize("dtype,idx_dtype,opts,expected", [
    (np.float32, np.int32, {}, 1), (np.int8, np.int32, {}, 2), (np.bool_, np.int32, {}, 3),
    (np.int16, np.int32, {}, 4), (np.float32, np.int32, {"batch_dims": 1}, 5), (np.float32, np.int16, {}, 6),
])
def test_gather_version(dtype, idx_dtype, opts, expected):
    assert version_of("GATHER", [(dtype, (2, 2)), (idx_dtype, (2, 2))], opts) == expected


@pytest.mark.parametrize("params_shape,idx_shape", [
    ((4,), (3, 1)), ((4, 5), (2,)), ((4, 5), (3, 2)), ((4, 5, 6), (2, 2, 1)), ((4, 5, 6), (2, 3)),
    ((3, 4, 5), (2, 2, 3)),
])
@pytest.mark.parametrize("idx_dtype", [np.int32, np.int64, np.int16])
def test_gather_nd(params_shape, idx_shape, idx_dtype):
    nd = idx_shape[-1]
    idx = np.stack([RNG.integers(0, params_shape[k], size=idx_shape[:-1]) for k in range(nd)], -1)
    check_op("GATHER_ND", [rand(params_shape), Const(idx.astype(idx_dtype))])


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.bool_, np.int8])
def test_gather_nd_dtypes(dtype):
    check_op("GATHER_ND", [rand((3, 4), dtype), np.array([[2, 1], [0, 3]], np.int32)])


@pytest.mark.parametrize("idx", [[[0, -1]], [[3, 0]]])
def test_gather_nd_bad_index(idx):
    check_both_fail("GATHER_ND", [rand((3, 4)), np.array(idx, np.int32)], out_shapes=[(1,)], out_dtypes=[np.float32])


def test_gather_nd_version():
    assert version_of("GATHER_ND", [(np.bool_, (2,)), (np.int32, (1,))]) == 5
    assert version_of("GATHER_ND", [(np.float32, (2,)), (np.int16, (1,))]) == 4
    assert version_of("GATHER_ND", [(np.int16, (2,)), (np.int32, (1,))]) == 3


# -- EMBEDDING_LOOKUP --------------------------------------------------------------------------

@pytest.mark.parametrize("table_shape", [(5, 3), (5, 2, 3), (1, 4)])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int8])
def test_embedding_lookup(table_shape, dtype):
    ids = RNG.integers(0, table_shape[0], size=6).astype(np.int32)
    check_op("EMBEDDING_LOOKUP", [ids, Const(rand(table_shape, dtype))])


@pytest.mark.parametrize("per_row", [False, True])
def test_embedding_lookup_hybrid(per_row):
    table = rand((6, 4), np.int8)
    scale = RNG.uniform(0.01, 0.2, size=6 if per_row else 1).astype(np.float32)
    q = QuantParams(scale, np.zeros_like(scale, dtype=np.int64))
    out = check_quant("EMBEDDING_LOOKUP", [i32(5, 0, 2, 2), table], (4, 4), np.float32,
                      in_q={1: q}, const=(1,))
    assert out.dtype == np.float32
    assert version_of("EMBEDDING_LOOKUP", [(np.int32, (4,)), (np.int8, (6, 4))]) == 1


@pytest.mark.parametrize("bad", [-1, 5])
def test_embedding_lookup_out_of_range(bad):
    check_both_fail("EMBEDDING_LOOKUP", [i32(0, bad), Const(rand((5, 3)))], out_shapes=[(2, 3)],
                    out_dtypes=[np.float32])
    with pytest.raises(OpError, match="index out of bounds"):
        kernel_call("EMBEDDING_LOOKUP", [i32(0, bad), rand((5, 3))])


# -- WHERE / SCATTER_ND / DYNAMIC_UPDATE_SLICE --------------------------------------------------

@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 3, 4), (2, 1, 3, 2)])
@pytest.mark.parametrize("dtype", [np.bool_, np.float32, np.int32, np.int64, np.int8, np.uint8])
def test_where(shape, dtype):
    cond = rand(shape, dtype)
    if dtype != np.bool_:
        cond = np.where(RNG.random(shape) > 0.5, cond, 0).astype(dtype)
    cond.reshape(-1)[0] = 1  # at least one true element (LiteRT cannot return an empty tensor)
    check_op("WHERE", [cond], out_dtypes=[np.int64])


def test_where_none_true_and_version():
    assert kernel_call("WHERE", [np.zeros((2, 3), bool)]).shape == (0, 2)
    assert version_of("WHERE", [(np.bool_, (2,))]) == 1
    assert version_of("WHERE", [(np.float32, (2,))]) == 2


@pytest.mark.parametrize("indices,shape", [
    ([[0], [2], [0]], (3, 2)), ([[1, 1], [0, 2]], (2, 3)), ([[[0, 1]], [[1, 0]]], (2, 2, 3)),
    ([[4], [4], [4]], (5,)), ([[0, 0, 0]], (1, 1, 1)),
])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.bool_, np.int8])
def test_scatter_nd(indices, shape, dtype):
    idx = np.array(indices, np.int32)
    outer, nd = idx.shape[:-1], idx.shape[-1]
    updates = rand(outer + shape[nd:], dtype)
    check_op("SCATTER_ND", [Const(idx), updates, Const(np.array(shape, np.int32))])


def test_scatter_nd_dynamic_and_bad_index():
    check_op("SCATTER_ND", [np.array([[1], [1]], np.int32), rand((2, 3)), np.array([4, 3], np.int32)])
    check_both_fail("SCATTER_ND", [np.array([[4]], np.int32), rand((1, 3)), Const(i32(4, 3))],
                    out_shapes=[(4, 3)], out_dtypes=[np.float32])


@pytest.mark.parametrize("shape,update_shape,start", [
    ((4, 5), (2, 2), (1, 2)), ((4, 5), (2, 2), (3, 4)), ((4, 5), (2, 2), (-3, 1)), ((4, 5), (4, 5), (1, 1)),
    ((2, 3, 4), (1, 3, 2), (1, 0, 1)), ((6,), (2,), (5,)),
])
@pytest.mark.parametrize("idx_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_, np.int8])
def test_dynamic_update_slice(shape, update_shape, start, idx_dtype, dtype):
    check_op("DYNAMIC_UPDATE_SLICE", [rand(shape, dtype), rand(update_shape, dtype),
                                      np.array(start, idx_dtype)])


def test_dynamic_update_slice_version():
    assert version_of("DYNAMIC_UPDATE_SLICE", [(np.float32, (2,)), (np.float32, (1,)), (np.int64, (1,))]) == 2
    assert version_of("DYNAMIC_UPDATE_SLICE", [(np.int16, (2,)), (np.int16, (1,)), (np.int32, (1,))]) == 4


# -- ONE_HOT / UNIQUE / MATRIX_DIAG / MATRIX_SET_DIAG -----------------------------------------

@pytest.mark.parametrize("idx_shape", [(4,), (2, 3)])
@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.bool_, np.int8])
@pytest.mark.parametrize("idx_dtype", [np.int32, np.int64])
def test_one_hot(idx_shape, axis, dtype, idx_dtype):
    idx = RNG.integers(-1, 5, size=idx_shape).astype(idx_dtype)  # -1 and 4 are off the table
    if dtype == np.bool_:
        on, off = np.array(True), np.array(False)
    else:
        on, off = np.array(3, dtype), np.array(-1, dtype)
    check_op("ONE_HOT", [idx, Const(np.int32(4)), Const(on), Const(off)], options={"axis": axis})


@pytest.mark.parametrize("values", [[3, 1, 3, 2, 1, 1], [5], [0, 0, 0], [2, -7, 9, -7, 2, 4]])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.int8, np.uint8])
@pytest.mark.parametrize("idx_type", [2, 4])
def test_unique(values, dtype, idx_type):
    x = np.array(values).astype(dtype)
    check_op("UNIQUE", [x], options={"idx_out_type": idx_type},
             out_dtypes=[dtype, np.int32 if idx_type == 2 else np.int64])


@pytest.mark.parametrize("shape", [(3,), (2, 4), (2, 3, 2)])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int8])
def test_matrix_diag(shape, dtype):
    check_op("MATRIX_DIAG", [rand(shape, dtype)])


@pytest.mark.parametrize("shape", [(3, 3), (2, 4), (4, 2), (2, 3, 5)])
def test_matrix_set_diag(shape):
    check_op("MATRIX_SET_DIAG", [rand(shape), rand(shape[:-2] + (min(shape[-2:]),))])


# -- quantized pass-through ------------------------------------------------------------------

@pytest.mark.parametrize("op_type,extra,options,out_shape", [
    ("GATHER", [i32(2, 0)], {"axis": 1}, (2, 2)),
    ("GATHER_ND", [np.array([[1, 2]], np.int32)], {}, (1,)),
    ("SLICE", [i32(0, 1), i32(2, 2)], {}, (2, 2)),
    ("STRIDED_SLICE", [i32(0, 2), i32(2, 0), i32(1, -1)], {}, (2, 2)),
])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_quantized_passthrough(op_type, extra, options, out_shape, dtype):
    q = QuantParams(0.07, 2)
    check_quant(op_type, [rand((2, 3), dtype), *extra], out_shape, dtype, options=options,
                in_q={0: q}, out_q=q, const=tuple(range(1, 1 + len(extra))))


# -- SPARSE_TO_DENSE --------------------------------------------------------------------------

@pytest.mark.parametrize("values_dtype,version", [(np.float32, 1), (np.int32, 1), (np.int64, 2), (np.int8, 3),
                                                  (np.uint8, 3)])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_sparse_to_dense(values_dtype, version, index_dtype):
    """2-D, 1-D and 0-D indices, a scalar value for every index, repeated indices (the last
    write wins, in LiteRT's order), no index at all."""
    values = rand((3,), values_dtype)
    default = Const(rand((), values_dtype))
    cases = [
        [np.array([[0, 1, 2], [1, 0, 3], [0, 1, 2]], index_dtype), Const(np.array([2, 2, 4], index_dtype)), values],
        [np.array([4, 0, 2], index_dtype), Const(np.array([5], index_dtype)), values],
        [np.array([1, 3, 0], index_dtype), Const(np.array([6], np.int32)), values[:1].reshape(())],
        [np.array(2, index_dtype), Const(np.array([3], index_dtype)), values[0]],
        [np.zeros((0, 2), index_dtype), Const(np.array([2, 3], index_dtype)), values[:0]],
    ]
    for indices, shape, vals in cases:
        check_op("SPARSE_TO_DENSE", [indices, shape, vals, default])
    operands = [(index_dtype, (3, 3)), (index_dtype, (3,)), (values_dtype, (3,)), (values_dtype, ())]
    assert version_of("SPARSE_TO_DENSE", operands) == version


def test_sparse_to_dense_refuses_what_litert_refuses():
    f = np.float32
    for indices, shape in (([[0], [7]], [5]), ([[-1]], [5]), ([[0, 0, 0, 0, 0]], [1, 1, 1, 1, 1])):
        check_both_fail("SPARSE_TO_DENSE", [np.array(indices, np.int32), Const(np.array(shape, np.int32)),
                                            np.ones(len(indices), f), Const(f(0))], out_dtypes=[f],
                        out_shapes=[tuple(shape)])
    with pytest.raises(OpError, match="do not agree"):
        kernel_call("SPARSE_TO_DENSE", [i32(1, 2), i32(5), np.ones(3, f), np.zeros((), f)])
    with pytest.raises(OpError, match="must share"):
        kernel_call("SPARSE_TO_DENSE", [i32(1), i32(5), np.ones(1, f), np.zeros((), np.int32)])
