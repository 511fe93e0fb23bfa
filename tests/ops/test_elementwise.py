"""Element-wise ops against LiteRT: arithmetic, math, comparisons, logic, select, cast.

``check_op`` runs LiteRT's default interpreter (XNNPACK takes some nodes); corner cases
where XNNPACK and LiteRT's builtin kernels disagree (inf/NaN) use ``check_builtin``, which
runs LiteRT without delegates: kiln follows the builtin kernels.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from kiln import ops
from kiln.errors import OpError
from kiln.ir import Model, Operator, QuantParams
from kiln.ops import activations, elementwise, reduce
from kiln.ops.record import KernelCall
from kiln.schema import Activation, DType
from tests.harness import Const, check_op, run_kiln, single_op_model

F32, I32, I64 = np.float32, np.int32, np.int64
ACTS = list(Activation)


def rand(*shape, seed=0, scale=1.0, dtype=F32):
    v = np.random.default_rng(seed).standard_normal(shape) * scale
    return v.astype(dtype)


def rand_int(*shape, seed=0, lo=-20, hi=20, dtype=I32):
    return np.random.default_rng(seed).integers(lo, hi, size=shape).astype(dtype)


def run_litert(model: bytes, feeds, *, builtin: bool):
    """LiteRT's default interpreter, or (builtin=True) only its builtin kernels, no XNNPACK."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    kind = (OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES if builtin else OpResolverType.AUTO)
    interp = Interpreter(model_content=model, experimental_op_resolver_type=kind)
    interp.allocate_tensors()
    for d, x in zip(interp.get_input_details(), feeds):
        interp.set_tensor(d["index"], np.asarray(x))
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()]


def run_builtin(model: bytes, feeds):
    return run_litert(model, feeds, builtin=True)


def check_builtin(op_type, inputs, *, options=None, out_dtypes=None, rtol=1e-6, atol=0.0,
                  builtin=True):
    """Like check_op, for outputs with NaN/inf: element-wise tolerance, NaN and inf must match.

    Compares with LiteRT's builtin kernels by default (kiln follows them where XNNPACK
    differs), or with the default interpreter when ``builtin`` is False.
    """
    model = single_op_model(op_type, inputs, options=options, out_dtypes=out_dtypes)
    feeds = [np.asarray(x) for x in inputs if x is not None and not isinstance(x, Const)]
    expected = run_litert(model, feeds, builtin=builtin)
    actual = run_kiln(model, feeds)
    for k, (a, e) in enumerate(zip(actual, expected)):
        assert a.dtype == e.dtype and a.shape == e.shape, f"{op_type} output {k}"
        if e.dtype.kind == "f":
            np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, equal_nan=True,
                                       err_msg=f"{op_type} output {k}")
        else:
            np.testing.assert_array_equal(a, e, err_msg=f"{op_type} output {k}")
    return actual


def litert_error(op_type, inputs, **kw) -> str:
    """The message LiteRT fails with (asserting that it does fail)."""
    first = np.asarray(inputs[0].value if isinstance(inputs[0], Const) else inputs[0])
    kw.setdefault("out_dtypes", [first.dtype])
    kw.setdefault("out_shapes", [first.shape])
    model = single_op_model(op_type, inputs, **kw)
    feeds = [np.asarray(x) for x in inputs if x is not None and not isinstance(x, Const)]
    with pytest.raises(Exception) as info:
        run_builtin(model, feeds)
    return str(info.value)


def kernel_call(op_type, inputs, *, options=None, out_dtypes=None, quant=None, out_quant=None):
    """A KernelCall on IR tensors (optionally quantized) for direct kernel tests."""
    record = ops.require(op_type)
    sg = Model().add_subgraph("t")
    ins = [sg.add_constant(f"in{i}", x, quantization=(quant or {}).get(i))
           for i, x in enumerate(inputs)]
    out_dtypes = out_dtypes or [np.asarray(inputs[0]).dtype]
    outs = [sg.add_tensor(f"out{i}", DType.from_numpy(d), (), quantization=out_quant)
            for i, d in enumerate(out_dtypes)]
    op = sg.add_operator(Operator(op_type, options=options or {}), ins, outs)
    return record, KernelCall(record.make_options(options), op, [np.dtype(d) for d in out_dtypes])


