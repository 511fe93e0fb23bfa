"""misc.py's ops against LiteRT: LOCAL_RESPONSE_NORMALIZATION, BUCKETIZE, BITWISE_XOR,
RIGHT_SHIFT, RFFT2D, COMPLEX_ABS, REAL, IMAG, RANK, NON_MAX_SUPPRESSION_V4 / V5; through kiln's
converter where it legalises them, and as TF's converter writes them."""

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
from tests.harness import Const, check_op, run_kiln, run_litert, single_op_model

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


# -- LOCAL_RESPONSE_NORMALIZATION ------------------------------------------------------------------

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


# -- BUCKETIZE -------------------------------------------------------------------------------------

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


# -- BITWISE_XOR / RIGHT_SHIFT ---------------------------------------------------------------------

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
    from kiln.ops import misc

    for record in misc.OPS:
        assert record.max_version == 1 and record.version(None) == 1
        # empty schema tables are not written, as TF's converter writes none
        assert (record.options is None) == (record.name not in (
            "LOCAL_RESPONSE_NORMALIZATION", "BUCKETIZE"))
    assert ops.require("BUCKETIZE").make_options().boundaries == ()
    assert ops.require("LOCAL_RESPONSE_NORMALIZATION").make_options().beta == 0.0


# -- the converter path ----------------------------------------------------------------------------

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


# -- RFFT2D, COMPLEX_ABS, REAL, IMAG, RANK ----------------------------------------------------------

def check_complex(op_type, inputs, rtol=1e-5, atol=1e-5):
    """check_op for complex outputs (the harness's comparison is for real numbers)."""
    model = single_op_model(op_type, inputs)
    feeds = [x for x in inputs if not isinstance(x, Const)]
    (expected,), (actual,) = run_litert(model, feeds), run_kiln(model, feeds)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    scale = float(np.abs(expected).max(initial=0.0))
    np.testing.assert_allclose(actual, expected, rtol=0, atol=atol + rtol * scale)
    return actual


@pytest.mark.parametrize("shape", [(8, 16), (2, 3, 8, 16), (5, 6), (1, 2, 1, 4, 4)])
@pytest.mark.parametrize("lengths", [(8, 16), (4, 8), (16, 32), (2, 2), (8, 2), (1, 4)])
def test_rfft2d(shape, lengths):
    out = check_complex("RFFT2D", [rand(*shape, seed=3), Const(np.array(lengths, np.int32))])
    assert out.shape == shape[:-2] + (lengths[0], lengths[1] // 2 + 1)


def test_rfft2d_width_one_is_the_true_transform():
    """LiteRT returns garbage for an fft width of 1; kiln returns what TF computes."""
    x = rand(2, 4, 4, seed=3)
    out = run_kernel("RFFT2D", [x, np.array([4, 1], np.int32)])
    np.testing.assert_allclose(out, np.fft.rfft2(x[:, :4, :1].astype(np.float64)), rtol=1e-6)


@pytest.mark.parametrize("lengths,match", [
    (np.array([6, 8], np.int32), "powers of two"),
    (np.array([0, 8], np.int32), "powers of two"),
    (np.array([8], np.int32), "vector of 2"),
    (np.array([8, 8], np.int64), "vector of 2"),
])
def test_rfft2d_errors(lengths, match):
    with pytest.raises(OpError, match=match):
        run_kernel("RFFT2D", [rand(8, 8), lengths])
    with pytest.raises(OpError, match="float32 only"):
        run_kernel("RFFT2D", [np.zeros((8, 8)), np.array([8, 8], np.int32)])


def complex_input(*shape, dtype=np.complex64):
    rng = np.random.default_rng(4)
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)


@pytest.mark.parametrize("name", ["COMPLEX_ABS", "REAL", "IMAG"])
@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 1, 5)])
def test_complex_parts(name, shape):
    out = check_op(name, [complex_input(*shape)], rtol=1e-6)[0]
    assert out.dtype == np.float32


@pytest.mark.parametrize("name,fn", [("COMPLEX_ABS", np.abs), ("REAL", np.real), ("IMAG", np.imag)])
def test_complex_parts_of_complex128(name, fn):
    x = complex_input(3, 2, dtype=np.complex128)
    out = run_kernel(name, [x])
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, fn(x))


