"""Quantized lowerings, bit for bit: QUANTIZE / DEQUANTIZE and int8 FULLY_CONNECTED / CONV_2D
through XlaDelegate against LiteRT's reference kernels (BUILTIN_REF), kiln's reference
kernels and kiln.kernels.nn's pure kernels; the fixed-point steps against kiln.kernels.fixedpoint."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import kiln  # noqa: E402
from kiln import ops  # noqa: E402
from kiln.format import write_model  # noqa: E402
from kiln.ir import Model, Operator, QuantParams  # noqa: E402
from kiln.kernels.windows import window_geometry  # noqa: E402
from kiln.kernels import fixedpoint as arith  # noqa: E402
from kiln.schema import Activation, DType, Padding  # noqa: E402
from kiln.xla import XlaDelegate  # noqa: E402
from kiln.xla._jax import x64  # noqa: E402
from tests.harness import feed, own_kernels  # noqa: E402

RNG = np.random.default_rng(5)
ACTS = [Activation.NONE, Activation.RELU, Activation.RELU6]


def qp(scale, zero_point=0, axis=0) -> QuantParams:
    scale = np.atleast_1d(np.asarray(scale, np.float32))
    return QuantParams(scale, np.broadcast_to(np.asarray(zero_point, np.int64), scale.shape), quantized_dimension=axis)


def one_op(op_type, operands, out_shape, out_dtype, out_qp, options=None) -> tuple[bytes, list]:
    """A one-op model; ``operands`` are (value, QuantParams | None, is_constant). Returns the
    model and the values to feed."""
    model = Model()
    sg = model.add_subgraph("main")
    ins, feeds = [], []
    for k, (value, q, const) in enumerate(operands):
        value = np.asarray(value)
        if const:
            ins.append(sg.add_constant(f"c{k}", value, quantization=q))
        else:
            t = sg.add_tensor(f"x{k}", DType.from_numpy(value.dtype), value.shape, quantization=q)
            sg.inputs.append(t)
            ins.append(t)
            feeds.append(value)
    out = sg.add_tensor("y", DType.from_numpy(np.dtype(out_dtype)), tuple(out_shape), quantization=out_qp)
    sg.outputs.append(out)
    op = Operator(op_type, options=options or {})
    sg.add_operator(op, ins, [out])
    op.version = ops.require(op_type).version(op)
    return write_model(model), feeds


def on_xla(model, feeds):
    """The output through an XlaDelegate that must claim the node."""
    delegate = XlaDelegate()
    (out,) = feed(kiln.Interpreter(model_content=model, experimental_delegates=[delegate]), feeds)
    assert not delegate.rejected, delegate.rejected
    assert delegate.claimed
    return out


def kiln_ref(model, feeds):
    """kiln's reference kernels on the model (its weighted ops: their kernel families on NumPy)."""
    ref = kiln.Interpreter(model_content=model, experimental_op_resolver_type=kiln.OpResolverType.BUILTIN_REF)
    return feed(ref, feeds)[0]


def rescale_once(x, m, s):
    return arith.xp_rescale_once(jax.numpy, x, m, s)


def rescale_twice(x, m, s):
    return arith.xp_rescale(jax.numpy, x, m, s)


def litert_ref(model, feeds):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    (out,) = feed(Interpreter(model_content=model, experimental_op_resolver_type=OpResolverType.BUILTIN_REF), feeds)
    return out


# -- the fixed-point steps --------------------------------------------------------------------