# -- ADD / SUB / MUL / DIV ------------------------------------------------------------------

ARITH = ["ADD", "SUB", "MUL", "DIV"]
SHAPES = [((2, 3), (2, 3)), ((2, 3), (3,)), ((4, 1, 3), (1, 5, 1)), ((2, 3), ()),
          ((1, 2, 3, 4), (2, 1, 4)), ((2, 1, 3, 1, 2), (1, 4, 1, 3, 2))]


@pytest.mark.parametrize("shapes", SHAPES)
@pytest.mark.parametrize("op", ARITH)
def test_arith_float_broadcast(op, shapes):
    a, b = rand(*shapes[0]), rand(*shapes[1], seed=1)
    if op == "DIV":
        b = np.where(np.abs(b) < 0.1, 1.0, b).astype(F32)
    check_op(op, [a, b], options={"fused_activation_function": Activation.NONE})


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("op", ARITH)
def test_arith_fused_activation(op, act):
    """Clamping activations clamp; TANH and SIGN_BIT are ignored by LiteRT's kernels."""
    a, b = rand(3, 4, scale=4), rand(3, 4, seed=1) + 2.5
    check_op(op, [a, Const(b)], options={"fused_activation_function": act})


@pytest.mark.parametrize("act", [Activation.NONE, Activation.RELU, Activation.RELU6,
                                 Activation.RELU_N1_TO_1])
@pytest.mark.parametrize("dtype", [I32, I64])
@pytest.mark.parametrize("op", ["ADD", "SUB", "MUL"])
def test_arith_int(op, dtype, act):
    a, b = rand_int(3, 4, dtype=dtype), rand_int(4, seed=1, dtype=dtype)
    check_op(op, [a, b], options={"fused_activation_function": act})


def test_arith_int_wraps():
    big = np.array([2**31 - 1, -2**31, 7], I32)
    check_op("ADD", [big, np.array([1, -1, 1], I32)])
    check_op("MUL", [big, np.array([2, 2, 3], I32)])


@pytest.mark.parametrize("act", [Activation.NONE, Activation.RELU6])
def test_div_int32_truncates_toward_zero(act):
    a = np.array([7, -7, 7, -7, 0, 6, -6, 1, -1, -2**31, -2**31, 2**31 - 1], I32)
    b = np.array([2, 2, -2, -2, 3, 3, -4, 5, 5, -1, 1, -1], I32)
    out = check_op("DIV", [a, b], options={"fused_activation_function": act})[0]
    if act == Activation.NONE:  # INT_MIN / -1 saturates in LiteRT
        np.testing.assert_array_equal(out, [3, -3, -3, 3, 0, 2, 1, 0, 0, 2**31 - 1, -2**31, 1 - 2**31])


def test_div_int32_by_zero_fails_like_litert():
    a, b = np.array([1, 2], I32), np.array([1, 0], I32)
    assert "DIV" in litert_error("DIV", [a, b])
    record, call = kernel_call("DIV", [a, b])
    with pytest.raises(OpError, match="division by 0"):
        record.kernel(call, a, b)


def test_float_arith_saturates_infinities_like_builtin_kernels():
    """LiteRT's builtin float kernels clamp to [-FLT_MAX, FLT_MAX] even without activation."""
    x = np.array([np.nan, -np.inf, np.inf, 3e38, -3e38, 1.0], F32)
    y = np.array([1, 1, 1, 3e38, -3e38, 0.0], F32)
    for op in ARITH:
        for act in ACTS:
            check_builtin(op, [x, y], options={"fused_activation_function": act})


