"""LOCAL_RESPONSE_NORMALIZATION, BUCKETIZE, BITWISE_XOR and RIGHT_SHIFT against LiteRT."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln import ops
from kiln.errors import OpError
from kiln.format import read_model
from kiln.ir import Model, QuantParams
from kiln.ops.record import KernelCall
from kiln.schema import DType
from tests.harness import check_op, run_litert, single_op_model

F32 = np.float32
BIT_TYPES = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32]


def rand(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(F32)


def run_kernel(name, arrays, options=None, quant=None):
    sg = Model().add_subgraph("t")
    tensors = [sg.add_tensor(f"t{i}", DType.from_numpy(np.asarray(a).dtype), np.shape(a),
                             quantization=(quant or {}).get(i)) for i, a in enumerate(arrays)]
    out = sg.add_tensor("out", DType.from_numpy(np.asarray(arrays[0]).dtype), ())
    op = sg.add_operator(name, tensors, [out], options=dict(options or {}))
    record = ops.require(name)
    call = KernelCall(record.make_options(options), op, [np.asarray(arrays[0]).dtype])
    return record.kernel(call, *arrays)


# -- LOCAL_RESPONSE_NORMALIZATION -------------------------------------------------------------------

def lrn(radius=2, bias=1.0, alpha=0.5, beta=0.75):
    return dict(radius=radius, bias=bias, alpha=alpha, beta=beta)


@pytest.mark.parametrize("builtin", [False, True])
@pytest.mark.parametrize("radius", [0, 1, 2, 5, 40])
@pytest.mark.parametrize("beta", [0.5, 0.75, 1.0, 2.0])
def test_lrn(radius, beta, builtin):
    check_op("LOCAL_RESPONSE_NORMALIZATION", [rand(2, 3, 4, 11)],
             options=lrn(radius=radius, beta=beta), builtin_kernels=builtin)


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (1, 2, 2, 3), (3, 5, 1, 16), (1, 4, 4, 64)])
@pytest.mark.parametrize("bias,alpha", [(1.0, 1e-4), (2.0, 1.0), (0.5, 3.0)])
def test_lrn_shapes_and_parameters(shape, bias, alpha):
    check_op("LOCAL_RESPONSE_NORMALIZATION", [rand(*shape, seed=1, scale=3.0)],
             options=lrn(radius=3, bias=bias, alpha=alpha))


def test_lrn_window_includes_c_plus_radius():
    """TensorFlow's window [c - r, c + r] (LiteRT's registered kernel), not the reference
    kernel's [c - r, c + r)."""
    x = np.zeros((1, 1, 1, 3), F32)
    x[0, 0, 0, 1] = 1.0
    x[0, 0, 0, 0] = 2.0
    out = check_op("LOCAL_RESPONSE_NORMALIZATION", [x], options=lrn(radius=1, bias=1.0, alpha=1.0,
                                                                  beta=1.0))[0]
    np.testing.assert_allclose(out[0, 0, 0, :2], [2.0 / 6.0, 1.0 / 6.0], rtol=1e-6)


def test_lrn_matches_tensorflow():
    tf = pytest.importorskip("tensorflow")
    x = rand(2, 3, 3, 9, seed=4, scale=2.0)
    o = lrn(radius=2, bias=1.5, alpha=0.2, beta=0.6)
    expected = tf.nn.local_response_normalization(x, depth_radius=2, bias=1.5, alpha=0.2,
                                                  beta=0.6).numpy()
    np.testing.assert_allclose(run_kernel("LOCAL_RESPONSE_NORMALIZATION", [x], o), expected,
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("arrays,options,match", [
    ([rand(2, 3, 4)], {}, "must be 4-D"),
    ([np.zeros((1, 2, 2, 3), np.float64)], {}, "float32 only"),
    ([np.zeros((1, 2, 2, 3), np.int32)], {}, "float32 only"),
    ([rand(1, 2, 2, 3)], {"radius": -1}, "must not be negative"),
])
def test_lrn_errors(arrays, options, match):
    with pytest.raises(OpError, match=match):
        run_kernel("LOCAL_RESPONSE_NORMALIZATION", arrays, options)


# -- BUCKETIZE --------------------------------------------------------------------------------------

BOUNDS = (-3.0, -0.5, 0.0, 0.0, 1.0, 2.5, 1e6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 2, 5), ()])
def test_bucketize(dtype, shape):
    x = rand(*shape, seed=2, scale=3.0) if shape else np.asarray(rand(1, seed=2)[0] * 3)
    if np.dtype(dtype).kind == "i":
        x = np.round(x)
    check_op("BUCKETIZE", [np.asarray(x).astype(dtype)], options=dict(boundaries=BOUNDS))


