"""Shape and data-movement ops against LiteRT (the oracle), over parameter sweeps."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import ops
from kiln.errors import KilnError, OpError
from kiln.format import write_model
from kiln.ir import Model, Operator, QuantParams
from kiln.ops.record import KernelCall
from kiln.schema import Activation, DType, MirrorPadMode
from tests.harness import Const, check_op, run_kiln, run_litert, single_op_model

RNG = np.random.default_rng(1234)


def rand(shape, dtype=np.float32):
    """Random test data of any supported element type."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return RNG.random(shape) > 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return RNG.integers(max(info.min, -100), min(info.max, 100), size=shape).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


def i32(*v):
    return np.array(v, np.int32)


DTYPES = [np.float32, np.int32, np.int64, np.bool_, np.int8, np.uint8, np.int16]


def check_both_fail(op_type, inputs, options=None, **kw):
    """LiteRT rejects the node, and kiln raises a kiln error (never silently computes)."""
    model = single_op_model(op_type, inputs, options=options, **kw)
    feeds = [np.asarray(x) for x in inputs if x is not None and not isinstance(x, Const)]
    with pytest.raises(Exception):
        run_litert(model, feeds)
    with pytest.raises(KilnError):
        run_kiln(model, feeds)


def kernel_call(op_type, inputs, options=None, n_out=1):
    """Run a kernel directly (for cases the one-op model cannot express, e.g. kiln errors)."""
    record = ops.require(op_type)
    op = Operator(op_type, options=options or {})
    call = KernelCall(record.make_options(options), op, [np.dtype(np.float32)] * n_out)
    return record.kernel(call, *inputs)


def quant_model(op_type, inputs, out_shape, out_dtype, *, options=None, in_q=None, out_q=None,
                const=()):
    """A one-op model whose tensors carry quantization parameters (the harness has none)."""
    model = Model()
    sg = model.add_subgraph("main")
    ins, feeds = [], []
    for k, x in enumerate(inputs):
        x = np.asarray(x)
        q = (in_q or {}).get(k)
        if k in const:
            ins.append(sg.add_constant(f"c{k}", x, quantization=q))
        else:
            t = sg.add_tensor(f"in{k}", DType.from_numpy(x.dtype), x.shape, quantization=q)
            sg.inputs.append(t)
            ins.append(t)
            feeds.append(x)
    out = sg.add_tensor("out", DType.from_numpy(np.dtype(out_dtype)), out_shape, quantization=out_q)
    sg.outputs = [out]
    op = Operator(op_type, options=options or {})
    sg.add_operator(op, ins, [out])
    op.version = ops.require(op_type).version(op)
    return write_model(model), feeds


def check_quant(op_type, inputs, out_shape, out_dtype, **kw):
    model, feeds = quant_model(op_type, inputs, out_shape, out_dtype, **kw)
    expected = run_litert(model, feeds)
    actual = run_kiln(model, feeds)
    np.testing.assert_array_equal(actual[0], expected[0])
    return actual[0]


def version_of(op_type, inputs, options=None, out_dtypes=None):
    """The version kiln's record assigns to an op over tensors of the given (dtype, shape)."""
    model = Model()
    sg = model.add_subgraph("v")
    ins = [sg.add_tensor(f"i{k}", DType.from_numpy(np.dtype(d)), s) for k, (d, s) in enumerate(inputs)]
    outs = [sg.add_tensor(f"o{k}", DType.from_numpy(np.dtype(d)), ()) for k, d in enumerate(out_dtypes or [np.float32])]
    op = Operator(op_type, options=options or {})
    sg.add_operator(op, ins, outs)
    return ops.require(op_type).version(op)


# -- RESHAPE ------------------------------------------------------------------------------------

