"""CONV_3D and CONV_3D_TRANSPOSE against LiteRT (default and builtin-only), plus the Keras
Conv3D / Conv3DTranspose conversion end to end."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import ops
from kiln.errors import OpError
from kiln.ir import Model, QuantParams
from kiln.ops.record import KernelCall
from kiln.schema import Activation, DType, Padding
from tests.harness import Const, check_op, run_litert, single_op_model

F32 = np.float32
SAME, VALID = Padding.SAME, Padding.VALID


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(F32)


def opts(padding=SAME, stride=(1, 1, 1), dilation=(1, 1, 1), act=Activation.NONE):
    return dict(padding=padding, stride_d=stride[0], stride_h=stride[1], stride_w=stride[2],
                dilation_d_factor=dilation[0], dilation_h_factor=dilation[1],
                dilation_w_factor=dilation[2], fused_activation_function=act)


def run_kernel(name, arrays, options=None, quant=None):
    """Call a record's kernel directly on an IR operator built for ``arrays``."""
    sg = Model().add_subgraph("t")
    tensors = []
    for i, a in enumerate(arrays):
        if a is None:
            tensors.append(None)
            continue
        a = np.asarray(a)
        tensors.append(sg.add_tensor(f"t{i}", DType.from_numpy(a.dtype), a.shape,
                                     quantization=(quant or {}).get(i)))
    out = sg.add_tensor("out", DType.FLOAT32, ())
    op = sg.add_operator(name, tensors, [out], options=dict(options or {}))
    record = ops.require(name)
    return record.kernel(KernelCall(record.make_options(options), op, [np.dtype(F32)]), *arrays)


# -- CONV_3D ---------------------------------------------------------------------------------------

CONV_CASES = [
    # (input N, D, H, W, Cin), (KD, KH, KW, Cout), stride, dilation
    ((1, 4, 5, 6, 2), (3, 3, 3, 4), (1, 1, 1), (1, 1, 1)),
    ((2, 5, 6, 7, 3), (3, 2, 3, 4), (2, 1, 2), (1, 2, 1)),
    ((1, 7, 6, 5, 1), (2, 2, 2, 3), (2, 2, 2), (1, 1, 1)),
    ((2, 6, 5, 8, 3), (1, 1, 1, 5), (1, 1, 1), (1, 1, 1)),   # pointwise
    ((1, 6, 5, 8, 2), (1, 1, 1, 3), (2, 3, 2), (1, 1, 1)),   # strided pointwise
    ((1, 9, 7, 8, 2), (2, 3, 2, 2), (1, 2, 3), (3, 1, 2)),
    ((1, 3, 3, 3, 4), (3, 3, 3, 2), (1, 1, 1), (1, 1, 1)),   # filter as large as the input
]


@pytest.mark.parametrize("padding", [SAME, VALID])
@pytest.mark.parametrize("x_shape,w_dims,stride,dilation", CONV_CASES)
def test_conv3d(x_shape, w_dims, stride, dilation, padding):
    kd, kh, kw, cout = w_dims
    x = rand(*x_shape)
    w = rand(kd, kh, kw, x_shape[4], cout, seed=1)
    b = rand(cout, seed=2)
    check_op("CONV_3D", [x, Const(w), Const(b)], options=opts(padding, stride, dilation),
             rtol=1e-5)


@pytest.mark.parametrize("act", list(Activation))
def test_conv3d_fused_activations(act):
    """LiteRT clamps for RELU-like activations and ignores TANH / SIGN_BIT; so does kiln."""
    x, w, b = rand(1, 4, 4, 5, 2), rand(2, 3, 2, 2, 3, seed=1), rand(3, seed=2)
    check_op("CONV_3D", [x, Const(w), Const(b)], options=opts(SAME, act=act),
             builtin_kernels=True)