# -- other binary ops ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F32, I32])
@pytest.mark.parametrize("op", ["FLOOR_DIV", "FLOOR_MOD"])
def test_floor_div_mod(op, dtype):
    if dtype == F32:
        a, b = rand(50, scale=7), rand(50, seed=1, scale=3)
        b = np.where(np.abs(b) < 0.05, 0.5, b).astype(F32)
    else:
        a = rand_int(50)
        b = np.where(rand_int(50, seed=1, lo=-6, hi=6) == 0, 3, rand_int(50, seed=1, lo=-6, hi=6))
        b = b.astype(I32)
    check_op(op, [a, b], atol=0, rtol=0)
    check_op(op, [a.reshape(5, 10), Const(b[:10])], atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, I64])
def test_floor_div_mod_other_ints(dtype):
    a = rand_int(4, 6, dtype=dtype)
    b = np.array([3, -3, 2, -5, 7, 1], dtype)
    check_op("FLOOR_MOD", [a, b])
    if dtype != I64:
        check_op("FLOOR_DIV", [a, b])


@pytest.mark.parametrize("op,dtype", [("FLOOR_DIV", I32), ("FLOOR_DIV", F32), ("FLOOR_MOD", I32)])
def test_floor_division_by_zero_is_an_error(op, dtype):
    a, b = np.array([1, 2], dtype), np.array([1, 0], dtype)
    assert "Division by 0" in litert_error(op, [a, b])
    record, call = kernel_call(op, [a, b])
    with pytest.raises(OpError, match="division by 0"):
        record.kernel(call, a, b)


def test_floor_mod_float_by_zero_is_nan():
    check_builtin("FLOOR_MOD", [np.array([1, -2, 3], F32), np.array([0, 0, 2], F32)])


@pytest.mark.parametrize("dtype", [F32, I32])
def test_squared_difference(dtype):
    if dtype == F32:
        a, b = rand(3, 4), rand(4, seed=1)
    else:
        a, b = rand_int(3, 4), rand_int(4, seed=1)
    check_op("SQUARED_DIFFERENCE", [a, b])


def test_pow():
    base, exp = np.abs(rand(4, 5, scale=3)) + 0.1, rand(4, 5, seed=1, scale=2)
    check_op("POW", [base, exp])
    check_op("POW", [base, Const(np.array(2.0, F32))])
    check_op("POW", [rand_int(3, 4, lo=-5, hi=5), rand_int(4, seed=1, lo=0, hi=6)])


def test_pow_int_negative_exponent_is_an_error():
    a, b = np.array([2, 3], I32), np.array([1, -1], I32)
    assert "negative" in litert_error("POW", [a, b])
    record, call = kernel_call("POW", [a, b])
    with pytest.raises(OpError, match="negative"):
        record.kernel(call, a, b)


@pytest.mark.parametrize("dtype", [F32, I32, I64, np.int8, np.int16])
@pytest.mark.parametrize("op", ["MAXIMUM", "MINIMUM"])
def test_maximum_minimum(op, dtype):
    if dtype == F32:
        a, b = rand(2, 3, 4), rand(3, 1, seed=1)
    else:
        a, b = rand_int(2, 3, 4, dtype=dtype), rand_int(3, 1, seed=1, dtype=dtype)
    check_op(op, [a, b])
    check_op(op, [a, Const(b)])


@pytest.mark.parametrize("op", ["MAXIMUM", "MINIMUM"])
def test_maximum_minimum_nan_follows_litert(op):
    """A NaN in the first operand loses, in the second it wins."""
    x = np.array([np.nan, 1.0, np.nan, -np.inf, 2.0], F32)
    y = np.array([1.0, np.nan, np.nan, 1.0, -np.inf], F32)
    out = check_builtin(op, [x, y])[0]
    assert out[0] == 1.0 and np.isnan(out[1])
    check_builtin(op, [x, y], builtin=False)