@pytest.mark.parametrize("in_shape,new_shape", [
    ((2, 3, 4), (4, -1)), ((2, 3, 4), (24,)), ((2, 3, 4), (-1,)), ((2, 3, 4), (1, 2, 1, 12)),
    ((6,), (2, 3)), ((1,), ()), ((2, 0, 3), (0, 5)), ((2, 0, 3), (-1, 3)), ((1, 1, 1, 1, 1, 4), (2, 2)),
])
@pytest.mark.parametrize("how", ["const", "dynamic", "options"])
def test_reshape(in_shape, new_shape, how):
    x = rand(in_shape)
    shape = np.array(new_shape, np.int32)
    if how == "const":
        inputs, options = [x, Const(shape)], {}
    elif how == "dynamic":
        inputs, options = [x, shape], {}
    else:
        if not new_shape:
            pytest.skip("an empty new_shape option means 'no option' in the schema")
        inputs, options = [x], {"new_shape": tuple(new_shape)}
    check_op("RESHAPE", inputs, options=options)


@pytest.mark.parametrize("dtype", DTYPES)
def test_reshape_dtypes(dtype):
    check_op("RESHAPE", [rand((3, 4), dtype), Const(i32(2, 6))])


def test_reshape_legacy_scalar_option():
    out = kernel_call("RESHAPE", [np.ones((1, 1), np.float32)], {"new_shape": (0,)})
    assert out.shape == ()


def test_reshape_errors():
    check_both_fail("RESHAPE", [rand((2, 3)), Const(i32(4, -1))], out_shapes=[(4, 2)], out_dtypes=[np.float32])
    with pytest.raises(OpError, match="more than one -1"):
        kernel_call("RESHAPE", [rand((2, 3)), i32(-1, -1)])
    with pytest.raises(OpError, match="negative"):
        kernel_call("RESHAPE", [rand((2, 3)), i32(-2, -3)])


# -- SQUEEZE / EXPAND_DIMS -------------------------------------------------------------------

@pytest.mark.parametrize("shape,dims", [
    ((1, 2, 1, 3, 1), ()), ((1, 2, 1, 3, 1), (0,)), ((1, 2, 1, 3, 1), (-1, 2)),
    ((1, 2, 1, 3, 1), (0, 2, 4)), ((1,), ()), ((3,), ()), ((1, 1), (1, -1)),
])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_])
def test_squeeze(shape, dims, dtype):
    check_op("SQUEEZE", [rand(shape, dtype)], options={"squeeze_dims": dims})


def test_squeeze_error():
    with pytest.raises(OpError, match="is not 1"):
        kernel_call("SQUEEZE", [rand((1, 2))], {"squeeze_dims": (1,)})


@pytest.mark.parametrize("axis", [-4, -3, -2, -1, 0, 1, 2, 3])
@pytest.mark.parametrize("axis_dtype", [np.int32, np.int64])
def test_expand_dims(axis, axis_dtype):
    check_op("EXPAND_DIMS", [rand((2, 3, 4)), Const(np.array([axis], axis_dtype))])


def test_expand_dims_dynamic_axis_and_error():
    check_op("EXPAND_DIMS", [rand((2, 3), np.int8), i32(1)])
    with pytest.raises(OpError, match="out of range"):
        kernel_call("EXPAND_DIMS", [rand((2, 3)), i32(3)])


# -- TRANSPOSE ----------------------------------------------------------------------------------