@pytest.mark.parametrize("name", ["COMPLEX_ABS", "REAL", "IMAG"])
def test_complex_parts_reject_real_input(name):
    with pytest.raises(OpError, match="complex64 or complex128"):
        run_kernel(name, [rand(3)])


@pytest.mark.parametrize("shape", [(), (3,), (2, 3), (1, 2, 3, 4, 5, 6)])
def test_rank(shape):
    out = check_op("RANK", [rand(*shape) if shape else np.float32(1.0)])[0]
    assert out.dtype == np.int32 and out.shape == () and out == len(shape)


# -- NON_MAX_SUPPRESSION_V4 / V5 --------------------------------------------------------------------

def boxes(n, seed=0, flip=False):
    rng = np.random.default_rng(seed)
    corner = rng.uniform(0, 1, (n, 2))
    b = np.concatenate([corner, corner + rng.uniform(0.05, 0.5, (n, 2))], axis=1)
    if flip:  # corners given in the other order: LiteRT normalises them
        b[::2] = b[::2][:, [2, 3, 0, 1]]
    return b.astype(F32)


def nms_inputs(b, s, max_out, iou, score, sigma=None, runtime_max=False):
    size = np.array(max_out, np.int32)
    ins = [b, s, size if runtime_max else Const(size), Const(np.array(iou, F32)),
           Const(np.array(score, F32))]
    return ins if sigma is None else [*ins, Const(np.array(sigma, F32))]


NMS_CASES = [
    # n, max_output_size, iou_threshold, score_threshold, rounded scores (ties)
    (30, 10, 0.3, 0.1, False),
    (30, 50, 0.5, -1.0, False),
    (40, 20, 0.4, 0.0, True),
    (12, 0, 0.5, 0.0, False),
    (25, 5, 1.0, 0.5, True),
    (60, 60, 0.7, 0.2, True),
    (1, 3, 0.5, 0.0, False),
]


@pytest.mark.parametrize("n,max_out,iou,score,ties", NMS_CASES)
def test_nms_v4(n, max_out, iou, score, ties):
    s = np.random.default_rng(n).uniform(0, 1, n)
    s = (np.round(s, 1) if ties else s).astype(F32)
    check_op("NON_MAX_SUPPRESSION_V4", nms_inputs(boxes(n, n, flip=True), s, max_out, iou, score))


