"""Activation ops against LiteRT: TANH ... GELU, SOFTMAX, LOG_SOFTMAX, L2_NORMALIZATION."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kiln.errors import OpError
from kiln.ir import QuantParams
from kiln.ops.activations import erfc
from kiln.schema import Activation, DType
from tests.harness import Const, check_op
from tests.ops.test_elementwise import check_builtin, ir_op, kernel_call, litert_error, rand

F32 = np.float32
SHAPES = [(5,), (2, 7), (2, 3, 4), (1, 2, 3, 5), (1, 1, 2, 3, 4)]
SPECIALS = np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, -7.0, -3.0, -1.0, 1.0, 3.0, 7.0,
                     1e-20, -50.0, 50.0], F32)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("op", ["TANH", "LOGISTIC", "RELU", "RELU6", "RELU_N1_TO_1", "ELU",
                                "HARD_SWISH"])
def test_pointwise(op, shape):
    check_op(op, [rand(*shape, scale=4)])


@pytest.mark.parametrize("op", ["TANH", "LOGISTIC", "RELU", "RELU6", "RELU_N1_TO_1", "ELU",
                                "HARD_SWISH"])
def test_pointwise_specials_follow_builtin(op):
    check_builtin(op, [SPECIALS], rtol=3e-7)


def test_logistic_saturates_without_overflow():
    x = np.array([-200.0, -89.0, -20.0, 0.0, 20.0, 89.0, 200.0], F32)
    check_op("LOGISTIC", [x])


@pytest.mark.parametrize("alpha", [0.0, 0.01, 0.2, 1.5, -0.5])
def test_leaky_relu(alpha):
    check_op("LEAKY_RELU", [rand(3, 4, scale=3)], options={"alpha": alpha})


@pytest.mark.parametrize("x_shape,alpha_shape", [
    ((2, 3, 4), (4,)), ((2, 3, 4), (3, 1)), ((2, 3, 4), (1, 1, 1)), ((1, 4, 4, 3), (1, 1, 3)),
    ((2, 3, 4), (2, 3, 4)),
])
def test_prelu_broadcast(x_shape, alpha_shape):
    alpha = np.abs(rand(*alpha_shape, seed=3)) * 0.5
    check_op("PRELU", [rand(*x_shape, scale=3), Const(alpha)])
    check_op("PRELU", [rand(*x_shape, scale=3), alpha])


@pytest.mark.parametrize("alpha_shape", [(4,), (2, 1, 1)])
def test_prelu_alpha_must_fit_the_input_shape(alpha_shape):
    """LiteRT's builtin PRELU fails to prepare when alpha would grow the output."""
    x, alpha = rand(2, 3), rand(*alpha_shape)
    record, call = kernel_call("PRELU", [x, alpha])
    with pytest.raises(OpError, match="does not broadcast into"):
        record.kernel(call, x, alpha)


# -- GELU -----------------------------------------------------------------------------------

def test_erfc_matches_math_erfc():
    z = np.concatenate([np.linspace(-8, 8, 4001), np.linspace(-30, 30, 601),
                        np.geomspace(1e-9, 26, 400), [0.0, -0.0, np.inf, -np.inf]])
    ref = np.array([math.erfc(v) for v in z])
    got = erfc(z)
    nonzero = ref > 0
    rel = np.abs(got[nonzero] - ref[nonzero]) / ref[nonzero]
    assert rel.max() < 1e-12
    assert np.all(got[~nonzero] == 0)


def _gelu_exact_reference(x: np.ndarray) -> np.ndarray:
    return np.array([0.5 * v * math.erfc(-v / math.sqrt(2)) for v in x.astype(np.float64)])


def test_gelu_exact_within_1e6_of_float64_reference():
    x = np.linspace(-12, 12, 48001).astype(F32)
    record, call = kernel_call("GELU", [x], options={"approximate": False})
    got = record.kernel(call, x)
    assert got.dtype == F32
    assert np.max(np.abs(got - _gelu_exact_reference(x))) <= 1e-6


@pytest.mark.parametrize("approximate", [False, True])
def test_gelu(approximate):
    x = np.concatenate([np.linspace(-10, 10, 2001), rand(50, scale=3)]).astype(F32)
    check_op("GELU", [x], options={"approximate": approximate}, atol=2e-6)
    check_op("GELU", [rand(2, 3, 4)], options={"approximate": approximate}, atol=2e-6)