@pytest.mark.parametrize("rank", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("seed", range(3))
def test_transpose(rank, seed):
    rng = np.random.default_rng(seed)
    shape = tuple(rng.integers(1, 4, size=rank))
    perm = rng.permutation(rank).astype(np.int32)
    check_op("TRANSPOSE", [rand(shape), Const(perm)])


@pytest.mark.parametrize("dtype", DTYPES)
def test_transpose_dtypes_and_negative_perm(dtype):
    check_op("TRANSPOSE", [rand((2, 3, 4), dtype), Const(i32(-1, 0, -2))])


def test_transpose_dynamic_perm_and_errors():
    check_op("TRANSPOSE", [rand((2, 3, 4)), i32(1, 2, 0)])
    with pytest.raises(OpError, match="not a permutation"):
        kernel_call("TRANSPOSE", [rand((2, 3)), i32(0, 0)])
    with pytest.raises(OpError, match="entries"):
        kernel_call("TRANSPOSE", [rand((2, 3)), i32(0, 1, 2)])


@pytest.mark.parametrize("dtype,rank,expected", [
    (np.float32, 4, 1), (np.int8, 4, 2), (np.bool_, 4, 3), (np.float32, 5, 4), (np.int16, 3, 5),
    (np.float32, 6, 6), (np.int8, 6, 6), (np.float16, 2, 9), (np.float32, 7, 8),
])
def test_transpose_version(dtype, rank, expected):
    assert version_of("TRANSPOSE", [(dtype, (1,) * rank), (np.int32, (rank,))]) == expected


# -- CONCATENATION / PACK / UNPACK ---------------------------------------------------------

@pytest.mark.parametrize("axis", [-3, -2, -1, 0, 1, 2])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_concatenation(axis, n):
    base = [2, 3, 4]
    xs = []
    for k in range(n):
        shape = list(base)
        shape[axis] = k + 1
        xs.append(rand(shape))
    check_op("CONCATENATION", xs, options={"axis": axis})


@pytest.mark.parametrize("dtype", DTYPES)
def test_concatenation_dtypes_with_const(dtype):
    check_op("CONCATENATION", [rand((2, 3), dtype), Const(rand((2, 2), dtype))], options={"axis": 1})


@pytest.mark.parametrize("act", list(Activation))
def test_concatenation_fused_activation(act):
    """LiteRT rejects a fused activation on CONCATENATION; kiln applies it (TF semantics)."""
    a, b = rand((2, 3)) * 4, rand((2, 2)) * 4
    if act == Activation.NONE:
        check_op("CONCATENATION", [a, b], options={"axis": -1, "fused_activation_function": act})
        return
    out = kernel_call("CONCATENATION", [a, b], {"axis": -1, "fused_activation_function": int(act)})
    cat = np.concatenate([a, b], -1)
    expected = {
        Activation.RELU: np.maximum(cat, 0), Activation.RELU6: np.clip(cat, 0, 6),
        Activation.RELU_N1_TO_1: np.clip(cat, -1, 1), Activation.TANH: np.tanh(cat),
        Activation.SIGN_BIT: np.signbit(cat).astype(np.float32),
    }[act]
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_concatenation_errors():
    check_both_fail("CONCATENATION", [rand((2, 3)), rand((3, 3))], options={"axis": 1},
                    out_shapes=[(2, 6)], out_dtypes=[np.float32])
    with pytest.raises(OpError, match="different ranks"):
        kernel_call("CONCATENATION", [rand((2, 3)), rand((3,))])


def test_concatenation_uint8_requantizes():
    a = RNG.integers(0, 256, (2, 3)).astype(np.uint8)
    b = RNG.integers(0, 256, (2, 2)).astype(np.uint8)
    q = {0: QuantParams(0.05, 3), 1: QuantParams(0.11, 140)}
    check_quant("CONCATENATION", [a, b], (2, 5), np.uint8, options={"axis": 1}, in_q=q,
                out_q=QuantParams(0.09, 100))


def test_concatenation_int8_same_params():
    a, b = rand((2, 3), np.int8), rand((1, 3), np.int8)
    q = QuantParams(0.1, -4)
    check_quant("CONCATENATION", [a, b], (3, 3), np.int8, options={"axis": 0}, in_q={0: q, 1: q}, out_q=q)


@pytest.mark.parametrize("axis", [-3, -2, -1, 0, 1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int8, np.int64])
def test_pack(axis, dtype):
    xs = [rand((2, 3), dtype) for _ in range(3)]
    check_op("PACK", xs, options={"values_count": 3, "axis": axis})


@pytest.mark.parametrize("axis", [-3, -1, 0, 1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int8, np.bool_])
def test_unpack(axis, dtype):
    x = rand((2, 3, 4), dtype)
    check_op("UNPACK", [x], options={"num": x.shape[axis], "axis": axis})


# -- SPLIT / SPLIT_V ----------------------------------------------------------------------

@pytest.mark.parametrize("axis,n", [(0, 2), (1, 3), (2, 4), (-1, 2), (-3, 1), (1, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int8])
def test_split(axis, n, dtype):
    check_op("SPLIT", [Const(i32(axis)), rand((2, 3, 4), dtype)], options={"num_splits": n})


def test_split_uneven_error():
    with pytest.raises(OpError, match="equal parts"):
        kernel_call("SPLIT", [i32(1), rand((2, 3))], {"num_splits": 2})


@pytest.mark.parametrize("sizes,axis", [
    ((1, 2, 1), 2), ((-1, 1), 0), ((2, -1), -1), ((0, 3), 1), ((3,), 1), ((1, -1, 1), -1),
])
@pytest.mark.parametrize("sizes_dtype", [np.int32, np.int64])
def test_split_v(sizes, axis, sizes_dtype):
    x = rand((2, 3, 4))
    check_op("SPLIT_V", [x, Const(np.array(sizes, sizes_dtype)), Const(i32(axis))],
             options={"num_splits": len(sizes)})


def test_split_v_errors():
    with pytest.raises(OpError, match="more than one -1"):
        kernel_call("SPLIT_V", [rand((4,)), i32(-1, -1), i32(0)], {"num_splits": 2})
    with pytest.raises(OpError, match="add up"):
        kernel_call("SPLIT_V", [rand((4,)), i32(1, 2), i32(0)], {"num_splits": 2})


# -- TILE / BROADCAST_TO / SHAPE / FILL / RANGE -----------------------------------------------

@pytest.mark.parametrize("shape,multiples", [
    ((3,), (2,)), ((2, 3), (1, 1)), ((2, 3), (2, 3)), ((2, 1, 3), (1, 4, 2)), ((1, 2, 1, 2, 1), (2, 1, 2, 1, 2)),
])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.bool_, np.int8])
def test_tile(shape, multiples, dtype):
    check_op("TILE", [rand(shape, dtype), Const(np.array(multiples, np.int32))])


