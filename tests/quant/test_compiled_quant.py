"""The quantized delegate (kiln/delegates/quantized.py), part of kiln's default runtime, gives
the reference kernels' bits: one-op integer models run invoke after invoke on fresh inputs
(the delegate checks a lowering against the kernel on the first run only, so later runs test
the lowering itself) agree with kiln's and LiteRT's BUILTIN_REF, and each node ran its
lowering, not its reference kernel. The output stage is tested against kiln.kernels.fixedpoint over
whole accumulator ranges. (The quantized zoo models: tests/quant/test_runtime_models.py.)"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import kiln
from kiln import ops
from kiln.delegates import LOWERINGS, NumpyDelegate, register_quantized
from kiln.kernels import fixedpoint as arith
from kiln.kernels.fixedpoint import INT32_MAX, INT32_MIN, Requantizer
from kiln.schema import Activation, Padding
from tests.harness import run_api
from tests.quant.test_dispatch import Const, In, _probe, bias_for, codes, one_op, qp, reference

REF = {"experimental_op_resolver_type": kiln.OpResolverType.BUILTIN_REF}
NONE, RELU, RELU6 = Activation.NONE, Activation.RELU, Activation.RELU6


def _fresh(operands, seed):
    """The operands with new random codes in the model inputs (constants kept)."""
    rng = np.random.default_rng(seed)
    out = []
    for o in operands:
        if o is None or isinstance(o, Const):
            out.append(o)
            continue
        if o.value.dtype.kind == "f":   # hybrid nodes: float input (all zeros on one run)
            value = rng.standard_normal(o.value.shape) * (seed != 2)
        else:
            info = np.iinfo(o.value.dtype)
            value = rng.integers(info.min, int(info.max) + 1, o.value.shape)
        out.append(In(value.astype(o.value.dtype), o.q))
    return out


def delegated(op_type, operands, outputs, options=None, *, invokes: int = 3, lowered: bool = True):
    """Run a one-op model in the default Interpreter ``invokes`` times on fresh inputs; every
    output equals kiln's and LiteRT's BUILTIN_REF bit for bit; the quantized delegate took
    the node and (``lowered``) ran its lowering without falling back."""
    model, _ = one_op(op_type, operands, outputs, options)
    interp, kiln_ref = kiln.Interpreter(model_content=model), kiln.Interpreter(model_content=model, **REF)
    for seed in range(invokes):
        feeds = [o.value for o in _fresh(operands, seed) if isinstance(o, In) and not isinstance(o, Const)]
        got = run_api(interp, feeds)
        for want in (run_api(kiln_ref, feeds), reference(model, feeds)):
            for g, w in zip(got, want):
                assert g.dtype == w.dtype and g.shape == w.shape, op_type
                np.testing.assert_array_equal(g, w, err_msg=f"{op_type}, invoke {seed}")
    (delegate,) = [d for d in interp._delegates if isinstance(d, NumpyDelegate)]
    assert [name for _, name, _ in delegate.claimed] == [op_type]
    assert delegate.fallbacks == {}
    assert bool(delegate.lowered) == lowered, delegate.lowered
    return delegate


# -- the output stage ---------------------------------------------------------------------------

RESCALINGS = {"single": arith.multiply_by_quantized_multiplier,
              "double": arith.multiply_by_quantized_multiplier_double_rounding,
              "int64": arith.multiply_by_quantized_multiplier_int64}


@pytest.mark.parametrize("kind", list(RESCALINGS))
@pytest.mark.parametrize("bound", [300, 1 << 20, (1 << 31) - 1, 1 << 34])
def test_requantizer_is_the_arith_rescaling(kind, bound):
    rng = np.random.default_rng(bound % 1000)
    channels = 6
    real = np.exp(rng.uniform(np.log(1e-6), np.log(4.0), channels))
    m, shift = arith.quantize_multipliers(real)
    m[0], shift[0] = 0, 0                                     # a zero multiplier
    m[1], shift[1] = 1 << 30, -2                              # x / 8: every rounding tie below
    m[2], shift[2] = 1 << 30, 1                               # a left shift (multiplier above one)
    if kind == "int64":
        shift = np.minimum(shift, 14)
    acc = rng.integers(-bound, bound + 1, (800, channels))
    acc[:2] = [[bound], [-bound]]
    acc[2:6] = [[0], [-1], [1], [-(1 << 30)]]
    acc[6:406] = np.minimum(np.arange(-200, 200), bound)[:, None]
    for zp, lo, hi, dtype in ((5, -128, 127, np.int8), (0, -32768, 32767, np.int16), (-3, -20, 90, np.int8)):
        want = np.clip(RESCALINGS[kind](acc, m, shift).astype(np.int64) + zp, lo, hi).astype(dtype)
        got = Requantizer(kind, m, shift, zp, lo, hi, dtype, bound)(acc.copy())
        np.testing.assert_array_equal(got, want)
        for c in (1, 3):   # one channel: a scalar multiplier
            scalar = Requantizer(kind, m[c], shift[c], zp, lo, hi, dtype, bound)(acc[:, c].copy())
            np.testing.assert_array_equal(scalar, want[:, c])
    if kind == "double" and bound < 1 << 31:   # the int32 second stage is taken for common bounds
        assert Requantizer(kind, m, shift, 5, -128, 127, np.int8, bound).narrow


def test_requantizer_keeps_int64_where_int32_could_overflow():
    """A multiplier near 2^31 on a saturating accumulator: the value after the high multiply
    reaches ±2^31 − 1, so the second stage stays in int64 (and still equals arith's)."""
    m, shift = np.array([(1 << 31) - 1, (1 << 31) - 2]), np.array([-1, 0])
    acc = np.array([[1 << 34, 1 << 34], [-(1 << 34), -(1 << 34)], [(1 << 31) - 1, -(1 << 31)], [3, -3]])
    rq = Requantizer("double", m, shift, 0, INT32_MIN, INT32_MAX, np.int64, 1 << 34)
    assert not rq.narrow
    want = arith.multiply_by_quantized_multiplier_double_rounding(acc, m, shift).astype(np.int64)
    np.testing.assert_array_equal(rq(acc.copy()), want)


# -- weighted ops -------------------------------------------------------------------------------

@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("keep_num_dims,act", [(False, NONE), (True, RELU6)])
def test_fully_connected_int8(per_channel, keep_num_dims, act):
    x, w = codes(2, 3, 40), codes(6, 40, low=-127)
    w_q = qp(np.random.default_rng(1).uniform(0.004, 0.02, 6)) if per_channel else qp(0.01)
    x_q, y_q = qp(0.03, -9), qp(0.1, 4)
    shape = (2, 3, 6) if keep_num_dims else (6, 6)
    delegated("FULLY_CONNECTED", [In(x, x_q), Const(w, w_q), bias_for(x_q, w_q, 6)], [(np.int8, shape, y_q)],
              dict(fused_activation_function=act, keep_num_dims=keep_num_dims))


def test_fully_connected_deep_int8_uses_float64_and_16x8():
    x, w = codes(3, 700), codes(4, 700, low=-127)   # depth · 255 · 127 > 2^24: float64 sums
    delegated("FULLY_CONNECTED", [In(x, qp(0.02, 100)), Const(w, qp(0.002)), None], [(np.int8, (3, 4), qp(0.3, -5))])
    x16 = codes(4, 12, dtype=np.int16)
    x_q, w_q = qp(0.001), qp(0.01)
    delegated("FULLY_CONNECTED", [In(x16, x_q), Const(codes(3, 12, low=-127), w_q),
                                  bias_for(x_q, w_q, 3, dtype=np.int64, high=10 ** 6)], [(np.int16, (4, 3), qp(0.002))])


@pytest.mark.parametrize("dtype", [np.int8, np.int16])
def test_fully_connected_multiplier_is_the_double_product_of_the_scales(dtype):
    """Per-tensor scales whose float32 and double products give different multipliers (0.1 ·
    0.01 / 0.5; 0.001 · 0.01 / 0.002): accumulators next to a rounding boundary come out as
    BUILTIN_REF's in kiln's kernel, the compiled delegate and XLA (once, the float32 product
    missed 5 of 3,600 int8 and 24 of 4,800 16x8 outputs)."""
    rng = np.random.default_rng(11)
    info = np.iinfo(dtype)
    (sx, sw, sy), zp = ((0.1, 0.01, 0.5), 3) if dtype == np.int8 else ((0.001, 0.01, 0.002), 0)
    x = rng.integers(max(info.min, -3000), min(info.max, 3000) + 1, (4000, 12)).astype(dtype)  # no saturation
    w = rng.integers(-127, 128, (3, 12)).astype(np.int8)
    bias = rng.integers(-10 ** 5, 10 ** 5, 3).astype(np.int32 if dtype == np.int8 else np.int64)
    model, feeds = one_op("FULLY_CONNECTED", [In(x, qp(sx, zp)), Const(w, qp(sw)), Const(bias, qp(sx * sw))],
                          [(dtype, (4000, 3), qp(sy, -2 if dtype == np.int8 else 0))])
    want = reference(model, feeds)[0]
    engines = {"kernel": kiln.Interpreter(model_content=model, **REF), "compiled": kiln.Interpreter(model_content=model)}
    try:
        from kiln.xla import XlaDelegate

        engines["xla"] = kiln.Interpreter(model_content=model, experimental_delegates=[XlaDelegate()])
    except kiln.KilnError:  # no JAX: the other two still count
        pass
    for name, interp in engines.items():
        np.testing.assert_array_equal(run_api(interp, feeds)[0], want, err_msg=name)


CONV_CASES = [(Padding.SAME, (1, 1), (1, 1), (3, 3)), (Padding.VALID, (2, 1), (1, 1), (3, 3)),
              (Padding.SAME, (2, 2), (1, 1), (3, 2)), (Padding.SAME, (1, 1), (2, 2), (3, 3)),
              (Padding.VALID, (1, 1), (1, 1), (1, 1)), (Padding.SAME, (2, 2), (1, 1), (1, 1))]


def _conv_opts(padding, stride, dilation, act=RELU6):
    return dict(padding=padding, stride_h=stride[0], stride_w=stride[1], dilation_h_factor=dilation[0],
                dilation_w_factor=dilation[1], fused_activation_function=act)


@pytest.mark.parametrize("padding,stride,dilation,khw", CONV_CASES)
@pytest.mark.parametrize("dtype", [np.int8, np.int16])
def test_conv_2d(padding, stride, dilation, khw, dtype):
    x, w = codes(2, 7, 6, 4, dtype=dtype), codes(5, *khw, 4, low=-127)
    w_q = qp(np.random.default_rng(2).uniform(0.005, 0.03, 5))
    x_q, y_q = (qp(0.05, -3), qp(0.2, 7)) if dtype == np.int8 else (qp(0.0005), qp(0.002))
    opts = _conv_opts(padding, stride, dilation, RELU6 if dtype == np.int8 else NONE)
    shape = ops.infer_output_shapes(_probe("CONV_2D", [x, w], opts))[0]
    bias = bias_for(x_q, w_q, 5, dtype=np.int32 if dtype == np.int8 else np.int64)
    delegated("CONV_2D", [In(x, x_q), Const(w, w_q), bias], [(dtype, shape, y_q)], opts)


@pytest.mark.parametrize("padding,stride,dilation,khw", CONV_CASES[:4])
@pytest.mark.parametrize("multiplier", [1, 2])
@pytest.mark.parametrize("dtype", [np.int8, np.int16])
def test_depthwise_conv_2d(padding, stride, dilation, khw, multiplier, dtype):
    x, w = codes(2, 7, 6, 4, dtype=dtype), codes(1, *khw, 4 * multiplier, low=-127)
    w_q = qp(np.random.default_rng(3).uniform(0.005, 0.03, 4 * multiplier), axis=3)
    x_q, y_q = (qp(0.05, 11), qp(0.1, -7)) if dtype == np.int8 else (qp(0.0005), qp(0.001))
    opts = dict(_conv_opts(padding, stride, dilation), depth_multiplier=multiplier)
    shape = ops.infer_output_shapes(_probe("DEPTHWISE_CONV_2D", [x, w], opts))[0]
    bias = bias_for(x_q, w_q, 4 * multiplier, dtype=np.int32 if dtype == np.int8 else np.int64)
    delegated("DEPTHWISE_CONV_2D", [In(x, x_q), Const(w, w_q), bias], [(dtype, shape, y_q)], opts)


def _uint8_case(rng):
    """Per-tensor uint8 parameters as TF1's quantization-aware models have them (weight zero points too)."""
    x_q = qp(rng.uniform(0.005, 0.05), int(rng.integers(0, 256)))
    w_q = qp(rng.uniform(0.002, 0.02), int(rng.integers(90, 170)))
    return x_q, w_q, qp(rng.uniform(0.05, 0.5), int(rng.integers(0, 256)))


def _uint8_bias(x_q, w_q, channels, rng):
    return Const(rng.integers(-4000, 4000, channels).astype(np.int32), qp(np.float32(x_q.scale[0]) * w_q.scale[0]))


@pytest.mark.parametrize("seed", [0, 1])
def test_weighted_uint8(seed):
    """The legacy uint8 FULLY_CONNECTED / CONV_2D / DEPTHWISE_CONV_2D (kiln.kernels.nn)."""
    rng = np.random.default_rng(seed)
    x_q, w_q, y_q = _uint8_case(rng)
    delegated("FULLY_CONNECTED", [In(codes(2, 3, 24, dtype=np.uint8), x_q), Const(codes(7, 24, dtype=np.uint8), w_q),
                                  _uint8_bias(x_q, w_q, 7, rng)], [(np.uint8, (6, 7), y_q)],
              dict(fused_activation_function=RELU))
    for padding, stride, khw in ((Padding.SAME, (1, 1), (3, 3)), (Padding.VALID, (2, 2), (3, 3)),
                                 (Padding.VALID, (1, 1), (1, 1))):
        opts = _conv_opts(padding, stride, (1, 1))
        x, w = codes(2, 9, 8, 4, dtype=np.uint8), codes(6, *khw, 4, dtype=np.uint8)
        shape = ops.infer_output_shapes(_probe("CONV_2D", [x, w], opts))[0]
        delegated("CONV_2D", [In(x, x_q), Const(w, w_q), _uint8_bias(x_q, w_q, 6, rng)], [(np.uint8, shape, y_q)], opts)
        opts = dict(opts, depth_multiplier=2)
        w = codes(1, *khw, 8, dtype=np.uint8)
        shape = ops.infer_output_shapes(_probe("DEPTHWISE_CONV_2D", [x, w], opts))[0]
        delegated("DEPTHWISE_CONV_2D", [In(x, x_q), Const(w, w_q), _uint8_bias(x_q, w_q, 8, rng)],
                  [(np.uint8, shape, y_q)], opts)


@pytest.mark.parametrize("adj_x,adj_y", [(False, False), (True, False), (False, True)])
def test_batch_matmul_int8(adj_x, adj_y):
    a = codes(2, 9, 5) if adj_x else codes(2, 5, 9)
    b = codes(1, 3, 9) if adj_y else codes(1, 9, 3)
    delegated("BATCH_MATMUL", [In(a, qp(0.04, 6)), In(b, qp(0.03, -2))], [(np.int8, (2, 5, 3), qp(0.15, 1))],
              dict(adj_x=adj_x, adj_y=adj_y))


@pytest.mark.parametrize("asymmetric", [False, True])
@pytest.mark.parametrize("per_channel,keep_num_dims", [(True, False), (False, True)])
def test_fully_connected_hybrid(asymmetric, per_channel, keep_num_dims):
    w = codes(4, 10, low=-127)
    w_q = qp(np.random.default_rng(4).uniform(0.01, 0.03, 4)) if per_channel else qp(0.02)
    delegated("FULLY_CONNECTED", [In(np.zeros((2, 3, 10), np.float32)), Const(w, w_q),
                                  Const(np.random.default_rng(5).standard_normal(4).astype(np.float32))],
              [(np.float32, (2, 3, 4) if keep_num_dims else (6, 4), None)],
              dict(asymmetric_quantize_inputs=asymmetric, fused_activation_function=RELU, keep_num_dims=keep_num_dims))


@pytest.mark.parametrize("op_type", ["CONV_2D", "DEPTHWISE_CONV_2D"])
@pytest.mark.parametrize("padding,stride,dilation,khw", CONV_CASES)
def test_convolutions_hybrid(op_type, padding, stride, dilation, khw):
    depthwise = op_type == "DEPTHWISE_CONV_2D"
    x = np.zeros((2, 6, 5, 3), np.float32)
    w = codes(1, *khw, 6, low=-127) if depthwise else codes(4, *khw, 3, low=-127)
    channels = 6 if depthwise else 4
    opts = _conv_opts(padding, stride, dilation, RELU)
    if depthwise:
        opts["depth_multiplier"] = 2
    shape = ops.infer_output_shapes(_probe(op_type, [x, w], opts))[0]
    w_q = qp(np.random.default_rng(6).uniform(0.01, 0.03, channels), axis=3 if depthwise else 0)
    delegated(op_type, [In(x), Const(w, w_q),
                        Const(np.random.default_rng(7).standard_normal(channels).astype(np.float32))],
              [(np.float32, shape, None)], opts)


def test_batch_matmul_16x8():
    a, b = codes(2, 4, 7, dtype=np.int16), codes(7, 3, dtype=np.int16)
    delegated("BATCH_MATMUL", [In(a, qp(0.0004)), In(b, qp(0.0003))], [(np.int16, (2, 4, 3), qp(0.002))])


# -- pooling, MEAN, tables ----------------------------------------------------------------------

@pytest.mark.parametrize("op_type", ["AVERAGE_POOL_2D", "MAX_POOL_2D"])
@pytest.mark.parametrize("dtype,padding", [(np.int8, Padding.SAME), (np.int16, Padding.VALID),
                                           (np.uint8, Padding.SAME)])
def test_pools(op_type, dtype, padding):
    x = codes(2, 7, 6, 3, dtype=dtype)
    q = qp(0.05, {np.int8: 3, np.int16: 0, np.uint8: 128}[dtype])
    shape = (2, 4, 3, 3) if padding == Padding.SAME else (2, 3, 3, 3)
    delegated(op_type, [In(x, q)], [(dtype, shape, q)],
              dict(padding=padding, stride_h=2, stride_w=2, filter_height=3, filter_width=2,
                   fused_activation_function=RELU6 if dtype == np.int8 else NONE))


@pytest.mark.parametrize("axes,keep,dtype", [([1, 2], True, np.int8), ([1], False, np.int8), ([-1], True, np.int8),
                                              ([1, 2], True, np.int16)])
def test_mean(axes, keep, dtype):
    x = codes(2, 4, 5, 3, dtype=dtype)
    reduced = {a % 4 for a in axes}
    out_shape = [1 if i in reduced else d for i, d in enumerate(x.shape)] if keep else \
        [d for i, d in enumerate(x.shape) if i not in reduced]
    x_q, y_q = (qp(0.05, -4), qp(0.02, 6)) if dtype == np.int8 else (qp(0.0003), qp(0.0002))
    delegated("MEAN", [In(x, x_q), Const(np.array(axes, np.int32))], [(dtype, out_shape, y_q)], dict(keep_dims=keep))


@pytest.mark.parametrize("op_type", ["ADD", "SUB", "MUL", "SQUARED_DIFFERENCE"])
@pytest.mark.parametrize("shapes,const_b", [(((3, 4), (3, 4)), False), (((2, 3, 4), (1, 4)), False),
                                            (((2, 3, 4), (4,)), True)])
def test_binary_int8_tables(op_type, shapes, const_b):
    options = {} if op_type == "SQUARED_DIFFERENCE" else dict(fused_activation_function=RELU)
    b = codes(*shapes[1])
    b_operand = Const(b, qp(0.09, -6)) if const_b else In(b, qp(0.09, -6))
    delegated(op_type, [In(codes(*shapes[0]), qp(0.04, 3)), b_operand],
              [(np.int8, np.broadcast_shapes(*shapes), qp(0.11, -20))], options)


def test_binary_16x8_is_lowered():
    """(16x8 ADD / SUB / MUL sweeps: tests/quant/test_compiled_quant_more.py.)"""
    a, b = codes(6, 20, dtype=np.int16), codes(1, 20, dtype=np.int16)
    delegated("ADD", [In(a, qp(0.0003)), In(b, qp(0.0001))], [(np.int16, (6, 20), qp(0.0004))])


@pytest.mark.parametrize("op_type,options,y_q", [
    ("LOGISTIC", {}, qp(1 / 256, -128)), ("TANH", {}, qp(1 / 128)), ("RELU6", {}, qp(0.03, -128)),
    ("LEAKY_RELU", dict(alpha=0.2), qp(0.05, 10)), ("GELU", dict(approximate=True), qp(0.03, -40)),
    ("HARD_SWISH", {}, qp(0.03, -40)),
])
def test_unary_int8_tables(op_type, options, y_q):
    delegated(op_type, [In(codes(3, 50), qp(0.05, 7))], [(np.int8, (3, 50), y_q)], options)


def test_dequantize_table():
    delegated("DEQUANTIZE", [In(codes(4, 9), qp(0.037, -5))], [(np.float32, (4, 9), None)])


# -- the safety net -----------------------------------------------------------------------------

def test_a_lowering_that_disagrees_with_its_kernel_is_dropped():
    """A wrong lowering never reaches the outputs: the first run compares it with the
    reference kernel, and the node keeps its kernel, the reason recorded."""
    def off_by_one(node):
        xi, oi = node.in_slots[0], node.out_slots[0]

        def run(slots):
            slots[oi] = np.maximum(slots[xi], 0).astype(np.int8) + np.int8(1)
        return run

    saved = LOWERINGS["RELU", "int8"]
    register_quantized("RELU", dataclasses.replace(saved, lower=off_by_one), types=("int8",), override=True)
    try:
        model, _ = one_op("RELU", [In(codes(3, 8), qp(0.05, 0))], [(np.int8, (3, 8), qp(0.05, 0))])
        interp = kiln.Interpreter(model_content=model)
        for seed in range(2):
            feeds = [codes(3, 8)]
            np.testing.assert_array_equal(run_api(interp, feeds)[0], reference(model, feeds)[0])
    finally:
        register_quantized("RELU", saved, types=("int8",), override=True)
    (delegate,) = [d for d in interp._delegates if isinstance(d, NumpyDelegate)]
    assert list(delegate.fallbacks.values()) == ["its lowering's output differs from the reference kernel's"]
    assert not delegate.lowered


def test_a_new_input_shape_gets_its_own_plan():
    """Resizing the input prepares the partition again for the new shape (the old plan kept)."""
    x, w = codes(1, 6, 5, 3), codes(4, 3, 3, 3, low=-127)
    x_q, w_q = qp(0.05, -3), qp(np.random.default_rng(8).uniform(0.005, 0.03, 4))
    opts = _conv_opts(Padding.SAME, (1, 1), (1, 1))
    model, _ = one_op("CONV_2D", [In(x, x_q), Const(w, w_q), bias_for(x_q, w_q, 4)],
                      [(np.int8, (1, 6, 5, 4), qp(0.2, 7))], opts)
    interp, ref = kiln.Interpreter(model_content=model), kiln.Interpreter(model_content=model, **REF)
    for batch in (1, 3, 1):
        for it in (interp, ref):
            it.resize_tensor_input(it.get_input_details()[0]["index"], [batch, 6, 5, 3])
        feeds = [codes(batch, 6, 5, 3)]
        np.testing.assert_array_equal(run_api(interp, feeds)[0], run_api(ref, feeds)[0])
    (delegate,) = [d for d in interp._delegates if isinstance(d, NumpyDelegate)]
    (kernel,) = delegate.kernels
    assert sorted(kernel.plans) == [((1, 6, 5, 3),), ((3, 6, 5, 3),)] and delegate.lowered and not delegate.fallbacks


def test_one_partition_mixes_float_and_integer_nodes():
    """QUANTIZE → int8 CONV_2D → DEQUANTIZE → float LOGISTIC → float ADD is one partition of
    the one default delegate: its integer run and its float run are chains of their own, the
    values passing between them; the outputs are kiln's reference kernels' bit for bit (and
    LiteRT's BUILTIN_REF's to float32 rounding: LOGISTIC is float)."""
    from kiln.delegates import MixedChain
    from kiln.format import write_model
    from kiln.ir import Model
    from kiln.schema import DType

    x_q, w_q, y_q = qp(0.05, 3), qp(np.random.default_rng(4).uniform(0.005, 0.03, 4)), qp(0.2, -7)
    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", DType.FLOAT32, (1, 6, 5, 3))
    xq = sg.add_tensor("xq", DType.INT8, (1, 6, 5, 3), quantization=x_q)
    w = sg.add_constant("w", codes(4, 3, 3, 3, low=-127), quantization=w_q)
    b = sg.add_constant("b", np.arange(4, dtype=np.int32) * 40,
                        quantization=qp(np.float32(x_q.scale[0]) * w_q.scale))
    yq = sg.add_tensor("yq", DType.INT8, (1, 6, 5, 4), quantization=y_q)
    y, s, z = (sg.add_tensor(n, DType.FLOAT32, (1, 6, 5, 4)) for n in ("y", "s", "z"))
    sg.inputs, sg.outputs = [x], [z]
    sg.add_operator("QUANTIZE", [x], [xq])
    sg.add_operator("CONV_2D", [xq, w, b], [yq], options=_conv_opts(Padding.SAME, (1, 1), (1, 1)))
    sg.add_operator("DEQUANTIZE", [yq], [y])
    sg.add_operator("LOGISTIC", [y], [s])
    sg.add_operator("ADD", [s, y], [z], options={"fused_activation_function": RELU})
    data = write_model(model)
    interp = kiln.Interpreter(model_content=data)
    for seed in range(3):
        feeds = [np.random.default_rng(seed).uniform(-3, 3, (1, 6, 5, 3)).astype(np.float32)]
        got, want = run_api(interp, feeds)[0], run_api(kiln.Interpreter(model_content=data, **REF), feeds)[0]
        assert got.tobytes() == want.tobytes()
        np.testing.assert_allclose(got, reference(data, feeds)[0], rtol=1e-6)
    (delegate,) = [d for d in interp._delegates if isinstance(d, NumpyDelegate)]
    (kernel,) = delegate.kernels
    assert isinstance(kernel, MixedChain) and len(kernel.parts) == 2
    assert [name for _, name, _ in delegate.claimed] == ["QUANTIZE", "CONV_2D", "DEQUANTIZE", "LOGISTIC", "ADD"]
    assert {(0, "QUANTIZE"), (1, "CONV_2D"), (2, "DEQUANTIZE")} <= delegate.lowered and not delegate.fallbacks
    assert all(d.stage == "backend" and d.rule == "numpy" and d.fired for d in delegate.decisions)
