"""Image ops (resizing, depth/space and batch/space rearrangements) against LiteRT."""

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
from tests.harness import Const, check_op

F32 = np.float32
FLAGS = [(False, False), (True, False), (False, True)]
RESIZE_SIZES = [
    (4, 4, 8, 8), (5, 7, 3, 11), (3, 3, 7, 5), (8, 8, 4, 4), (1, 1, 3, 3), (6, 4, 6, 4),
    (5, 5, 1, 1), (2, 9, 13, 2), (12, 35, 28, 29),
]


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(F32)


def codes(shape, dtype, seed=0):
    """Random values spanning the dtype's range (bool: random truth values)."""
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    lo, hi = max(info.min, -1000), min(info.max, 1000)
    return rng.integers(lo, hi, shape, endpoint=True).astype(dtype)


def size(h, w, const=True):
    s = np.array([h, w], np.int32)
    return Const(s) if const else s


# -- RESIZE_BILINEAR / RESIZE_NEAREST_NEIGHBOR --------------------------------------------------------

@pytest.mark.parametrize("const_size", [True, False])
@pytest.mark.parametrize("align_corners,half_pixel", FLAGS)
@pytest.mark.parametrize("dims", RESIZE_SIZES)
def test_resize_bilinear(dims, align_corners, half_pixel, const_size):
    h, w, oh, ow = dims
    opts = dict(align_corners=align_corners, half_pixel_centers=half_pixel)
    check_op("RESIZE_BILINEAR", [rand(2, h, w, 3), size(oh, ow, const_size)], options=opts,
             atol=1e-5)


@pytest.mark.parametrize("const_size", [True, False])
@pytest.mark.parametrize("align_corners,half_pixel", FLAGS + [(True, True)])
@pytest.mark.parametrize("dims", RESIZE_SIZES)
def test_resize_nearest(dims, align_corners, half_pixel, const_size):
    h, w, oh, ow = dims
    opts = dict(align_corners=align_corners, half_pixel_centers=half_pixel)
    check_op("RESIZE_NEAREST_NEIGHBOR", [rand(2, h, w, 3), size(oh, ow, const_size)],
             options=opts, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.int8, np.int16, np.bool_])
@pytest.mark.parametrize("align_corners,half_pixel", FLAGS)
def test_resize_nearest_dtypes(dtype, align_corners, half_pixel):
    opts = dict(align_corners=align_corners, half_pixel_centers=half_pixel)
    check_op("RESIZE_NEAREST_NEIGHBOR", [codes((1, 5, 3, 2), dtype), size(7, 8)], options=opts,
             out_dtypes=[dtype], version=1)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(h=st.integers(1, 40), w=st.integers(1, 40), oh=st.integers(1, 40), ow=st.integers(1, 40),
       flags=st.sampled_from(FLAGS))
def test_resize_coordinate_fuzz(h, w, oh, ow, flags):
    """Nearest must pick exactly LiteRT's source pixels; bilinear must match its weights."""
    opts = dict(align_corners=flags[0], half_pixel_centers=flags[1])
    x = rand(1, h, w, 2)
    check_op("RESIZE_NEAREST_NEIGHBOR", [x, size(oh, ow)], options=opts, rtol=0, atol=0)
    check_op("RESIZE_BILINEAR", [x, size(oh, ow)], options=opts, atol=1e-5)


def test_resize_bilinear_refuses_both_flags():
    """LiteRT's kernel rejects align_corners together with half_pixel_centers."""
    opts = dict(align_corners=True, half_pixel_centers=True)
    with pytest.raises(OpError, match="align_corners must be False"):
        run_kernel("RESIZE_BILINEAR", [rand(1, 4, 4, 1), np.array([8, 8], np.int32)], opts)


@pytest.mark.parametrize("bad", [np.array([8], np.int32), np.array([0, 4], np.int32),
                                 np.array([2.0, 2.0], F32)])
def test_resize_bad_size(bad):
    with pytest.raises(OpError):
        run_kernel("RESIZE_NEAREST_NEIGHBOR", [rand(1, 4, 4, 1), bad])


# -- DEPTH_TO_SPACE / SPACE_TO_DEPTH -------------------------------------------------------------------

MOVE_DTYPES = [F32, np.int32, np.int64, np.uint8, np.int8]


@pytest.mark.parametrize("dtype", MOVE_DTYPES)
@pytest.mark.parametrize("shape,block", [((2, 4, 6, 8), 2), ((1, 3, 3, 18), 3), ((1, 2, 2, 3), 1),
                                         ((1, 1, 5, 16), 4)])