def test_tile_int64_multiples():
    check_op("TILE", [rand((2, 2)), Const(np.array([3, 1], np.int64))])


@pytest.mark.parametrize("shape,target", [
    ((3,), (2, 3)), ((1, 3), (4, 3)), ((2, 1), (2, 5)), ((1,), (2, 3, 4)), ((2, 1, 3), (4, 2, 2, 3)),
    ((), (3, 2)),
])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_])
def test_broadcast_to(shape, target, dtype):
    check_op("BROADCAST_TO", [rand(shape, dtype), Const(np.array(target, np.int32))])


def test_broadcast_to_int64_shape_and_error():
    check_op("BROADCAST_TO", [rand((1, 3)), Const(np.array([2, 3], np.int64))])
    with pytest.raises(OpError, match="cannot broadcast"):
        kernel_call("BROADCAST_TO", [rand((2, 3)), i32(3, 3)])


@pytest.mark.parametrize("a,b", [((2, 3), (1, 3)), ((4, 1, 3), (5, 1)), ((1,), (2, 2, 2)), ((0, 1), (1, 7))])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_broadcast_args(a, b, dtype):
    out = check_op("BROADCAST_ARGS", [np.array(a, dtype), np.array(b, dtype)])[0]
    assert tuple(out) == np.broadcast_shapes(a, b)


def test_broadcast_args_incompatible():
    with pytest.raises(OpError, match="incompatible"):
        kernel_call("BROADCAST_ARGS", [i32(2, 3), i32(4, 3)])


@pytest.mark.parametrize("shape", [(3,), (2, 0, 4), (1, 2, 3, 4, 5)])
@pytest.mark.parametrize("out", [np.int32, np.int64])
def test_shape(shape, out):
    check_op("SHAPE", [rand(shape)], options={"out_type": DType.from_numpy(np.dtype(out))},
             out_dtypes=[out])


