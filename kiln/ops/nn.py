"""Op family: neural-network layers (fully connected, convolutions, batch matmul).

The records. Their kernels are kernel families (kiln.kernels.dense, kiln.kernels.conv): per
number format — float, int8 / 16x8 / legacy uint8, hybrid (float input, int8 weights) — a
``prepare`` and a ``run`` over an array namespace, which the reference kernels, the NumPy
delegate and XLA all call (`record.family`). Convolutions go through im2col (one GEMM per
chunk of output rows), depthwise convolutions accumulate the filter taps in order over the
whole tensor, so no Python loop ever runs per pixel (pooling: kiln/ops/pool.py).
"""

from __future__ import annotations

import math

from ..kernels import conv, dense
from ..schema import Activation, DType, Padding
from .record import OpDef, OptionsSpec, family, input_dtype, output_dtype, takes
from .traits import Shapes, Weights, elements, output_times_weights, own, shape_of


# -- FULLY_CONNECTED ----------------------------------------------------------------------------

_WEIGHTS_DEFAULT = 0


def _per_channel(tensor, channels: int, strict: bool) -> bool:
    """Whether a weight tensor is quantized per channel (op_signature.cc's test)."""
    q = tensor.quantization if tensor is not None else None
    if q is None or q.scale.size == 0:
        return False
    return q.scale.size == channels and (q.scale.size > 1 or not strict)


def _fc_version(op) -> int:
    opts = op.options
    t_in, t_w, t_out = input_dtype(op, 0), input_dtype(op, 1), output_dtype(op, 0)
    weights = op.inputs[1] if len(op.inputs) > 1 else None
    f32, i8, i16 = DType.FLOAT32, DType.INT8, DType.INT16
    if (t_in, t_w, t_out) == (f32, i8, f32) and weights is not None and weights.shape \
            and _per_channel(weights, weights.shape[0], strict=True):
        return 12
    if (t_in, t_w, t_out) == (i16, i8, i16) and opts["quantized_bias_type"]:
        return 11
    if weights is not None and weights.sparsity is not None:
        return 8
    if (t_in, t_w, t_out) == (i16, i16, i16):
        return 7
    if len(op.inputs) == 2:
        return 6
    if opts["keep_num_dims"]:
        return 5
    if (t_in, t_w, t_out) == (i8, i8, i8):
        return 4
    if (t_in, t_w, t_out) == (i8, DType.INT4, i8):
        return 10
    if (t_in, t_w, t_out) == (f32, i8, f32):
        return 9 if opts["asymmetric_quantize_inputs"] else 3
    if opts["weights_format"] != _WEIGHTS_DEFAULT:
        return 2
    return 1


# -- multiply-accumulate counts ------------------------------------------------------------------

def _transpose_conv_macs(op, shapes: Shapes | None = None) -> int:
    """Every input element meets every kh × kw × out_c tap of the filter."""
    w = op.inputs[1]
    return elements(op.inputs[2], shapes) * w.shape[0] * w.shape[1] * w.shape[2] if w is not None else 0


def _batch_matmul_macs(op, shapes: Shapes | None = None) -> int:
    """Output elements × the contracted dimension of input 0."""
    if op.inputs[0] is None or not op.outputs or op.outputs[0] is None:
        return 0
    x = shape_of(op.inputs[0], shapes)
    return elements(op.outputs[0], shapes) * (x[-2] if op.options["adj_x"] else x[-1])


FULLY_CONNECTED = OpDef(
    name="FULLY_CONNECTED",
    **family(dense.FULLY_CONNECTED),
    options=OptionsSpec("FullyConnectedOptions", {
        "fused_activation_function": Activation.NONE,
        "weights_format": _WEIGHTS_DEFAULT,
        "keep_num_dims": False,
        "asymmetric_quantize_inputs": False,
        "quantized_bias_type": DType.FLOAT32,
    }),
    version=_fc_version,
    max_version=14,
    shape=lambda opts, shapes: [dense.fc_shape(opts, shapes[0], shapes[1])],
    fused_activation_host=True,
    runtime_versions=("1.5.0", "1.10.0", "1.14.0", "1.14.0", "2.0.0", "2.1.0", "2.3.0", "2.3.0",
                      "2.3.0", "2.11.0", "2.15.0", "2.17.0", "2.18.0", "2.21.0"),
                      operands=("input", "weights", "bias"), weights=Weights((1,), axis=0, bias=2),
    quantization=own(int4_weights=True, hybrid=True), macs=output_times_weights(lambda w: w[-1]),
    types=takes("float32 int8 uint8 int16"),
)


# -- CONV_2D --------------------------------------------------------------------------------------

def _conv_version(op) -> int:
    t_in, t_w, t_out = input_dtype(op, 0), input_dtype(op, 1), output_dtype(op, 0)
    f32, i8, i16 = DType.FLOAT32, DType.INT8, DType.INT16
    if (t_in, t_w, t_out) == (i16, i8, i16) and op.options["quantized_bias_type"]:
        return 8
    x, w = op.inputs[0], op.inputs[1]
    if x is not None and w is not None and len(x.shape) == 4 and len(w.shape) == 4 \
            and x.shape[3] != w.shape[3]:
        return 6  # grouped convolution
    if (t_in, t_w, t_out) == (i16, i16, i16):
        return 4
    if (t_in, t_w, t_out) == (i8, i8, i8):
        return 3
    if (t_in, t_w, t_out) == (i8, DType.INT4, i8):
        return 7
    if (t_in, t_w, t_out) == (f32, i8, f32):
        return 5 if w is not None and w.shape and _per_channel(w, w.shape[0], False) else 2
    return 1


