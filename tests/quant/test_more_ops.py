"""int8 PRELU, L2_NORMALIZATION, SQRT, ELU, RESIZE_BILINEAR, SPACE_TO_BATCH_ND /
BATCH_TO_SPACE_ND and uint8 FULLY_CONNECTED / CONV_2D / DEPTHWISE_CONV_2D.

Kernels: parameter sweeps on one-op models, kiln's Interpreter against LiteRT's reference
kernels (BUILTIN_REF; ELU, which BUILTIN_REF lacks, against the builtin kernel without
delegates), bit for bit. Quantizer: on tiny Keras models, kiln's int8 model against TF
2.21's (parameters, versions), LiteRT's error on it no worse than on TF's, and kiln's runtime
bit-exact with BUILTIN_REF on both."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import kiln
from kiln.errors import OpError
from kiln.kernels.windows import window_geometry
from kiln.schema import Activation, Padding
from tests.harness import run_api
from tests.quant.test_dispatch import Const, In, codes, one_op, qp, reference

RNG = np.random.default_rng(11)
NONE, RELU, RELU6 = Activation.NONE, Activation.RELU, Activation.RELU6


def same(op_type, operands, outputs, options=None, *, ref=reference) -> np.ndarray:
    """kiln's Interpreter and the LiteRT reference on one one-op model: identical outputs."""
    model, feeds = one_op(op_type, operands, outputs, options)
    want = ref(model, feeds)
    got = run_api(kiln.Interpreter(model_content=model), feeds)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w, err_msg=f"{op_type} {options}")
    return got[0]


def builtin(model: bytes, feeds) -> list[np.ndarray]:
    """LiteRT's builtin kernels without XNNPACK (for ops BUILTIN_REF does not register)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    kind = OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    return run_api(Interpreter(model_content=model, experimental_op_resolver_type=kind), feeds)


def scale(low=0.002, high=0.1) -> float:
    return float(np.exp(RNG.uniform(np.log(low), np.log(high))))


# --- kernels: int8 ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("alpha_shape", [(1, 1, 5), (4, 3, 5), (5,), (1, 4, 3, 5)])
def test_prelu_kernel(dtype, alpha_shape):
    info = np.iinfo(dtype)
    for _ in range(6):
        mid = (int(info.min) + int(info.max) + 1) // 2
        x_q = qp(scale(), int(RNG.integers(mid - 60, mid + 60)))
        a_q = qp(scale(0.001, 0.05), 0 if dtype == np.int8 else int(RNG.integers(100, 156)))
        y_q = qp(scale(), int(RNG.integers(mid - 60, mid + 60)))
        same("PRELU", [In(codes(2, 4, 3, 5, dtype=dtype), x_q), Const(codes(*alpha_shape, dtype=dtype), a_q)],
             [(dtype, (2, 4, 3, 5), y_q)])


@pytest.mark.parametrize("depth", [1, 3, 16, 200])
def test_l2_normalization_kernel(depth):
    for zp in (-128, -3, 0, 40, 127):
        x = codes(5, depth)
        x[0] = zp                                   # a row of zeros: LiteRT's input <= 1 case
        same("L2_NORMALIZATION", [In(x, qp(scale(), zp))], [(np.int8, (5, depth), qp(1 / 128, 0))])
    small = codes(3, 2, depth, low=-2, high=2)      # tiny sums of squares
    same("L2_NORMALIZATION", [In(small, qp(0.05, 0))], [(np.int8, small.shape, qp(1 / 128, 0))])


def test_l2_normalization_kernel_large_sums():
    """Sums of squares past 2^29, where LiteRT's inverse square root first divides by 4."""
    x = codes(3, 40000)
    same("L2_NORMALIZATION", [In(x, qp(0.01, -128))], [(np.int8, x.shape, qp(1 / 128, 0))])


def test_l2_normalization_refuses_other_output_params():
    model, feeds = one_op("L2_NORMALIZATION", [In(codes(2, 4), qp(0.1, 0))], [(np.int8, (2, 4), qp(0.01, 0))])
    with pytest.raises(OpError, match="1/128"):
        run_api(kiln.Interpreter(model_content=model), feeds)


def test_sqrt_kernel():
    for _ in range(40):
        zp = int(RNG.integers(-128, 0))
        x = codes(4, 64, low=zp)
        same("SQRT", [In(x, qp(scale(0.001, 1.0), zp))], [(np.int8, x.shape, qp(scale(0.001, 0.2), int(RNG.integers(-128, 20))))])


def test_sqrt_refuses_negative_inputs_as_litert():
    model, feeds = one_op("SQRT", [In(np.array([[-5, 3]], np.int8), qp(0.1, 0))], [(np.int8, (1, 2), qp(0.1, 0))])
    with pytest.raises(Exception, match="non-negative"):
        reference(model, feeds)
    with pytest.raises(OpError, match="non-negative"):
        run_api(kiln.Interpreter(model_content=model), feeds)