def test_rescaling_matches_kiln_quant_arith():
    acc = np.concatenate([RNG.integers(-(1 << 31), 1 << 31, 3000), [arith.INT32_MIN, arith.INT32_MAX, 0, -1, 1]])
    real = np.concatenate([10.0 ** RNG.uniform(-6, 1.5, 29), [1.0, 0.5]])  # shifts on both sides
    m, s = arith.quantize_multipliers(real)
    x = acc[:, None]
    with x64():
        once = np.asarray(jax.jit(rescale_once)(x, m, s))
        twice = np.asarray(jax.jit(rescale_twice)(x, m, s))
    small = np.abs(acc) < (1 << 24)  # single rounding: the reference's x · M stays in int64 here
    np.testing.assert_array_equal(once[small], arith.multiply_by_quantized_multiplier(x, m, s)[small])
    np.testing.assert_array_equal(twice, arith.multiply_by_quantized_multiplier_double_rounding(x, m, s))
    with x64():  # multipliers and shifts known while tracing (the lowerings' case) take a shorter path
        static = np.asarray(jax.jit(lambda v: rescale_twice(v, m, s))(x))
    np.testing.assert_array_equal(static, twice)


def test_fixed_point_steps_match_gemmlowp_at_the_edges():
    def _high_mul(a, b):
        return arith.xp_high_mul(jax.numpy, a, b)

    def _divide_by_pot(x, e):
        return arith.xp_divide_by_pot(jax.numpy, x, e)

    edges = np.array([arith.INT32_MIN, arith.INT32_MIN + 1, -(1 << 30), -1, 0, 1, 1 << 30, arith.INT32_MAX])
    a = np.concatenate([edges, RNG.integers(-(1 << 31), 1 << 31, 500)])[:, None]
    b = np.concatenate([edges, RNG.integers(-(1 << 31), 1 << 31, 40)])[None, :]
    e = np.arange(0, 32)
    with x64():
        high = np.asarray(jax.jit(_high_mul)(a, b))
        high_static = np.asarray(jax.jit(lambda v: _high_mul(v, np.abs(b[:, 1:])))(a))
        pot = np.asarray(jax.jit(_divide_by_pot)(a, e[None, :]))
        pot_static = np.asarray(jax.jit(lambda v: _divide_by_pot(v, e[None, :]))(a))
    np.testing.assert_array_equal(high, arith.saturating_rounding_doubling_high_mul(a, b))
    np.testing.assert_array_equal(high_static, arith.saturating_rounding_doubling_high_mul(a, np.abs(b[:, 1:])))
    np.testing.assert_array_equal(pot, arith.rounding_divide_by_pot(a, e[None, :]))
    np.testing.assert_array_equal(pot_static, pot)


# -- QUANTIZE / DEQUANTIZE --------------------------------------------------------------------

FLOATS = np.concatenate([RNG.normal(0, 3, 500), [0.5, -0.5, 1.5, -2.5, 1e6, -1e6, 0.0]]).astype(np.float32)


@pytest.mark.parametrize("dtype,scale,zp", [(np.int8, 0.02, -3), (np.uint8, 0.05, 128), (np.int16, 1e-3, 0),
                                            (np.int8, 0.5, 0)])
def test_quantize_float(dtype, scale, zp):
    model, feeds = one_op("QUANTIZE", [(FLOATS, None, False)], FLOATS.shape, dtype, qp(scale, zp))
    np.testing.assert_array_equal(on_xla(model, feeds), litert_ref(model, feeds))


