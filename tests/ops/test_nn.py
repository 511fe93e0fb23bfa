"""NN ops (FULLY_CONNECTED, convolutions, pooling, BATCH_MATMUL) against LiteRT."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln import ops
from kiln.errors import OpError
from kiln.ir import Model, QuantParams
from kiln.kernels import conv
from kiln.ops.record import KernelCall
from kiln.schema import Activation, DType, Padding
from tests.harness import Const, check_op, run_kiln, single_op_model

F32 = np.float32
ACTS = list(Activation)
CLAMPS = [Activation.NONE, Activation.RELU, Activation.RELU6, Activation.RELU_N1_TO_1]


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(F32)


def conv_opts(padding, stride=(1, 1), dilation=(1, 1), act=Activation.NONE):
    return dict(padding=padding, stride_h=stride[0], stride_w=stride[1],
                dilation_h_factor=dilation[0], dilation_w_factor=dilation[1],
                fused_activation_function=act)


# -- FULLY_CONNECTED -------------------------------------------------------------------------------

@pytest.mark.parametrize("act", CLAMPS)
@pytest.mark.parametrize("x_shape,units,keep", [
    ((3, 4), 5, False),
    ((1, 16), 8, False),
    ((2, 3, 4), 5, False),   # flattened to [6, 4]
    ((2, 3, 4), 5, True),
    ((2, 2, 3, 8), 3, True),
    ((12,), 7, False),
])
def test_fully_connected(x_shape, units, keep, act):
    x, w, b = rand(*x_shape), rand(units, x_shape[-1], seed=1), rand(units, seed=2)
    opts = dict(fused_activation_function=act, keep_num_dims=keep)
    check_op("FULLY_CONNECTED", [x, Const(w), Const(b)], options=opts, rtol=1e-5)


@pytest.mark.parametrize("act", [Activation.TANH, Activation.SIGN_BIT])
def test_fully_connected_refuses_non_clamping_activation(act):
    """LiteRT's FULLY_CONNECTED fails to prepare with these; kiln says so too."""
    with pytest.raises(OpError, match="not supported"):
        run_kernel("FULLY_CONNECTED", [rand(2, 4), rand(3, 4), rand(3)],
                   dict(fused_activation_function=act))


@pytest.mark.parametrize("omitted", [True, False])
@pytest.mark.parametrize("act", CLAMPS)
def test_fully_connected_without_bias(omitted, act):
    x, w = rand(4, 6), rand(3, 6, seed=1)
    inputs = [x, Const(w), None] if omitted else [x, Const(w)]
    check_op("FULLY_CONNECTED", inputs, options=dict(fused_activation_function=act))


def test_fully_connected_dynamic_weights():
    check_op("FULLY_CONNECTED", [rand(4, 6), rand(3, 6, seed=1), Const(rand(3, seed=2))])


def test_fully_connected_rejects_bad_depth():
    with pytest.raises(OpError, match="does not split"):
        run_kernel("FULLY_CONNECTED", [rand(5), rand(3, 2)])


# -- CONV_2D ----------------------------------------------------------------------------------------

CONV_CASES = [
    # (N, H, W, Cin, Cout, KH, KW, stride, dilation)
    (1, 7, 9, 3, 4, 3, 3, (1, 1), (1, 1)),
    (2, 7, 9, 3, 4, 3, 3, (2, 2), (1, 1)),
    (1, 8, 8, 4, 6, 3, 3, (2, 1), (1, 1)),
    (1, 9, 7, 4, 6, 2, 2, (3, 3), (1, 1)),
    (1, 10, 11, 2, 5, 3, 3, (1, 1), (2, 2)),
    (1, 12, 10, 2, 5, 3, 2, (2, 1), (2, 3)),
    (2, 5, 6, 8, 4, 1, 1, (1, 1), (1, 1)),
    (1, 5, 6, 8, 4, 1, 1, (2, 2), (1, 1)),
    (1, 4, 4, 2, 3, 5, 5, (1, 1), (1, 1)),   # filter larger than the input under SAME
    (1, 6, 6, 3, 2, 4, 4, (2, 2), (1, 1)),   # even filter: odd total padding
]