@pytest.mark.parametrize("bias", ["omitted", "absent", "given"])
@pytest.mark.parametrize("builtin", [False, True])
def test_conv3d_bias_forms(bias, builtin):
    """The converter writes the bias as an omitted operand (-1); two inputs are legal too."""
    x, w = rand(2, 4, 5, 3, 2), rand(2, 2, 2, 2, 3, seed=1)
    extra = {"omitted": [None], "absent": [], "given": [Const(rand(3, seed=2))]}[bias]
    check_op("CONV_3D", [x, Const(w), *extra], options=opts(VALID, (1, 2, 1)),
             builtin_kernels=builtin)


def test_conv3d_in_depth_chunks(monkeypatch):
    """Large convolutions build their im2col matrix a few output depth slices at a time."""
    from kiln.ops import conv3d

    monkeypatch.setattr(conv3d, "_IM2COL_BUDGET", 200)
    x, w = rand(2, 7, 5, 4, 3), rand(3, 2, 2, 3, 4, seed=1)
    check_op("CONV_3D", [x, Const(w)], options=opts(SAME, (1, 2, 1), (2, 1, 1)))


def test_conv3d_runtime_filter_and_bias():
    x, w, b = rand(1, 5, 4, 4, 2), rand(3, 3, 3, 2, 2, seed=1), rand(2, seed=2)
    check_op("CONV_3D", [x, w, b], options=opts(SAME, (2, 1, 1)))


def test_conv3d_infinities_clamp_to_float_max():
    x = rand(1, 3, 3, 3, 1)
    x[0, 1, 1, 1, 0] = np.inf
    w = np.ones((1, 1, 1, 1, 1), F32)
    out = check_op("CONV_3D", [x, Const(w)], options=opts(VALID), builtin_kernels=True)[0]
    assert out[0, 1, 1, 1, 0] == np.finfo(F32).max


@pytest.mark.parametrize("arrays,options,match", [
    ([rand(1, 4, 4, 4, 3), rand(2, 2, 2, 2, 4)], {}, "input channels"),
    ([rand(1, 4, 4, 3), rand(2, 2, 3, 4)], {}, "must be 5-D"),
    ([rand(1, 4, 4, 4, 2), rand(2, 2, 2, 2, 3), rand(4)], {}, "bias has 4 elements"),
    ([rand(1, 2, 4, 4, 2), rand(4, 2, 2, 2, 3)], {"padding": VALID}, "does not fit"),
    ([rand(1, 4, 4, 4, 2), rand(2, 2, 2, 2, 3)], {"stride_d": 0}, "must be positive"),
    ([np.zeros((1, 4, 4, 4, 2), np.int32), rand(2, 2, 2, 2, 3)], {}, "float32 only"),
])
def test_conv3d_errors(arrays, options, match):
    base = opts(SAME)
    base.update(options)
    with pytest.raises(OpError, match=match):
        run_kernel("CONV_3D", arrays, base)


def test_conv3d_refuses_quantized_operands():
    x = np.zeros((1, 3, 3, 3, 2), np.int8)
    w = np.zeros((1, 1, 1, 2, 2), np.int8)
    q = QuantParams(scale=[0.5], zero_point=[0])
    with pytest.raises(OpError, match="quantized kernel not implemented yet"):
        run_kernel("CONV_3D", [x, w], opts(SAME), quant={0: q, 1: q})


def test_records_version_and_options():
    for name in ("CONV_3D", "CONV_3D_TRANSPOSE"):
        record = ops.require(name)
        assert record.max_version == 1 and record.options.table == "Conv3DOptions"
        assert record.make_options().dilation_d_factor == 1
        assert record.make_options().padding == SAME
    assert ops.OPTIONS_BY_TABLE["Conv3DOptions"].defaults["stride_d"] == 0


# -- CONV_3D_TRANSPOSE -----------------------------------------------------------------------------

