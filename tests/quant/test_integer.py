"""kiln's integer kernels (the weighted and windowed ops' kernel families, kiln.kernels) against
LiteRT's reference kernels (BUILTIN_REF), bit for bit, on one-op int8 models with quantized
inputs, weights and outputs."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from kiln import ops
from kiln.ir import Model, QuantParams
from kiln.kernels import activations as integer_activations, elementwise as integer_elementwise
from kiln.kernels import conv, dense
from kiln.kernels import softmax as softmax_kernels
from kiln.kernels.fixedpoint import IntegerKernelError, Requantizer
from kiln.kernels.windows import window_geometry
from kiln.ops.record import KernelCall
from kiln.schema import Activation, DType, Padding
from tests.harness import run_api
from tests.quant.test_dispatch import Const, In, one_op, qp, reference

RNG = np.random.default_rng(11)
ACTS = [Activation.NONE, Activation.RELU, Activation.RELU6]


def Q(value, qp: QuantParams | None, const: bool = False) -> In:
    """An operand: its integer values and QuantParams; ``const`` puts it in the model."""
    return (Const if const else In)(value, qp)


def int8(*shape, low=-128, high=127) -> np.ndarray:
    return RNG.integers(low, high + 1, shape).astype(np.int8)


def kiln_kernel(op_type, operands, out_qp, options=None, out_dtype=np.int8) -> np.ndarray:
    """kiln's kernel of ``op_type`` for ``operands`` [(array, QuantParams or None) or None]: the
    record's kernel for their types (its kernel family's format, prepared and run on NumPy)."""
    sg = Model().add_subgraph("t")
    arrays = [None if o is None else np.asarray(o[0]) for o in operands]
    tensors = [None if a is None else sg.add_tensor(f"t{i}", DType.from_numpy(a.dtype), a.shape, quantization=o[1])
               for i, (a, o) in enumerate(zip(arrays, operands))]
    out = sg.add_tensor("out", DType.from_numpy(np.dtype(out_dtype)), (), quantization=out_qp)
    op = sg.add_operator(op_type, tensors, [out], options=dict(options or {}))
    record = ops.require(op_type)
    return record.kernel_for(op)(KernelCall(record.make_options(options), op, [np.dtype(out_dtype)]), *arrays)


def run_ref(op_type, operands, out_shape, out_qp, options=None, out_dtype=np.int8) -> np.ndarray:
    """Build a one-op model and run it in LiteRT with its reference kernels."""
    model, feeds = one_op(op_type, operands, [(out_dtype, tuple(out_shape), out_qp)], options)
    return reference(model, feeds)[0]


# --- FULLY_CONNECTED -------------------------------------------------------------------

@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("x_zp,out_zp", [(0, 0), (-128, 127), (17, -5)])
def test_fully_connected(per_channel, act, x_zp, out_zp):
    x = int8(7, 48)
    w = int8(12, 48, low=-127)
    w_qp = qp(RNG.uniform(0.002, 0.02, 12) if per_channel else 0.0113)
    x_qp, out_qp = qp(0.031, x_zp), qp(0.09, out_zp)
    bias = RNG.integers(-20000, 20000, 12).astype(np.int32)
    b_qp = qp(x_qp.scale[0] * w_qp.scale)
    got = kiln_kernel("FULLY_CONNECTED", [(x, x_qp), (w, w_qp), (bias, None)], out_qp, {"fused_activation_function": act})
    ref = run_ref("FULLY_CONNECTED", [Q(x, x_qp), Q(w, w_qp, True), Q(bias, b_qp, True)], (7, 12), out_qp,
                  {"fused_activation_function": act})
    np.testing.assert_array_equal(got, ref)


def test_fully_connected_keep_num_dims_no_bias_and_saturation():
    x = int8(2, 3, 32)
    w = int8(5, 32, low=-127)
    x_qp, w_qp, out_qp = qp(0.05, 3), qp(0.02), qp(0.01, -2)     # a small output scale: many saturate
    got = kiln_kernel("FULLY_CONNECTED", [(x, x_qp), (w, w_qp), None], out_qp, {"keep_num_dims": True})
    ref = run_ref("FULLY_CONNECTED", [Q(x, x_qp), Q(w, w_qp, True), None], (2, 3, 5), out_qp,
                  {"keep_num_dims": True})
    np.testing.assert_array_equal(got, ref)
    assert got.shape == (2, 3, 5) and (got == 127).any() and (got == -128).any()


# --- CONV_2D / DEPTHWISE_CONV_2D -------------------------------------------------------

def _conv_case(op_type, x, w, x_qp, w_qp, out_qp, *, padding, stride, dilation, act, multiplier=1):
    out_c = w.shape[0] if op_type == "CONV_2D" else w.shape[3]
    bias = RNG.integers(-3000, 3000, out_c).astype(np.int32)
    b_qp = qp(np.float32(x_qp.scale[0]) * np.broadcast_to(w_qp.scale, (out_c,)))
    opts = dict(padding=padding, stride_h=stride[0], stride_w=stride[1], dilation_h_factor=dilation[0],
                dilation_w_factor=dilation[1], fused_activation_function=act)
    if op_type == "DEPTHWISE_CONV_2D":
        opts["depth_multiplier"] = multiplier
    (oh, ow), pads = window_geometry(SimpleNamespace(**opts), x.shape[1:3], w.shape[1:3], dilation)
    got = kiln_kernel(op_type, [(x, x_qp), (w, w_qp), (bias, None)], out_qp, opts)
    ref = run_ref(op_type, [Q(x, x_qp), Q(w, w_qp, True), Q(bias, b_qp, True)], (x.shape[0], oh, ow, out_c),
                  out_qp, opts)
    np.testing.assert_array_equal(got, ref)
    return got


GEOMETRIES = [(Padding.VALID, (1, 1), (1, 1)), (Padding.SAME, (1, 1), (1, 1)), (Padding.SAME, (2, 2), (1, 1)),
              (Padding.VALID, (2, 1), (1, 1)), (Padding.SAME, (1, 1), (2, 2)), (Padding.VALID, (1, 2), (2, 1))]


@pytest.mark.parametrize("padding,stride,dilation", GEOMETRIES)
@pytest.mark.parametrize("act", ACTS)
def test_conv2d(padding, stride, dilation, act):
    x = int8(2, 9, 8, 6)
    w = int8(5, 3, 3, 6, low=-127)
    _conv_case("CONV_2D", x, w, qp(0.04, -7), qp(RNG.uniform(0.005, 0.03, 5), axis=0), qp(0.12, 9),
               padding=padding, stride=stride, dilation=dilation, act=act)


@pytest.mark.parametrize("x_zp,out_zp,out_scale", [(-128, -128, 0.5), (127, 127, 0.05), (0, 0, 0.02)])
def test_conv2d_zero_point_extremes_and_saturation(x_zp, out_zp, out_scale):
    x = int8(1, 6, 6, 4)
    w = int8(3, 2, 2, 4, low=-127)
    got = _conv_case("CONV_2D", x, w, qp(0.05, x_zp), qp([0.01, 0.02, 0.004], axis=0), qp(out_scale, out_zp),
                     padding=Padding.SAME, stride=(1, 1), dilation=(1, 1), act=Activation.NONE)
    assert len(np.unique(got)) > 3


@pytest.mark.parametrize("padding,stride,dilation", GEOMETRIES)
@pytest.mark.parametrize("multiplier", [1, 3])
def test_depthwise_conv2d(padding, stride, dilation, multiplier):
    x = int8(2, 8, 9, 4)
    w = int8(1, 3, 3, 4 * multiplier, low=-127)
    _conv_case("DEPTHWISE_CONV_2D", x, w, qp(0.03, 5), qp(RNG.uniform(0.005, 0.03, 4 * multiplier), axis=3),
               qp(0.07, -3), padding=padding, stride=stride, dilation=dilation, act=Activation.RELU6,
               multiplier=multiplier)


@pytest.mark.parametrize("act", ACTS)
def test_depthwise_conv2d_per_tensor_filter(act):
    x = int8(1, 7, 7, 8)
    _conv_case("DEPTHWISE_CONV_2D", x, int8(1, 5, 5, 8, low=-127), qp(0.02, -100), qp(0.011, axis=3),
               qp(0.03, 20), padding=Padding.SAME, stride=(2, 2), dilation=(1, 1), act=act)


def test_rounding_modes_are_the_measured_ones(monkeypatch):
    """BUILTIN_REF's FULLY_CONNECTED rounds once, its CONV_2D / DEPTHWISE_CONV_2D twice: on
    enough outputs the other rounding is caught (guards the finding in kiln.kernels.dense's and
    .conv's docstrings)."""
    x, w = int8(128, 64), int8(96, 64, low=-127)
    x_qp, w_qp, out_qp = qp(0.03, 3), qp(RNG.uniform(0.005, 0.02, 96)), qp(0.5, -1)
    fc_ref = run_ref("FULLY_CONNECTED", [Q(x, x_qp), Q(w, w_qp, True), None], (128, 96), out_qp)
    xc, wc = int8(4, 16, 16, 8), int8(6, 3, 3, 8, low=-127)
    wc_qp = qp(RNG.uniform(0.005, 0.02, 6))
    conv_case = lambda: _conv_case("CONV_2D", xc, wc, x_qp, wc_qp, qp(0.2, 1), padding=Padding.VALID,  # noqa: E731
                                   stride=(1, 1), dilation=(1, 1), act=Activation.NONE)
    conv_case()
    def fc():
        return kiln_kernel("FULLY_CONNECTED", [(x, x_qp), (w, w_qp), None], out_qp)

    np.testing.assert_array_equal(fc(), fc_ref)
    monkeypatch.setattr(dense, "Requantizer", lambda kind, *args: Requantizer("double", *args))
    assert (fc() != fc_ref).any()
    monkeypatch.setattr(conv, "Requantizer", lambda kind, *args: Requantizer("single", *args))
    with pytest.raises(AssertionError):
        conv_case()


# --- pools -----------------------------------------------------------------------------

POOLS = [(Padding.VALID, (2, 2), (2, 2)), (Padding.SAME, (3, 3), (1, 1)), (Padding.SAME, (3, 2), (2, 3)),
         (Padding.VALID, (3, 3), (2, 1))]


@pytest.mark.parametrize("op_type", ["AVERAGE_POOL_2D", "MAX_POOL_2D"])
@pytest.mark.parametrize("padding,filter_hw,stride", POOLS)
@pytest.mark.parametrize("act", ACTS)
def test_pools(op_type, padding, filter_hw, stride, act):
    x = int8(2, 7, 8, 3)
    x[0, :3] = -128          # a corner of extremes: sums that round at ±half
    x[1, :, :2] = 127
    x_qp = qp(0.05, 4 if act == Activation.NONE else -20)
    opts = dict(padding=padding, stride_h=stride[0], stride_w=stride[1], filter_height=filter_hw[0],
                filter_width=filter_hw[1], fused_activation_function=act)
    out_hw, pads = window_geometry(SimpleNamespace(**opts), x.shape[1:3], filter_hw)
    got = kiln_kernel(op_type, [(x, x_qp)], x_qp, opts)
    np.testing.assert_array_equal(got, run_ref(op_type, [Q(x, x_qp)], (2,) + out_hw + (3,), x_qp, opts))


def test_average_pool_rounds_half_away_from_zero():
    x = np.array([1, 2, -1, -2, 0, 1, 0, -1], np.int8).reshape(1, 2, 4, 1)   # 2x1 windows: sums 1, 3, -1, -3
    x_qp = qp(0.1)
    opts = dict(padding=Padding.VALID, stride_h=1, stride_w=1, filter_height=2, filter_width=1)
    got = kiln_kernel("AVERAGE_POOL_2D", [(x, x_qp)], x_qp, opts)
    np.testing.assert_array_equal(got, run_ref("AVERAGE_POOL_2D", [Q(x, x_qp)], (1, 1, 4, 1), x_qp, opts))
    np.testing.assert_array_equal(got.ravel(), [1, 2, -1, -2])


# --- ADD / SUB / MUL -------------------------------------------------------------------

BINARY_SHAPES = [((3, 4, 5), (3, 4, 5)), ((2, 3, 4), (4,)), ((2, 1, 4), (1, 3, 1)), ((5,), ())]
BINARY_PARAMS = [((0.05, 3), (0.05, 3), (0.1, -2)),          # equal input scales
                 ((0.02, -128), (0.3, 127), (0.25, 10)),       # very different, extreme zero points
                 ((0.1, 0), (0.01, -5), (0.004, 0))]           # small output scale: saturates


@pytest.mark.parametrize("op_type", ["ADD", "SUB", "MUL"])
@pytest.mark.parametrize("shapes", BINARY_SHAPES)
@pytest.mark.parametrize("params", BINARY_PARAMS)
def test_binary(op_type, shapes, params):
    (a_qp, b_qp, out_qp) = [qp(*p) for p in params]
    a, b = int8(*shapes[0]), int8(*shapes[1])
    fn = {"ADD": integer_elementwise.add, "SUB": integer_elementwise.sub, "MUL": integer_elementwise.mul}[op_type]
    got = fn(a, a_qp, b, b_qp, out_qp)
    ref = run_ref(op_type, [Q(a, a_qp), Q(b, b_qp)], np.broadcast_shapes(a.shape, b.shape), out_qp,
                  {"fused_activation_function": Activation.NONE})
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("op_type", ["ADD", "SUB", "MUL"])
@pytest.mark.parametrize("act", ACTS)
def test_binary_activations(op_type, act):
    a_qp, b_qp, out_qp = qp(0.04, -10), qp(0.03, 7), qp(0.03, -40)
    a, b = int8(6, 40), int8(6, 40)
    fn = getattr(integer_elementwise, op_type.lower())
    got = fn(a, a_qp, b, b_qp, out_qp, activation=act)
    ref = run_ref(op_type, [Q(a, a_qp), Q(b, b_qp)], a.shape, out_qp, {"fused_activation_function": act})
    np.testing.assert_array_equal(got, ref)


def test_mul_multiplier_is_formed_in_float32():
    a_qp, b_qp, out_qp = qp(0.1), qp(0.01, -5), qp(0.004)     # double-precision multiplier: 43 of 5000 differ
    a, b = int8(50, 100), int8(50, 100)
    got = integer_elementwise.mul(a, a_qp, b, b_qp, out_qp)
    np.testing.assert_array_equal(got, run_ref("MUL", [Q(a, a_qp), Q(b, b_qp)], a.shape, out_qp))


# --- MEAN / CONCATENATION --------------------------------------------------------------

MEANS = [((8, 5, 6, 16), [1, 2], True), ((8, 5, 6, 16), [2, 1], False), ((4, 9, 10), [-1], False),
         ((4, 9, 10), [0, 2], True), ((3, 40, 7), [1], True), ((2, 3, 4, 5), [0, 1, 2, 3], False)]


@pytest.mark.parametrize("shape,axes,keep", MEANS)
@pytest.mark.parametrize("params", [((0.05, 3), (0.03, -2)), ((0.05, 3), (0.05, 3)), ((0.05, -128), (0.011, 127)),
                                    ((0.002, 0), (0.4, 0))])
def test_mean(shape, axes, keep, params):
    x = int8(*shape)
    x_qp, out_qp = qp(*params[0]), qp(*params[1])
    got = kiln_kernel("MEAN", [(x, x_qp), (np.array(axes, np.int32), None)], out_qp, {"keep_dims": keep})
    ref = run_ref("MEAN", [Q(x, x_qp), Q(np.array(axes, np.int32), None, True)], got.shape, out_qp, {"keep_dims": keep})
    np.testing.assert_array_equal(got, ref)


def test_concatenation_and_what_litert_refuses():
    a, b, c = int8(2, 3, 4), int8(2, 1, 4), int8(2, 5, 4)
    q = qp(0.07, -9)
    got = integer_elementwise.concatenation([a, b, c], [q, q, q], q, axis=1)
    np.testing.assert_array_equal(got, run_ref("CONCATENATION", [Q(a, q), Q(b, q), Q(c, q)], (2, 9, 4), q, {"axis": 1}))
    for qs, act in [([q, qp(0.07, -8), q], Activation.NONE), ([q, qp(0.08, -9), q], Activation.NONE),
                    ([q, q, q], Activation.RELU)]:
        with pytest.raises(RuntimeError):
            run_ref("CONCATENATION", [Q(a, qs[0]), Q(b, qs[1]), Q(c, qs[2])], (2, 9, 4), q,
                    {"axis": 1, "fused_activation_function": act})
        with pytest.raises(IntegerKernelError):
            integer_elementwise.concatenation([a, b, c], qs, q, axis=1, activation=act)


# --- SOFTMAX / LOGISTIC / TANH ---------------------------------------------------------

LEVELS = np.arange(-128, 128, dtype=np.int8).reshape(16, 16)


@pytest.mark.parametrize("op_type,out_qp", [("LOGISTIC", qp(1 / 256, -128)), ("TANH", qp(1 / 128, 0))])
@pytest.mark.parametrize("x_qp", [qp(0.05, 3), qp(0.1, -128), qp(0.0123, 0), qp(0.0021, 127), qp(0.47, -30)])
def test_logistic_tanh_every_level(op_type, out_qp, x_qp):
    fn = integer_activations.logistic if op_type == "LOGISTIC" else integer_activations.tanh
    np.testing.assert_array_equal(fn(LEVELS, x_qp, out_qp), run_ref(op_type, [Q(LEVELS, x_qp)], LEVELS.shape, out_qp))


@pytest.mark.parametrize("x_qp", [qp(0.09, -3), qp(0.3, 100), qp(0.007, -128), qp(0.021, 10)])
@pytest.mark.parametrize("beta", [1.0, 0.5, 2.0])
def test_softmax(x_qp, beta):
    x = int8(12, 37)
    x[0] = 5                        # a flat row: 1/37 each
    x[1, :3] = 127                  # ties at the maximum
    out_qp = qp(1 / 256, -128)
    got = softmax_kernels.softmax(x, x_qp, out_qp, beta=beta)
    np.testing.assert_array_equal(got, run_ref("SOFTMAX", [Q(x, x_qp)], x.shape, out_qp, {"beta": beta}))


def test_softmax_over_the_last_axis_of_4d():
    x, x_qp, out_qp = int8(2, 3, 4, 10), qp(0.1, 0), qp(1 / 256, -128)
    got = softmax_kernels.softmax(x, x_qp, out_qp)
    np.testing.assert_array_equal(got, run_ref("SOFTMAX", [Q(x, x_qp)], x.shape, out_qp, {"beta": 1.0}))


#: A row on which LiteRT's two int8 SOFTMAX kernels disagree (issue #22): the float table's
#: 27.499968 rounds to 27, the reference kernel's fixed-point sum gives 28.
TIE_ROW = [98, 117, -91, 97, -49, 35, -95, -2, -119, -39, -99, 52, 12, -29, 16, 43, -120, 25, 63, 15, -24, -64,
           -25, 105, -86, 69, -92, 52, -42, -59, 75, 43, 81, -39, 106, 6, 40, 44, -29, 54]


def test_softmax_near_ties_equal_builtin_ref():
    """kiln's int8 SOFTMAX is LiteRT's reference kernel (gemmlowp fixed point), not its
    optimized float table: equal to BUILTIN_REF on rows whose outputs sit a hair from .5
    (12 of 1.7 million outputs tell the two LiteRT kernels apart; each is reproduced)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType


    rng = np.random.default_rng(7)
    out_qp = qp(1 / 256, -128)
    cases = [(np.asarray([TIE_ROW], np.int8), qp(float(np.float32(0.04791308138348149)), 0))]
    cases += [(rng.integers(-128, 128, (300, int(rng.choice([5, 16, 40])))).astype(np.int8),
               qp(float(np.exp(rng.uniform(np.log(0.005), np.log(0.5)))), 0)) for _ in range(40)]
    differ = 0
    for x, x_qp in cases:
        model, feeds = one_op("SOFTMAX", [In(x, x_qp)], [(np.int8, x.shape, out_qp)], {"beta": 1.0})
        np.testing.assert_array_equal(softmax_kernels.softmax(x, x_qp, out_qp), reference(model, feeds)[0])
        optimized = run_api(Interpreter(model_content=model, experimental_op_resolver_type=(
            OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)), feeds)[0]
        np.testing.assert_array_equal(softmax_kernels.softmax_float_table(x, x_qp, out_qp), optimized)
        differ += int(np.sum(optimized != reference(model, feeds)[0]))
    assert differ >= 1     # the tie row at least: the two kernels are not one


# --- RELU family / LEAKY_RELU ----------------------------------------------------------

@pytest.mark.parametrize("op_type", ["RELU", "RELU6", "RELU_N1_TO_1"])
@pytest.mark.parametrize("x_qp,out_qp", [(qp(0.05, 3), qp(0.04, -128)), (qp(0.1, -128), qp(0.1, -128)),
                                         (qp(0.0123, 0), qp(0.03, 12)), (qp(0.3, 127), qp(0.02, -5))])
def test_relu_family_every_level(op_type, x_qp, out_qp):
    got = integer_activations.relu(LEVELS, x_qp, out_qp, activation=Activation[op_type])
    np.testing.assert_array_equal(got, run_ref(op_type, [Q(LEVELS, x_qp)], LEVELS.shape, out_qp))


@pytest.mark.parametrize("alpha", [0.2, 0.01, 1.5])
@pytest.mark.parametrize("x_qp,out_qp", [(qp(0.05, 3), qp(0.04, -20)), (qp(0.1, -128), qp(0.2, 0)),
                                         (qp(0.02, 60), qp(0.013, 127))])
def test_leaky_relu_every_level(alpha, x_qp, out_qp):
    got = integer_activations.leaky_relu(LEVELS, x_qp, out_qp, alpha=alpha)
    np.testing.assert_array_equal(got, run_ref("LEAKY_RELU", [Q(LEVELS, x_qp)], LEVELS.shape, out_qp, {"alpha": alpha}))


# --- BATCH_MATMUL ----------------------------------------------------------------------

@pytest.mark.parametrize("adj_x,adj_y", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("shapes", [((2, 3, 20, 30), (1, 30, 24)), ((5, 8, 16), (5, 16, 4)), ((6, 7), (7, 9))])
def test_batch_matmul(adj_x, adj_y, shapes):
    a, b = int8(*shapes[0]), int8(*shapes[1])
    if adj_x:
        a = np.swapaxes(a, -1, -2).copy()
    if adj_y:
        b = np.swapaxes(b, -1, -2).copy()
    a_qp, b_qp, out_qp = qp(0.03, 5), qp(0.02, -3), qp(1.1, -7)
    got = kiln_kernel("BATCH_MATMUL", [(a, a_qp), (b, b_qp)], out_qp, {"adj_x": adj_x, "adj_y": adj_y})
    ref = run_ref("BATCH_MATMUL", [Q(a, a_qp), Q(b, b_qp)], got.shape, out_qp, {"adj_x": adj_x, "adj_y": adj_y})
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("approximate", [False, True])
@pytest.mark.parametrize("x_qp,out_qp", [(qp(0.05, 3), qp(0.04, -100)), (qp(0.1, -128), qp(0.1, -20)),
                                         (qp(0.0123, 0), qp(0.01, -128))])
def test_gelu_every_level(approximate, x_qp, out_qp):
    got = integer_activations.gelu(LEVELS, x_qp, out_qp, approximate=approximate)
    ref = run_ref("GELU", [Q(LEVELS, x_qp)], LEVELS.shape, out_qp, {"approximate": approximate})
    np.testing.assert_array_equal(got, ref)


# --- 16x8: int16 activations, int8 weights, int64 bias ---------------------------------

def int16(*shape) -> np.ndarray:
    return RNG.integers(-32768, 32768, shape).astype(np.int16)


@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("act", [Activation.NONE, Activation.RELU])
def test_fully_connected_16x8(per_channel, act):
    x, w = int16(64, 48), int8(32, 48, low=-127)
    x_qp, w_qp = qp(3e-4), qp(RNG.uniform(0.002, 0.02, 32) if per_channel else 0.01)
    out_qp = qp(3e-4 * 0.01 * 1000)
    bias = RNG.integers(-2 ** 20, 2 ** 20, 32).astype(np.int64)
    got = kiln_kernel("FULLY_CONNECTED", [(x, x_qp), (w, w_qp), (bias, None)], out_qp, {"fused_activation_function": act},
                      out_dtype=np.int16)
    ref = run_ref("FULLY_CONNECTED", [Q(x, x_qp), Q(w, w_qp, True), Q(bias, qp(np.float32(3e-4) * w_qp.scale), True)],
                  (64, 32), out_qp, {"fused_activation_function": act}, out_dtype=np.int16)
    np.testing.assert_array_equal(got, ref)
    assert (np.abs(got) < 32767).mean() > 0.9


@pytest.mark.parametrize("op_type", ["CONV_2D", "DEPTHWISE_CONV_2D"])
@pytest.mark.parametrize("padding,stride,dilation", GEOMETRIES[:3])
def test_convolutions_16x8(op_type, padding, stride, dilation):
    x = int16(2, 8, 8, 6)
    w = int8(5, 3, 3, 6, low=-127) if op_type == "CONV_2D" else int8(1, 3, 3, 12, low=-127)
    out_c = w.shape[0] if op_type == "CONV_2D" else 12
    x_qp, out_qp = qp(3e-4), qp(3e-4 * 0.01 * 100)
    w_qp = qp(RNG.uniform(0.002, 0.02, out_c), axis=0 if op_type == "CONV_2D" else 3)
    bias = RNG.integers(-2 ** 20, 2 ** 20, out_c).astype(np.int64)
    opts = dict(padding=padding, stride_h=stride[0], stride_w=stride[1], dilation_h_factor=dilation[0],
                dilation_w_factor=dilation[1])
    if op_type == "DEPTHWISE_CONV_2D":
        opts["depth_multiplier"] = 2
    out_hw, pads = window_geometry(SimpleNamespace(**opts), x.shape[1:3], w.shape[1:3], dilation)
    got = kiln_kernel(op_type, [(x, x_qp), (w, w_qp), (bias, None)], out_qp, opts, out_dtype=np.int16)
    ref = run_ref(op_type, [Q(x, x_qp), Q(w, w_qp, True), Q(bias, qp(np.float32(3e-4) * w_qp.scale), True)],
                  (2,) + out_hw + (out_c,), out_qp, opts, out_dtype=np.int16)
    np.testing.assert_array_equal(got, ref)


# --- HARD_SWISH --------------------------------------------------------------------------

@pytest.mark.parametrize("x_qp,out_qp", [(qp(0.05, 7), qp(0.03, -40)), (qp(0.1, -128), qp(0.08, -128)),
                                         (qp(0.02), qp(0.01)), (qp(0.5, 20), qp(0.3, -100)),
                                         (qp(0.004, 3), qp(0.003, -5)), (qp(0.05, 7), qp(0.0004, -40))])
def test_hard_swish_every_level(x_qp, out_qp):
    levels = np.arange(-128, 128, dtype=np.int8)
    want = run_ref("HARD_SWISH", [Q(levels, x_qp)], levels.shape, out_qp)
    np.testing.assert_array_equal(integer_activations.hard_swish(levels, x_qp, out_qp), want)


def test_softmax_of_a_wide_flat_row_runs():
    """1000 near-equal classes sum to more than 255 in the reference kernel's Q12.19, which
    leaves it no output shift (BUILTIN_REF aborts the process); kiln gives those rows LiteRT's
    optimized kernel's values and the other rows the reference's."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType


    rng = np.random.default_rng(0)
    x = rng.integers(-3, 3, (3, 1000)).astype(np.int8)
    x[0] = rng.integers(-128, 128, 1000)
    x_qp, out_qp = qp(0.05, 0), qp(1 / 256, -128)
    got = softmax_kernels.softmax(x, x_qp, out_qp)
    model, feeds = one_op("SOFTMAX", [In(x, x_qp)], [(np.int8, x.shape, out_qp)], {"beta": 1.0})
    optimized = run_api(Interpreter(model_content=model, experimental_op_resolver_type=(
        OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)), feeds)[0]
    np.testing.assert_array_equal(got[1:], optimized[1:])
    row0, _ = one_op("SOFTMAX", [In(x[:1], x_qp)], [(np.int8, (1, 1000), out_qp)], {"beta": 1.0})
    np.testing.assert_array_equal(got[:1], reference(row0, [x[:1]])[0])