@pytest.mark.parametrize("dtype,scale,zp", [(np.int8, 0.0213, -7), (np.int16, 3.7e-4, 0), (np.uint8, 0.0123, 120)])
def test_quantize_float_next_to_half_boundaries(dtype, scale, zp):
    """Values at and one float32 step either side of (k + 1/2) * scale, where a quotient one
    ulp off rounds the other way (XLA rewrites x / constant as x * (1 / constant))."""
    info = np.iinfo(dtype)
    k = np.arange(info.min - zp, info.max - zp, max(1, (int(info.max) - int(info.min)) // 400), dtype=np.float32)
    mid = ((k + np.float32(0.5)) * np.float32(scale)).astype(np.float32)
    x = np.concatenate([mid, np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(-np.inf))])
    model, feeds = one_op("QUANTIZE", [(x, None, False)], x.shape, dtype, qp(scale, zp))
    np.testing.assert_array_equal(on_xla(model, feeds), litert_ref(model, feeds))


@pytest.mark.parametrize("src,dst", [((np.int8, 0.02, -3), (np.int8, 0.05, 10)),
                                     ((np.uint8, 0.03, 128), (np.int8, 0.03, 0)),
                                     ((np.int16, 1e-4, 0), (np.int8, 0.01, 5)),
                                     ((np.int8, 0.05, 3), (np.int8, 0.011, -2))])   # multiplier > 1
def test_quantize_requantizes_integers(src, dst):
    info = np.iinfo(src[0])
    x = RNG.integers(info.min, info.max + 1, 400).astype(src[0])
    model, feeds = one_op("QUANTIZE", [(x, qp(src[1], src[2]), False)], x.shape, dst[0], qp(dst[1], dst[2]))
    np.testing.assert_array_equal(on_xla(model, feeds), litert_ref(model, feeds))


@pytest.mark.parametrize("dtype,scale,zp", [(np.int8, 0.0213, -7), (np.uint8, 0.1, 128), (np.int16, 3.05e-5, 0)])
def test_dequantize(dtype, scale, zp):
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, info.max + 1, 300).astype(dtype)
    model, feeds = one_op("DEQUANTIZE", [(x, qp(scale, zp), False)], x.shape, np.float32, None)
    np.testing.assert_array_equal(on_xla(model, feeds), litert_ref(model, feeds))


def test_quantize_saturates():
    """x / scale beyond the integer range saturates, as kiln/ops/quantize.py documents (LiteRT's
    cast is undefined there). The reference kernel agrees except on -inf quotients, which its
    int64 cast plus the zero point wraps to the top of the range."""
    x = np.array([1e9, -1e9, np.float32(3e38), -np.float32(3e38)], np.float32)
    model, feeds = one_op("QUANTIZE", [(x, None, False)], x.shape, np.int8, qp(0.02, -3))
    got = on_xla(model, feeds)
    np.testing.assert_array_equal(got, [127, -128, 127, -128])
    np.testing.assert_array_equal(got[:3], feed(kiln.Interpreter(model_content=model, **own_kernels()), feeds)[0][:3])


# -- int8 FULLY_CONNECTED / CONV_2D -----------------------------------------------------------

def int8(*shape, low=-128, high=127):
    return RNG.integers(low, high + 1, shape).astype(np.int8)


@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("x_zp,out_zp", [(0, 0), (-128, 127), (17, -5)])
def test_int8_fully_connected(per_channel, act, x_zp, out_zp):
    x, w = int8(7, 48), int8(12, 48, low=-127)
    w_qp = qp(RNG.uniform(0.002, 0.02, 12) if per_channel else 0.0113)
    x_qp, out_qp = qp(0.031, x_zp), qp(0.09, out_zp)
    bias = RNG.integers(-20000, 20000, 12).astype(np.int32)
    operands = [(x, x_qp, False), (w, w_qp, True), (bias, qp(x_qp.scale[0] * w_qp.scale), True)]
    model, feeds = one_op("FULLY_CONNECTED", operands, (7, 12), np.int8, out_qp, {"fused_activation_function": act})
    got = on_xla(model, feeds)
    np.testing.assert_array_equal(got, kiln_ref(model, feeds))
    np.testing.assert_array_equal(got, litert_ref(model, feeds))


def test_int8_fully_connected_keep_num_dims_without_bias():
    x, w = int8(2, 3, 32), int8(5, 32, low=-127)
    x_qp, w_qp, out_qp = qp(0.05, 3), qp(0.02), qp(0.01, -2)     # a small output scale: many saturate
    model, feeds = one_op("FULLY_CONNECTED", [(x, x_qp, False), (w, w_qp, True)], (2, 3, 5), np.int8, out_qp,
                          {"keep_num_dims": True})
    got = on_xla(model, feeds)
    np.testing.assert_array_equal(got, kiln_ref(model, feeds))
    np.testing.assert_array_equal(got, litert_ref(model, feeds))


