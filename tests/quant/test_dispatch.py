"""The op records' quantized kernels, chosen by operand types, run by kiln's Interpreter on
one-op models: bit for bit what LiteRT's reference kernels (BUILTIN_REF) compute, and
refused where no kernel exists for the node's types."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import ops
from kiln.errors import OpError
from kiln.format import write_model
from kiln.ir import Model, Operator, QuantParams
from kiln.ops.record import HYBRID, INT8, INT16, UINT8, operand_types
from kiln.schema import Activation, DType, Padding
from tests.harness import run_api

RNG = np.random.default_rng(5)
NONE, RELU, RELU6 = Activation.NONE, Activation.RELU, Activation.RELU6


def qp(scale, zero_point=0, axis=0) -> QuantParams:
    scale = np.atleast_1d(np.asarray(scale, np.float32))
    return QuantParams(scale, np.broadcast_to(np.asarray(zero_point, np.int64), scale.shape), quantized_dimension=axis)


class In:
    """A model input: its value and quantization."""

    def __init__(self, value, q=None):
        self.value, self.q = np.asarray(value), q


class Const(In):
    """A constant operand."""


def codes(*shape, dtype=np.int8, low=None, high=None) -> np.ndarray:
    info = np.iinfo(dtype)
    lo = info.min if low is None else low
    hi = info.max if high is None else high
    return RNG.integers(lo, hi + 1, shape).astype(dtype)


def one_op(op_type, operands, outputs, options=None) -> tuple[bytes, list[np.ndarray]]:
    """A one-op .tflite; ``outputs``: (dtype, shape, QuantParams | None) per output."""
    model = Model()
    sg = model.add_subgraph("main")
    ins, feeds = [], []
    for k, o in enumerate(operands):
        if o is None:
            ins.append(None)
        elif isinstance(o, Const):
            ins.append(sg.add_constant(f"c{k}", o.value, quantization=o.q))
        else:
            t = sg.add_tensor(f"x{k}", DType.from_numpy(o.value.dtype), o.value.shape, quantization=o.q)
            sg.inputs.append(t)
            ins.append(t)
            feeds.append(o.value)
    outs = [sg.add_tensor(f"y{k}", DType.from_numpy(np.dtype(d)), tuple(s), quantization=q)
            for k, (d, s, q) in enumerate(outputs)]
    sg.outputs.extend(outs)
    op = Operator(op_type, options=options or {})
    sg.add_operator(op, ins, outs)
    op.version = ops.require(op_type).version(op)
    return write_model(model), feeds


def reference(model: bytes, feeds) -> list[np.ndarray]:
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    return run_api(Interpreter(model_content=model, experimental_op_resolver_type=OpResolverType.BUILTIN_REF), feeds)


def check(op_type, operands, outputs, options=None, *, rtol: float = 0.0) -> np.ndarray:
    """kiln's Interpreter and BUILTIN_REF on the same one-op model: identical outputs (with
    ``rtol``: float outputs within ``rtol`` of the largest magnitude)."""
    model, feeds = one_op(op_type, operands, outputs, options)
    want = reference(model, feeds)
    got = run_api(kiln.Interpreter(model_content=model), feeds)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        if rtol:
            np.testing.assert_allclose(g, w, rtol=0, atol=rtol * float(np.abs(w).max()), err_msg=op_type)
        else:
            np.testing.assert_array_equal(g, w, err_msg=op_type)
    return got[0]


def bias_for(x_q, w_q, channels, *, dtype=np.int32, high=3000):
    scales = np.float32(x_q.scale[0]) * np.broadcast_to(w_q.scale, (channels,))
    return Const(RNG.integers(-high, high, channels).astype(dtype), qp(scales))


# --- weighted ops ------------------------------------------------------------------------

@pytest.mark.parametrize("keep_num_dims", [False, True])
@pytest.mark.parametrize("act", [NONE, RELU, RELU6])
def test_fully_connected_int8(keep_num_dims, act):
    x, w = codes(2, 3, 16), codes(5, 16, low=-127)
    x_q, w_q, y_q = qp(0.03, -9), qp(RNG.uniform(0.004, 0.02, 5)), qp(0.1, 4)
    shape = (2, 3, 5) if keep_num_dims else (6, 5)
    check("FULLY_CONNECTED", [In(x, x_q), Const(w, w_q), bias_for(x_q, w_q, 5)], [(np.int8, shape, y_q)],
          dict(fused_activation_function=act, keep_num_dims=keep_num_dims))


def test_fully_connected_16x8_and_without_bias():
    x, w = codes(4, 12, dtype=np.int16), codes(3, 12, low=-127)
    x_q, w_q, y_q = qp(0.001), qp(0.01), qp(0.002)
    check("FULLY_CONNECTED", [In(x, x_q), Const(w, w_q), bias_for(x_q, w_q, 3, dtype=np.int64, high=10 ** 6)],
          [(np.int16, (4, 3), y_q)])
    check("FULLY_CONNECTED", [In(codes(4, 12), qp(0.02, 3)), Const(w, w_q), None], [(np.int8, (4, 3), y_q)])


@pytest.mark.parametrize("op_type", ["CONV_2D", "DEPTHWISE_CONV_2D"])
@pytest.mark.parametrize("padding,stride,dilation", [(Padding.SAME, (1, 1), (1, 1)), (Padding.VALID, (2, 1), (1, 1)),
                                                     (Padding.SAME, (2, 2), (1, 1)), (Padding.SAME, (1, 1), (2, 2))])
def test_convolutions_int8(op_type, padding, stride, dilation):
    x = codes(2, 7, 6, 4)
    multiplier = 2 if op_type == "DEPTHWISE_CONV_2D" else 1
    w = codes(1, 3, 3, 8, low=-127) if multiplier == 2 else codes(5, 3, 3, 4, low=-127)
    channels = 8 if multiplier == 2 else 5
    x_q, w_q, y_q = qp(0.05, -3), qp(RNG.uniform(0.005, 0.03, channels), axis=3 if multiplier == 2 else 0), qp(0.2, 7)
    opts = dict(padding=padding, stride_h=stride[0], stride_w=stride[1], dilation_h_factor=dilation[0],
                dilation_w_factor=dilation[1], fused_activation_function=RELU6, depth_multiplier=multiplier)
    if op_type == "CONV_2D":
        del opts["depth_multiplier"]
    shape = ops.infer_output_shapes(_probe(op_type, [x, w], opts))[0]
    check(op_type, [In(x, x_q), Const(w, w_q), bias_for(x_q, w_q, channels)], [(np.int8, shape, y_q)], opts)


def _probe(op_type, arrays, options):
    """A float IR node of the same shapes, for its output shape."""
    sg = Model().add_subgraph("p")
    ts = [sg.add_tensor(f"t{k}", DType.FLOAT32, a.shape) for k, a in enumerate(arrays)]
    return sg.add_operator(Operator(op_type, options=options), ts, [sg.add_tensor("y", DType.FLOAT32, ())])


def test_convolution_16x8():
    x, w = codes(1, 5, 5, 3, dtype=np.int16), codes(4, 2, 2, 3, low=-127)
    x_q, w_q, y_q = qp(0.0005), qp(RNG.uniform(0.01, 0.02, 4)), qp(0.001)
    check("CONV_2D", [In(x, x_q), Const(w, w_q), bias_for(x_q, w_q, 4, dtype=np.int64, high=10 ** 5)],
          [(np.int16, (1, 5, 5, 4), y_q)], dict(padding=Padding.SAME, stride_h=1, stride_w=1))


@pytest.mark.parametrize("padding,stride,out_hw", [(Padding.SAME, (2, 2), (8, 10)), (Padding.VALID, (2, 1), (9, 7)),
                                                   (Padding.SAME, (1, 1), (4, 5))])
@pytest.mark.parametrize("act", [NONE, RELU])
def test_transpose_conv_int8(padding, stride, out_hw, act):
    w = codes(6, 3, 3, 4, low=-127)
    x_hw = tuple(-(-o // s) if padding == Padding.SAME else (o - 3) // s + 1 for o, s in zip(out_hw, stride))
    x = codes(2, *x_hw, 4)
    x_q, w_q, y_q = qp(0.04, 5), qp(RNG.uniform(0.005, 0.02, 6)), qp(0.3, -11)
    out_shape = np.array([2, *out_hw, 6], np.int32)
    check("TRANSPOSE_CONV", [Const(out_shape), Const(w, w_q), In(x, x_q), bias_for(x_q, w_q, 6)],
          [(np.int8, (2, *out_hw, 6), y_q)],
          dict(padding=padding, stride_h=stride[0], stride_w=stride[1], fused_activation_function=act))


def test_transpose_conv_16x8():
    w = codes(3, 3, 3, 2, low=-127)
    x = codes(1, 4, 4, 2, dtype=np.int16)
    x_q, w_q = qp(0.0004), qp(RNG.uniform(0.005, 0.02, 3))
    check("TRANSPOSE_CONV", [Const(np.array([1, 8, 8, 3], np.int32)), Const(w, w_q), In(x, x_q),
                             bias_for(x_q, w_q, 3, dtype=np.int64, high=10 ** 5)],
          [(np.int16, (1, 8, 8, 3), qp(0.001))], dict(padding=Padding.SAME, stride_h=2, stride_w=2))


@pytest.mark.parametrize("adj_x,adj_y", [(False, False), (True, False), (False, True)])
def test_batch_matmul_int8(adj_x, adj_y):
    a = codes(2, 5, 4) if not adj_x else codes(2, 4, 5)
    b = codes(1, 4, 3) if not adj_y else codes(1, 3, 4)
    check("BATCH_MATMUL", [In(a, qp(0.05, 2)), In(b, qp(0.03, -4))], [(np.int8, (2, 5, 3), qp(0.4, 1))],
          dict(adj_x=adj_x, adj_y=adj_y))


# --- hybrid ------------------------------------------------------------------------------

@pytest.mark.parametrize("asymmetric", [False, True])
def test_fully_connected_hybrid(asymmetric):
    x = RNG.standard_normal((3, 10)).astype(np.float32)
    w = codes(4, 10, low=-127)
    check("FULLY_CONNECTED", [In(x), Const(w, qp(RNG.uniform(0.01, 0.03, 4))), Const(RNG.standard_normal(4).astype(np.float32))],
          [(np.float32, (3, 4), None)], dict(asymmetric_quantize_inputs=asymmetric, fused_activation_function=RELU))


@pytest.mark.parametrize("op_type", ["CONV_2D", "DEPTHWISE_CONV_2D"])
def test_convolutions_hybrid(op_type):
    x = RNG.standard_normal((2, 6, 5, 3)).astype(np.float32)
    depthwise = op_type == "DEPTHWISE_CONV_2D"
    w = codes(1, 3, 3, 6, low=-127) if depthwise else codes(4, 3, 3, 3, low=-127)
    channels = w.shape[3] if depthwise else 4
    opts = dict(padding=Padding.SAME, stride_h=2, stride_w=1)
    if depthwise:
        opts["depth_multiplier"] = 2
    check(op_type, [In(x), Const(w, qp(RNG.uniform(0.01, 0.03, channels), axis=3 if depthwise else 0)),
                    Const(RNG.standard_normal(channels).astype(np.float32))],
          [(np.float32, (2, 3, 5, channels), None)], opts)


@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("batch,stride,padding", [(1, 1, Padding.SAME), (2, 2, Padding.SAME), (2, 3, Padding.VALID)])
def test_transpose_conv_hybrid(per_channel, batch, stride, padding):
    """Bit-exact with LiteRT's HybridTransposeConv: each tap rescaled and added in float32 in
    its scatter order (a single rescaled integer accumulator missed by a few ulps)."""
    x = (3 * RNG.standard_normal((batch, 4, 3, 5))).astype(np.float32)
    w = codes(3, 3, 3, 5, low=-127)
    scales = RNG.uniform(0.01, 0.03, 3) if per_channel else 0.02
    out_hw = (4 * stride, 3 * stride) if padding == Padding.SAME else (3 * stride + 3, 2 * stride + 3)
    check("TRANSPOSE_CONV", [Const(np.array([batch, *out_hw, 3], np.int32)), Const(w, qp(scales)), In(x),
                             Const(RNG.standard_normal(3).astype(np.float32))],
          [(np.float32, (batch, *out_hw, 3), None)],
          dict(padding=padding, stride_h=stride, stride_w=stride, fused_activation_function=RELU))


# --- pooling, reductions, joins ----------------------------------------------------------

@pytest.mark.parametrize("op_type", ["AVERAGE_POOL_2D", "MAX_POOL_2D"])
@pytest.mark.parametrize("dtype", [np.int8, np.int16])
def test_pools(op_type, dtype):
    x = codes(1, 7, 6, 3, dtype=dtype)
    q = qp(0.05, 3 if dtype == np.int8 else 0)
    check(op_type, [In(x, q)], [(dtype, (1, 4, 3, 3), q)],
          dict(padding=Padding.SAME, stride_h=2, stride_w=2, filter_height=3, filter_width=2,
               fused_activation_function=RELU6 if dtype == np.int8 else NONE))


@pytest.mark.parametrize("axes,keep", [([1, 2], True), ([1], False), ([-1], True)])
def test_mean_int8(axes, keep):
    x = codes(2, 4, 5, 3)
    out_shape = [d for i, d in enumerate(x.shape) if i not in {a % 4 for a in axes}]
    if keep:
        out_shape = [1 if i in {a % 4 for a in axes} else d for i, d in enumerate(x.shape)]
    check("MEAN", [In(x, qp(0.05, -4)), Const(np.array(axes, np.int32))], [(np.int8, out_shape, qp(0.02, 6))],
          dict(keep_dims=keep))


def test_concatenation_and_pack_share_params_or_are_refused():
    q = qp(0.07, -2)
    a, b = codes(2, 3), codes(2, 5)
    check("CONCATENATION", [In(a, q), In(b, q)], [(np.int8, (2, 8), q)], dict(axis=-1))
    check("PACK", [In(a, q), In(codes(2, 3), q)], [(np.int8, (2, 2, 3), q)], dict(axis=1, values_count=2))
    model, feeds = one_op("CONCATENATION", [In(a, q), In(b, qp(0.05, -2))], [(np.int8, (2, 8), q)], dict(axis=1))
    with pytest.raises(Exception):
        reference(model, feeds)
    with pytest.raises(kiln.KilnError, match="input 1 has scale"):
        run_api(kiln.Interpreter(model_content=model), feeds)


# --- elementwise and activations ------------------------------------------------------------

@pytest.mark.parametrize("op_type", ["ADD", "SUB", "MUL", "DIV", "SQUARED_DIFFERENCE"])
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((2, 3, 4), (1, 4))])
def test_binary_int8(op_type, shapes):
    options = {} if op_type == "SQUARED_DIFFERENCE" else dict(fused_activation_function=RELU)
    divisor = codes(*shapes[1])
    divisor[divisor == -6] = -5   # DIV: no divisor at the zero point
    check(op_type, [In(codes(*shapes[0]), qp(0.04, 3)), In(divisor, qp(0.09, -6))],
          [(np.int8, np.broadcast_shapes(*shapes), qp(0.11, -20))], options)


@pytest.mark.parametrize("op_type", ["ADD", "SUB", "MUL"])
def test_binary_16x8(op_type):
    a, b = codes(6, 20, dtype=np.int16), codes(1, 20, dtype=np.int16)
    check(op_type, [In(a, qp(0.0003)), In(b, qp(0.0001))], [(np.int16, (6, 20), qp(0.0004))])


@pytest.mark.parametrize("x_scale,beta,spread", [(0.0003, 1.0, 32767), (0.001, 1.0, 3000), (0.0001, 2.0, 32767)])
def test_softmax_16x8(x_scale, beta, spread):
    x = codes(12, 10, dtype=np.int16, low=-spread, high=spread)
    check("SOFTMAX", [In(x, qp(x_scale))], [(np.int16, x.shape, qp(1 / 32768))], dict(beta=beta))


def test_mean_16x8():
    x = codes(2, 5, 6, 3, dtype=np.int16)
    check("MEAN", [In(x, qp(0.0003)), Const(np.array([1, 2], np.int32))], [(np.int16, (2, 1, 1, 3), qp(0.0002))],
          dict(keep_dims=True))


LEVELS = np.arange(-128, 128, dtype=np.int8).reshape(4, 64)


@pytest.mark.parametrize("op_type,options,y_q", [
    ("LOGISTIC", {}, qp(1 / 256, -128)), ("TANH", {}, qp(1 / 128)), ("SOFTMAX", dict(beta=1.0), qp(1 / 256, -128)),
    ("RELU", {}, qp(0.03, -128)), ("RELU6", {}, qp(0.03, -128)), ("RELU_N1_TO_1", {}, qp(0.01)),
    ("LEAKY_RELU", dict(alpha=0.2), qp(0.05, 10)), ("GELU", dict(approximate=True), qp(0.03, -40)),
    ("GELU", dict(approximate=False), qp(0.03, -40)), ("HARD_SWISH", {}, qp(0.03, -40)), ("HARD_SWISH", {}, qp(0.2, 100)),
    ("LOG_SOFTMAX", {}, qp(16 / 256, 127)),
])
def test_activations_every_level(op_type, options, y_q):
    check(op_type, [In(LEVELS, qp(0.05, 7))], [(np.int8, LEVELS.shape, y_q)], options)


@pytest.mark.parametrize("x_q,y_q", [(qp(0.05, 7), qp(0.03, -40)), (qp(0.02, -128), qp(0.08, -128)),
                                     (qp(0.1), qp(0.5, -128))])
def test_exp_log_abs_every_level(x_q, y_q):
    check("EXP", [In(LEVELS, x_q)], [(np.int8, LEVELS.shape, y_q)])
    check("LOG", [In(LEVELS, x_q)], [(np.int8, LEVELS.shape, y_q)])   # zero and below: the smallest code
    check("ABS", [In(LEVELS, x_q)], [(np.int8, LEVELS.shape, y_q)])


def test_div_near_zero_dividends_and_a_zero_divisor():
    """Dividends near their zero point need shifts past 31 bits: LiteRT's results there follow
    x86's treatment of C's out-of-range shifts, and kiln's follow them."""
    a = np.repeat(np.arange(-4, 5, dtype=np.int8), 9).reshape(9, 9)
    b = np.tile(np.array([-128, -70, -9, -1, 2, 3, 40, 99, 127], np.int8), (9, 1))
    check("DIV", [In(a, qp(0.1)), In(b, qp(0.3, 5))], [(np.int8, (9, 9), qp(0.02))])
    model, feeds = one_op("DIV", [In(a, qp(0.1)), In(b, qp(0.3, 40))], [(np.int8, (9, 9), qp(0.02))])
    with pytest.raises(kiln.KilnError, match="divisor equals its zero point"):
        run_api(kiln.Interpreter(model_content=model), feeds)