def test_atan2():
    check_op("ATAN2", [rand(3, 4, scale=3), rand(3, 4, seed=1, scale=3)])
    check_op("ATAN2", [rand(3, 4), Const(rand(3, 4, seed=2))])


def test_atan2_does_not_broadcast():
    a, b = rand(3, 4), rand(4, seed=1)
    assert "ATAN2" in litert_error("ATAN2", [a, b])
    record, call = kernel_call("ATAN2", [a, b])
    with pytest.raises(OpError, match="must be equal"):
        record.kernel(call, a, b)


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("dtype", [F32, I32])
def test_add_n(n, dtype):
    xs = [rand(2, 3, seed=i) if dtype == F32 else rand_int(2, 3, seed=i) for i in range(n)]
    check_op("ADD_N", xs)


def test_add_n_needs_two_inputs():
    x = rand(2, 3)
    record, call = kernel_call("ADD_N", [x])
    with pytest.raises(OpError, match="at least two"):
        record.kernel(call, x)


def test_add_n_shape_mismatch():
    record, call = kernel_call("ADD_N", [rand(2, 3), rand(3, 2)])
    with pytest.raises(OpError, match="differ"):
        record.kernel(call, rand(2, 3), rand(3, 2))


# -- unary math -----------------------------------------------------------------------------

def positive(*shape, seed=0):
    return (np.abs(rand(*shape, seed=seed, scale=3)) + 1e-3).astype(F32)


UNARY_FLOAT = [
    ("RSQRT", positive), ("SQRT", positive), ("LOG", positive),
    ("EXP", lambda *s, seed=0: rand(*s, seed=seed, scale=4)),
    ("SIN", lambda *s, seed=0: rand(*s, seed=seed, scale=10)),
    ("COS", lambda *s, seed=0: rand(*s, seed=seed, scale=10)),
    ("FLOOR", lambda *s, seed=0: rand(*s, seed=seed, scale=10)),
    ("CEIL", lambda *s, seed=0: rand(*s, seed=seed, scale=10)),
    ("ROUND", lambda *s, seed=0: rand(*s, seed=seed, scale=10)),
    ("SQUARE", lambda *s, seed=0: rand(*s, seed=seed, scale=3)),
    ("NEG", rand), ("ABS", rand), ("SIGN", rand),
]


@pytest.mark.parametrize("shape", [(7,), (2, 3, 4), (1, 2, 3, 4, 5), ()])
@pytest.mark.parametrize("op,make", UNARY_FLOAT, ids=[u[0] for u in UNARY_FLOAT])
def test_unary_float(op, make, shape):
    check_op(op, [make(*shape)])


def test_unary_float_specials_follow_builtin():
    specials = np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, -2.0, 2.0, 1e-30, 7.5], F32)
    for op, _ in UNARY_FLOAT:
        check_builtin(op, [specials], rtol=2e-7)


def test_round_half_to_even():
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, -3.5, 0.49999997, 1e8 + 0.5], F32)
    out = check_op("ROUND", [x], atol=0, rtol=0)[0]
    np.testing.assert_array_equal(out, [-2, -2, 0, 0, 2, 2, 4, -4, 0, 1e8])


@pytest.mark.parametrize("op,dtype", [("NEG", I32), ("NEG", I64), ("NEG", np.int16),
                                      ("NEG", np.int8), ("ABS", I32), ("ABS", np.int16),
                                      ("SIGN", I32)])
def test_unary_int(op, dtype):
    """The integer types LiteRT's kernels accept (kiln is more lenient)."""
    check_op(op, [rand_int(3, 5, dtype=dtype)])


def test_float_only_math_refuses_ints():
    x = np.array([1, 4], I32)
    record, call = kernel_call("SQRT", [x])
    with pytest.raises(OpError, match="float only"):
        record.kernel(call, x)


# -- comparisons and logic ------------------------------------------------------------------

COMPARISONS = ["LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL", "EQUAL", "NOT_EQUAL"]