def test_shape_of_scalar_and_out_type_option():
    """(LiteRT's Python API cannot return an empty tensor, so these run kiln alone.)"""
    assert kernel_call("SHAPE", [np.float32(1)]).shape == (0,)
    out = kernel_call("SHAPE", [rand((2, 3))], {"out_type": DType.INT64})
    assert out.dtype == np.int64 and out.tolist() == [2, 3]


@pytest.mark.parametrize("dims", [(2, 3), (4,), (1, 2, 1, 2)])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.bool_])
def test_fill(dims, dtype):
    value = rand((), dtype)
    check_op("FILL", [Const(np.array(dims, np.int32)), value])


def test_fill_int64_dims_and_scalar():
    check_op("FILL", [np.array([2, 2], np.int64), np.float32(3.5)])
    assert kernel_call("FILL", [np.zeros(0, np.int32), np.int32(4)]).tolist() == 4
    assert kernel_call("FILL", [i32(2, 0), np.float32(1)]).shape == (2, 0)


@pytest.mark.parametrize("start,limit,delta", [
    (0.1, 7.3, 0.7), (0.0, 1.0, 0.1), (5.0, -3.0, -0.3), (-2.0, 100.0, 0.37), (0.0, 0.5, 1.0),
])
def test_range_float(start, limit, delta):
    out = check_op("RANGE", [np.float32(start), np.float32(limit), np.float32(delta)])[0]
    assert out.dtype == np.float32


@pytest.mark.parametrize("start,limit,delta", [(0, 10, 3), (10, -3, -3), (-5, 5, 1), (0, 1, 7)])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_range_int(start, limit, delta, dtype):
    t = np.dtype(dtype).type
    check_op("RANGE", [t(start), t(limit), t(delta)])


def test_range_empty():
    assert kernel_call("RANGE", [np.int32(4), np.int32(4), np.int32(1)]).shape == (0,)
    assert kernel_call("RANGE", [np.float32(1.5), np.float32(1.5), np.float32(1)]).shape == (0,)


def test_range_errors():
    with pytest.raises(OpError, match="zero"):
        kernel_call("RANGE", [np.int32(0), np.int32(3), np.int32(0)])
    with pytest.raises(OpError, match="towards"):
        kernel_call("RANGE", [np.int32(0), np.int32(3), np.int32(-1)])


# -- PAD / PADV2 / MIRROR_PAD ----------------------------------------------------------------

PADDINGS = [
    ((2, 3), ((1, 2), (0, 1))), ((2, 3, 4), ((0, 0), (1, 1), (2, 0))), ((1, 3, 3, 2), ((0, 0), (1, 1), (1, 1), (0, 0))),
    ((2,), ((3, 0),)), ((1, 2, 1, 2, 1), ((1, 0), (0, 1), (1, 1), (0, 0), (2, 0))),
]


@pytest.mark.parametrize("shape,pads", PADDINGS)
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.int8])
@pytest.mark.parametrize("pad_dtype", [np.int32, np.int64])
def test_pad(shape, pads, dtype, pad_dtype):
    check_op("PAD", [rand(shape, dtype), Const(np.array(pads, pad_dtype))])


@pytest.mark.parametrize("shape,pads", PADDINGS)
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64])
def test_padv2(shape, pads, dtype):
    value = np.array([7], dtype)
    check_op("PADV2", [rand(shape, dtype), Const(np.array(pads, np.int32)), Const(value)])


def test_pad_dynamic_paddings_and_errors():
    check_op("PAD", [rand((2, 3)), np.array([[1, 0], [2, 2]], np.int32)])
    with pytest.raises(OpError, match="non-negative"):
        kernel_call("PAD", [rand((2, 3)), np.array([[1, 0], [-1, 2]], np.int32)])
    with pytest.raises(OpError, match="shape"):
        kernel_call("PAD", [rand((2, 3)), np.array([[1, 0]], np.int32)])