TCONV_CASES = [
    # input (N, D, H, W, Cin), filter (KD, KH, KW, Cout), stride, output spatial dims
    ((1, 3, 4, 3, 2), (3, 3, 3, 4), (2, 2, 2), {SAME: (6, 8, 6), VALID: (7, 9, 7)}),
    ((2, 3, 2, 4, 3), (2, 3, 2, 2), (1, 2, 2), {SAME: (3, 4, 8), VALID: (4, 5, 8)}),
    ((1, 4, 3, 3, 1), (1, 1, 1, 3), (1, 1, 1), {SAME: (4, 3, 3), VALID: (4, 3, 3)}),
    ((1, 2, 3, 2, 2), (2, 2, 3, 2), (3, 2, 1), {SAME: (6, 6, 2), VALID: (5, 6, 4)}),
    # SAME with an output smaller than input * stride (TF's output_shape picks it)
    ((1, 3, 4, 3, 2), (3, 3, 3, 3), (2, 2, 2), {SAME: (5, 7, 5), VALID: (8, 10, 8)}),
]


@pytest.mark.parametrize("builtin", [False, True])
@pytest.mark.parametrize("padding", [SAME, VALID])
@pytest.mark.parametrize("x_shape,w_dims,stride,outs", TCONV_CASES)
def test_conv3d_transpose(x_shape, w_dims, stride, outs, padding, builtin):
    kd, kh, kw, cout = w_dims
    x = rand(*x_shape)
    w = rand(kd, kh, kw, cout, x_shape[4], seed=1)
    shape = np.array([x_shape[0], *outs[padding], cout], np.int32)
    check_op("CONV_3D_TRANSPOSE", [Const(shape), Const(w), x, Const(rand(cout, seed=2))],
             options=opts(padding, stride), builtin_kernels=builtin)


@pytest.mark.parametrize("dilation", [(2, 1, 1), (1, 2, 3)])
@pytest.mark.parametrize("padding,stride,out_dims", [
    (SAME, (1, 1, 1), None), (VALID, (1, 1, 1), None), (SAME, (2, 2, 2), (5, 6, 8)),
])
def test_conv3d_transpose_dilated(dilation, padding, stride, out_dims):
    """Dilation runs LiteRT's reference kernel (its optimized one has none)."""
    x = rand(1, 3, 3, 4, 2)
    w = rand(2, 2, 2, 3, 2, seed=1)
    if out_dims is None:  # stride 1: SAME keeps the extents, VALID grows them by the window
        grow = 0 if padding == SAME else 1
        out_dims = tuple(i + grow * d for i, d in zip((3, 3, 4), dilation))
    shape = np.array([1, *out_dims, 3], np.int32)
    check_op("CONV_3D_TRANSPOSE", [Const(shape), Const(w), x],
             options=opts(padding, stride, dilation), builtin_kernels=True)


@pytest.mark.parametrize("act", list(Activation))
@pytest.mark.parametrize("bias", [None, "given"])
def test_conv3d_transpose_activation_and_bias(act, bias):
    x, w = rand(1, 2, 3, 2, 2), rand(2, 2, 2, 3, 2, seed=1)
    shape = Const(np.array([1, 4, 6, 4, 3], np.int32))
    extra = [Const(rand(3, seed=2))] if bias else []
    check_op("CONV_3D_TRANSPOSE", [shape, Const(w), x, *extra], options=opts(SAME, (2, 2, 2), act=act))


def test_conv3d_transpose_runtime_filter():
    x, w = rand(2, 2, 2, 2, 3), rand(3, 2, 2, 2, 3, seed=1)
    shape = Const(np.array([2, 4, 4, 4, 2], np.int32))
    check_op("CONV_3D_TRANSPOSE", [shape, w, x, None], options=opts(SAME, (2, 2, 2)))


def test_conv3d_transpose_is_adjoint_of_conv3d():
    """<conv(y), x> == <y, conv_transpose(x)> for the same filter and geometry."""
    rng = np.random.default_rng(3)
    y = rng.standard_normal((1, 5, 6, 7, 2)).astype(np.float64)
    w = rng.standard_normal((3, 2, 3, 2, 4)).astype(np.float64)
    o = opts(SAME, (2, 2, 3), (1, 2, 1))
    fwd = run_kernel("CONV_3D", [y, w], o)
    x = rng.standard_normal(fwd.shape)
    # The same [KD, KH, KW, Cin, Cout] filter: the transpose maps Cout back to Cin.
    back = run_kernel("CONV_3D_TRANSPOSE", [np.array(y.shape, np.int32), w, x], o)
    assert back.shape == y.shape
    np.testing.assert_allclose(np.vdot(fwd, x), np.vdot(y, back), rtol=1e-4)