@pytest.mark.parametrize("dtype", [F32, I32, I64])
@pytest.mark.parametrize("op", COMPARISONS)
def test_comparisons(op, dtype):
    if dtype == F32:
        a = np.round(rand(3, 4), 1).astype(F32)
        b = np.round(rand(4, seed=1), 1).astype(F32)
        b[0] = a[0, 0]
    else:
        a, b = rand_int(3, 4, lo=-3, hi=3, dtype=dtype), rand_int(4, seed=1, lo=-3, hi=3, dtype=dtype)
    check_op(op, [a, b], out_dtypes=[np.bool_])
    check_op(op, [a, Const(np.array(0, dtype))], out_dtypes=[np.bool_])


@pytest.mark.parametrize("op", ["EQUAL", "NOT_EQUAL"])
def test_equality_on_bool(op):
    a, b = rand(3, 4) > 0, rand(4, seed=1) > 0
    check_op(op, [a, b], out_dtypes=[np.bool_])


def test_comparisons_nan():
    x = np.array([np.nan, 1.0, np.nan, np.inf], F32)
    y = np.array([1.0, np.nan, np.nan, np.inf], F32)
    for op in COMPARISONS:
        check_builtin(op, [x, y], out_dtypes=[np.bool_], builtin=False)


@pytest.mark.parametrize("op", ["LOGICAL_AND", "LOGICAL_OR"])
def test_logical_binary(op):
    a, b = rand(2, 3, 4) > 0, rand(3, 1, seed=1) > 0
    check_op(op, [a, b], out_dtypes=[np.bool_])


def test_logical_not():
    check_op("LOGICAL_NOT", [rand(2, 5) > 0], out_dtypes=[np.bool_])


def test_logical_refuses_non_bool():
    x = np.array([1.0], F32)
    record, call = kernel_call("LOGICAL_NOT", [x])
    with pytest.raises(OpError, match="bool"):
        record.kernel(call, x)


# -- select ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F32, I32, I64, np.bool_])
def test_select_same_shape_and_row_mask(dtype):
    x, y = rand(3, 4).astype(dtype), rand(3, 4, seed=1).astype(dtype)
    check_op("SELECT", [rand(3, 4, seed=2) > 0, x, y], out_dtypes=[np.dtype(dtype)])
    check_op("SELECT", [np.array([True, False, True]), x, y], out_dtypes=[np.dtype(dtype)])


def test_select_rejects_broadcast_condition():
    x = rand(2, 3)
    assert "condition" in litert_error("SELECT", [np.array([True, False, True]), x, x],
                                       out_dtypes=[F32], out_shapes=[(2, 3)])
    record, call = kernel_call("SELECT", [np.array([True, False, True]), x, x])
    with pytest.raises(OpError, match="condition shape"):
        record.kernel(call, np.array([True, False, True]), x, x)


@pytest.mark.parametrize("shapes", [((2, 3), (2, 3), (2, 3)), ((3,), (2, 3), ()),
                                    ((2, 1), (1, 3), (2, 3)), ((1, 2, 1, 3), (2, 4, 1), (3,))])
def test_select_v2_broadcasts(shapes):
    c, x, y = rand(*shapes[0]) > 0, rand(*shapes[1], seed=1), rand(*shapes[2], seed=2)
    check_op("SELECT_V2", [c, x, y])
    check_op("SELECT_V2", [c, Const(x), y])


# -- cast -----------------------------------------------------------------------------------

CAST_PAIRS = [
    (F32, I32), (F32, I64), (F32, np.uint8), (F32, np.int8), (F32, np.int16), (F32, np.bool_),
    (F32, np.float16), (F32, np.float64), (I32, F32), (I32, I64), (I32, np.uint8),
    (I32, np.int8), (I32, np.bool_), (I64, I32), (I64, F32), (np.bool_, F32), (np.bool_, I32),
    (np.uint8, F32), (np.int8, I32), (np.int16, F32), (np.float64, F32), (np.float16, F32),
]