#: The convolutions' enum-typed options (strides, dilations and depth_multiplier are plain
#: integers: the schema's defaults, read from the bindings, need no restating).
_WINDOW_ENUMS = {"padding": Padding.SAME, "fused_activation_function": Activation.NONE}
_CONV_ENUMS = {**_WINDOW_ENUMS, "quantized_bias_type": DType.FLOAT32}

CONV_2D = OpDef(
    name="CONV_2D",
    **family(conv.CONV_2D),
    options=OptionsSpec("Conv2DOptions", _CONV_ENUMS),
    version=_conv_version,
    max_version=8,
    shape=lambda opts, shapes: [conv.conv_shape(opts, shapes[0], shapes[1])],
    fused_activation_host=True,
    runtime_versions=("1.5.0", "1.14.0", "1.14.0", "2.3.0", "2.4.0", "2.9.0", "2.11.0", "2.15.0"),
    operands=("input", "filter", "bias"), weights=Weights((1,), axis=0, bias=2, spatial=(1, 2), bias_required=True),
    quantization=own(int4_weights=True, hybrid=True), macs=output_times_weights(lambda w: math.prod(w[1:]))
)


# -- DEPTHWISE_CONV_2D ----------------------------------------------------------------------------

def _dw_version(op) -> int:
    t_in, t_w, t_out = input_dtype(op, 0), input_dtype(op, 1), output_dtype(op, 0)
    f32, i8, i16 = DType.FLOAT32, DType.INT8, DType.INT16
    w = op.inputs[1] if len(op.inputs) > 1 else None
    if (t_in, t_w, t_out) == (i16, i16, i16):
        return 5
    if (t_in, t_w, t_out) == (f32, i8, f32):
        return 6 if w is not None and len(w.shape) == 4 and _per_channel(w, w.shape[3], False) else 4
    if (t_in, t_w, t_out) == (i8, i8, i8):
        return 3
    if (t_in, t_w, t_out) == (i8, DType.INT4, i8):
        return 7
    if op.options["dilation_w_factor"] != 1 or op.options["dilation_h_factor"] != 1:
        return 2
    return 1


DEPTHWISE_CONV_2D = OpDef(
    name="DEPTHWISE_CONV_2D",
    **family(conv.DEPTHWISE_CONV_2D),
    options=OptionsSpec("DepthwiseConv2DOptions", _WINDOW_ENUMS),
    version=_dw_version,
    max_version=7,
    shape=lambda opts, shapes: [conv.depthwise_shape(opts, shapes[0], shapes[1])],
    fused_activation_host=True,
    runtime_versions=("1.5.0", "1.12.0", "1.14.0", "2.2.0", "2.3.0", "2.3.0", "2.11.0"),
    operands=("input", "filter", "bias"), weights=Weights((1,), axis=3, bias=2, spatial=(1, 2), bias_required=True),
    quantization=own(int4_weights=True, hybrid=True), macs=output_times_weights(lambda w: w[1] * w[2])
)


# -- TRANSPOSE_CONV -------------------------------------------------------------------------------

def _tconv_version(op) -> int:
    # op_version.cc tests operand 0 (the output shape) here; kept as written there.
    if (input_dtype(op, 0), input_dtype(op, 1), output_dtype(op, 0)) == \
            (DType.INT16, DType.INT8, DType.INT16) and op.options["quantized_bias_type"]:
        return 5
    if op.options["fused_activation_function"] != Activation.NONE:
        return 4
    if len(op.inputs) == 4 and op.inputs[3] is not None:
        return 3
    if input_dtype(op, 1) == DType.INT8:
        return 2
    return 1


TRANSPOSE_CONV = OpDef(
    name="TRANSPOSE_CONV",
    **family(conv.TRANSPOSE_CONV),
    options=OptionsSpec("TransposeConvOptions", _CONV_ENUMS),
    version=_tconv_version,
    max_version=5,
    runtime_versions=("1.9.0", "2.2.0", "2.3.0", "2.13.0", "2.15.0"),
    operands=("output_shape", "weights", "input", "bias"), weights=Weights((1,), axis=0, bias=3, input=2),
    quantization=own(2, hybrid=True), macs=_transpose_conv_macs
)


# -- BATCH_MATMUL ----------------------------------------------------------------------------------

def _bmm_version(op) -> int:
    t_in = input_dtype(op, 0)
    if t_in == DType.INT16:
        return 3
    if t_in == DType.INT8:
        return 2
    if (t_in, input_dtype(op, 1), output_dtype(op)) == (DType.FLOAT32, DType.INT8, DType.FLOAT32) \
            and op.options["asymmetric_quantize_inputs"]:
        return 4
    return 1


BATCH_MATMUL = OpDef(
    name="BATCH_MATMUL",
    **family(dense.BATCH_MATMUL),
    options=OptionsSpec("BatchMatMulOptions", {
        "adj_x": False,
        "adj_y": False,
        "asymmetric_quantize_inputs": False,
    }),
    version=_bmm_version,
    max_version=4,
    shape=lambda opts, shapes: [dense.bmm_shape(opts, shapes[0], shapes[1])],
    runtime_versions=("2.3.0", "2.3.0", "2.4.0", "2.5.0"),
    quantization=own(0, 1),
    macs=_batch_matmul_macs,
    types=takes("float16 float32 int8 int16"),
)


OPS = (FULLY_CONNECTED, CONV_2D, DEPTHWISE_CONV_2D, TRANSPOSE_CONV, BATCH_MATMUL)
