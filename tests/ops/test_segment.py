"""SEGMENT_SUM and UNSORTED_SEGMENT_{SUM, PROD, MAX, MIN} against LiteRT."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln import ops
from kiln.errors import OpError
from kiln.ir import Model, QuantParams
from kiln.ops.record import KernelCall
from kiln.schema import DType
from tests.harness import Const, check_op, run_kiln, run_litert, single_op_model

F32, I32 = np.float32, np.int32
UNSORTED = ["UNSORTED_SEGMENT_SUM", "UNSORTED_SEGMENT_PROD", "UNSORTED_SEGMENT_MAX",
            "UNSORTED_SEGMENT_MIN"]


def data(*shape, dtype=F32, seed=0):
    rng = np.random.default_rng(seed)
    if dtype == I32:
        return rng.integers(-9, 10, size=shape).astype(I32)
    return rng.standard_normal(shape).astype(F32)


def ids(*values):
    return np.array(values, I32)


def run_kernel(name, arrays, quant=None):
    sg = Model().add_subgraph("t")
    tensors = [sg.add_tensor(f"t{i}", DType.from_numpy(np.asarray(a).dtype), np.shape(a),
                             quantization=(quant or {}).get(i)) for i, a in enumerate(arrays)]
    out = sg.add_tensor("out", DType.from_numpy(np.asarray(arrays[0]).dtype), ())
    op = sg.add_operator(name, tensors, [out])
    record = ops.require(name)
    call = KernelCall(record.make_options(), op, [np.asarray(arrays[0]).dtype])
    return record.kernel(call, *arrays)


# -- SEGMENT_SUM -----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F32, I32])
@pytest.mark.parametrize("shape,segment_ids", [
    ((6,), ids(0, 0, 1, 1, 1, 2)),
    ((6, 3), ids(0, 0, 1, 1, 1, 2)),
    ((4, 2, 3), ids(0, 1, 2, 3)),
    ((5, 2, 2), ids(0, 0, 0, 0, 0)),
    ((1, 7), ids(0)),
])
@pytest.mark.parametrize("const_ids", [True, False])
def test_segment_sum(shape, segment_ids, dtype, const_ids):
    """Constant ids let LiteRT size the output at prepare; runtime ids make it dynamic."""
    seg = Const(segment_ids) if const_ids else segment_ids
    check_op("SEGMENT_SUM", [data(*shape, dtype=dtype), seg])


def test_segment_sum_constant_data():
    check_op("SEGMENT_SUM", [Const(data(5, 2)), Const(ids(0, 1, 1, 2, 2))])


def test_segment_sum_adds_in_order():
    """Sequential float32 adds, as LiteRT (a pairwise sum would round differently)."""
    x = np.array([1e8, 1.0, -1e8, 1.0, 3.0], F32).reshape(5, 1)
    out = check_op("SEGMENT_SUM", [x, ids(0, 0, 0, 0, 1)])[0]
    assert out[0, 0] == np.float32(np.float32(np.float32(1e8 + 1.0) - 1e8) + 1.0)


def test_segment_sum_int32_wraps():
    x = np.array([2**31 - 1, 5, -7], I32)
    check_op("SEGMENT_SUM", [x, ids(0, 0, 1)])


@pytest.mark.parametrize("segment_ids,match", [
    (ids(0, 2, 2, 3), "no gaps"),
    (ids(1, 1, 2, 2), "start at 0"),
    (ids(0, 1, 0, 1), "increase by 0 or 1"),
    (ids(0, 0, 1), "as long as"),
    (ids(0, 0, 1, 1).reshape(2, 2), "vector"),
])
def test_segment_sum_rejects_bad_ids(segment_ids, match):
    with pytest.raises(OpError, match=match):
        run_kernel("SEGMENT_SUM", [data(4, 3), segment_ids])


def test_segment_sum_gaps_fail_in_litert_too():
    """TF allows gaps in sorted ids; LiteRT does not, and kiln says so rather than guess."""
    x, seg = data(4, 3), ids(0, 2, 2, 3)
    model = single_op_model("SEGMENT_SUM", [x, Const(seg)], out_dtypes=[F32], out_shapes=[(4, 3)])
    with pytest.raises(RuntimeError):
        run_litert(model, [x])


@pytest.mark.parametrize("arrays,match", [
    ([np.zeros((3, 2), np.float64), ids(0, 0, 1)], "float32 or int32"),
    ([np.zeros((3, 2), np.int64), ids(0, 0, 1)], "float32 or int32"),
    ([data(3, 2), np.array([0, 0, 1], np.int64)], "must be int32"),
    ([np.float32(1.0), ids()], "at least one dimension"),
])
def test_segment_sum_type_errors(arrays, match):
    with pytest.raises(OpError, match=match):
        run_kernel("SEGMENT_SUM", arrays)


# -- UNSORTED_SEGMENT_* ----------------------------------------------------------------------------

UNSORTED_CASES = [
    # data shape, segment ids, num_segments
    ((6,), ids(3, 0, 1, 1, 3, 0), 4),
    ((6, 3), ids(3, -1, 1, 1, 3, 0), 5),          # negative ids are skipped; rows 2, 4 empty
    ((2, 3, 4), ids(0, 2, 1, 1, 0, 2).reshape(2, 3), 3),   # 2-D ids: a prefix of the data shape
    ((2, 3), ids(1, 1, 0, 0, 1, 1).reshape(2, 3), 2),      # ids as big as the data
    ((4, 2), ids(0, 0, 0, 0), 1),
    ((3, 2), ids(-1, -1, -1), 2),                  # every row skipped: identities only
]


@pytest.mark.parametrize("dtype", [F32, I32])
@pytest.mark.parametrize("name", UNSORTED)
@pytest.mark.parametrize("shape,segment_ids,num", UNSORTED_CASES)
def test_unsorted_segment(name, shape, segment_ids, num, dtype):
    check_op(name, [data(*shape, dtype=dtype), segment_ids, Const(np.array(num, I32))])


@pytest.mark.parametrize("name", UNSORTED)
@pytest.mark.parametrize("num_form", ["scalar", "vector", "runtime"])
def test_unsorted_segment_num_segments_forms(name, num_form):
    num = np.array(4, I32) if num_form == "scalar" else np.array([4], I32)
    operand = num if num_form == "runtime" else Const(num)
    check_op(name, [data(5, 2), Const(ids(2, 0, 2, 1, 0)), operand])


@pytest.mark.parametrize("name", UNSORTED)
def test_unsorted_segment_nan_and_inf(name):
    """MAX / MIN never let a NaN through (std::max keeps the running value); SUM / PROD do."""
    x = np.array([[np.nan, 1], [2, np.nan], [-np.inf, 3], [np.inf, 0]], F32)
    check_op(name, [x, ids(0, 0, 2, 2), Const(np.array(4, I32))])


@pytest.mark.parametrize("name", ["UNSORTED_SEGMENT_MAX", "UNSORTED_SEGMENT_MIN"])
def test_unsorted_segment_signed_zeros_keep_the_first(name):
    """std::max keeps the running value on a tie, so 0.0 then -0.0 gives 0.0 (and back)."""
    x = np.array([[0.0, -0.0, -0.0, 0.0, 1.0], [-0.0, 0.0, -0.0, 0.0, -1.0]], F32).T.copy()
    seg = ids(0, 0, 1, 1, 2)
    model = single_op_model(name, [x, seg, Const(np.array(3, I32))])
    (expected,), (actual,) = run_litert(model, [x, seg]), run_kiln(model, [x, seg])
    np.testing.assert_array_equal(actual, expected)
    np.testing.assert_array_equal(np.signbit(actual), np.signbit(expected))


@pytest.mark.parametrize("name", ["UNSORTED_SEGMENT_SUM", "UNSORTED_SEGMENT_PROD"])
def test_unsorted_segment_int32_wraps(name):
    x = np.array([2**30, 7, 2**30 + 3, -5], I32)
    check_op(name, [x, ids(0, 0, 0, 1), Const(np.array(2, I32))])


def test_unsorted_segment_empty_rows_hold_type_limits():
    out = run_kernel("UNSORTED_SEGMENT_MAX", [data(2, 2), ids(0, 0), np.array(2, I32)])
    assert np.all(out[1] == np.finfo(F32).min)
    out = run_kernel("UNSORTED_SEGMENT_MIN", [data(2, 2, dtype=I32), ids(1, 1), np.array(2, I32)])
    assert np.all(out[0] == np.iinfo(I32).max)


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_unsorted_segment_random(draw):
    name = draw.draw(st.sampled_from(UNSORTED))
    rows = draw.draw(st.integers(1, 8))
    width = draw.draw(st.integers(1, 3))
    num = draw.draw(st.integers(1, 5))
    seg = np.array(draw.draw(st.lists(st.integers(-1, num - 1), min_size=rows, max_size=rows)), I32)
    dtype = draw.draw(st.sampled_from([F32, I32]))
    check_op(name, [data(rows, width, dtype=dtype, seed=rows), seg, Const(np.array(num, I32))])


@pytest.mark.parametrize("arrays,match", [
    ([data(3, 2), ids(0, 3, 1), np.array(3, I32)], "out of range"),
    ([data(3, 2), ids(0, 1), np.array(3, I32)], "prefix"),
    ([data(3, 2), ids(0, 1, 1, 0, 0, 0).reshape(3, 2, 1), np.array(3, I32)], "prefix"),
    ([data(3, 2), ids(0, 1, 1), np.array(-1, I32)], "negative"),
    ([data(3, 2), ids(0, 1, 1), np.array([3, 3], I32)], "scalar or a 1-element"),
    ([data(3, 2), ids(0, 1, 1), np.array(3, np.int64)], "num_segments must be int32"),
    ([np.zeros((3, 2), np.float64), ids(0, 1, 1), np.array(3, I32)], "float32 or int32"),
])
@pytest.mark.parametrize("name", UNSORTED)
def test_unsorted_segment_errors(name, arrays, match):
    with pytest.raises(OpError, match=match):
        run_kernel(name, arrays)


def test_refuses_quantized_data():
    q = QuantParams(scale=[0.5], zero_point=[0])
    with pytest.raises(OpError, match="quantized kernel not implemented yet"):
        run_kernel("UNSORTED_SEGMENT_SUM", [np.zeros((3, 2), np.int8), ids(0, 1, 1),
                                            np.array(2, I32)], quant={0: q})


def test_records():
    for name in ["SEGMENT_SUM", *UNSORTED]:
        record = ops.require(name)
        assert record.max_version == 1 and record.options is None  # TF writes no table either