@pytest.mark.parametrize("arrays,match", [
    ([np.array([1, 6, 6, 6, 3], np.int32), rand(2, 2, 2, 3, 2), rand(1, 3, 3, 3, 4)], "disagree"),
    ([np.array([1, 6, 6, 6, 4], np.int32), rand(2, 2, 2, 3, 2), rand(1, 3, 3, 3, 2)], "disagree"),
    ([np.array([2, 6, 6, 6, 3], np.int32), rand(2, 2, 2, 3, 2), rand(1, 3, 3, 3, 2)], "disagree"),
    ([np.array([1, 9, 6, 6, 3], np.int32), rand(2, 2, 2, 3, 2), rand(1, 3, 3, 3, 2)], "not the input"),
    ([np.array([1, 6, 6, 6], np.int32), rand(2, 2, 2, 3, 2), rand(1, 3, 3, 3, 2)], "vector of 5"),
    ([np.array([1, 6, 6, 6, 3], np.int64), rand(2, 2, 2, 3, 2), rand(1, 3, 3, 3, 2)], "int32"),
])
def test_conv3d_transpose_errors(arrays, match):
    with pytest.raises(OpError, match=match):
        run_kernel("CONV_3D_TRANSPOSE", arrays, opts(SAME, (2, 2, 2)))


def test_conv3d_transpose_litert_agrees_on_bad_output_shape():
    """LiteRT refuses an output_shape that does not invert the forward geometry, as kiln does."""
    shape = np.array([1, 9, 6, 6, 3], np.int32)
    x, w = rand(1, 3, 3, 3, 2), rand(2, 2, 2, 3, 2)
    model = single_op_model("CONV_3D_TRANSPOSE", [Const(shape), Const(w), x],
                            options=opts(SAME, (2, 2, 2)), out_dtypes=[F32],
                            out_shapes=[(1, 9, 6, 6, 3)])
    with pytest.raises(RuntimeError):
        run_litert(model, [x])


# -- the converter path ----------------------------------------------------------------------------

def test_keras_conv3d_end_to_end():
    """Keras Conv3D / Conv3DTranspose through kiln's converter: LiteRT and kiln agree with Keras."""
    keras = pytest.importorskip("keras")
    import kiln
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    layers = keras.layers
    x = keras.Input((5, 6, 7, 2))
    y = layers.Conv3D(4, 3, padding="same", strides=(1, 2, 1), activation="relu")(x)
    y = layers.Conv3D(3, (2, 3, 2))(y)
    y = layers.Conv3DTranspose(2, 3, strides=2, padding="same")(y)
    y = layers.Conv3DTranspose(2, (2, 3, 2), strides=(1, 2, 2), padding="valid")(y)
    model = keras.Model(x, y)
    rng = np.random.default_rng(0)
    for weight in model.weights:
        weight.assign(rng.uniform(-0.5, 0.5, tuple(weight.shape)).astype(F32))
    feed = rng.standard_normal((2, 5, 6, 7, 2)).astype(F32)
    expected = np.asarray(model(feed))

    data = kiln.TFLiteConverter.from_keras_model(model).convert()
    kinds = {op.name for _, _, op in kiln.read_model(data).operators()}
    assert {"CONV_3D", "CONV_3D_TRANSPOSE"} <= kinds
    name = model.inputs[0].name
    ours = next(iter(kiln.Interpreter(model_content=data).get_signature_runner()(**{name: feed}).values()))
    theirs = next(iter(LiteRT(model_content=data).get_signature_runner()(**{name: feed}).values()))
    scale = float(np.abs(expected).max())
    assert ours.shape == expected.shape
    np.testing.assert_allclose(ours, expected, atol=1e-5 * scale)
    np.testing.assert_allclose(theirs, ours, atol=1e-5 * scale)