@pytest.mark.parametrize("src,dst", CAST_PAIRS, ids=[f"{np.dtype(a)}-{np.dtype(b)}" for a, b in CAST_PAIRS])
def test_cast(src, dst):
    if np.dtype(src) == np.bool_:
        x = rand(3, 4) > 0
    elif np.issubdtype(src, np.floating):
        x = rand(3, 4, scale=100).astype(src)
    else:
        x = rand_int(3, 4, lo=-300, hi=300).astype(src)
    check_op("CAST", [x], out_dtypes=[np.dtype(dst)], atol=0, rtol=0,
             options={"in_data_type": DType.from_numpy(src), "out_data_type": DType.from_numpy(dst)})


@pytest.mark.parametrize("dst", [np.int8, np.uint8, np.int16, np.uint16, I32, np.uint32, I64,
                                 np.bool_])
def test_cast_float_to_int_truncates_and_saturates(dst):
    x = np.array([np.nan, -np.inf, np.inf, -1e20, 1e20, -3.9, 3.9, -0.0, 255.5, -128.7], F32)
    out = check_builtin("CAST", [x], out_dtypes=[np.dtype(dst)])[0]
    if dst == I32:
        info = np.iinfo(I32)
        np.testing.assert_array_equal(
            out, [info.max, info.min, info.max, info.min, info.max, -3, 3, 0, 255, -128])


def test_cast_int_narrowing_wraps():
    x = np.array([-1, 300, 2**31 - 1, -2**31, 128, -129], I32)
    for dst in (np.int8, np.uint8, np.int16, np.uint32):
        check_builtin("CAST", [x], out_dtypes=[np.dtype(dst)])
    check_builtin("CAST", [np.array([2**40 + 5, -3], I64)], out_dtypes=[np.dtype(I32)])


@pytest.mark.parametrize("dtype", [F32, I32, I64])
def test_zeros_like(dtype):
    check_op("ZEROS_LIKE", [rand(2, 3, 4).astype(dtype)])


# -- property test --------------------------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(data=st.data(), op=st.sampled_from(["ADD", "SUB", "MUL", "MAXIMUM", "MINIMUM",
                                           "SQUARED_DIFFERENCE"]))
def test_binary_broadcast_property(data, op):
    shapes = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4,
                                                         max_side=4))
    elems = st.floats(-100, 100, width=32)
    a = data.draw(hnp.arrays(F32, shapes.input_shapes[0], elements=elems))
    b = data.draw(hnp.arrays(F32, shapes.input_shapes[1], elements=elems))
    check_op(op, [a, b])


# -- quantized operands ---------------------------------------------------------------------

Q = QuantParams(scale=[0.5], zero_point=[3])


@pytest.mark.parametrize("op,n", [("ADD", 2), ("MUL", 2), ("SUB", 2), ("DIV", 2), ("NEG", 1),
                                  ("ABS", 1), ("SQUARED_DIFFERENCE", 2), ("ADD_N", 2)])
def test_quantized_inputs_are_refused(op, n):
    xs = [np.array([1, 2, 3], np.int8) for _ in range(n)]
    record, call = kernel_call(op, xs, quant={0: Q, 1: Q}, out_quant=Q)
    with pytest.raises(OpError, match="quantized kernel not implemented yet"):
        record.kernel(call, *xs)


def test_order_only_ops_accept_shared_quantization():
    a, b = np.array([1, 5, -3], np.int8), np.array([2, 4, -3], np.int8)
    record, call = kernel_call("MAXIMUM", [a, b], quant={0: Q, 1: Q}, out_quant=Q)
    np.testing.assert_array_equal(record.kernel(call, a, b), [2, 5, -3])
    other = QuantParams(scale=[0.25], zero_point=[0])
    record, call = kernel_call("MAXIMUM", [a, b], quant={0: Q, 1: other}, out_quant=Q)
    with pytest.raises(OpError, match="quantized kernel not implemented yet"):
        record.kernel(call, a, b)
    record, call = kernel_call("LESS", [a, b], quant={0: Q, 1: Q}, out_dtypes=[np.bool_])
    np.testing.assert_array_equal(record.kernel(call, a, b), [True, False, False])