def test_bucketize_edges():
    """Values equal to a boundary go right of it; NaN after every boundary; +-inf at the ends."""
    x = np.array([-3.0, 0.0, 1.0, np.nan, np.inf, -np.inf, 1e6, 0.1], F32)
    out = check_op("BUCKETIZE", [x], options=dict(boundaries=BOUNDS))[0]
    assert out.tolist() == [1, 4, 5, 7, 7, 0, 7, 4]


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_bucketize_compares_integers_as_float32(dtype):
    """16777217 becomes 16777216.0 as float32 and so ties the boundary, as in LiteRT."""
    x = np.array([16777216, 16777217, 16777218, -16777217, 2**31 - 1], dtype)
    check_op("BUCKETIZE", [x], options=dict(boundaries=(16777216.0, 16777218.0, 2147483648.0)))


def test_bucketize_float64_against_float32_boundaries():
    """The boundaries are float32 in the file: 0.1 is 0.100000001490116..., so 0.1 (double)
    falls below it."""
    x = np.array([0.1, np.float64(np.float32(0.1)), 0.10000001], np.float64)
    out = check_op("BUCKETIZE", [x], options=dict(boundaries=(0.1,)))[0]
    assert out.tolist() == [0, 1, 1]


def test_bucketize_boundaries_round_trip_the_file():
    model = single_op_model("BUCKETIZE", [rand(3)], options=dict(boundaries=(0.5, 1.0, 2.25)))
    (_, _, op), = list(read_model(model).operators())
    assert tuple(op.options["boundaries"]) == (0.5, 1.0, 2.25)


def test_bucketize_single_boundary():
    check_op("BUCKETIZE", [rand(10, seed=3)], options=dict(boundaries=(0.0,)))


def test_bucketize_without_boundaries_is_all_zero():
    out = run_kernel("BUCKETIZE", [rand(4)], dict(boundaries=()))
    assert out.dtype == np.int32 and not out.any()


def test_bucketize_unsorted_boundaries_fail_like_litert():
    x = rand(4)
    with pytest.raises(OpError, match="sorted"):
        run_kernel("BUCKETIZE", [x], dict(boundaries=(1.0, 0.0)))
    model = single_op_model("BUCKETIZE", [x], options=dict(boundaries=(1.0, 0.0)),
                            out_dtypes=[np.int32], out_shapes=[(4,)])
    with pytest.raises(RuntimeError):
        run_litert(model, [x])


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.bool_])
def test_bucketize_rejects_types(dtype):
    with pytest.raises(OpError, match="not supported"):
        run_kernel("BUCKETIZE", [np.zeros(3, dtype)], dict(boundaries=(1.0,)))


# -- BITWISE_XOR / RIGHT_SHIFT ----------------------------------------------------------------------

def ints(shape, dtype, lo=None, hi=None, seed=0):
    info = np.iinfo(dtype)
    lo = info.min if lo is None else lo
    hi = info.max if hi is None else hi
    return np.random.default_rng(seed).integers(lo, hi, size=shape, endpoint=True).astype(dtype)


SHAPES = [
    ((2, 3, 4), (2, 3, 4)),
    ((2, 3, 4), (3, 1)),
    ((1,), (4, 5)),
    ((2, 1, 3, 2, 4), (1, 2, 1, 2, 1)),         # rank 5 broadcast: LiteRT 2.3 handles it
    ((3, 1, 2, 1, 2, 3), (1, 2, 1, 3, 1, 1)),
    ((), (3,)),
]


@pytest.mark.parametrize("dtype", BIT_TYPES)
@pytest.mark.parametrize("a_shape,b_shape", SHAPES)
def test_bitwise_xor(a_shape, b_shape, dtype):
    check_op("BITWISE_XOR", [ints(a_shape, dtype), ints(b_shape, dtype, seed=1)])


@pytest.mark.parametrize("dtype", BIT_TYPES)
@pytest.mark.parametrize("a_shape,b_shape", SHAPES)
def test_right_shift(a_shape, b_shape, dtype):
    bits = np.dtype(dtype).itemsize * 8
    lo = -3 if np.dtype(dtype).kind == "i" else 0
    check_op("RIGHT_SHIFT", [ints(a_shape, dtype), ints(b_shape, dtype, lo, bits + 3, seed=1)])