def test_relu_uint8_and_rsqrt():
    levels = np.arange(256, dtype=np.uint8).reshape(4, 64)
    check("RELU", [In(levels, qp(0.05, 131))], [(np.uint8, levels.shape, qp(0.04, 2))])
    positive = np.arange(-100, 128, dtype=np.int8)
    check("RSQRT", [In(positive, qp(0.01, -100))], [(np.int8, positive.shape, qp(0.05, -128))])
    every = np.arange(-128, 128, dtype=np.int8)   # a float table misses one of these levels
    check("RSQRT", [In(every, qp(0.0038007, -128))], [(np.int8, every.shape, qp(0.00612909, -128))])


# --- edges and value movers -----------------------------------------------------------------

@pytest.mark.parametrize("src,dst", [
    ((np.float32, None), (np.int8, qp(0.02, 5))), ((np.float32, None), (np.int16, qp(0.0005))),
    ((np.int8, qp(0.02, 5)), (np.int8, qp(0.035, -9))), ((np.uint8, qp(0.02, 133)), (np.int8, qp(0.02, 5))),
    ((np.int8, qp(0.02, 5)), (np.uint8, qp(0.02, 133))), ((np.int8, qp(0.02, 5)), (np.float32, None)),
    ((np.uint8, qp(0.1, 128)), (np.float32, None)), ((np.int16, qp(0.001)), (np.float32, None)),
])
def test_quantize_and_dequantize(src, dst):
    dtype, q = src
    x = RNG.uniform(-3, 3, (3, 50)).astype(np.float32) if dtype == np.float32 else codes(3, 50, dtype=dtype)
    check("DEQUANTIZE" if dst[0] == np.float32 else "QUANTIZE", [In(x, q)], [(dst[0], x.shape, dst[1])])