@pytest.mark.parametrize("padding,stride,dilation", [(Padding.SAME, 1, 1), (Padding.VALID, 2, 1),
                                                     (Padding.SAME, 2, 2)])
@pytest.mark.parametrize("act", ACTS)
def test_int8_conv(padding, stride, dilation, act):
    x, w = int8(2, 9, 8, 3), int8(6, 3, 3, 3, low=-127)
    x_qp, w_qp, out_qp = qp(0.04, -11), qp(RNG.uniform(0.003, 0.03, 6)), qp(0.2, 6)
    bias = RNG.integers(-5000, 5000, 6).astype(np.int32)
    options = {"padding": padding, "stride_h": stride, "stride_w": stride, "dilation_h_factor": dilation,
               "dilation_w_factor": dilation, "fused_activation_function": act}
    opts = ops.require("CONV_2D").make_options(options)
    (oh, ow), pads = window_geometry(opts, (9, 8), (3, 3), (dilation, dilation))
    model, feeds = one_op("CONV_2D", [(x, x_qp, False), (w, w_qp, True), (bias, qp(0.04 * w_qp.scale), True)],
                          (2, oh, ow, 6), np.int8, out_qp, options)
    got = on_xla(model, feeds)
    np.testing.assert_array_equal(got, kiln_ref(model, feeds))
    np.testing.assert_array_equal(got, litert_ref(model, feeds))


def test_16x8_fully_connected_is_lowered():
    x, w = RNG.integers(-3000, 3000, (3, 16)).astype(np.int16), int8(4, 16, low=-127)
    model, feeds = one_op("FULLY_CONNECTED", [(x, qp(0.01), False), (w, qp(0.02), True)], (3, 4), np.int16,
                          qp(0.05))
    got = on_xla(model, feeds)
    np.testing.assert_array_equal(got, feed(kiln.Interpreter(model_content=model, **own_kernels()), feeds)[0])
    np.testing.assert_array_equal(got, litert_ref(model, feeds))


def test_quantized_nodes_without_a_lowering_say_why():
    """A 16x8 FULLY_CONNECTED whose int16 input has a zero point (LiteRT's kernel refuses it)
    stays on the reference kernels, with the reason."""
    x = RNG.integers(-300, 300, (3, 16)).astype(np.int16)
    w = RNG.integers(-127, 128, (4, 16)).astype(np.int8)
    model, _ = one_op("FULLY_CONNECTED", [(x, qp(0.01, 5), False), (w, qp(0.02), True)], (3, 4), np.int16, qp(0.05))
    delegate = XlaDelegate()
    interp = kiln.Interpreter(model_content=model, experimental_delegates=[delegate])
    interp.allocate_tensors()
    ((_, name, _), reason), = delegate.rejected.items()
    assert name == "FULLY_CONNECTED" and "non-zero zero points" in reason, reason


@pytest.mark.parametrize("dtype,per_channel", [(np.int8, False), (np.int8, True), (np.uint8, False),
                                               (np.int16, False)])
def test_fully_connected_with_run_time_weights(dtype, per_channel):
    """Weights fed at run time, as LiteRT's quantized FULLY_CONNECTED accepts them."""
    x_dtype, w_dtype = (dtype, np.int8) if dtype != np.uint8 else (np.uint8, np.uint8)
    info, w_info = np.iinfo(x_dtype), np.iinfo(w_dtype)
    x = RNG.integers(info.min, info.max + 1, (3, 16)).astype(x_dtype)
    w = RNG.integers(max(w_info.min, -127), w_info.max + 1, (4, 16)).astype(w_dtype)
    zp = 0 if dtype == np.int16 else (128 if dtype == np.uint8 else -3)
    w_q = qp([0.02, 0.03, 0.01, 0.04], 0) if per_channel else qp(0.02, 120 if dtype == np.uint8 else 0)
    out_t = np.int16 if dtype == np.int16 else dtype
    model, feeds = one_op("FULLY_CONNECTED", [(x, qp(0.01, zp), False), (w, w_q, False)], (3, 4), out_t,
                          qp(0.3 if dtype != np.int16 else 0.05, 0 if dtype == np.int16 else zp))
    got = on_xla(model, feeds)
    np.testing.assert_array_equal(got, litert_ref(model, feeds))