# -- versions, options, registration --------------------------------------------------------

def ir_op(op_type, specs, outs=None, options=None):
    """An IR operator over tensors given as (DType, shape[, QuantParams]) tuples."""
    sg = Model().add_subgraph("v")
    ins = [sg.add_tensor(f"i{k}", s[0], s[1], quantization=s[2] if len(s) > 2 else None)
           for k, s in enumerate(specs)]
    outs = [sg.add_tensor(f"o{k}", s[0], s[1], quantization=s[2] if len(s) > 2 else None)
            for k, s in enumerate(outs or specs[:1])]
    return sg.add_operator(Operator(op_type, options=options or {}), ins, outs)


F, I8, I16, Q16 = DType.FLOAT32, DType.INT8, DType.INT16, QuantParams(scale=[0.1], zero_point=[0])
VERSION_CASES = [
    ("ADD", [(F, (2,)), (F, (2,))], None, None, 1),
    ("ADD", [(I8, (2,), Q), (I8, (2,), Q)], None, None, 2),
    ("ADD", [(I16, (2,), Q16), (I16, (2,), Q16)], None, {"pot_scale_int16": False}, 3),
    ("ADD", [(I16, (2,), Q16), (I16, (2,), Q16)], None, None, 1),
    ("ADD", [(DType.INT64, (2,)), (DType.INT64, (2,))], None, None, 4),
    ("ADD", [(I16, (2,)), (I16, (2,))], None, None, 5),
    ("ADD", [(DType.FLOAT16, (2,)), (DType.FLOAT16, (2,))], None, None, 6),
    ("SUB", [(F, (1, 2, 1, 2, 2)), (F, (2, 2))], None, None, 3),
    ("SUB", [(F, (1, 2, 1, 2, 2)), (F, (1, 2, 1, 2, 2))], None, None, 1),
    ("SUB", [(DType.INT64, (2,)), (DType.INT64, (2,))], None, None, 4),
    ("SUB", [(I16, (2,), Q16), (I16, (2,), Q16)], None, {"pot_scale_int16": False}, 5),
    ("MUL", [(I8, (2,), QuantParams([2.0], [0])), (I8, (2,), QuantParams([1.0], [0]))],
     [(I8, (2,), QuantParams([1.0], [0]))], None, 3),
    ("MUL", [(I8, (2,), Q), (I8, (2,), Q)], None, None, 2),
    ("MUL", [(DType.INT64, (2,)), (DType.INT64, (2,))], None, None, 5),
    ("MUL", [(I16, (2,)), (I16, (2,))], None, None, 7),
    ("MUL", [(I16, (2,), Q16), (I16, (2,), Q16)], None, None, 4),
    ("MUL", [(DType.FLOAT16, (2,)), (DType.FLOAT16, (2,))], None, None, 8),
    ("DIV", [(F, (1, 1, 1, 1, 2)), (F, (2,))], None, None, 2),
    ("FLOOR_DIV", [(F, (2,)), (F, (2,))], None, None, 2),
    ("FLOOR_DIV", [(DType.INT32, (2,)), (DType.INT32, (2,))], None, None, 1),
    ("FLOOR_DIV", [(I16, (2,)), (I16, (2,))], None, None, 3),
    ("FLOOR_MOD", [(I8, (2,)), (I8, (2,))], None, None, 2),
    ("MAXIMUM", [(I16, (2,)), (I16, (2,))], None, None, 4),
    ("MAXIMUM", [(F, (1, 1, 1, 1, 2)), (F, (2,))], None, None, 3),
    ("ABS", [(DType.INT32, (2,))], None, None, 5),
    ("ABS", [(I16, (2,))], None, None, 4),
    ("ABS", [(I16, (2,), Q16)], None, None, 3),
    ("SIGN", [(DType.INT32, (2,))], None, None, 2),
    ("RSQRT", [(I16, (2,))], None, None, 3),
    ("SQRT", [(I8, (2,))], None, None, 2),
    ("LESS", [(I16, (2,)), (I16, (2,))], [(DType.BOOL, (2,))], None, 3),
    ("GREATER", [(I16, (2,)), (I16, (2,))], [(DType.BOOL, (2,))], None, 1),
    ("EQUAL", [(I16, (2,)), (I16, (2,))], [(DType.BOOL, (2,))], None, 5),
    ("EQUAL", [(DType.STRING, (2,)), (DType.STRING, (2,))], [(DType.BOOL, (2,))], None, 3),
    ("NOT_EQUAL", [(I16, (2,)), (I16, (2,))], [(DType.BOOL, (2,))], None, 4),
    ("SELECT", [(DType.BOOL, (1, 1, 1, 1, 2)), (F, (1, 1, 1, 1, 2)), (F, (1, 1, 1, 1, 2))],
     None, None, 3),
    ("CAST", [(F, (2,))], [(DType.INT32, (2,))], None, 1),
    ("CAST", [(DType.UINT32, (2,))], [(F, (2,))], None, 2),
    ("CAST", [(F, (2,))], [(I8, (2,))], None, 3),
    ("CAST", [(DType.UINT16, (2,))], [(F, (2,))], None, 4),
    ("CAST", [(F, (2,))], [(DType.FLOAT16, (2,))], None, 5),
    ("CAST", [(DType.BFLOAT16, (2,))], [(F, (2,))], None, 7),
]