@pytest.mark.parametrize("dtype", BIT_TYPES)
def test_right_shift_clamps_the_shift(dtype):
    """Negative shifts shift by 0, shifts past the width by width - 1 (sign fill for signed)."""
    info, bits = np.iinfo(dtype), np.dtype(dtype).itemsize * 8
    a = np.array([info.min, info.max, -1 if info.min else 1, 5], dtype)
    shifts = [0, bits - 1, bits, min(info.max, 100)]
    if info.min:
        shifts[0] = -5
    out = check_op("RIGHT_SHIFT", [a, np.array(shifts, dtype)])[0]
    assert out[0] == a[0]
    assert out[1] == (0 if info.min else 1)
    assert out[2] == (-1 if info.min else 0)


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(BIT_TYPES), st.sampled_from(["BITWISE_XOR", "RIGHT_SHIFT"]),
       st.integers(0, 2**31))
def test_bit_ops_random(dtype, name, seed):
    rng = np.random.default_rng(seed)
    a_shape = tuple(rng.integers(1, 4, size=rng.integers(0, 4)))
    b_shape = tuple(d if rng.random() < 0.6 else 1 for d in a_shape)
    check_op(name, [ints(a_shape, dtype, seed=seed), ints(b_shape, dtype, seed=seed + 1)])


@pytest.mark.parametrize("name", ["BITWISE_XOR", "RIGHT_SHIFT"])
@pytest.mark.parametrize("arrays,match", [
    ([np.zeros(3, np.int32), np.zeros(3, np.int16)], "differ"),
    ([np.zeros(3, np.int64), np.zeros(3, np.int64)], "not supported"),
    ([np.zeros(3, np.float32), np.zeros(3, np.float32)], "not supported"),
    ([np.zeros(3, np.bool_), np.zeros(3, np.bool_)], "not supported"),
    ([np.zeros(3, np.int32), np.zeros(2, np.int32)], "do not broadcast"),
])
def test_bit_op_errors(name, arrays, match):
    with pytest.raises(OpError, match=match):
        run_kernel(name, arrays)


def test_bit_ops_refuse_quantized():
    q = QuantParams(scale=[0.5], zero_point=[0])
    with pytest.raises(OpError, match="quantized kernel not implemented yet"):
        run_kernel("BITWISE_XOR", [np.zeros(3, np.int8), np.zeros(3, np.int8)], quant={0: q})


def test_records():
    for name in ("LOCAL_RESPONSE_NORMALIZATION", "BUCKETIZE", "BITWISE_XOR", "RIGHT_SHIFT"):
        assert ops.require(name).max_version == 1
    assert ops.require("BUCKETIZE").make_options().boundaries == ()
    assert ops.require("LOCAL_RESPONSE_NORMALIZATION").make_options().beta == 0.0


# -- the converter path -----------------------------------------------------------------------------

def _converter_cases(tf):
    x = rand(2, 3, 3, 8, seed=5, scale=2.0)
    n = np.random.default_rng(6).integers(-1000, 1000, size=(4, 6)).astype(np.int32)
    s = np.random.default_rng(7).integers(0, 40, size=(6,)).astype(np.int32)
    return {
        "lrn": ("LOCAL_RESPONSE_NORMALIZATION", [x], lambda x: tf.nn.local_response_normalization(
            x, depth_radius=2, bias=1.5, alpha=0.3, beta=0.75)),
        "bucketize": ("BUCKETIZE", [x], lambda x: tf.raw_ops.Bucketize(
            input=x, boundaries=[-1.0, 0.0, 0.1, 2.0])),
        "xor": ("BITWISE_XOR", [n, s], lambda a, b: tf.bitwise.bitwise_xor(a, b)),
        "shift": ("RIGHT_SHIFT", [n, s], lambda a, b: tf.bitwise.right_shift(a, b)),
    }


@pytest.mark.parametrize("case", ["lrn", "bucketize", "xor", "shift"])
def test_converted_tf_ops_run_in_kiln_and_litert(case):
    tf = pytest.importorskip("tensorflow")
    import kiln
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    op_name, feeds, body = _converter_cases(tf)[case]
    specs = [tf.TensorSpec(f.shape, tf.as_dtype(f.dtype), name=f"in{i}") for i, f in enumerate(feeds)]
    fn = tf.function(body, input_signature=specs)
    data = kiln.TFLiteConverter.from_concrete_functions([fn.get_concrete_function()]).convert()
    assert op_name in {op.name for _, _, op in kiln.read_model(data).operators()}
    kwargs = {f"in{i}": f for i, f in enumerate(feeds)}
    expected = fn(*feeds).numpy()
    ours = kiln.Interpreter(model_content=data).get_signature_runner()(**kwargs)["output_0"]
    theirs = LiteRT(model_content=data).get_signature_runner()(**kwargs)["output_0"]
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