@pytest.mark.parametrize("padding", [Padding.SAME, Padding.VALID])
@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d(case, padding):
    n, h, w, cin, cout, kh, kw, stride, dil = case
    if padding == Padding.VALID and (kh - 1) * dil[0] + 1 > h:
        pytest.skip("window does not fit under VALID")
    x, f, b = rand(n, h, w, cin), rand(cout, kh, kw, cin, seed=1), rand(cout, seed=2)
    check_op("CONV_2D", [x, Const(f), Const(b)], options=conv_opts(padding, stride, dil), rtol=1e-5)


@pytest.mark.parametrize("act", ACTS)
def test_conv2d_activations(act):
    """LiteRT clamps RELU/RELU6/RELU_N1_TO_1 and leaves TANH/SIGN_BIT unapplied."""
    x, f, b = rand(1, 6, 6, 3), rand(4, 3, 3, 3, seed=1), rand(4, seed=2)
    check_op("CONV_2D", [x, Const(f), Const(b)], options=conv_opts(Padding.SAME, act=act))


@pytest.mark.parametrize("groups,cin,cout", [(2, 4, 6), (3, 6, 6), (4, 8, 4)])
@pytest.mark.parametrize("padding", [Padding.SAME, Padding.VALID])
def test_conv2d_grouped(groups, cin, cout, padding):
    x, f, b = rand(2, 7, 6, cin), rand(cout, 3, 3, cin // groups, seed=1), rand(cout, seed=2)
    opts = conv_opts(padding, (1, 2))
    check_op("CONV_2D", [x, Const(f), Const(b)], options=opts)
    assert version_of("CONV_2D", [x, f, b], opts) == 6


def test_conv2d_dynamic_filter():
    x, f, b = rand(1, 5, 5, 3), rand(2, 3, 3, 3, seed=1), rand(2, seed=2)
    check_op("CONV_2D", [x, f, Const(b)], options=conv_opts(Padding.SAME))


@pytest.mark.parametrize("groups", [1, 2])
def test_conv2d_im2col_in_row_chunks(monkeypatch, groups):
    """A small im2col budget splits the output rows into several chunks (and a remainder)."""
    monkeypatch.setattr(conv, "FLOAT_IM2COL_BUDGET", 2 * 9 * 8 * 9 * 4)  # 4 rows per chunk
    x, f, b = rand(2, 11, 9, 8), rand(6, 3, 3, 8 // groups, seed=1), rand(6, seed=2)
    check_op("CONV_2D", [x, Const(f), Const(b)], options=conv_opts(Padding.SAME, (1, 1), (1, 2)))


def test_bias_of_wrong_size_is_an_op_error():
    with pytest.raises(OpError, match="bias has 2 elements"):
        run_kernel("CONV_2D", [rand(1, 4, 4, 2), rand(3, 3, 3, 2), rand(2)],
                   conv_opts(Padding.SAME))


def test_conv2d_without_bias_matches_zero_bias():
    """LiteRT requires the bias; kiln also accepts it left out (treated as zeros)."""
    x, f = rand(1, 5, 5, 3), rand(2, 3, 3, 3, seed=1)
    opts = conv_opts(Padding.SAME)
    (ref,) = check_op("CONV_2D", [x, Const(f), Const(np.zeros(2, F32))], options=opts)
    model = single_op_model("CONV_2D", [x, Const(f), None], options=opts, version=1)
    (got,) = run_kiln(model, [x])
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(h=st.integers(1, 12), w=st.integers(1, 12), k=st.integers(1, 4), s=st.integers(1, 3),
       d=st.integers(1, 2), same=st.booleans())
def test_conv2d_geometry_fuzz(h, w, k, s, d, same):
    eff = (k - 1) * d + 1
    if not same and (eff > h or eff > w):
        return
    x, f, b = rand(1, h, w, 2), rand(3, k, k, 2, seed=1), rand(3, seed=2)
    padding = Padding.SAME if same else Padding.VALID
    check_op("CONV_2D", [x, Const(f), Const(b)], options=conv_opts(padding, (s, s), (d, d)))


# -- DEPTHWISE_CONV_2D ------------------------------------------------------------------------------

DW_CASES = [
    # (N, H, W, Cin, multiplier, K, stride, dilation)
    (1, 7, 9, 3, 1, 3, (1, 1), (1, 1)),
    (2, 7, 9, 3, 2, 3, (2, 2), (1, 1)),
    (1, 8, 8, 4, 3, 3, (2, 1), (1, 1)),
    (1, 9, 7, 4, 1, 2, (3, 3), (2, 2)),
    (1, 10, 10, 6, 1, 3, (1, 1), (2, 1)),
    (1, 6, 6, 5, 2, 1, (1, 1), (1, 1)),
    (1, 4, 4, 2, 1, 5, (1, 1), (1, 1)),
]


@pytest.mark.parametrize("padding", [Padding.SAME, Padding.VALID])
@pytest.mark.parametrize("case", DW_CASES)
def test_depthwise_conv2d(case, padding):
    n, h, w, cin, mult, k, stride, dil = case
    if padding == Padding.VALID and (k - 1) * max(dil) + 1 > min(h, w):
        pytest.skip("window does not fit under VALID")
    x, f, b = rand(n, h, w, cin), rand(1, k, k, cin * mult, seed=1), rand(cin * mult, seed=2)
    opts = dict(conv_opts(padding, stride, dil), depth_multiplier=mult)
    check_op("DEPTHWISE_CONV_2D", [x, Const(f), Const(b)], options=opts)


@pytest.mark.parametrize("act", ACTS)
def test_depthwise_conv2d_activations(act):
    x, f, b = rand(1, 6, 6, 3), rand(1, 3, 3, 6, seed=1), rand(6, seed=2)
    opts = dict(conv_opts(Padding.SAME, act=act), depth_multiplier=2)
    check_op("DEPTHWISE_CONV_2D", [x, Const(f), Const(b)], options=opts)


def test_depthwise_conv2d_multiplier_zero_is_inferred():
    x, f, b = rand(1, 5, 5, 2), rand(1, 3, 3, 4, seed=1), rand(4, seed=2)
    opts = dict(conv_opts(Padding.SAME), depth_multiplier=0)
    check_op("DEPTHWISE_CONV_2D", [x, Const(f), Const(b)], options=opts)


def test_depthwise_conv2d_ignores_inconsistent_multiplier_option():
    """As LiteRT's builtin kernel: the multiplier comes from the shapes (XNNPACK refuses)."""
    x, f, b = rand(1, 5, 5, 2), rand(1, 3, 3, 4, seed=1), rand(4, seed=2)
    good = run_kernel("DEPTHWISE_CONV_2D", [x, f, b], dict(conv_opts(Padding.SAME), depth_multiplier=2))
    odd = check_builtin("DEPTHWISE_CONV_2D", [x, Const(f), Const(b)],
                        dict(conv_opts(Padding.SAME), depth_multiplier=3))
    np.testing.assert_array_equal(odd, good)


def test_depthwise_conv2d_rejects_indivisible_channels():
    with pytest.raises(OpError, match="not a multiple"):
        run_kernel("DEPTHWISE_CONV_2D", [rand(1, 5, 5, 3), rand(1, 3, 3, 4), rand(4)],
                   conv_opts(Padding.SAME))


# -- TRANSPOSE_CONV -----------------------------------------------------------------------------------

TCONV_CASES = [
    # (N, H, W, Cin, Cout, K, stride, padding, out_h, out_w)
    (1, 4, 4, 3, 2, 3, 2, Padding.SAME, 8, 8),
    (2, 4, 4, 3, 2, 3, 2, Padding.VALID, 9, 9),
    (1, 3, 5, 2, 4, 4, 2, Padding.SAME, 6, 10),
    (1, 3, 5, 2, 4, 4, 2, Padding.SAME, 5, 9),    # odd output under SAME
    (1, 3, 3, 2, 2, 3, 1, Padding.VALID, 5, 5),
    (1, 3, 3, 2, 2, 3, 1, Padding.SAME, 3, 3),
    (1, 3, 3, 2, 2, 2, 3, Padding.SAME, 9, 9),
    (1, 3, 3, 2, 2, 2, 3, Padding.VALID, 10, 10),  # stride larger than the filter
    (1, 2, 3, 3, 3, 1, 2, Padding.VALID, 3, 5),
]


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("case", TCONV_CASES)
def test_transpose_conv(case, with_bias):
    n, h, w, cin, cout, k, s, padding, oh, ow = case
    x, f, b = rand(n, h, w, cin), rand(cout, k, k, cin, seed=1), rand(cout, seed=2)
    inputs = [Const(np.array([n, oh, ow, cout], np.int32)), Const(f), x]
    if with_bias:
        inputs.append(Const(b))
    opts = dict(padding=padding, stride_h=s, stride_w=s)
    check_op("TRANSPOSE_CONV", inputs, options=opts)


@pytest.mark.parametrize("act", CLAMPS)
def test_transpose_conv_activation(act):
    x, f, b = rand(1, 3, 3, 2), rand(3, 3, 3, 2, seed=1), rand(3, seed=2)
    inputs = [Const(np.array([1, 6, 6, 3], np.int32)), Const(f), x, Const(b)]
    opts = dict(padding=Padding.SAME, stride_h=2, stride_w=2, fused_activation_function=act)
    check_op("TRANSPOSE_CONV", inputs, options=opts)


def test_transpose_conv_dynamic_output_shape_and_weights():
    x, f, b = rand(1, 3, 4, 2), rand(3, 3, 3, 2, seed=1), rand(3, seed=2)
    inputs = [np.array([1, 6, 8, 3], np.int32), f, x, Const(b)]
    check_op("TRANSPOSE_CONV", inputs, options=dict(padding=Padding.SAME, stride_h=2, stride_w=2))


def test_transpose_conv_rejects_inconsistent_output_shape():
    x, f = rand(1, 3, 3, 2), rand(3, 3, 3, 2, seed=1)
    opts = dict(padding=Padding.SAME, stride_h=2, stride_w=2)
    with pytest.raises(OpError, match="needs an input of 4x4"):
        run_kernel("TRANSPOSE_CONV", [np.array([1, 7, 7, 3], np.int32), f, x], opts)


# -- pooling ------------------------------------------------------------------------------------------

POOL_CASES = [
    # (H, W, KH, KW, stride)
    (7, 9, 3, 3, (1, 1)),
    (7, 9, 3, 3, (2, 2)),
    (8, 8, 2, 2, (2, 2)),
    (9, 7, 3, 2, (3, 2)),
    (5, 5, 5, 5, (1, 1)),
    (6, 6, 4, 4, (3, 3)),
    (1, 6, 1, 3, (1, 2)),
]


@pytest.mark.parametrize("op", ["MAX_POOL_2D", "AVERAGE_POOL_2D"])
@pytest.mark.parametrize("padding", [Padding.SAME, Padding.VALID])
@pytest.mark.parametrize("case", POOL_CASES)
def test_pool(op, case, padding):
    h, w, kh, kw, stride = case
    opts = dict(padding=padding, stride_h=stride[0], stride_w=stride[1],
                filter_height=kh, filter_width=kw)
    check_op(op, [rand(2, h, w, 3)], options=opts)


@pytest.mark.parametrize("op", ["MAX_POOL_2D", "AVERAGE_POOL_2D"])
@pytest.mark.parametrize("act", ACTS)
def test_pool_activations(op, act):
    opts = dict(padding=Padding.SAME, stride_h=2, stride_w=2, filter_height=3, filter_width=3,
                fused_activation_function=act)
    check_op(op, [rand(1, 7, 7, 4)], options=opts)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16])