# -- hybrid (float activations, int8 weights) -------------------------------------------------

def _hybrid_weights(w, axis):
    from kiln.quant import params

    q, a = params.symmetric_weights(w, axis)
    return q, QuantParams(a.scale, np.zeros(a.scale.size, np.int64), quantized_dimension=axis or 0)


def _same_as_reference_and_litert(model, feeds):
    got = on_xla(model, feeds)
    np.testing.assert_array_equal(got, feed(kiln.Interpreter(model_content=model, **own_kernels()), feeds)[0])
    np.testing.assert_array_equal(got, litert_ref(model, feeds))


@pytest.mark.parametrize("asymmetric", [True, False])
@pytest.mark.parametrize("per_channel", [True, False])
def test_hybrid_fully_connected(asymmetric, per_channel):
    x = RNG.normal(0, 1.5, (16, 60)).astype(np.float32)
    x[2] = 0.0                       # a flat row
    x[3] = np.abs(x[3])              # all positive
    q, w_qp = _hybrid_weights(RNG.normal(0, 0.1, (12, 60)).astype(np.float32), 0 if per_channel else None)
    bias = RNG.normal(0, 0.5, 12).astype(np.float32)
    model, feeds = one_op("FULLY_CONNECTED", [(x, None, False), (q, w_qp, True), (bias, None, True)], (16, 12),
                          np.float32, None, {"asymmetric_quantize_inputs": asymmetric,
                                             "fused_activation_function": Activation.RELU})
    _same_as_reference_and_litert(model, feeds)
    zeros, _ = one_op("FULLY_CONNECTED", [(np.zeros_like(x), None, False), (q, w_qp, True), (bias, None, True)],
                      (16, 12), np.float32, None)
    _same_as_reference_and_litert(zeros, [np.zeros_like(x)])   # LiteRT skips the product: the bias


@pytest.mark.parametrize("op_type,multiplier", [("CONV_2D", 1), ("DEPTHWISE_CONV_2D", 1), ("DEPTHWISE_CONV_2D", 2)])
@pytest.mark.parametrize("padding,stride", [(Padding.SAME, 1), (Padding.VALID, 2)])
def test_hybrid_convolutions(op_type, multiplier, padding, stride):
    x = RNG.normal(0, 1.0, (2, 7, 6, 3)).astype(np.float32)
    x[1] = np.abs(x[1])
    if op_type == "CONV_2D":
        q, w_qp = _hybrid_weights(RNG.normal(0, 0.2, (5, 3, 3, 3)).astype(np.float32), 0)
        channels = 5
    else:
        channels = 3 * multiplier
        q, w_qp = _hybrid_weights(RNG.normal(0, 0.2, (1, 3, 3, channels)).astype(np.float32), 3)
    bias = RNG.normal(0, 0.5, channels).astype(np.float32)
    options = {"padding": padding, "stride_h": stride, "stride_w": stride,
               "fused_activation_function": Activation.RELU6}
    if op_type != "CONV_2D":
        options["depth_multiplier"] = multiplier
    opts = ops.require(op_type).make_options(options)
    (oh, ow), _ = window_geometry(opts, (7, 6), (3, 3), (1, 1))
    model, feeds = one_op(op_type, [(x, None, False), (q, w_qp, True), (bias, None, True)], (2, oh, ow, channels),
                          np.float32, None, options)
    _same_as_reference_and_litert(model, feeds)


