"""The quantized delegate's SOFTMAX, CONCATENATION / PACK, 16x8 ADD / SUB / MUL, QUANTIZE from
float and TRANSPOSE_CONV lowerings (kiln/delegates/more_lowerings.py, transpose_lowerings.py):
one-op models run invoke after invoke on fresh inputs (the delegate checks a lowering against
its kernel on the first run only, so the later runs test the lowering itself) agree with kiln's
and LiteRT's BUILTIN_REF bit for bit, and the node ran its lowering. Where LiteRT's reference
cannot be the judge (inputs it refuses), the lowering is compared with the pure kernel."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import ops
from kiln.delegates import NumpyDelegate
from kiln.format import write_model
from kiln.ir import Model, Operator
from kiln.kernels import softmax as softmax_kernels
from kiln.schema import Activation, DType, Padding
from tests.quant.test_compiled_quant import REF, delegated
from tests.harness import run_api
from tests.quant.test_dispatch import Const, In, bias_for, codes, one_op, qp, reference

NONE, RELU, RELU6 = Activation.NONE, Activation.RELU, Activation.RELU6


# -- SOFTMAX ------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(3, 10), (2, 4, 7), (5, 1), (1, 2, 6, 33)])
@pytest.mark.parametrize("scale,beta", [(0.05, 1.0), (0.3, 1.0), (0.01, 2.5), (0.12, 0.7)])
def test_softmax_int8(shape, scale, beta):
    delegated("SOFTMAX", [In(codes(*shape), qp(scale, 9))], [(np.int8, shape, qp(1 / 256, -128))],
              dict(beta=beta), invokes=4)


@pytest.mark.parametrize("shape", [(3, 10), (2, 4, 50), (4, 1)])
@pytest.mark.parametrize("scale,beta", [(0.0004, 1.0), (0.002, 1.0), (0.0001, 3.0)])
def test_softmax_int16(shape, scale, beta):
    delegated("SOFTMAX", [In(codes(*shape, dtype=np.int16), qp(scale))], [(np.int16, shape, qp(1 / 32768))],
              dict(beta=beta), invokes=4)


def test_softmax_int8_rows_of_equal_codes_and_extremes():
    """Rows of one repeated code, and rows holding both -128 and 127 (distances 0 and 255)."""
    x = np.array([[5] * 8, [-128] * 8, [127, -128] * 4, [127] + [-128] * 7], np.int8)
    model, _ = one_op("SOFTMAX", [In(x, qp(0.08, -3))], [(np.int8, x.shape, qp(1 / 256, -128))], dict(beta=1.0))
    interp = kiln.Interpreter(model_content=model)
    for feed in (codes(*x.shape), x, x[::-1].copy()):
        np.testing.assert_array_equal(run_api(interp, [feed])[0], reference(model, [feed])[0])
    (delegate,) = [d for d in interp._delegates if isinstance(d, NumpyDelegate)]
    assert delegate.lowered and not delegate.fallbacks


def softmax_near_ties(count: int = 3, seed: int = 1) -> list[tuple[float, np.ndarray]]:
    """(input scale, int8 row) pairs on which LiteRT's reference int8 SOFTMAX (gemmlowp fixed
    point, BUILTIN_REF) and its optimized float-table kernel give different codes: found by
    search (about 1 row in 30 000 is such a near tie), so a lowering that computes the float
    table cannot pass them."""
    rng = np.random.default_rng(seed)
    found = []
    while len(found) < count:
        scale, cols = float(np.float32(np.exp(rng.uniform(np.log(1e-3), 0)))), int(rng.integers(2, 64))
        x = rng.integers(-128, 128, (16, cols)).astype(np.int8)
        x_q, y_q = qp(scale, 0), qp(1 / 256, -128)
        differ = (softmax_kernels.softmax(x, x_q, y_q) != softmax_kernels.softmax_float_table(x, x_q, y_q)).any(axis=1)
        found += [(scale, x[r]) for r in np.flatnonzero(differ)[:1]]
    return found


@pytest.mark.parametrize("case", range(3))
def test_softmax_int8_near_ties_are_builtin_refs(case):
    """On rows where LiteRT's reference and optimized kernels disagree, the lowering gives the
    reference's codes (it runs `softmax_fixed_point`, the kernel's own arithmetic) — fed
    after a first invoke of random rows, when the delegate no longer checks it."""
    scale, row = softmax_near_ties()[case]
    shape = (2, row.size)
    model, _ = one_op("SOFTMAX", [In(codes(*shape), qp(scale, 0))], [(np.int8, shape, qp(1 / 256, -128))],
                      dict(beta=1.0))
    interp = kiln.Interpreter(model_content=model)
    for feed in (codes(*shape), np.stack([row, row[::-1]])):
        np.testing.assert_array_equal(run_api(interp, [feed])[0], reference(model, [feed])[0])
    (delegate,) = [d for d in interp._delegates if isinstance(d, NumpyDelegate)]
    assert delegate.lowered and not delegate.fallbacks


def test_softmax_int8_rows_builtin_ref_aborts_on_get_the_kernels_values():
    """A row of 600 equal codes sums its exps past LiteRT's reference kernel's range (it aborts
    the process, so it is not run here): the lowering gives kiln's kernel's values for it."""
    x = np.zeros((2, 600), np.int8)
    x[1, ::2] = 7
    _against_kiln_kernel("SOFTMAX", [In(x, qp(0.05, 0))], [(np.int8, x.shape, qp(1 / 256, -128))], dict(beta=1.0),
                         [[codes(*x.shape)], [x]])


# -- CONCATENATION / PACK -----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.int8, np.int16])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concatenation(dtype, axis):
    q = qp(0.05, 3 if dtype == np.int8 else 0)
    shapes = [(2, 3, 4), (2, 3, 4), (2, 3, 4)]
    grow = axis % 3
    shapes = [tuple(d + k if i == grow else d for i, d in enumerate(s)) for k, s in enumerate(shapes)]
    out_shape = list(shapes[0])
    out_shape[grow] = sum(s[grow] for s in shapes)
    operands = [In(codes(*shapes[0], dtype=dtype), q), Const(codes(*shapes[1], dtype=dtype), q),
                In(codes(*shapes[2], dtype=dtype), q)]
    delegated("CONCATENATION", operands, [(dtype, tuple(out_shape), q)], dict(axis=axis))


@pytest.mark.parametrize("dtype", [np.int8, np.int16])
@pytest.mark.parametrize("axis", [0, 2, -1])
def test_pack(dtype, axis):
    q = qp(0.02, -7 if dtype == np.int8 else 0)
    xs = [codes(3, 5, dtype=dtype) for _ in range(3)]
    out_shape = np.stack(xs, axis=axis).shape
    delegated("PACK", [In(xs[0], q), In(xs[1], q), Const(xs[2], q)], [(dtype, out_shape, q)],
              dict(axis=axis, values_count=3))


# -- 16x8 ADD / SUB / MUL -----------------------------------------------------------------------

@pytest.mark.parametrize("op_type", ["ADD", "SUB", "MUL"])
@pytest.mark.parametrize("shapes,const_b", [(((6, 20), (6, 20)), False), (((2, 3, 8), (1, 8)), False),
                                            (((2, 3, 8), (8,)), True)])
@pytest.mark.parametrize("scales", [(0.0003, 0.0001, 0.0004), (0.001, 0.001, 0.0005), (0.0002, 0.0007, 0.00002)])
def test_binary_16x8(op_type, shapes, const_b, scales):
    b = codes(*shapes[1], dtype=np.int16)
    b_operand = Const(b, qp(scales[1])) if const_b else In(b, qp(scales[1]))
    out_scale = scales[2] * (300 if op_type == "MUL" else 1)
    delegated(op_type, [In(codes(*shapes[0], dtype=np.int16), qp(scales[0])), b_operand],
              [(np.int16, np.broadcast_shapes(*shapes), qp(out_scale))],
              dict(fused_activation_function=RELU if scales[0] == 0.001 else NONE))


# -- QUANTIZE from float ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,zero_point", [(np.int8, -5), (np.uint8, 128), (np.int16, 0)])
def test_quantize_from_float(dtype, zero_point):
    """Values far beyond the range, ties (k + 0.5 steps) and signed zeros agree with BUILTIN_REF;
    quotients beyond int32 (undefined behaviour in LiteRT's reference) with kiln's kernel."""
    q = qp(0.0371 if dtype != np.int16 else 0.0003, zero_point)
    model, _ = one_op("QUANTIZE", [In(np.zeros((4, 64), np.float32))], [(dtype, (4, 64), q)])
    interp, kiln_ref = kiln.Interpreter(model_content=model), kiln.Interpreter(model_content=model, **REF)
    rng = np.random.default_rng(11)
    scale = np.float32(q.scale[0])
    ties = ((np.arange(-128, 128) + 0.5) * scale).astype(np.float32).reshape(4, 64)
    far = (rng.uniform(-2e9, 2e9, (4, 64)) * scale).astype(np.float32)
    for feed in (rng.standard_normal((4, 64)).astype(np.float32) * 3, ties, far, np.full((4, 64), -0.0, np.float32)):
        got = run_api(interp, [feed])[0]
        np.testing.assert_array_equal(got, reference(model, [feed])[0])
    beyond = np.array([np.inf, -np.inf, 1e30, -1e30] * 64, np.float32).reshape(4, 64)
    np.testing.assert_array_equal(run_api(interp, [beyond])[0], run_api(kiln_ref, [beyond])[0])
    (delegate,) = [d for d in interp._delegates if isinstance(d, NumpyDelegate)]
    assert delegate.lowered and not delegate.fallbacks


def test_lowered_ops_run_in_one_chain_with_the_reference():
    """A SOFTMAX after a 16x8 ADD in one partition: both lowered, the output BUILTIN_REF's."""
    model = Model()
    sg = model.add_subgraph("main")
    a = sg.add_tensor("a", DType.INT16, (3, 12), quantization=qp(0.0004))
    b = sg.add_tensor("b", DType.INT16, (3, 12), quantization=qp(0.0002))
    s = sg.add_tensor("s", DType.INT16, (3, 12), quantization=qp(0.0005))
    y = sg.add_tensor("y", DType.INT16, (3, 12), quantization=qp(1 / 32768))
    sg.inputs.extend([a, b])
    sg.outputs.append(y)
    for op_type, options, ins, out in (("ADD", dict(fused_activation_function=NONE), [a, b], s),
                                       ("SOFTMAX", dict(beta=1.0), [s], y)):
        op = Operator(op_type, options=options)
        sg.add_operator(op, ins, [out])
        op.version = ops.require(op_type).version(op)
    data = write_model(model)
    interp, ref = kiln.Interpreter(model_content=data), kiln.Interpreter(model_content=data, **REF)
    for _ in range(3):
        feeds = [codes(3, 12, dtype=np.int16), codes(3, 12, dtype=np.int16)]
        got = run_api(interp, feeds)[0]
        np.testing.assert_array_equal(got, run_api(ref, feeds)[0])
        np.testing.assert_array_equal(got, reference(data, feeds)[0])
    (delegate,) = [d for d in interp._delegates if isinstance(d, NumpyDelegate)]
    assert sorted(name for _, name in delegate.lowered) == ["ADD", "SOFTMAX"] and not delegate.fallbacks


# -- TRANSPOSE_CONV -----------------------------------------------------------------------------

TCONV_CASES = [(Padding.SAME, (2, 2), (8, 10), (3, 3)), (Padding.VALID, (2, 1), (9, 7), (3, 3)),
               (Padding.SAME, (1, 1), (4, 5), (3, 2)), (Padding.VALID, (3, 3), (11, 8), (2, 2)),
               (Padding.SAME, (2, 2), (7, 9), (4, 4))]


def _tconv_input_hw(padding, stride, out_hw, khw):
    return tuple(-(-o // s) if padding == Padding.SAME else (o - k) // s + 1
                 for o, s, k in zip(out_hw, stride, khw))


@pytest.mark.parametrize("padding,stride,out_hw,khw", TCONV_CASES)
@pytest.mark.parametrize("dtype,act", [(np.int8, NONE), (np.int8, RELU6), (np.int16, NONE)])
def test_transpose_conv(padding, stride, out_hw, khw, dtype, act):
    w = codes(6, *khw, 4, low=-127)
    x = codes(2, *_tconv_input_hw(padding, stride, out_hw, khw), 4, dtype=dtype)
    w_q = qp(np.random.default_rng(12).uniform(0.005, 0.02, 6))
    x_q, y_q = (qp(0.04, 5), qp(0.3, -11)) if dtype == np.int8 else (qp(0.0004), qp(0.003))
    bias = bias_for(x_q, w_q, 6, dtype=np.int32 if dtype == np.int8 else np.int64)
    delegated("TRANSPOSE_CONV", [Const(np.array([2, *out_hw, 6], np.int32)), Const(w, w_q), In(x, x_q), bias],
              [(dtype, (2, *out_hw, 6), y_q)],
              dict(padding=padding, stride_h=stride[0], stride_w=stride[1], fused_activation_function=act))


def test_transpose_conv_without_bias():
    w, x = codes(3, 3, 3, 5, low=-127), codes(1, 4, 4, 5)
    delegated("TRANSPOSE_CONV", [Const(np.array([1, 8, 8, 3], np.int32)), Const(w, qp(0.01)), In(x, qp(0.05, -2)),
                                 None],
              [(np.int8, (1, 8, 8, 3), qp(0.2, 3))], dict(padding=Padding.SAME, stride_h=2, stride_w=2))


@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("padding,stride,out_hw,khw", TCONV_CASES)
def test_transpose_conv_hybrid(per_channel, padding, stride, out_hw, khw):
    """Bit-exact with LiteRT's HybridTransposeConv (every tap rescaled and added in float32 in
    its scatter order); fresh float inputs on every invoke."""
    w = codes(3, *khw, 5, low=-127)
    scales = np.random.default_rng(13).uniform(0.01, 0.03, 3) if per_channel else 0.02
    x = np.zeros((2, *_tconv_input_hw(padding, stride, out_hw, khw), 5), np.float32)
    delegated("TRANSPOSE_CONV", [Const(np.array([2, *out_hw, 3], np.int32)), Const(w, qp(scales)), In(x),
                                 Const(np.random.default_rng(14).standard_normal(3).astype(np.float32))],
              [(np.float32, (2, *out_hw, 3), None)],
              dict(padding=padding, stride_h=stride[0], stride_w=stride[1], fused_activation_function=RELU),
              invokes=4)


# -- int16 tables over a kernel's domain --------------------------------------------------------

def test_rsqrt_16x8_table_and_its_refusal():
    """int16 RSQRT refuses codes below the zero point: the table covers the codes it takes
    (all 32768 of them checked against BUILTIN_REF), and a refused code still raises."""
    x_q, y_q = qp(0.0005), qp(0.01)
    model, _ = one_op("RSQRT", [In(np.zeros((4, 8192), np.int16), x_q)], [(np.int16, (4, 8192), y_q)])
    interp, kiln_ref = kiln.Interpreter(model_content=model), kiln.Interpreter(model_content=model, **REF)
    every = np.arange(32768, dtype=np.int16).reshape(4, 8192)
    for feed in (codes(4, 8192, dtype=np.int16, low=0), every, every[::-1].copy()):
        got = run_api(interp, [feed])[0]
        np.testing.assert_array_equal(got, reference(model, [feed])[0])
        np.testing.assert_array_equal(got, run_api(kiln_ref, [feed])[0])
    (delegate,) = [d for d in interp._delegates if isinstance(d, NumpyDelegate)]
    assert delegate.lowered and not delegate.fallbacks
    negative = every.copy()
    negative[2, 5] = -1
    with pytest.raises(kiln.KilnError, match="positive"):
        run_api(interp, [negative])


# -- run-time shape operands --------------------------------------------------------------------

def _ref_and_lowered(model, feeds_list):
    interp, kiln_ref = kiln.Interpreter(model_content=model), kiln.Interpreter(model_content=model, **REF)
    for feeds in feeds_list:
        got = run_api(interp, feeds)
        for want in (run_api(kiln_ref, feeds), reference(model, feeds)):
            for g, w in zip(got, want):
                assert g.dtype == w.dtype and g.shape == w.shape
                np.testing.assert_array_equal(g, w)
    (delegate,) = [d for d in interp._delegates if isinstance(d, NumpyDelegate)]
    assert delegate.lowered and not delegate.fallbacks
    return delegate


def test_transpose_conv_with_a_run_time_output_shape():
    """An output_shape tensor computed at run time (Keras' SHAPE → STRIDED_SLICE → PACK) is a
    partition input; its value keys the plan."""
    w, x_q, w_q = codes(3, 3, 3, 4, low=-127), qp(0.05, 2), qp(0.01)
    shape = np.array([1, 8, 8, 3], np.int32)
    model, _ = one_op("TRANSPOSE_CONV", [In(shape), Const(w, w_q), In(codes(1, 4, 4, 4), x_q), None],
                      [(np.int8, (1, 8, 8, 3), qp(0.2, -1))], dict(padding=Padding.SAME, stride_h=2, stride_w=2))
    delegate = _ref_and_lowered(model, [[shape, codes(1, 4, 4, 4)] for _ in range(3)])
    (kernel,) = delegate.kernels
    assert list(kernel.plans) == [((4,), (1, 4, 4, 4), shape.tobytes())]


def test_reshape_and_transpose_with_run_time_shapes():
    """A RESHAPE whose shape input changes between invokes (same input shape) gets a plan per
    shape value; a TRANSPOSE with a run-time permutation likewise."""
    q = qp(0.05, 4)
    model, _ = one_op("RESHAPE", [In(codes(2, 6), q), In(np.array([3, 4], np.int32))], [(np.int8, (3, 4), q)])
    feeds = [[codes(2, 6), np.array(s, np.int32)] for s in ([3, 4], [4, 3], [3, 4], [12, 1])]
    delegate = _ref_and_lowered(model, feeds)
    assert len(delegate.kernels[0].plans) == 3
    model, _ = one_op("TRANSPOSE", [In(codes(2, 3, 5, dtype=np.int16), qp(0.001)), In(np.array([2, 0, 1], np.int32))],
                      [(np.int16, (5, 2, 3), qp(0.001))])
    feeds = [[codes(2, 3, 5, dtype=np.int16), np.array(p, np.int32)] for p in ([2, 0, 1], [1, 2, 0], [2, 0, 1])]
    delegate = _ref_and_lowered(model, feeds)
    assert len(delegate.kernels[0].plans) == 2


@pytest.mark.parametrize("perm", [(1, 0), (0, 2, 1, 3), (3, 1, 2, 0)])
def test_transpose_int8(perm):
    x = codes(*(2, 3, 4, 5)[:len(perm)])
    delegated("TRANSPOSE", [In(x, qp(0.02, -3)), Const(np.array(perm, np.int32))],
              [(np.int8, np.transpose(x, perm).shape, qp(0.02, -3))])


def test_mean_with_run_time_axes_and_a_bias_that_must_be_constant():
    """MEAN's axes may be a run-time tensor (keying the plan); a FULLY_CONNECTED bias may not
    (only the ops' shape operands may)."""
    model, _ = one_op("MEAN", [In(codes(2, 4, 5, 3), qp(0.05, -4)), In(np.array([1, 2], np.int32))],
                      [(np.int8, (2, 1, 1, 3), qp(0.02, 6))], dict(keep_dims=True))
    _ref_and_lowered(model, [[codes(2, 4, 5, 3), np.array([1, 2], np.int32)] for _ in range(3)])
    x_q, w_q = qp(0.03, -9), qp(0.01)
    model, _ = one_op("FULLY_CONNECTED", [In(codes(2, 8), x_q), Const(codes(3, 8, low=-127), w_q),
                                          In(np.zeros(3, np.int32))], [(np.int8, (2, 3), qp(0.1, 4))])
    interp = kiln.Interpreter(model_content=model)
    interp.allocate_tensors()
    (delegate,) = [d for d in interp._delegates if isinstance(d, NumpyDelegate)]
    assert not delegate.claimed and "is not a constant" in " ".join(delegate.rejected.values())


# -- parameter sweeps against kiln's reference kernels -------------------------------------------

def _against_kiln_kernel(op_type, operands, outputs, options, feeds_list):
    """The default Interpreter vs kiln's BUILTIN_REF (the pure kernels) on every feed; the node lowered."""
    model, _ = one_op(op_type, operands, outputs, options)
    interp, kiln_ref = kiln.Interpreter(model_content=model), kiln.Interpreter(model_content=model, **REF)
    for feeds in feeds_list:
        for g, w in zip(run_api(interp, feeds), run_api(kiln_ref, feeds)):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(g, w, err_msg=op_type)
    (delegate,) = [d for d in interp._delegates if isinstance(d, NumpyDelegate)]
    assert delegate.lowered and not delegate.fallbacks, (op_type, delegate.fallbacks)


@pytest.mark.parametrize("seed", range(6))
def test_softmax_parameter_sweep(seed):
    """Random input scales (1e-3 .. 1), zero points, betas and row lengths (1 .. 300)."""
    rng = np.random.default_rng(100 + seed)
    for _ in range(5):
        scale, beta = float(np.exp(rng.uniform(np.log(1e-3), 0))), float(rng.uniform(0.2, 4))
        cols = int(rng.integers(1, 300))
        x_q = qp(scale, int(rng.integers(-128, 128)))
        _against_kiln_kernel("SOFTMAX", [In(codes(3, cols), x_q)], [(np.int8, (3, cols), qp(1 / 256, -128))],
                             dict(beta=beta), [[codes(3, cols)] for _ in range(3)])
        _against_kiln_kernel("SOFTMAX", [In(codes(3, cols, dtype=np.int16), qp(scale / 300))],
                             [(np.int16, (3, cols), qp(1 / 32768))], dict(beta=beta),
                             [[codes(3, cols, dtype=np.int16)] for _ in range(3)])


@pytest.mark.parametrize("op_type", ["ADD", "SUB", "MUL"])
def test_binary_16x8_parameter_sweep(op_type):
    """Random scales over four decades for the inputs and the output (saturating ones included)."""
    rng = np.random.default_rng({"ADD": 1, "SUB": 2, "MUL": 3}[op_type])
    for _ in range(12):
        sa, sb, sy = (float(np.exp(rng.uniform(np.log(1e-5), np.log(1e-1)))) for _ in range(3))
        feeds = [[codes(4, 16, dtype=np.int16), codes(1, 16, dtype=np.int16)] for _ in range(3)]
        _against_kiln_kernel(op_type, [In(feeds[0][0], qp(sa)), In(feeds[0][1], qp(sb))],
                             [(np.int16, (4, 16), qp(sy))], dict(fused_activation_function=NONE), feeds)


@pytest.mark.parametrize("name", ["UNIDIRECTIONAL_SEQUENCE_LSTM-keras", "UNIDIRECTIONAL_SEQUENCE_LSTM-time_major"])
def test_hybrid_lstm_runs_in_the_chain_with_its_state(name):
    """A dynamic-range (hybrid) sequence LSTM, as kiln.quantize writes it, is claimed by the
    NumPy delegate (its kernel runs in the chain) and gives kiln's reference kernels' bits
    invoke after invoke, its variable states carried from one invoke to the next."""
    from tests.quant.test_one_op_conformance import feeds, quantized

    model = quantized(name, "dynamic")
    delegate = NumpyDelegate()
    ours = kiln.Interpreter(model_content=model, experimental_delegates=[delegate], **REF)
    kiln_ref = kiln.Interpreter(model_content=model, **REF)
    for k, row in enumerate(feeds(name, "dynamic") * 2):
        for g, w in zip(run_api(ours, row), run_api(kiln_ref, row)):
            np.testing.assert_array_equal(g, w, err_msg=f"{name}, invoke {k}")
    assert [n for _, n, _ in delegate.claimed] == ["UNIDIRECTIONAL_SEQUENCE_LSTM"] and not delegate.fallbacks