@pytest.mark.parametrize("op_type,operands,out_shape,options", [
    ("RESHAPE", [Const(np.array([4, 6], np.int32))], (4, 6), {}),
    ("TRANSPOSE", [Const(np.array([0, 2, 1], np.int32))], (2, 4, 3), {}),
    ("STRIDED_SLICE", [Const(np.array([0, 1, 0], np.int32)), Const(np.array([2, 3, 4], np.int32)),
                       Const(np.array([1, 1, 2], np.int32))], (2, 2, 2), {}),
    ("GATHER", [Const(np.array([2, 0], np.int32))], (2, 2, 4), dict(axis=1)),
    ("PAD", [Const(np.array([[0, 0], [1, 2], [0, 1]], np.int32))], (2, 6, 5), {}),
    ("EXPAND_DIMS", [Const(np.array(0, np.int32))], (1, 2, 3, 4), {}),
    ("SLICE", [Const(np.array([1, 0, 1], np.int32)), Const(np.array([1, 2, 3], np.int32))], (1, 2, 3), {}),
])
def test_value_movers_on_codes(op_type, operands, out_shape, options):
    q = qp(0.05, -7)
    check(op_type, [In(codes(2, 3, 4), q), *operands], [(np.int8, out_shape, q)], options)


@pytest.mark.parametrize("op_type", ["LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL", "EQUAL", "NOT_EQUAL"])
@pytest.mark.parametrize("a_q,b_q", [(qp(0.05, -7), qp(0.05, -7)), (qp(0.05, 3), qp(0.02, -9)),
                                     (qp(0.0004, 0), qp(0.0004, 0))])   # tiny scales: codes collapse