@pytest.mark.parametrize("sigma", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("n,max_out,iou,score,ties", NMS_CASES)
def test_nms_v5(n, max_out, iou, score, ties, sigma):
    """Soft-NMS decays scores by float32 exp, which may differ from libm's by an ulp."""
    s = np.random.default_rng(n).uniform(0, 1, n)
    s = (np.round(s, 1) if ties else s).astype(F32)
    check_op("NON_MAX_SUPPRESSION_V5", nms_inputs(boxes(n, n), s, max_out, iou, score, sigma),
             rtol=1e-6)


def test_nms_runtime_max_output_size():
    s = np.random.default_rng(2).uniform(0, 1, 20).astype(F32)
    check_op("NON_MAX_SUPPRESSION_V4", nms_inputs(boxes(20, 2), s, 7, 0.4, 0.0, runtime_max=True))


@pytest.mark.parametrize("iou", [0.5, 1.5])
def test_nms_selects_a_zero_area_box_repeatedly_like_litert(iou):
    b = np.array([[0, 0, 1, 1], [0, 0, 0, 0], [0.1, 0.1, 1.1, 1.1], [2, 2, 2, 3]], F32)
    s = np.array([0.5, 0.9, 0.8, 0.7], F32)
    indices, count = check_op("NON_MAX_SUPPRESSION_V4", nms_inputs(b, s, 6, iou, 0.0))
    assert count == 4 and indices.tolist() == [1, 1, 1, 1, 0, 0]


@pytest.mark.parametrize("sigma", [None, 0.5])
def test_nms_nan_and_inf_corners_like_litert(sigma):
    """std::min / std::max drop a NaN second operand (np.minimum would keep it)."""
    nan, inf = np.nan, np.inf
    b = np.array([[0, 0, 1, 1], [0, 0, nan, nan], [nan, 0, 1, 1], [0, 0.1, 1, 1.1], [0, 0, inf, 1],
                  [-inf, -inf, inf, inf], [5, 5, 6, 6]], F32)
    s = np.array([0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6], F32)
    check_op("NON_MAX_SUPPRESSION_V4" if sigma is None else "NON_MAX_SUPPRESSION_V5",
             nms_inputs(b, s, 8, 0.5, 0.0, sigma))


@pytest.mark.parametrize("arrays,match", [
    ([rand(5, 3), rand(5), np.array(3, np.int32), F32(0.5), F32(0.0)], "boxes must be"),
    ([rand(5, 4), rand(4), np.array(3, np.int32), F32(0.5), F32(0.0)], "scores must be"),
    ([rand(5, 4), rand(5), np.array([3], np.int32), F32(0.5), F32(0.0)], "max_output_size"),
    ([rand(5, 4), rand(5), np.array(-1, np.int32), F32(0.5), F32(0.0)], "must not be negative"),
    ([rand(5, 4), rand(5), np.array(3, np.int32), np.float64(0.5), F32(0.0)], "iou_threshold"),
    ([rand(5, 4), rand(5), np.array(3, np.int32), F32(0.5), F32(0.0), F32(-1)], "sigma"),
])
def test_nms_errors(arrays, match):
    name = "NON_MAX_SUPPRESSION_V5" if len(arrays) == 6 else "NON_MAX_SUPPRESSION_V4"
    with pytest.raises(OpError, match=match):
        run_kernel(name, arrays)


# -- models from TensorFlow's own converter ---------------------------------------------------------

def _tf_cases(tf):
    sig = np.sin(np.linspace(0, 60, 1024)).astype(F32)[None] + rand(1, 1024, seed=8) * 0.1
    n = 16
    b, s = boxes(n, 3), np.random.default_rng(3).uniform(0, 1, n).astype(F32)
    return {
        "spectrogram": ([sig], lambda x: tf.abs(tf.signal.stft(x, 64, 32))),
        "rfft2d_parts": ([rand(3, 8, 16)], lambda x: tf.math.real(tf.signal.rfft2d(x))
                         - tf.math.imag(tf.signal.rfft2d(x))),
        "nms": ([b, s], lambda b, s: tf.image.non_max_suppression(b, s, 6, 0.4, 0.1)),
        "soft_nms": ([b, s], lambda b, s: tf.image.non_max_suppression_with_scores(
            b, s, 6, 0.4, 0.1, 0.5)[1]),
        "rank": ([rand(2, 3)], lambda x: tf.rank(x)),
    }


def _run_by_name(interp, feeds):
    """Feed inputs named in0, in1, ... (TF's names) and return the outputs in file order."""
    for d in interp.get_input_details():
        value = feeds[next(i for i in range(len(feeds)) if f"in{i}" in d["name"])]
        interp.resize_tensor_input(d["index"], value.shape)
    interp.allocate_tensors()
    for d in interp.get_input_details():
        interp.set_tensor(d["index"], feeds[next(i for i in range(len(feeds)) if f"in{i}" in d["name"])])
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()]


@pytest.mark.parametrize("case", ["spectrogram", "rfft2d_parts", "nms", "soft_nms", "rank"])
def test_tf_converted_models_run_in_kiln(case):
    """TF's converter writes these ops; kiln's Interpreter runs its files like LiteRT."""
    tf = pytest.importorskip("tensorflow")
    import kiln
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    feeds, body = _tf_cases(tf)[case]
    shapes = [None] if case == "rank" else [f.shape for f in feeds]  # rank: unknown rank
    specs = [tf.TensorSpec(sh, tf.as_dtype(f.dtype), name=f"in{i}")
             for i, (f, sh) in enumerate(zip(feeds, shapes))]
    fn = tf.function(body, input_signature=specs)
    data = tf.lite.TFLiteConverter.from_concrete_functions([fn.get_concrete_function()]).convert()
    names = {op.name for _, _, op in kiln.read_model(data).operators()}
    assert names & {"RFFT2D", "NON_MAX_SUPPRESSION_V4", "NON_MAX_SUPPRESSION_V5", "RANK"}
    theirs = _run_by_name(LiteRT(model_content=data), feeds)
    ours = _run_by_name(kiln.Interpreter(model_content=data), feeds)
    assert len(ours) == len(theirs)
    for a, e in zip(ours, theirs):
        assert a.dtype == e.dtype and a.shape == e.shape
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5)