def test_elu_kernel():
    levels = np.arange(-128, 128, dtype=np.int8).reshape(2, 128)
    for _ in range(40):
        x_q = qp(scale(0.001, 0.2), int(RNG.integers(-128, 128)))
        y_q = qp(scale(0.001, 0.2), int(RNG.integers(-128, 128)))
        same("ELU", [In(levels, x_q)], [(np.int8, levels.shape, y_q)], ref=builtin)


@pytest.mark.parametrize("align_corners,half_pixel", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("out_hw", [(7, 9), (2, 3), (1, 1), (8, 10), (13, 4)])
def test_resize_bilinear_kernel(align_corners, half_pixel, out_hw):
    x = codes(2, 4, 5, 3)
    q = qp(0.02, -7)
    same("RESIZE_BILINEAR", [In(x, q), Const(np.array(out_hw, np.int32))], [(np.int8, (2, *out_hw, 3), q)],
         dict(align_corners=align_corners, half_pixel_centers=half_pixel))


def test_space_batch_kernels_pad_with_the_zero_point():
    x, q = codes(1, 4, 5, 3), qp(0.03, 17)
    block, pads = np.array([2, 2], np.int32), np.array([[0, 2], [1, 2]], np.int32)
    y = same("SPACE_TO_BATCH_ND", [In(x, q), Const(block), Const(pads)], [(np.int8, (4, 3, 4, 3), q)])
    assert np.any(y == 17)
    same("BATCH_TO_SPACE_ND", [In(codes(4, 3, 4, 3), q), Const(block), Const(pads)], [(np.int8, (1, 4, 5, 3), q)])


def test_prelu_16x8_kernel():
    """int16 input and output with an int8 alpha (what LiteRT's int16 PRELU reads)."""
    for _ in range(6):
        x_q, a_q, y_q = qp(scale(1e-5, 1e-3)), qp(scale(0.001, 0.05)), qp(scale(1e-5, 1e-3))
        same("PRELU", [In(codes(2, 4, 3, 5, dtype=np.int16), x_q), Const(codes(1, 1, 5), a_q)],
             [(np.int16, (2, 4, 3, 5), y_q)])


# --- kernels: uint8 weighted ops (TF1 quantization-aware models) ---------------------------------

def _uint8_bias(x_q, w_q, channels):
    return Const(RNG.integers(-4000, 4000, channels).astype(np.int32), qp(np.float32(x_q.scale[0]) * w_q.scale[0]))


@pytest.mark.parametrize("keep_num_dims", [False, True])
@pytest.mark.parametrize("act", [NONE, RELU, RELU6])
def test_fully_connected_uint8(keep_num_dims, act):
    for _ in range(8):
        x, w = codes(2, 3, 24, dtype=np.uint8), codes(7, 24, dtype=np.uint8)
        x_q, w_q = qp(scale(0.005, 0.05), int(RNG.integers(0, 256))), qp(scale(0.002, 0.02), int(RNG.integers(90, 170)))
        y_q = qp(scale(0.02, 0.3), int(RNG.integers(0, 256)))
        shape = (2, 3, 7) if keep_num_dims else (6, 7)
        same("FULLY_CONNECTED", [In(x, x_q), Const(w, w_q), _uint8_bias(x_q, w_q, 7)], [(np.uint8, shape, y_q)],
             dict(fused_activation_function=act, keep_num_dims=keep_num_dims))


@pytest.mark.parametrize("padding,stride,dilation", [(Padding.SAME, 1, 1), (Padding.VALID, 2, 1),
                                                     (Padding.SAME, 2, 1), (Padding.VALID, 1, 2)])
@pytest.mark.parametrize("act", [NONE, RELU6])
def test_conv_2d_uint8(padding, stride, dilation, act):
    for _ in range(3):
        x, w = codes(2, 9, 8, 4, dtype=np.uint8), codes(6, 3, 3, 4, dtype=np.uint8)
        x_q, w_q = qp(scale(0.005, 0.05), int(RNG.integers(0, 256))), qp(scale(0.002, 0.02), int(RNG.integers(90, 170)))
        y_q = qp(scale(0.05, 0.5), int(RNG.integers(0, 256)))
        opts = dict(padding=padding, stride_h=stride, stride_w=stride, dilation_h_factor=dilation,
                    dilation_w_factor=dilation, fused_activation_function=act)
        hw, _ = window_geometry(SimpleNamespace(**opts), (9, 8), (3, 3), (dilation, dilation))
        same("CONV_2D", [In(x, x_q), Const(w, w_q), _uint8_bias(x_q, w_q, 6)], [(np.uint8, (2, *hw, 6), y_q)], opts)


@pytest.mark.parametrize("padding,stride,multiplier", [(Padding.SAME, 1, 1), (Padding.VALID, 2, 2),
                                                       (Padding.SAME, 2, 3)])
@pytest.mark.parametrize("act", [NONE, RELU])
def test_depthwise_conv_2d_uint8(padding, stride, multiplier, act):
    for _ in range(3):
        c = 4
        x, w = codes(1, 8, 9, c, dtype=np.uint8), codes(1, 3, 3, c * multiplier, dtype=np.uint8)
        x_q, w_q = qp(scale(0.005, 0.05), int(RNG.integers(0, 256))), qp(scale(0.002, 0.02), int(RNG.integers(90, 170)))
        y_q = qp(scale(0.02, 0.2), int(RNG.integers(0, 256)))
        opts = dict(padding=padding, stride_h=stride, stride_w=stride, depth_multiplier=multiplier,
                    fused_activation_function=act)
        hw, _ = window_geometry(SimpleNamespace(dilation_h_factor=1, dilation_w_factor=1, **opts), (8, 9), (3, 3),
                                (1, 1))
        same("DEPTHWISE_CONV_2D", [In(x, x_q), Const(w, w_q), _uint8_bias(x_q, w_q, c * multiplier)],
             [(np.uint8, (1, *hw, c * multiplier), y_q)], opts)


# --- the quantizer: kiln's int8 models against TF 2.21's -----------------------------------------

def _keras(name: str):
    """A tiny Keras model ending in the op under test, and its input shape."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(3)
    L = keras.layers

    def conv_then(shape, fn):
        x = keras.Input(shape)
        return keras.Model(x, fn(L.Conv2D(shape[-1], 1)(x))), shape

    def dense_then(fn):
        x = keras.Input((8,))
        return keras.Model(x, fn(L.Dense(8)(x))), (8,)

    if name == "prelu":
        model, shape = conv_then((4, 4, 3), L.PReLU(shared_axes=[1, 2]))
        model.layers[-1].set_weights([np.array([[[0.2, -0.5, 1.5]]], np.float32)])
        return model, shape
    if name == "prelu_full":
        model, shape = conv_then((4, 4, 3), L.PReLU())
        model.layers[-1].set_weights([np.random.default_rng(1).uniform(-1, 2, (4, 4, 3)).astype(np.float32)])
        return model, shape
    if name == "l2_normalization":
        return dense_then(L.Lambda(lambda t: tf.math.l2_normalize(t, axis=-1)))
    if name == "sqrt":
        return dense_then(L.Lambda(lambda t: tf.sqrt(tf.abs(t))))
    if name == "elu":   # a Dense after ELU: both converters quantize its output there
        return dense_then(lambda t: L.Dense(8)(L.Activation("elu")(t)))
    if name == "resize_bilinear":
        return conv_then((4, 5, 3), L.Lambda(lambda t: tf.image.resize(t, (7, 9), method="bilinear")))
    if name == "resize_bilinear_align_corners":
        return conv_then((4, 5, 3), L.Lambda(
            lambda t: tf.compat.v1.image.resize_bilinear(t, (7, 9), align_corners=True)))
    if name == "space_batch":
        return conv_then((4, 6, 3), L.Lambda(lambda t: tf.batch_to_space(
            tf.space_to_batch_nd(t, [2, 2], [[0, 0], [1, 1]]) * 2.0, [2, 2], [[0, 0], [1, 1]])))
    raise KeyError(name)


OPS = {"prelu": "PRELU", "prelu_full": "PRELU", "l2_normalization": "L2_NORMALIZATION", "sqrt": "SQRT",
       "elu": "ELU", "resize_bilinear": "RESIZE_BILINEAR", "resize_bilinear_align_corners": "RESIZE_BILINEAR",
       "space_batch": "SPACE_TO_BATCH_ND"}


@functools.lru_cache(maxsize=None)
def _models(name: str):
    """(float model, TF's int8 model, kiln's int8 model, kiln's integer-only model, test inputs)."""
    tf = pytest.importorskip("tensorflow")
    from kiln.quant import quantize

    model, shape = _keras(name)
    rng = np.random.default_rng(0)
    data = [rng.uniform(-1, 1, (1, *shape)).astype(np.float32) for _ in range(16)]
    dataset = lambda: ([d] for d in data)   # noqa: E731
    float_model = tf.lite.TFLiteConverter.from_keras_model(model).convert()
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = dataset
    tf_model = conv.convert()
    ours = quantize(float_model, "int8", representative_dataset=dataset, progress=False)
    integer_only = quantize(float_model, "int8", representative_dataset=dataset, integer_only=True,
                            inference_input_type="int8", inference_output_type="int8", progress=False)
    tests = [rng.uniform(-1, 1, (1, *shape)).astype(np.float32) for _ in range(6)]
    return float_model, tf_model, ours, integer_only, tests


def _ops(model: bytes):
    return [(op.op_type, op.version, op.outputs[0].dtype.name) for op in kiln.read_model(model).main.operators]


def _litert(model: bytes, x: np.ndarray, kind: str = "BUILTIN_REF") -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    interp = Interpreter(model_content=model, experimental_op_resolver_type=getattr(OpResolverType, kind))
    return run_api(interp, [x])[0]


def _kind(model: bytes) -> str:
    """BUILTIN_REF, or the builtin kernels where BUILTIN_REF lacks an op (ELU)."""
    return "BUILTIN_WITHOUT_DEFAULT_DELEGATES" if any(op == "ELU" for op, _, _ in _ops(model)) else "BUILTIN_REF"


@pytest.mark.parametrize("name", sorted(OPS))
def test_params_and_versions_match_tf(name):
    _, tf_model, ours, _, _ = _models(name)
    mine, theirs = _ops(ours), _ops(tf_model)
    if name == "elu":
        # TF 2.21 keeps ELU float between DEQUANTIZE and QUANTIZE (also integer-only); kiln
        # runs LiteRT's int8 ELU (version 1: op_version.cc has no int8 ELU version).
        assert ("ELU", 1, "FLOAT32") in theirs and ("ELU", 1, "INT8") in mine
        return
    assert mine == theirs
    a = kiln.read_model(ours).main.operators
    b = kiln.read_model(tf_model).main.operators
    for u_op, v_op in zip(a, b):
        for u, v in zip(list(u_op.inputs) + list(u_op.outputs), list(v_op.inputs) + list(v_op.outputs)):
            if u is None or u.quantization is None or u.quantization.scale.size == 0:
                assert v is None or v.quantization is None or v.quantization.scale.size == 0
                continue
            # calibration ranges from float kernels an ulp apart: scales to float32 precision
            np.testing.assert_allclose(u.quantization.scale, v.quantization.scale, rtol=3e-7)
            np.testing.assert_array_equal(u.quantization.zero_point, v.quantization.zero_point)
            if u.is_constant and u.dtype.name == "INT8":
                np.testing.assert_array_equal(u.data, v.data)   # PRELU's alpha, the weights


@pytest.mark.parametrize("name", sorted(OPS))
def test_litert_error_no_worse_than_tf(name):
    float_model, tf_model, ours, _, tests = _models(name)
    want = [_litert(float_model, x, _kind(float_model)) for x in tests]
    mine = np.mean([np.abs(_litert(ours, x, _kind(ours)) - w).mean() for x, w in zip(tests, want)])
    theirs = np.mean([np.abs(_litert(tf_model, x, _kind(tf_model)) - w).mean() for x, w in zip(tests, want)])
    assert mine <= theirs * 1.05 + 1e-6, (mine, theirs)


@pytest.mark.parametrize("name", sorted(OPS))
def test_kiln_runtime_bit_exact_on_both_models(name):
    _, tf_model, ours, integer_only, tests = _models(name)
    q = kiln.read_model(integer_only).main.inputs[0].quantization
    assert OPS[name] in [op for op, _, dtype in _ops(integer_only) if dtype == "INT8"]
    for model, feeds in ((tf_model, tests), (ours, tests),
                         (integer_only, [np.clip(np.round(x / q.scale[0]) + q.zero_point[0], -128, 127)
                                         .astype(np.int8) for x in tests])):
        for x in feeds:
            got, want = run_api(kiln.Interpreter(model_content=model), [x])[0], _litert(model, x, _kind(model))
            if got.dtype == np.float32 and _kind(model) != "BUILTIN_REF":
                # LiteRT's optimized float DEQUANTIZE (and float ELU) round the last bit
                # differently from its reference ones; the integer codes are checked exactly
                # on the integer-only model.
                np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
            else:
                np.testing.assert_array_equal(got, want)


def test_tf1_quantization_aware_uint8_model(tmp_path):
    """A uint8 model from TF's legacy quantization-aware path runs bit-exact in kiln."""
    import subprocess
    import sys

    pytest.importorskip("tensorflow")
    path = tmp_path / "uint8.tflite"
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-m", "tests.quant.uint8_qat_model", str(path)], check=True, cwd=root,
                   env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, timeout=300)
    model = path.read_bytes()
    assert [(op, dtype) for op, _, dtype in _ops(model)] == [
        ("CONV_2D", "UINT8"), ("DEPTHWISE_CONV_2D", "UINT8"), ("RESHAPE", "UINT8"), ("FULLY_CONNECTED", "UINT8")]
    for seed in range(6):
        x = np.random.default_rng(seed).integers(0, 256, (1, 8, 8, 3)).astype(np.uint8)
        np.testing.assert_array_equal(run_api(kiln.Interpreter(model_content=model), [x])[0], _litert(model, x))