def test_int8_comparisons_rescale_both_sides(op_type, a_q, b_q):
    a = codes(8, 16)
    b = np.where(RNG.random((8, 16)) < 0.3, a, codes(8, 16)).astype(np.int8)
    check(op_type, [In(a, a_q), In(b, b_q)], [(np.bool_, (8, 16), None)])


@pytest.mark.parametrize("op_type", ["LESS", "EQUAL"])
def test_uint8_comparisons_rescale_both_sides_too(op_type):
    """LiteRT rescales uint8 comparisons as it does int8 ones (uint8 is its legacy quantized type)."""
    a = codes(8, 16, dtype=np.uint8)
    b = np.where(RNG.random((8, 16)) < 0.3, a, codes(8, 16, dtype=np.uint8)).astype(np.uint8)
    check(op_type, [In(a, qp(0.05, 128)), In(b, qp(0.02, 120))], [(np.bool_, (8, 16), None)])


def test_order_ops_on_codes():
    q = qp(0.05, -7)
    x = codes(3, 5)
    check("ARG_MAX", [In(x, q), Const(np.array([1], np.int32))], [(np.int32, (3,), None)], dict(output_type=DType.INT32))
    check("REDUCE_MAX", [In(x, q), Const(np.array([0], np.int32))], [(np.int8, (5,), q)])
    check("MAXIMUM", [In(x, q), In(codes(3, 5), q)], [(np.int8, (3, 5), q)])