@pytest.mark.parametrize("multiplier,stride,padding", [(1, 1, Padding.SAME), (2, 2, Padding.VALID),
                                                       (1, 2, Padding.SAME)])
def test_int8_depthwise(multiplier, stride, padding):
    x, w = int8(2, 7, 6, 4), int8(1, 3, 3, 4 * multiplier, low=-127)
    x_qp, w_qp, out_qp = qp(0.05, 9), qp(RNG.uniform(0.004, 0.04, 4 * multiplier), axis=3), qp(0.15, -4)
    bias = RNG.integers(-3000, 3000, 4 * multiplier).astype(np.int32)
    options = {"padding": padding, "stride_h": stride, "stride_w": stride, "depth_multiplier": multiplier,
               "fused_activation_function": Activation.RELU6}
    opts = ops.require("DEPTHWISE_CONV_2D").make_options(options)
    (oh, ow), pads = window_geometry(opts, (7, 6), (3, 3), (1, 1))
    model, feeds = one_op("DEPTHWISE_CONV_2D", [(x, x_qp, False), (w, w_qp, True),
                                                (bias, qp(0.05 * w_qp.scale), True)], (2, oh, ow, 4 * multiplier),
                          np.int8, out_qp, options)
    got = on_xla(model, feeds)
    np.testing.assert_array_equal(got, kiln_ref(model, feeds))
    np.testing.assert_array_equal(got, litert_ref(model, feeds))


@pytest.mark.parametrize("op_type", ["ADD", "SUB", "MUL"])
@pytest.mark.parametrize("act", [Activation.NONE, Activation.RELU])
@pytest.mark.parametrize("shapes", [((3, 8), (3, 8)), ((2, 3, 8), (8,))])
def test_int8_elementwise(op_type, act, shapes):
    from kiln.kernels import elementwise as integer_elementwise

    a, b = int8(*shapes[0]), int8(*shapes[1])
    a_qp, b_qp, out_qp = qp(0.03, -5), qp(0.011, 7), qp(0.05 if op_type != "MUL" else 0.004, 3)
    model, feeds = one_op(op_type, [(a, a_qp, False), (b, b_qp, False)], np.broadcast_shapes(*shapes), np.int8,
                          out_qp, {"fused_activation_function": act})
    got = on_xla(model, feeds)
    want = getattr(integer_elementwise, op_type.lower())(a, a_qp, b, b_qp, out_qp, activation=act)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, litert_ref(model, feeds))


@pytest.mark.parametrize("depth", [64, 515, 516, 4096])
def test_int_dot_is_exact_on_either_side_of_the_float32_bound(depth):
    """The int8 dot runs in float32 only while no partial sum can pass 2^24 (255 * 127 * 515 is
    just under it, 516 over); worst-case operands give the exact int32 product either way."""
    import jax.numpy as jnp

    from kiln.kernels.fixedpoint import ExactProduct, centred_max

    x = RNG.integers(-128, 128, (6, depth)).astype(np.int8)
    x[0] = -128                                   # |x - 127| = 255, the largest an int8 allows
    w = RNG.integers(-127, 128, (5, depth)).astype(np.int32)
    w[0] = -127                                   # row 0 x column 0: every product +255 * 127
    a = x.astype(np.int32) - 127

    product = ExactProduct(w.T, centred_max(np.int8, 127))

    def dot(v):
        return product(jnp, v)

    with x64():
        got = np.asarray(jax.jit(dot)(a))
        hlo = jax.jit(dot).lower(a).as_text()
    np.testing.assert_array_equal(got, a.astype(np.int64) @ w.T.astype(np.int64))
    assert got[0, 0] == 255 * 127 * depth
    in_float = "xf32>" in hlo.split("dot_general")[1].split("\n")[0]
    assert in_float == (255 * 127 * depth < 2 ** 24), hlo