def test_pad_quantized_uses_zero_point():
    x = rand((2, 3), np.int8)
    q = QuantParams(0.2, 5)
    out = check_quant("PAD", [x, np.array([[1, 1], [0, 2]], np.int32)], (4, 5), np.int8,
                      in_q={0: q}, out_q=q, const=(1,))
    assert out[0, 0] == 5


def test_padv2_quantized():
    x = rand((2, 3), np.uint8)
    q = QuantParams(0.2, 128)
    check_quant("PADV2", [x, np.array([[1, 1], [0, 2]], np.int32), np.array([77], np.uint8)], (4, 5),
                np.uint8, in_q={0: q, 2: q}, out_q=q, const=(1, 2))


@pytest.mark.parametrize("mode", [MirrorPadMode.REFLECT, MirrorPadMode.SYMMETRIC])
@pytest.mark.parametrize("shape,pads", [
    ((3, 4), ((1, 2), (0, 3))), ((2, 3, 4), ((1, 1), (2, 2), (3, 3))), ((4,), ((3, 0),)),
    ((1, 3, 3, 1), ((0, 0), (2, 2), (1, 2), (0, 0))),
])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int8])
def test_mirror_pad(mode, shape, pads, dtype):
    pads = np.array(pads, np.int32)
    if mode == MirrorPadMode.REFLECT:
        pads = np.minimum(pads, np.array(shape)[:, None] - 1)
    check_op("MIRROR_PAD", [rand(shape, dtype), Const(pads)], options={"mode": mode})


def test_mirror_pad_too_wide():
    with pytest.raises(OpError, match="exceed"):
        kernel_call("MIRROR_PAD", [rand((2, 3)), np.array([[2, 0], [0, 0]], np.int32)], {"mode": 0})


# -- REVERSE_V2 / REVERSE_SEQUENCE ------------------------------------------------------------

@pytest.mark.parametrize("axes", [(0,), (1,), (2,), (3,), (0, 1), (1, 2), (2, 3), (0, 1, 2)])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_, np.int8, np.int64])
def test_reverse_v2(axes, dtype):
    check_op("REVERSE_V2", [rand((2, 3, 4, 2), dtype), Const(np.array(axes, np.int32))])


def test_reverse_v2_negative_axis():
    """LiteRT only takes axes >= 0; kiln also accepts negative ones (TF semantics)."""
    x = rand((2, 3))
    np.testing.assert_array_equal(kernel_call("REVERSE_V2", [x, i32(-1)]), x[:, ::-1])


@pytest.mark.parametrize("seq_dim,batch_dim", [(1, 0), (0, 1), (2, 0), (0, 2), (2, 1)])
@pytest.mark.parametrize("len_dtype", [np.int32, np.int64])
def test_reverse_sequence(seq_dim, batch_dim, len_dtype):
    x = rand((3, 4, 5))
    lengths = RNG.integers(0, x.shape[seq_dim] + 1, size=x.shape[batch_dim]).astype(len_dtype)
    check_op("REVERSE_SEQUENCE", [x, Const(lengths)], options={"seq_dim": seq_dim, "batch_dim": batch_dim})


def test_reverse_sequence_errors():
    with pytest.raises(OpError, match="must lie"):
        kernel_call("REVERSE_SEQUENCE", [rand((2, 3)), i32(4, 1)], {"seq_dim": 1, "batch_dim": 0})


# -- quantized pass-through ------------------------------------------------------------------

@pytest.mark.parametrize("op_type,extra,options,out_shape", [
    ("RESHAPE", [i32(3, 2)], {}, (3, 2)),
    ("TRANSPOSE", [i32(1, 0)], {}, (3, 2)),
    ("TILE", [i32(2, 1)], {}, (4, 3)),
    ("REVERSE_V2", [i32(1)], {}, (2, 3)),
    ("MIRROR_PAD", [np.array([[1, 1], [1, 0]], np.int32)], {"mode": 0}, (4, 4)),
])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_quantized_passthrough(op_type, extra, options, out_shape, dtype):
    q = QuantParams(0.05, 3)
    x = rand((2, 3), dtype)
    check_quant(op_type, [x, *extra], out_shape, dtype, options=options, in_q={0: q}, out_q=q,
                const=tuple(range(1, 1 + len(extra))))