# --- the dispatch ---------------------------------------------------------------------------

def _node(op_type, ins, outs):
    sg = Model().add_subgraph("n")
    tensors = [None if spec is None else sg.add_tensor(f"t{k}", spec[0], (2,), quantization=spec[1])
               for k, spec in enumerate(ins)]
    outputs = [sg.add_tensor(f"o{k}", d, (2,), quantization=q) for k, (d, q) in enumerate(outs)]
    return sg.add_operator(Operator(op_type), tensors, outputs)


F32, I8, U8, I16, I32 = DType.FLOAT32, DType.INT8, DType.UINT8, DType.INT16, DType.INT32
Q = qp(0.1, 1)


@pytest.mark.parametrize("ins,outs,key", [
    ([(F32, None), (F32, None)], [(F32, None)], None),
    ([(I8, Q), (I8, Q), (I32, Q)], [(I8, Q)], INT8),
    ([(I16, Q), (I8, Q), None], [(I16, Q)], INT16),
    ([(F32, None), (I8, Q)], [(F32, None)], HYBRID),
    ([(I32, None), (I8, Q)], [(F32, None)], HYBRID),     # EMBEDDING_LOOKUP of an int8 table
    ([(F32, None)], [(U8, Q)], UINT8),                   # QUANTIZE
    ([(I8, None), (I8, None)], [(I8, None)], None),      # plain integers: no quantization
])
def test_operand_types(ins, outs, key):
    assert operand_types(_node("ADD", ins, outs)) == key