@pytest.mark.parametrize("approximate", [False, True])
def test_gelu_specials(approximate):
    x = np.array([np.nan, np.inf, -0.0, 0.0, -5.0, 5.0, -30.0], F32)
    # LiteRT's tanh saturates to exactly 1 earlier than NumPy's: |difference| < 3e-7 near 0.
    check_builtin("GELU", [x], options={"approximate": approximate}, rtol=2e-6, atol=3e-7)


# -- SOFTMAX / LOG_SOFTMAX / L2_NORMALIZATION ----------------------------------------------

@pytest.mark.parametrize("beta", [1.0, 0.5, 2.0, 0.0])
@pytest.mark.parametrize("shape", SHAPES[:4])
def test_softmax(shape, beta):
    check_op("SOFTMAX", [rand(*shape, scale=3)], options={"beta": beta})


def test_softmax_extremes():
    x = np.array([[1, 2, 3, 4], [-1e30, 0, 1e30, 5], [7, 7, 7, 7], [-90, -95, -100, -200]], F32)
    check_op("SOFTMAX", [x], options={"beta": 1.0})
    check_op("LOG_SOFTMAX", [x])


@pytest.mark.parametrize("shape", SHAPES[:4])
def test_log_softmax(shape):
    check_op("LOG_SOFTMAX", [rand(*shape, scale=3)], atol=2e-6)


@pytest.mark.parametrize("shape", SHAPES[:4])
def test_l2_normalization(shape):
    check_op("L2_NORMALIZATION", [rand(*shape, scale=3)])


def test_l2_normalization_tiny_and_zero_rows():
    x = np.array([[-3, 4, 0], [0, 0, 0], [1e-7, 0, 0], [1e-3, 0, 0]], F32)
    check_op("L2_NORMALIZATION", [x])


@pytest.mark.parametrize("act", [a for a in Activation if a != Activation.NONE])
def test_l2_normalization_refuses_fused_activation(act):
    x = rand(2, 3)
    opts = {"fused_activation_function": act}
    assert "activation" in litert_error("L2_NORMALIZATION", [x], options=opts)
    record, call = kernel_call("L2_NORMALIZATION", [x], options=opts)
    with pytest.raises(OpError, match="only NONE"):
        record.kernel(call, x)


@pytest.mark.parametrize("op", ["TANH", "SOFTMAX", "GELU", "ELU", "LOG_SOFTMAX"])
def test_float_only(op):
    x = np.array([1, 2], np.int32)
    record, call = kernel_call(op, [x])
    with pytest.raises(OpError, match="float only"):
        record.kernel(call, x)


@pytest.mark.parametrize("op", ["TANH", "LOGISTIC", "RELU", "RELU6", "SOFTMAX", "HARD_SWISH",
                                "LEAKY_RELU", "GELU", "L2_NORMALIZATION"])
def test_quantized_inputs_are_refused(op):
    q = QuantParams(scale=[0.1], zero_point=[-3])
    x = np.array([1, 2, 3], np.int8)
    record, call = kernel_call(op, [x], quant={0: q}, out_quant=q)
    with pytest.raises(OpError, match="quantized kernel not implemented yet"):
        record.kernel(call, x)


# -- versions -------------------------------------------------------------------------------

F, I8, U8, I16 = DType.FLOAT32, DType.INT8, DType.UINT8, DType.INT16
Q = QuantParams(scale=[0.1], zero_point=[0])


@pytest.mark.parametrize("op_type,dtype,expected", [
    ("TANH", F, 1), ("TANH", I8, 2), ("TANH", I16, 3), ("LOGISTIC", I16, 3),
    ("RELU", U8, 2), ("RELU", I16, 3), ("RELU6", I8, 2), ("RELU6", I16, 3),
    ("RELU_N1_TO_1", I8, 1), ("LEAKY_RELU", I16, 2), ("LEAKY_RELU", I8, 1),
    ("GELU", I8, 2), ("GELU", U8, 2), ("GELU", F, 1), ("SOFTMAX", I8, 2), ("SOFTMAX", I16, 3),
    ("LOG_SOFTMAX", I8, 2), ("L2_NORMALIZATION", I8, 2), ("L2_NORMALIZATION", F, 1),
    ("HARD_SWISH", I8, 1), ("ELU", I8, 1), ("PRELU", I8, 1),
])
def test_version_rules(op_type, dtype, expected):
    from kiln import ops

    op = ir_op(op_type, [(dtype, (2,), Q if dtype != F else None)])
    assert ops.require(op_type).version(op) == expected