# -- versions ----------------------------------------------------------------------------------

@pytest.mark.parametrize("op_type,inputs,options,out_dtypes,expected", [
    ("CONCATENATION", [(np.int8, (2,)), (np.int8, (2,))], {}, None, 2),
    ("CONCATENATION", [(np.int16, (2,))], {}, None, 3),
    ("CONCATENATION", [(np.float16, (2,))], {}, None, 6),
    ("PACK", [(np.int16, (2,))], {}, [np.int16], 3),
    ("UNPACK", [(np.bool_, (2,))], {}, [np.bool_], 3),
    ("SPLIT", [(np.int32, ()), (np.int32, (4,))], {}, None, 3),
    ("SPLIT", [(np.int32, ()), (np.int16, (4,))], {}, None, 4),
    ("SPLIT_V", [(np.int8, (4,))], {}, None, 2),
    ("BROADCAST_TO", [(np.float32, (4,))], {}, None, 2),
    ("BROADCAST_TO", [(np.int8, (4,))], {}, None, 3),
    ("FILL", [(np.int32, (2,)), (np.bool_, ())], {}, None, 2),
    ("RANGE", [(np.int64, ())], {}, None, 2),
    ("PAD", [(np.float32, (1, 1, 1, 1, 1))], {}, None, 4),
    ("PAD", [(np.bool_, (1,))], {}, None, 5),
    ("PADV2", [(np.int16, (1,))], {}, None, 3),
    ("MIRROR_PAD", [(np.int8, (1,))], {}, None, 2),
    ("REVERSE_V2", [(np.bool_, (1,))], {}, None, 2),
    ("TILE", [(np.int8, (1,))], {}, None, 3),
    ("RESHAPE", [(np.int8, (1,))], {}, None, 1),
])
def test_versions(op_type, inputs, options, out_dtypes, expected):
    assert version_of(op_type, inputs, options, out_dtypes) == expected


def test_max_versions_run_in_litert():
    """kiln's max_version for each op is one LiteRT's builtin resolver registers too."""
    for name in ["RESHAPE", "TRANSPOSE", "CONCATENATION", "PAD", "TILE", "SPLIT_V", "BROADCAST_TO"]:
        rec = ops.require(name)
        assert rec.max_version >= 1
    x = rand((2, 3))
    check_op("TRANSPOSE", [x, Const(i32(1, 0))], version=ops.require("TRANSPOSE").max_version)
    check_op("PAD", [x, Const(np.array([[1, 0], [0, 1]], np.int32))], version=ops.require("PAD").max_version)


# -- BITCAST ----------------------------------------------------------------------------------

@pytest.mark.parametrize("x,out", [
    (np.array([1.5, -0.0, np.inf, np.nan], np.float32), np.int32),   # same width: same shape
    (np.array([[1, 2, 3, 4], [0, 0, 128, 255]], np.uint8), np.float32),  # narrower in: last dim goes
    (np.array([[1.5, 2]], np.float32), np.uint8),                     # wider in: a last dim of 4 comes
    (np.array(-7, np.int64), np.int32), (np.array([1, 2], np.int16), np.float16),
    (np.array([True, False]), np.int8), (np.zeros((0, 2), np.int32), np.float32),
])
def test_bitcast(x, out):
    check_op("BITCAST", [x], out_dtypes=[out])


def test_bitcast_needs_the_size_ratio_as_last_dim():
    for x, out in ((np.array([1, 2, 3], np.uint8), np.float32), (np.array(1, np.uint8), np.int16)):
        check_both_fail("BITCAST", [x], out_dtypes=[out], out_shapes=[(1,)])