def test_kernel_for_picks_the_records_kernels():
    record = ops.require("FULLY_CONNECTED")
    float_node = _node("FULLY_CONNECTED", [(F32, None), (F32, None)], [(F32, None)])
    assert record.kernel_for(float_node) is record.kernel
    assert record.kernel_for(_node("FULLY_CONNECTED", [(I8, Q), (I8, Q)], [(I8, Q)])) is record.quantized[INT8]
    assert record.kernel_for(_node("FULLY_CONNECTED", [(F32, None), (I8, Q)], [(F32, None)])) \
        is record.quantized[HYBRID]
    assert record.kernel_for(_node("FULLY_CONNECTED", [(U8, Q), (U8, Q)], [(U8, Q)])) is record.quantized[UINT8]
    batch_matmul = ops.require("BATCH_MATMUL")
    with pytest.raises(OpError, match=r"BATCH_MATMUL has no kernel for uint8 operands \(UINT8, UINT8\) -> UINT8"):
        batch_matmul.kernel_for(_node("BATCH_MATMUL", [(U8, Q), (U8, Q)], [(U8, Q)]))


def test_a_node_without_a_kernel_is_refused_at_prepare():
    model, feeds = one_op("FLOOR_DIV", [In(codes(4), Q), In(codes(4), Q)], [(np.int8, (4,), Q)])
    interp = kiln.Interpreter(model_content=model)
    with pytest.raises(OpError, match=r"subgraph 0, node 0 \(FLOOR_DIV\).*FLOOR_DIV has no kernel for int8 operands "
                                      r"\(INT8, INT8\) -> INT8 \(kiln's quantized FLOOR_DIV kernels: none\)"):
        interp.allocate_tensors()
        interp.invoke()
