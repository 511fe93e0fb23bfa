"""Quantized lowerings whose kernels' own sweeps (tests/quant/test_more_ops.py) are not
collected by test_quant_sweeps: int8 / uint8 PRELU over many quantization parameters,
L2_NORMALIZATION (zero rows, tiny and past-2^29 sums of squares) and the int8 RESIZE_BILINEAR
modes, and the hybrid TRANSPOSE_CONV to the bit. Each one-op model must be claimed by XlaDelegate, and its outputs must equal kiln's
reference kernel and LiteRT's BUILTIN_REF bit for bit on several inputs."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("jax")

#: `make test` runs each function's first case and one in 3; the whole sweep runs over both lanes (conftest.py).
FAST_LANE_SHARE = 3

import kiln  # noqa: E402
from kiln.schema import Activation, Padding  # noqa: E402
from kiln.xla import XlaDelegate  # noqa: E402
from tests.quant.test_compiled_quant import REF  # noqa: E402
from tests.harness import run_api
from tests.quant.test_compiled_quant_more import softmax_near_ties  # noqa: E402
from tests.quant.test_dispatch import Const, In, codes, one_op, qp, reference  # noqa: E402

RELU = Activation.RELU


def _claimed_and_exact(op_type, operands, outputs, feeds_list, options=None):
    model, _ = one_op(op_type, operands, outputs, options)
    delegate = XlaDelegate()
    ours = kiln.Interpreter(model_content=model, experimental_delegates=[delegate], **REF)
    ours.allocate_tensors()
    assert not delegate.rejected, delegate.rejected
    assert [name for _, name, _ in delegate.claimed] == [op_type]
    kiln_ref = kiln.Interpreter(model_content=model, **REF)
    for k, feeds in enumerate(feeds_list):
        got = run_api(ours, feeds)
        for want, what in ((run_api(kiln_ref, feeds), "kiln's kernel"), (reference(model, feeds), "BUILTIN_REF")):
            for g, w in zip(got, want):
                assert g.dtype == w.dtype and g.shape == w.shape
                np.testing.assert_array_equal(g, w, err_msg=f"{op_type}, XLA vs {what}, feed {k}")


def _codes(rng, shape, dtype=np.int8, low=None, high=None):
    info = np.iinfo(dtype)
    return rng.integers(info.min if low is None else low, (info.max if high is None else high) + 1,
                        shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("alpha_shape", [(1, 1, 5), (4, 3, 5), (5,), (2, 4, 3, 5)])
def test_prelu_8bit(dtype, alpha_shape):
    rng = np.random.default_rng(len(alpha_shape) + 7 * (dtype == np.uint8))
    info = np.iinfo(dtype)
    mid = (int(info.min) + int(info.max) + 1) // 2
    for _ in range(3):
        x_q = qp(rng.uniform(0.005, 0.1), int(rng.integers(mid - 60, mid + 60)))
        a_q = qp(rng.uniform(0.001, 0.05), 0 if dtype == np.int8 else int(rng.integers(100, 156)))
        y_q = qp(rng.uniform(0.005, 0.1), int(rng.integers(mid - 60, mid + 60)))
        x = _codes(rng, (2, 4, 3, 5), dtype)
        _claimed_and_exact("PRELU", [In(x, x_q), Const(_codes(rng, alpha_shape, dtype), a_q)],
                           [(dtype, x.shape, y_q)], [[_codes(rng, x.shape, dtype)] for _ in range(3)])


@pytest.mark.parametrize("depth", [1, 3, 16, 200])
def test_l2_normalization(depth):
    rng = np.random.default_rng(depth)
    for zp in (-128, -3, 0, 40, 127):
        feeds = []
        for _ in range(3):
            x = _codes(rng, (5, depth))
            x[0] = zp                                  # a row of zeros: the kernel's sum <= 1 case
            feeds.append([x])
        feeds.append([_codes(rng, (5, depth), low=max(-128, zp - 2), high=min(127, zp + 2))])   # tiny sums
        _claimed_and_exact("L2_NORMALIZATION", [In(feeds[0][0], qp(rng.uniform(0.005, 0.1), zp))],
                           [(np.int8, (5, depth), qp(1 / 128, 0))], feeds)


def test_l2_normalization_sums_past_2_to_the_29():
    """Rows whose sum of squares the kernel first divides by 4 (more than once); below 2^31,
    where LiteRT's int32 sum (which kiln's kernel does not wrap) would overflow."""
    rng = np.random.default_rng(5)
    x = _codes(rng, (3, 40000))
    _claimed_and_exact("L2_NORMALIZATION", [In(x, qp(0.01, -128))], [(np.int8, x.shape, qp(1 / 128, 0))],
                       [[x], [_codes(rng, x.shape)], [np.full(x.shape, 127 - 128 * (np.arange(40000) % 2), np.int8)]])


def test_l2_normalization_other_output_params_stay_on_the_kernel():
    model, _ = one_op("L2_NORMALIZATION", [In(np.zeros((2, 4), np.int8), qp(0.1, 0))], [(np.int8, (2, 4), qp(0.01, 0))])
    delegate = XlaDelegate()
    kiln.Interpreter(model_content=model, experimental_delegates=[delegate]).allocate_tensors()
    assert not delegate.claimed
    assert any("1/128" in reason for reason in delegate.rejected.values())


@pytest.mark.parametrize("align_corners,half_pixel", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("out_hw", [(7, 9), (2, 3), (1, 1), (8, 10), (13, 4)])
def test_resize_bilinear_int8(align_corners, half_pixel, out_hw):
    rng = np.random.default_rng(out_hw[0])
    x, q = _codes(rng, (2, 4, 5, 3)), qp(0.02, -7)
    _claimed_and_exact("RESIZE_BILINEAR", [In(x, q), Const(np.array(out_hw, np.int32))], [(np.int8, (2, *out_hw, 3), q)],
                       [[_codes(rng, x.shape)] for _ in range(3)],
                       dict(align_corners=align_corners, half_pixel_centers=half_pixel))


@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("padding,stride,out_hw,khw", [
    (Padding.SAME, (1, 1), (5, 4), (3, 3)), (Padding.SAME, (2, 2), (8, 6), (3, 3)),
    (Padding.VALID, (2, 3), (9, 11), (3, 2)), (Padding.VALID, (1, 2), (6, 7), (2, 3))])
def test_hybrid_transpose_conv_bit_for_bit(per_channel, padding, stride, out_hw, khw):
    """Float outputs equal to the bit (the sweeps allow float32 rounding): every term rounded
    and added in LiteRT's scatter order; fresh inputs, one of them all zeros."""
    rng = np.random.default_rng(out_hw[0] + per_channel)
    in_hw = [-(-o // s) if padding == Padding.SAME else (o - k) // s + 1 for o, s, k in zip(out_hw, stride, khw)]
    w = _codes(rng, (3, *khw, 5), low=-127)
    scales = rng.uniform(0.01, 0.03, 3) if per_channel else 0.02
    x = np.zeros((2, *in_hw, 5), np.float32)
    feeds = [[(3 * rng.standard_normal(x.shape)).astype(np.float32)] for _ in range(3)] + [[x]]
    _claimed_and_exact("TRANSPOSE_CONV", [Const(np.array([2, *out_hw, 3], np.int32)), Const(w, qp(scales)), In(x),
                                          Const(rng.standard_normal(3).astype(np.float32))],
                       [(np.float32, (2, *out_hw, 3), None)], feeds,
                       dict(padding=padding, stride_h=stride[0], stride_w=stride[1], fused_activation_function=RELU))


@pytest.mark.parametrize("depth", [1, 5, 8, 13, 64, 130, 300])
def test_log_softmax_int8(depth):
    """Row lengths on both sides of NumPy's summation blocks (8, 128), wide and narrow input
    scales (sums near 1 and near the row length)."""
    rng = np.random.default_rng(depth)
    for scale in (0.02, 0.1, 0.5):
        x = _codes(rng, (6, depth))
        feeds = [[_codes(rng, x.shape)] for _ in range(3)] + [[np.full(x.shape, 7, np.int8)]]
        _claimed_and_exact("LOG_SOFTMAX", [In(x, qp(scale, int(rng.integers(-20, 20))))],
                           [(np.int8, x.shape, qp(16 / 256, 127))], feeds)


def test_log_softmax_row_sums_add_in_numpys_order():
    """The lowering's float32 row sums equal NumPy's to the bit (the kernel sums with NumPy),
    where a plain left-to-right or tree sum differs."""
    import jax

    from kiln.xla.lower_quant_activations import _numpy_sum

    rng = np.random.default_rng(0)
    for n in (*range(1, 20), 31, 64, 127, 128, 129, 200, 257, 300, 1000):
        v = np.exp(3 * rng.standard_normal((50, n))).astype(np.float32)
        want = v.sum(axis=-1, dtype=np.float32)
        np.testing.assert_array_equal(np.asarray(jax.jit(_numpy_sum)(v)), want, err_msg=f"row length {n}")
    sequential = np.zeros(50, np.float32)
    for j in range(v.shape[1]):
        sequential += v[:, j]
    assert not np.array_equal(sequential, want)


@pytest.mark.parametrize("case", range(3))
def test_softmax_int8_near_ties_are_builtin_refs(case):
    """int8 SOFTMAX runs the reference kernel's fixed point (`softmax_fixed_point` on
    jax.numpy): on rows where LiteRT's reference and optimized kernels disagree it gives the
    reference's codes."""
    scale, row = softmax_near_ties()[case]
    shape = (2, row.size)
    _claimed_and_exact("SOFTMAX", [In(codes(*shape), qp(scale, 0))], [(np.int8, shape, qp(1 / 256, -128))],
                       [[codes(*shape)], [np.stack([row, row[::-1]])]], dict(beta=1.0))


def test_softmax_int8_rows_builtin_ref_aborts_on_get_the_kernels_values():
    """Rows wide and flat enough that LiteRT's reference aborts (not run here): the lowering
    traces the kernel's fallback and equals kiln's kernel on them and on random rows."""
    x = np.zeros((2, 600), np.int8)
    x[1, ::2] = 7
    model, _ = one_op("SOFTMAX", [In(x, qp(0.05, 0))], [(np.int8, x.shape, qp(1 / 256, -128))], dict(beta=1.0))
    delegate = XlaDelegate()
    ours, kiln_ref = (kiln.Interpreter(model_content=model, experimental_delegates=[delegate], **REF),
                      kiln.Interpreter(model_content=model, **REF))
    for feed in (x, codes(*x.shape)):
        np.testing.assert_array_equal(run_api(ours, [feed])[0], run_api(kiln_ref, [feed])[0])
    assert [name for _, name, _ in delegate.claimed] == ["SOFTMAX"]


def test_sum_int8_is_litert_default_kernel():
    """int8 SUM on XLA is kiln's kernel (`xp_quantized_sum` on jax.numpy), which is LiteRT's
    optimized kernel (BUILTIN_REF's is wrong for negative codes): random shapes, axes
    (negative, repeated), keep_dims and parameters (tests/quant/test_sum.py's cases). An empty
    axes constant has no buffer in the file, so XLA cannot see its value and leaves the node
    to the reference kernel (its reason checked)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    from tests.quant.test_sum import _case

    for seed in range(40):
        model, feeds = _case(seed)
        delegate = XlaDelegate()
        ours = kiln.Interpreter(model_content=model, experimental_delegates=[delegate], **REF)
        got = run_api(ours, feeds)[0]
        if kiln.read_model(model).main.operators[0].inputs[1].shape == (0,):
            assert "only known at run time" in next(iter(delegate.rejected.values()))
        else:
            assert [name for _, name, _ in delegate.claimed] == ["SUM"], delegate.rejected
        want = run_api(Interpreter(model_content=model,
                                   experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES),
                       feeds)[0]
        np.testing.assert_array_equal(got, want, err_msg=f"seed {seed}")