def test_depth_to_space(shape, block, dtype):
    check_op("DEPTH_TO_SPACE", [codes(shape, dtype)], options=dict(block_size=block),
             out_dtypes=[dtype], version=1, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", MOVE_DTYPES)
@pytest.mark.parametrize("shape,block", [((2, 4, 6, 8), 2), ((1, 6, 3, 2), 3), ((1, 2, 2, 3), 1),
                                         ((1, 8, 4, 1), 4)])
def test_space_to_depth(shape, block, dtype):
    check_op("SPACE_TO_DEPTH", [codes(shape, dtype)], options=dict(block_size=block),
             out_dtypes=[dtype], version=1, rtol=0, atol=0)


def test_depth_space_round_trip():
    x = rand(2, 4, 6, 8)
    y = run_kernel("SPACE_TO_DEPTH", [x], dict(block_size=2))
    np.testing.assert_array_equal(run_kernel("DEPTH_TO_SPACE", [y], dict(block_size=2)), x)


@pytest.mark.parametrize("name,shape,block", [
    ("DEPTH_TO_SPACE", (1, 2, 2, 6), 2), ("SPACE_TO_DEPTH", (1, 3, 4, 1), 2),
    ("SPACE_TO_DEPTH", (1, 4, 4, 1), 0), ("DEPTH_TO_SPACE", (4, 4, 4), 2),
])
def test_depth_space_bad_shapes(name, shape, block):
    with pytest.raises(OpError):
        run_kernel(name, [rand(*shape)], dict(block_size=block))


# -- SPACE_TO_BATCH_ND / BATCH_TO_SPACE_ND ---------------------------------------------------------------

BATCH_SPACE_CASES = [
    ((1, 4, 4, 3), [2, 2], [[0, 0], [0, 0]]),
    ((2, 5, 7, 3), [2, 3], [[1, 0], [0, 2]]),
    ((1, 3, 3, 1), [1, 1], [[1, 1], [2, 2]]),
    ((2, 5, 6, 2), [5, 2], [[0, 0], [2, 0]]),
    ((2, 6, 3), [3], [[1, 2]]),          # 3-D input: version 3
    ((3, 4, 2), [2], [[0, 0]]),
]
BATCH_SPACE_DTYPES = [F32, np.int32, np.int64, np.uint8, np.int8, np.int16, np.bool_]


@pytest.mark.parametrize("dtype", BATCH_SPACE_DTYPES)
@pytest.mark.parametrize("shape,block,pads", BATCH_SPACE_CASES)
def test_space_to_batch_and_back(shape, block, pads, dtype):
    x = codes(shape, dtype)
    block, pads = np.array(block, np.int32), np.array(pads, np.int32)
    version = 3 if len(shape) != 4 else 1
    (y,) = check_op("SPACE_TO_BATCH_ND", [x, Const(block), Const(pads)], out_dtypes=[dtype],
                    version=version, rtol=0, atol=0)
    (back,) = check_op("BATCH_TO_SPACE_ND", [y, Const(block), Const(pads)], out_dtypes=[dtype],
                       version=version, rtol=0, atol=0)
    np.testing.assert_array_equal(back, x)


def test_space_to_batch_dynamic_operands():
    x = rand(2, 5, 7, 3)
    check_op("SPACE_TO_BATCH_ND", [x, np.array([2, 3], np.int32), np.array([[1, 0], [0, 2]], np.int32)])


def test_space_to_batch_pads_quantized_with_zero_point():
    q = QuantParams(scale=[0.5], zero_point=[-7])
    x = np.ones((1, 2, 2, 1), np.int8)
    y = run_kernel("SPACE_TO_BATCH_ND", [x, np.array([2, 2], np.int32),
                                         np.array([[1, 1], [1, 1]], np.int32)], quant={0: q, "out": q})
    assert y.shape == (4, 2, 2, 1)
    assert sorted(np.unique(y).tolist()) == [-7, 1]


@pytest.mark.parametrize("name,x,block,pairs", [
    ("SPACE_TO_BATCH_ND", rand(1, 5, 4, 1), [2, 2], [[0, 0], [0, 0]]),   # 5 not divisible
    ("SPACE_TO_BATCH_ND", rand(1, 4, 4, 1), [2, 2], [[0, 0]]),           # paddings shape
    ("BATCH_TO_SPACE_ND", rand(3, 2, 2, 1), [2, 2], [[0, 0], [0, 0]]),   # batch not divisible
    ("BATCH_TO_SPACE_ND", rand(4, 2, 2, 1), [2, 2], [[3, 2], [0, 0]]),   # crops too large
    ("BATCH_TO_SPACE_ND", rand(4, 2, 2, 1), [0, 2], [[0, 0], [0, 0]]),   # zero block
])
def test_batch_space_bad_operands(name, x, block, pairs):
    with pytest.raises(OpError):
        run_kernel(name, [x, np.array(block, np.int32), np.array(pairs, np.int32)])


# -- versions and quantization ----------------------------------------------------------------------------

def build_op(name, arrays, options=None, quant=None):
    sg = Model().add_subgraph("t")
    tensors = []
    for i, a in enumerate(arrays):
        a = np.asarray(a)
        tensors.append(sg.add_tensor(f"t{i}", DType.from_numpy(a.dtype), a.shape,
                                     quantization=(quant or {}).get(i)))
    x = np.asarray(arrays[0])
    out = sg.add_tensor("out", DType.from_numpy(x.dtype), (), quantization=(quant or {}).get("out"))
    return sg.add_operator(name, tensors, [out], options=dict(options or {}))


def run_kernel(name, arrays, options=None, quant=None):
    record = ops.require(name)
    op = build_op(name, arrays, options, quant)
    call = KernelCall(record.make_options(options), op, [op.outputs[0].dtype.numpy])
    return record.kernel(call, *arrays)


def version_of(name, arrays, options=None):
    return ops.require(name).version(build_op(name, arrays, options))


def z(*shape, dtype=F32):
    return np.zeros(shape, dtype)


SIZE = np.array([4, 4], np.int32)
B2, P2 = np.array([2, 2], np.int32), np.zeros((2, 2), np.int32)


@pytest.mark.parametrize("name,arrays,options,expected", [
    ("RESIZE_BILINEAR", [z(1, 2, 2, 1), SIZE], {}, 1),
    ("RESIZE_BILINEAR", [z(1, 2, 2, 1), SIZE], {"align_corners": True}, 1),
    ("RESIZE_BILINEAR", [z(1, 2, 2, 1), SIZE], {"half_pixel_centers": True}, 3),
    ("RESIZE_BILINEAR", [z(1, 2, 2, 1, dtype=np.int8), SIZE], {}, 2),
    ("RESIZE_BILINEAR", [z(1, 2, 2, 1, dtype=np.int16), SIZE], {"half_pixel_centers": True}, 4),
    ("RESIZE_NEAREST_NEIGHBOR", [z(1, 2, 2, 1), SIZE], {}, 1),
    ("RESIZE_NEAREST_NEIGHBOR", [z(1, 2, 2, 1), SIZE], {"align_corners": True}, 3),
    ("RESIZE_NEAREST_NEIGHBOR", [z(1, 2, 2, 1), SIZE], {"half_pixel_centers": True}, 3),
    ("RESIZE_NEAREST_NEIGHBOR", [z(1, 2, 2, 1, dtype=np.int8), SIZE], {}, 2),
    ("RESIZE_NEAREST_NEIGHBOR", [z(1, 2, 2, 1, dtype=np.int16), SIZE], {}, 4),
    ("DEPTH_TO_SPACE", [z(1, 2, 2, 4)], {"block_size": 2}, 1),
    ("DEPTH_TO_SPACE", [z(1, 2, 2, 4, dtype=np.int8)], {"block_size": 2}, 2),
    ("SPACE_TO_DEPTH", [z(1, 2, 2, 4, dtype=np.int8)], {"block_size": 2}, 2),
    ("SPACE_TO_DEPTH", [z(1, 2, 2, 4, dtype=np.int32)], {"block_size": 2}, 1),
    ("SPACE_TO_BATCH_ND", [z(1, 4, 4, 1), B2, P2], None, 1),
    ("SPACE_TO_BATCH_ND", [z(1, 4, 4, 1, dtype=np.int8), B2, P2], None, 2),
    ("SPACE_TO_BATCH_ND", [z(1, 4, 4), B2[:1], P2[:1]], None, 3),
    ("BATCH_TO_SPACE_ND", [z(4, 2, 2, 1, dtype=np.int16), B2, P2], None, 4),
    ("BATCH_TO_SPACE_ND", [z(4, 2, 2, 1, 1), B2, P2], None, 3),
])
def test_versions(name, arrays, options, expected):
    assert version_of(name, arrays, options) == expected


def test_options_match_the_schema():
    assert ops.require("SPACE_TO_BATCH_ND").options is None
    assert ops.require("BATCH_TO_SPACE_ND").options is None
    assert ops.require("RESIZE_BILINEAR").options.defaults == {
        "align_corners": False, "half_pixel_centers": False}
    assert ops.require("DEPTH_TO_SPACE").options.defaults == {"block_size": 0}


Q = QuantParams(scale=[0.5], zero_point=[3])
Q2 = QuantParams(scale=[0.25], zero_point=[3])


def test_resize_bilinear_refuses_quantized():
    with pytest.raises(OpError, match="quantized kernel not implemented"):
        run_kernel("RESIZE_BILINEAR", [z(1, 2, 2, 1, dtype=np.int8), SIZE], quant={0: Q, "out": Q})


@pytest.mark.parametrize("name,arrays,options", [
    ("RESIZE_NEAREST_NEIGHBOR", [codes((1, 2, 3, 2), np.int8), SIZE], {}),
    ("DEPTH_TO_SPACE", [codes((1, 2, 2, 4), np.uint8)], {"block_size": 2}),
    ("SPACE_TO_DEPTH", [codes((1, 2, 2, 4), np.int8)], {"block_size": 2}),
    ("BATCH_TO_SPACE_ND", [codes((4, 2, 2, 1), np.int16), B2, P2], None),
])
def test_data_movement_on_quantized_codes(name, arrays, options):
    """Shared input/output quantization: the codes move unchanged; differing: refused."""
    plain = run_kernel(name, arrays, options)
    np.testing.assert_array_equal(run_kernel(name, arrays, options, {0: Q, "out": Q}), plain)
    with pytest.raises(OpError, match="quantized kernel not implemented"):
        run_kernel(name, arrays, options, {0: Q, "out": Q2})
