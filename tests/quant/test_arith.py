"""kiln.kernels.fixedpoint is bit-exact with LiteRT's reference integer kernels (BUILTIN_REF), which
requantize with a single rounding; the double-rounding variant (LiteRT's optimised kernels)
is not, on the same data."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.kernels import fixedpoint as arith

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")


def _int8_model(model, samples) -> bytes:
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = lambda: ([s] for s in samples)
    return conv.convert()


def _run_ref(model: bytes, x: np.ndarray):
    """Run in LiteRT's reference kernels, keeping every intermediate tensor."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    interp = Interpreter(model_content=model, experimental_preserve_all_tensors=True,
                         experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    inp = interp.get_input_details()[0]
    interp.resize_tensor_input(inp["index"], x.shape)
    interp.allocate_tensors()
    interp.set_tensor(inp["index"], x)
    interp.invoke()
    return interp


def _op(model: bytes, op_type: str):
    """The first ``op_type`` operator, and the LiteRT index of each tensor (by position)."""
    import kiln

    sg = kiln.read_model(model).subgraphs[0]
    index = {id(t): i for i, t in enumerate(sg.tensors)}
    return next(op for op in sg.operators if op.op_type == op_type), lambda t: index[id(t)]




@pytest.fixture(scope="module")
def fc_case():
    rng = np.random.default_rng(1)
    m = keras.Sequential([keras.Input((256,)), keras.layers.Dense(128)])
    m.layers[-1].kernel.assign(rng.normal(0, 0.1, (256, 128)).astype(np.float32))
    m.layers[-1].bias.assign(rng.normal(0, 0.2, 128).astype(np.float32))
    samples = [rng.normal(0, 1, (1, 256)).astype(np.float32) for _ in range(32)]
    model = _int8_model(m, samples)
    x = rng.normal(0, 1, (500, 256)).astype(np.float32)
    return model, _run_ref(model, x)


def _fc_accumulators(model, interp):
    op, index = _op(model, "FULLY_CONNECTED")
    x_t, w_t, b_t = op.inputs
    y_t = op.outputs[0]
    xq = interp.get_tensor(index(x_t)).astype(np.int64)
    acc = (xq - int(x_t.quantization.zero_point[0])) @ w_t.data.astype(np.int64).T + b_t.data
    multiplier = (np.float64(x_t.quantization.scale[0]) * w_t.quantization.scale.astype(np.float64)
                  / np.float64(y_t.quantization.scale[0]))
    return acc, multiplier, int(y_t.quantization.zero_point[0]), interp.get_tensor(index(y_t))


def test_int8_fully_connected_is_bit_exact_with_builtin_ref(fc_case):
    acc, multiplier, zp, expected = _fc_accumulators(*fc_case)
    got = arith.requantize(acc, multiplier, zp, -128, 127)
    assert expected.size == 64000
    np.testing.assert_array_equal(got, expected)


def test_double_rounding_differs_from_builtin_ref(fc_case):
    """The same data through two roundings: a few outputs are one LSB off (why kiln and its
    tests use BUILTIN_REF's single rounding)."""
    acc, multiplier, zp, expected = _fc_accumulators(*fc_case)
    m, s = arith.quantize_multipliers(multiplier)
    double = np.clip(arith.multiply_by_quantized_multiplier_double_rounding(acc, m, s) + zp, -128, 127)
    diff = np.abs(double.astype(np.int64) - expected)
    assert diff.max() == 1 and 0 < np.count_nonzero(diff) < 200


@pytest.mark.parametrize("m,expected", [
    (0.0, (0, 0)),
    (0.5, (1 << 30, 0)),
    (1.0, (1 << 30, 1)),
    (0.75, (3 << 29, 0)),
    (2.0 ** -40, (0, 0)),                   # shift below −31: flushed to zero
    (1 - 2.0 ** -40, (1 << 30, 1)),         # mantissa rounds up to 2^31: halved, shift + 1
])
def test_quantize_multiplier(m, expected):
    assert arith.quantize_multiplier(m) == expected


def test_quantize_multiplier_refuses_negative():
    with pytest.raises(ValueError):
        arith.quantize_multiplier(-0.5)


def test_rounding_primitives_match_gemmlowp():
    x = np.array([5, -5, 6, -6, 7, -7], np.int64)
    # RoundingDivideByPOT(x, 1): halves away from zero.
    np.testing.assert_array_equal(arith.rounding_divide_by_pot(x, 1), [3, -3, 3, -3, 4, -4])
    imin = arith.INT32_MIN
    assert arith.saturating_rounding_doubling_high_mul(imin, imin) == arith.INT32_MAX
    assert arith.saturating_rounding_doubling_high_mul(1 << 30, 1 << 30) == 1 << 29
