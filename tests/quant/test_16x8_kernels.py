"""kiln's 16x8 kernels that LiteRT computes with fixed tables or shifts (LOGISTIC, TANH, ...),
run by kiln's Interpreter on one-op models against BUILTIN_REF over every int16 input code."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.kernels import activations as act
from tests.quant.test_dispatch import Const, In, check, one_op, qp, reference

EVERY_INT16 = np.arange(-32768, 32768, dtype=np.int16).reshape(256, 256)
EVERY_INT8 = np.arange(-128, 128, dtype=np.int8).reshape(16, 16)
Q15 = qp(1 / 32768)

#: Input scales: the two power-of-two paths (2^-12, 2^-11), TF's 16x8 calibration scales
#: (max|x| / 32767 for |x| ≤ 4 and ≤ 9.5), non-power-of-two ones small and large, one that
#: saturates almost everywhere, one whose multiplier overflows int32 (10: LiteRT's product
#: wraps) and one past the 31 doublings (1e-9).
INT16_SCALES = [2.0 ** -12, 2.0 ** -11, 2.0 ** -10, 4.0 / 32767, 9.5 / 32767, 0.000123, 3.1e-6, 0.0021, 10.0, 1e-9]


@pytest.mark.parametrize("op_type", ["LOGISTIC", "TANH"])
@pytest.mark.parametrize("x_scale", INT16_SCALES)
def test_logistic_tanh_16x8_every_input(op_type, x_scale):
    y = check(op_type, [In(EVERY_INT16, qp(x_scale))], [(np.int16, EVERY_INT16.shape, Q15)])
    real = EVERY_INT16.astype(np.float64) * np.float32(x_scale)
    with np.errstate(over="ignore"):
        want = 1 / (1 + np.exp(-real)) if op_type == "LOGISTIC" else np.tanh(real)
    if x_scale * 12288 * 32768 < 2 ** 31:   # else LiteRT's int32 product wraps: its bits, not the function
        assert np.abs(y / 32768 - want).max() < 2e-4     # the table's accuracy, not only LiteRT's bits


def test_sigmoid_table_is_litert_s():
    """kiln's copy of LiteRT's sigmoid table, entry by entry, read back through LiteRT's TANH:
    where the input on the table's scale is a multiple of 256 (no interpolation) the output
    is entry − 32768 (entry 32768 − output below zero). Scale 2^-12 (3·x) and six scales
    whose multiplier is 16385..16400 with shift 13 (≈ 2·x) reach 239 of the 255 entries read
    as a lower end; the exhaustive tests above use every entry."""
    seen = {}
    x = EVERY_INT16.astype(np.int64).reshape(-1)
    for scale in [2.0 ** -12] + [m / (12288 * 8192) for m in (16385.5, 16388.5, 16391.5, 16394.5, 16397.5, 16400.5)]:
        model, feeds = one_op("TANH", [In(EVERY_INT16, qp(scale))], [(np.int16, EVERY_INT16.shape, Q15)])
        out = reference(model, feeds)[0].astype(np.int64).reshape(-1)
        multiplier, shift = act._int16_lut_params(qp(scale), Q15, "TANH", (0, 1), False)
        data = act._int16_table_input(x, multiplier, shift)
        exact = (data % 256 == 0) & ((np.abs(data) >> 8) < 255)
        for d, y in zip(data[exact], out[exact]):
            seen[int(abs(d) >> 8)] = int(y) + 32768 if d >= 0 else 32768 - int(y)
    assert len(seen) >= 239
    for k, v in seen.items():
        assert act.SIGMOID_TABLE_U16[k] == v, k


@pytest.mark.parametrize("op_type,y_q", [("LOGISTIC", qp(1 / 256, -128)), ("TANH", qp(1 / 128))])
@pytest.mark.parametrize("x_q", [qp(0.05, 3), qp(0.0123, -20), qp(0.17, 0)])
def test_logistic_tanh_int8_every_input(op_type, y_q, x_q):
    check(op_type, [In(EVERY_INT8, x_q)], [(np.int8, EVERY_INT8.shape, y_q)])


@pytest.mark.parametrize("op_type", ["LOGISTIC", "TANH"])
def test_16x8_refusals_match_litert(op_type):
    """Zero points other than 0 and an output scale other than 1/32768 are refused by both."""
    for x_q, y_q in [(qp(0.001, 3), Q15), (qp(0.001), qp(1 / 16384))]:
        model, feeds = one_op(op_type, [In(EVERY_INT16[:2], x_q)], [(np.int16, (2, 256), y_q)])
        with pytest.raises(Exception):
            reference(model, feeds)
        with pytest.raises(kiln.KilnError, match=op_type):
            interp = kiln.Interpreter(model_content=model)
            interp.allocate_tensors()
            interp.set_tensor(interp.get_input_details()[0]["index"], feeds[0])
            interp.invoke()


@pytest.mark.parametrize("op_type,options", [("RELU", None), ("RELU6", None), ("LEAKY_RELU", dict(alpha=0.2)),
                                             ("LEAKY_RELU", dict(alpha=1.7))])
@pytest.mark.parametrize("x_scale,y_scale", [(0.0004, 0.0003), (6.0 / 32767, 6.0 / 32767), (0.00021, 0.0009)])
def test_relu_family_16x8_every_input(op_type, options, x_scale, y_scale):
    check(op_type, [In(EVERY_INT16, qp(x_scale))], [(np.int16, EVERY_INT16.shape, qp(y_scale))], options)


POSITIVE_INT16 = np.arange(0, 32768, dtype=np.int16).reshape(128, 256)


@pytest.mark.parametrize("op_type,x,x_scale,y_scale,options", [
    ("EXP", EVERY_INT16, 3.0 / 32767, 20.0 / 32767, None),
    ("EXP", EVERY_INT16, 0.00017, 0.0004, None),
    ("EXP", EVERY_INT16, 2.0 ** -12, 2.0 ** -9, None),
    ("LOG", EVERY_INT16, 0.001, 7.0 / 32767, None),
    ("LOG", EVERY_INT16, 3.3e-5, 0.0003, None),
    ("RSQRT", POSITIVE_INT16, 0.001, 32.0 / 32767, None),
    ("RSQRT", POSITIVE_INT16, 2.0 ** -10, 0.0005, None),
    ("GELU", EVERY_INT16, 6.0 / 32767, 6.0 / 32767, dict(approximate=False)),
    ("GELU", EVERY_INT16, 0.00041, 0.00029, dict(approximate=True)),
    ("GELU", EVERY_INT16, 3.0 / 32767, 3.0 / 32767, dict(approximate=False)),
    ("GELU", EVERY_INT16, 6.0 / 32767, 6.0 / 32767, dict(approximate=True)),
    ("ABS", EVERY_INT16, 0.0005, 0.0005, None),
    ("ABS", EVERY_INT16, 0.0005, 0.0003, None),
    ("SQRT", POSITIVE_INT16, 0.0002, 1.0 / 32767, None),
    ("SQRT", POSITIVE_INT16, 0.01, 0.0007, None),
])
def test_elementwise_16x8_every_input(op_type, x, x_scale, y_scale, options):
    check(op_type, [In(x, qp(x_scale))], [(np.int16, x.shape, qp(y_scale))], options)


def test_rsqrt_and_sqrt_refuse_negative_inputs_as_litert():
    for op_type in ("RSQRT", "SQRT"):
        model, feeds = one_op(op_type, [In(EVERY_INT16[:1], qp(0.001))], [(np.int16, (1, 256), qp(0.001))])
        with pytest.raises(Exception, match="only defined for"):
            reference(model, feeds)
        with pytest.raises(kiln.KilnError, match="defined for"):
            interp = kiln.Interpreter(model_content=model)
            interp.allocate_tensors()
            interp.set_tensor(interp.get_input_details()[0]["index"], feeds[0])
            interp.invoke()


@pytest.mark.parametrize("adj_x,adj_y", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("rhs_dtype", [np.int16, np.int8])
def test_batch_matmul_16x8(adj_x, adj_y, rhs_dtype):
    """int16 x int16 and int16 x int8 (LiteRT's two 16x8 paths), broadcast batch, int16 out."""
    rng = np.random.default_rng(7)
    a = rng.integers(-32768, 32768, (2, 1, 5, 33) if not adj_x else (2, 1, 33, 5)).astype(np.int16)
    info = np.iinfo(rhs_dtype)
    b = rng.integers(info.min + 1, info.max + 1, (3, 33, 4) if not adj_y else (3, 4, 33)).astype(rhs_dtype)
    b_scale = 0.0002 if rhs_dtype == np.int16 else 0.03
    check("BATCH_MATMUL", [In(a, qp(0.0003)), In(b, qp(b_scale))], [(np.int16, (2, 3, 5, 4), qp(0.5))],
          dict(adj_x=adj_x, adj_y=adj_y))


@pytest.mark.parametrize("x_dtype", [np.int8, np.int16])
@pytest.mark.parametrize("alpha_shape", [(1, 1, 8), (4, 4, 8)])
def test_prelu_int8_and_16x8(x_dtype, alpha_shape):
    """int8 alpha for both input types (LiteRT reads it as int8), broadcast and elementwise."""
    rng = np.random.default_rng(11)
    info = np.iinfo(x_dtype)
    x = rng.integers(info.min, info.max + 1, (1, 4, 4, 8)).astype(x_dtype)
    alpha = rng.integers(-128, 128, alpha_shape).astype(np.int8)
    x_q, y_q = (qp(0.02, 5), qp(0.03, -3)) if x_dtype == np.int8 else (qp(0.0004), qp(0.0006))
    check("PRELU", [In(x, x_q), Const(alpha, qp(0.004, 7))], [(x_dtype, x.shape, y_q)])


@pytest.mark.parametrize("dtype", [np.int8, np.int16])
@pytest.mark.parametrize("out_hw,options", [((9, 7), {}), ((4, 3), {}), ((9, 7), dict(align_corners=True)),
                                            ((11, 13), dict(half_pixel_centers=True)),
                                            ((3, 2), dict(half_pixel_centers=True))])
def test_resize_bilinear_int8_and_16x8(dtype, out_hw, options):
    rng = np.random.default_rng(13)
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max + 1, (2, 5, 6, 3)).astype(dtype)
    q = qp(0.01, -7) if dtype == np.int8 else qp(0.0003)
    check("RESIZE_BILINEAR", [In(x, q), Const(np.array(out_hw, np.int32))], [(dtype, (2, *out_hw, 3), q)], options)