def test_max_pool_integer_codes(dtype):
    """Max pooling of unquantized integer codes is exact (no arithmetic)."""
    info = np.iinfo(dtype)
    x = np.random.default_rng(3).integers(info.min, info.max, (1, 7, 7, 3), endpoint=True).astype(dtype)
    opts = dict(padding=Padding.SAME, stride_h=2, stride_w=2, filter_height=3, filter_width=3)
    check_op("MAX_POOL_2D", [x], options=opts, out_dtypes=[dtype], version=1)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(h=st.integers(1, 10), w=st.integers(1, 10), k=st.integers(1, 4), s=st.integers(1, 3),
       same=st.booleans())
def test_average_pool_geometry_fuzz(h, w, k, s, same):
    if not same and (k > h or k > w):
        return
    opts = dict(padding=Padding.SAME if same else Padding.VALID, stride_h=s, stride_w=s,
                filter_height=k, filter_width=k)
    check_op("AVERAGE_POOL_2D", [rand(1, h, w, 2)], options=opts)


# -- BATCH_MATMUL --------------------------------------------------------------------------------------

@pytest.mark.parametrize("adj_x", [False, True])
@pytest.mark.parametrize("adj_y", [False, True])
@pytest.mark.parametrize("a_batch,b_batch", [
    ((), ()),
    ((2,), ()),
    ((), (3,)),
    ((2,), (2,)),
    ((2, 1), (3,)),
    ((1, 3), (2, 1)),
    ((2, 1, 2), (1, 3, 1)),
])
def test_batch_matmul(a_batch, b_batch, adj_x, adj_y):
    m, k, n = 3, 4, 5
    a = rand(*a_batch, *((k, m) if adj_x else (m, k)))
    b = rand(*b_batch, *((n, k) if adj_y else (k, n)), seed=1)
    check_op("BATCH_MATMUL", [a, b], options=dict(adj_x=adj_x, adj_y=adj_y))