@pytest.mark.parametrize("op_type,ins,outs,options,expected", VERSION_CASES)
def test_version_rules(op_type, ins, outs, options, expected):
    op = ir_op(op_type, ins, outs, options)
    assert ops.require(op_type).version(op) == expected


MY_OPS = [r for fam in (elementwise, activations, reduce) for r in fam.OPS]


def _model_at_version(record, version):
    x = np.zeros((2,), F32)
    return single_op_model(record.name, [x, x],
                           version=version, out_dtypes=[F32, F32], out_shapes=[(2,), (2,)])


@pytest.mark.parametrize("record", MY_OPS, ids=lambda r: r.name)
def test_max_version_matches_litert_registration(record):
    """LiteRT resolves the op at max_version and not above it."""
    from ai_edge_litert.interpreter import Interpreter

    def resolves(version):
        try:
            Interpreter(model_content=_model_at_version(record, version))
        except Exception as exc:  # noqa: BLE001 - LiteRT raises plain exceptions
            return "Didn't find op" not in str(exc)
        return True

    assert resolves(record.max_version)
    assert not resolves(record.max_version + 1)


def _schema_defaults(table: str) -> dict:
    """Field name -> default, read from the tflite bindings' builder functions."""
    importlib.import_module(f"tflite.{table}")
    module = sys.modules[f"tflite.{table}"]
    found = {}
    for name, fn in vars(module).items():
        if not name.startswith(f"{table}Add") or not callable(fn):
            continue
        m = re.search(r"Prepend(\w+?)Slot\(\d+, \w+, (.+)\)", inspect.getsource(fn))
        if m:
            snake = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name[len(table) + 3:]).lower()
            found[snake] = (m.group(1), m.group(2))
    return found


@pytest.mark.parametrize("record", [r for r in MY_OPS if r.options], ids=lambda r: r.name)
def test_option_defaults_match_schema(record):
    schema = _schema_defaults(record.options.table)
    assert set(record.options.defaults) == set(schema)
    for name, value in record.options.defaults.items():
        kind, default = schema[name]
        if kind == "Bool":
            assert value is bool(int(default)), name
        elif kind.startswith("Float"):
            assert isinstance(value, float) and value == float(default), name
        else:
            assert isinstance(value, int) and value == int(default), name