def test_batch_matmul_constant_rhs():
    check_op("BATCH_MATMUL", [rand(2, 3, 4), Const(rand(4, 6, seed=1))])


def test_batch_matmul_rejects_mismatched_depth():
    with pytest.raises(OpError, match="contraction"):
        run_kernel("BATCH_MATMUL", [rand(2, 3), rand(4, 5)], dict(adj_x=False, adj_y=False))


# -- LiteRT's builtin kernels (where the default XNNPACK delegate behaves differently) ------------

def check_builtin(name, inputs, options):
    """Run a one-op model in LiteRT without delegates and in kiln; assert equal outputs."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    model = single_op_model(name, inputs, options=options)
    feeds = [x for x in inputs if not isinstance(x, Const)]
    ref = Interpreter(model_content=model,
                      experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    for d, x in zip(ref.get_input_details(), feeds):
        ref.resize_tensor_input(d["index"], x.shape)
    ref.allocate_tensors()
    for d, x in zip(ref.get_input_details(), feeds):
        ref.set_tensor(d["index"], x)
    ref.invoke()
    expected = ref.get_tensor(ref.get_output_details()[0]["index"])
    (actual,) = run_kiln(model, feeds)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)
    return actual


def with_infinities(shape):
    x = np.zeros(shape, F32)
    x[0, 1, 1, 0], x[0, 2, 2, -1] = np.inf, -np.inf
    return x


@pytest.mark.parametrize("act", [Activation.NONE, Activation.RELU])
@pytest.mark.parametrize("name", ["CONV_2D", "DEPTHWISE_CONV_2D", "MAX_POOL_2D", "AVERAGE_POOL_2D",
                                  "FULLY_CONNECTED"])
def test_infinities_clamp_to_float_max(name, act):
    """Builtin kernels clamp to the activation range, which is +-FLT_MAX for NONE."""
    x = with_infinities((1, 4, 4, 2))
    pool = dict(padding=Padding.SAME, stride_h=1, stride_w=1, filter_height=2, filter_width=2,
                fused_activation_function=act)
    inputs, opts = {
        "CONV_2D": ([x, Const(np.ones((1, 1, 1, 2), F32)), Const(np.zeros(1, F32))],
                    conv_opts(Padding.SAME, act=act)),
        "DEPTHWISE_CONV_2D": ([x, Const(np.ones((1, 1, 1, 2), F32)), Const(np.zeros(2, F32))],
                              conv_opts(Padding.SAME, act=act)),
        "FULLY_CONNECTED": ([x.reshape(8, 4), Const(np.ones((3, 4), F32)), Const(np.zeros(3, F32))],
                            dict(fused_activation_function=act)),
        "MAX_POOL_2D": ([x], pool),
        "AVERAGE_POOL_2D": ([x], pool),
    }[name]
    y = check_builtin(name, inputs, opts)
    assert np.isfinite(y).all() and y.max() == np.finfo(F32).max


# -- versions, quantized refusal ------------------------------------------------------------------------

def build_op(name, arrays, options=None, quant=None, out_dtype=None):
    """An IR operator over tensors for ``arrays``; ``quant`` maps input index -> QuantParams."""
    sg = Model().add_subgraph("t")
    tensors = []
    for i, a in enumerate(arrays):
        if a is None:
            tensors.append(None)
            continue
        a = np.asarray(a)
        q = (quant or {}).get(i)
        tensors.append(sg.add_tensor(f"t{i}", DType.from_numpy(a.dtype), a.shape, quantization=q))
    first = next(np.asarray(a) for a in arrays if a is not None)
    out_dt = DType.from_numpy(out_dtype or (arrays[2].dtype if name == "TRANSPOSE_CONV" else first.dtype))
    out = sg.add_tensor("out", out_dt, (), quantization=(quant or {}).get("out"))
    return sg.add_operator(name, tensors, [out], options=dict(options or {}))


def version_of(name, arrays, options=None, quant=None, out_dtype=None):
    return ops.require(name).version(build_op(name, arrays, options, quant, out_dtype))


def run_kernel(name, arrays, options=None, quant=None, out_dtype=None):
    record = ops.require(name)
    op = build_op(name, arrays, options, quant, out_dtype)
    call = KernelCall(record.make_options(options), op, [op.outputs[0].dtype.numpy])
    return record.kernel(call, *arrays)


I8, U8, I16 = np.int8, np.uint8, np.int16
Q = QuantParams(scale=[0.5], zero_point=[0])
QC = QuantParams(scale=[0.5, 0.25, 0.1], zero_point=[0, 0, 0])


def z(*shape, dtype=F32):
    return np.zeros(shape, dtype)


@pytest.mark.parametrize("name,arrays,options,quant,out,expected", [
    ("FULLY_CONNECTED", [z(2, 4), z(3, 4), z(3)], {}, None, None, 1),
    ("FULLY_CONNECTED", [z(2, 4), z(3, 4)], {}, None, None, 6),
    ("FULLY_CONNECTED", [z(2, 4), z(3, 4), None], {}, None, None, 1),
    ("FULLY_CONNECTED", [z(2, 4), z(3, 4), z(3)], {"keep_num_dims": True}, None, None, 5),
    ("FULLY_CONNECTED", [z(2, 4, dtype=I8), z(3, 4, dtype=I8), z(3, dtype=np.int32)], {},
     {0: Q, 1: Q, "out": Q}, None, 4),
    ("FULLY_CONNECTED", [z(2, 4), z(3, 4, dtype=I8), z(3)], {}, {1: Q}, None, 3),
    ("FULLY_CONNECTED", [z(2, 4), z(3, 4, dtype=I8), z(3)], {"asymmetric_quantize_inputs": True},
     {1: Q}, None, 9),
    ("FULLY_CONNECTED", [z(2, 4), z(3, 4, dtype=I8), z(3)], {}, {1: QC}, None, 12),
    ("FULLY_CONNECTED", [z(2, 4, dtype=I16), z(3, 4, dtype=I16), z(3, dtype=np.int64)], {},
     {0: Q, 1: Q, "out": Q}, None, 7),
    ("CONV_2D", [z(1, 4, 4, 2), z(3, 3, 3, 2), z(3)], {}, None, None, 1),
    ("CONV_2D", [z(1, 4, 4, 4), z(3, 3, 3, 2), z(3)], {}, None, None, 6),
    ("CONV_2D", [z(1, 4, 4, 2, dtype=I8), z(3, 3, 3, 2, dtype=I8), z(3, dtype=np.int32)], {},
     {0: Q, 1: QC, "out": Q}, None, 3),
    ("CONV_2D", [z(1, 4, 4, 2), z(3, 3, 3, 2, dtype=I8), z(3)], {}, {1: Q}, None, 2),
    ("CONV_2D", [z(1, 4, 4, 2), z(3, 3, 3, 2, dtype=I8), z(3)], {}, {1: QC}, None, 5),
    ("DEPTHWISE_CONV_2D", [z(1, 4, 4, 2), z(1, 3, 3, 2), z(2)], {}, None, None, 1),
    ("DEPTHWISE_CONV_2D", [z(1, 4, 4, 2), z(1, 3, 3, 2), z(2)], {"dilation_h_factor": 2}, None,
     None, 2),
    ("DEPTHWISE_CONV_2D", [z(1, 4, 4, 3, dtype=I8), z(1, 3, 3, 3, dtype=I8), z(3, dtype=np.int32)],
     {}, {0: Q, 1: QC, "out": Q}, None, 3),
    ("DEPTHWISE_CONV_2D", [z(1, 4, 4, 3), z(1, 3, 3, 3, dtype=I8), z(3)], {}, {1: QC}, None, 6),
    ("DEPTHWISE_CONV_2D", [z(1, 4, 4, 3), z(1, 3, 3, 3, dtype=I8), z(3)], {}, {1: Q}, None, 4),
    ("TRANSPOSE_CONV", [np.array([1, 4, 4, 2], np.int32), z(2, 3, 3, 2), z(1, 2, 2, 2)], {}, None,
     None, 1),
    ("TRANSPOSE_CONV", [np.array([1, 4, 4, 2], np.int32), z(2, 3, 3, 2), z(1, 2, 2, 2), z(2)], {},
     None, None, 3),
    ("TRANSPOSE_CONV", [np.array([1, 4, 4, 2], np.int32), z(2, 3, 3, 2), z(1, 2, 2, 2), None], {},
     None, None, 1),
    ("TRANSPOSE_CONV", [np.array([1, 4, 4, 2], np.int32), z(2, 3, 3, 2), z(1, 2, 2, 2)],
     {"fused_activation_function": Activation.RELU}, None, None, 4),
    ("TRANSPOSE_CONV", [np.array([1, 4, 4, 2], np.int32), z(2, 3, 3, 2, dtype=I8),
                        z(1, 2, 2, 2, dtype=I8)], {}, {1: Q, 2: Q, "out": Q}, None, 2),
    ("MAX_POOL_2D", [z(1, 4, 4, 2)], {}, None, None, 1),
    ("MAX_POOL_2D", [z(1, 4, 4, 2, dtype=I8)], {}, {0: Q, "out": Q}, None, 2),
    ("AVERAGE_POOL_2D", [z(1, 4, 4, 2, dtype=I16)], {}, {0: Q, "out": Q}, None, 3),
    ("BATCH_MATMUL", [z(2, 3), z(3, 2)], {}, None, None, 1),
    ("BATCH_MATMUL", [z(2, 3, dtype=I8), z(3, 2, dtype=I8)], {}, {0: Q, 1: Q, "out": Q}, None, 2),
    ("BATCH_MATMUL", [z(2, 3, dtype=I16), z(3, 2, dtype=I16)], {}, {0: Q, 1: Q, "out": Q}, None, 3),
    ("BATCH_MATMUL", [z(2, 3), z(3, 2, dtype=I8)], {"asymmetric_quantize_inputs": True}, {1: Q},
     np.float32, 4),
])
def test_versions(name, arrays, options, quant, out, expected):
    assert version_of(name, arrays, options, quant, out) == expected


@pytest.mark.parametrize("name,arrays,options,quant", [
    ("FULLY_CONNECTED", [z(2, 4, dtype=I8), z(3, 4, dtype=I8), z(3, dtype=np.int32)], {},
     {0: Q, 1: Q, "out": Q}),
    ("CONV_2D", [z(1, 4, 4, 2, dtype=U8), z(3, 3, 3, 2, dtype=U8), z(3, dtype=np.int32)],
     dict(stride_h=1, stride_w=1), {0: Q, 1: Q, "out": Q}),
    ("DEPTHWISE_CONV_2D", [z(1, 4, 4, 2, dtype=I8), z(1, 3, 3, 2, dtype=I8), z(2, dtype=np.int32)],
     dict(stride_h=1, stride_w=1), {0: Q, 1: Q, "out": Q}),
    ("TRANSPOSE_CONV", [np.array([1, 4, 4, 2], np.int32), z(2, 3, 3, 2, dtype=I8),
                        z(1, 4, 4, 2, dtype=I8)], dict(stride_h=1, stride_w=1),
     {1: Q, 2: Q, "out": Q}),
    ("AVERAGE_POOL_2D", [z(1, 4, 4, 2, dtype=I8)],
     dict(stride_h=1, stride_w=1, filter_height=2, filter_width=2), {0: Q, "out": Q}),
    ("MAX_POOL_2D", [z(1, 4, 4, 2, dtype=I8)],
     dict(stride_h=1, stride_w=1, filter_height=2, filter_width=2),
     {0: Q, "out": QuantParams(scale=[0.1], zero_point=[3])}),
    ("BATCH_MATMUL", [z(2, 3, dtype=I16), z(3, 2, dtype=I16)], {}, {0: Q, 1: Q, "out": Q}),
])
def test_quantized_operands_are_refused(name, arrays, options, quant):
    with pytest.raises(OpError, match="quantized kernel not implemented"):
        run_kernel(name, arrays, options, quant)


def test_max_pool_runs_on_shared_quantization():
    x = np.arange(32, dtype=I8).reshape(1, 4, 4, 2)
    opts = dict(stride_h=2, stride_w=2, filter_height=2, filter_width=2, padding=Padding.VALID)
    y = run_kernel("MAX_POOL_2D", [x], opts, {0: Q, "out": Q})
    np.testing.assert_array_equal(y, x.reshape(1, 2, 2, 2, 2, 2).max(axis=(2, 4)))


@pytest.mark.parametrize("name,options", [
    ("CONV_2D", dict(stride_h=0, stride_w=1)),
    ("MAX_POOL_2D", dict(stride_h=1, stride_w=1, filter_height=0, filter_width=2)),
])
def test_bad_geometry_is_an_op_error(name, options):
    arrays = [rand(1, 4, 4, 2), rand(3, 3, 3, 2), rand(3)] if name == "CONV_2D" else [rand(1, 4, 4, 2)]
    with pytest.raises(OpError):
        run_kernel(name, arrays, options)


def test_shape_rules_agree_with_kernels():
    cases = [
        ("FULLY_CONNECTED", [rand(2, 3, 4), rand(5, 4), rand(5)], dict(keep_num_dims=True)),
        ("CONV_2D", [rand(1, 7, 9, 4), rand(6, 3, 3, 2), rand(6)],
         conv_opts(Padding.SAME, (2, 3), (1, 2))),
        ("DEPTHWISE_CONV_2D", [rand(1, 7, 9, 4), rand(1, 3, 3, 8), rand(8)],
         dict(conv_opts(Padding.VALID, (2, 1)), depth_multiplier=2)),
        ("AVERAGE_POOL_2D", [rand(2, 7, 9, 4)],
         dict(padding=Padding.SAME, stride_h=2, stride_w=3, filter_height=3, filter_width=2)),
        ("BATCH_MATMUL", [rand(2, 1, 4, 3), rand(5, 4, 6)], dict(adj_x=True)),
    ]
    for name, arrays, options in cases:
        record = ops.require(name)
        shapes = record.shape(record.make_options(options), [a.shape for a in arrays])
        assert shapes == [run_kernel(name, arrays, options).shape], name
