"""16x8 quantization: int16 activations, int8 weights (TF's
``EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8``).

The int8 rewrite (kiln.quant.static) with another `Scheme`: activations are int16 and
symmetric (zero point 0, scale ``max|range| / 32767``), biases of FULLY_CONNECTED / CONV_2D /
DEPTHWISE_CONV_2D / TRANSPOSE_CONV int64, LOGISTIC / TANH / SOFTMAX outputs fixed to 1/32768,
ADD / SUB use general scales (``pot_scale_int16 = false``). Ops get the int16 versions of
op_version.cc — TF 2.21 writes the int8 ones (measured), which LiteRT accepts too. Every
quantized op gets its own copy of its weights and bias, so a bias that TF's converter shares
between two convolutions cannot end up with the first one's scale (TF's 16x8 bug, measured).
"""

from __future__ import annotations

from typing import Any

from ..ir import Model
from ..schema import DType
from . import params
from .static import Scheme, StaticReport, quantize_static

#: Ops LiteRT 2.3 runs with int16 activations (measured op by op with BUILTIN_REF on
#: kiln-quantized models; see tests/quant/test_16x8.py). Every other op stays float.
INT16_OPS = frozenset({
    "CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "TRANSPOSE_CONV",
    "ADD", "SUB", "MUL", "BATCH_MATMUL", "MEAN",
    "RELU", "RELU6", "LEAKY_RELU", "PRELU", "ABS", "RSQRT", "GELU", "EXP", "LOG", "SQRT",
    "RESHAPE", "SQUEEZE", "EXPAND_DIMS", "TRANSPOSE", "MAX_POOL_2D", "AVERAGE_POOL_2D", "PAD", "PADV2",
    "STRIDED_SLICE", "SLICE", "SPLIT", "SPLIT_V", "GATHER", "RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR",
    "REDUCE_MAX", "REDUCE_MIN", "MAXIMUM", "MINIMUM", "TILE", "BROADCAST_TO", "PACK", "CONCATENATION", "REVERSE_V2",
    "LOGISTIC", "SOFTMAX", "TANH",
    "UNIDIRECTIONAL_SEQUENCE_LSTM",   # as TF's int8 LSTM, between int16 <-> int8 QUANTIZEs
})
#: Measured without an int16 kernel in LiteRT 2.3 (so kept float; rechecked one op at a time
#: with BUILTIN_REF): SQUARED_DIFFERENCE ("SquaredDifference only supports FLOAT32 and INT32"),
#: HARD_SWISH, RELU_N1_TO_1, LOG_SOFTMAX ("Only float32, uint8 and int8 are supported"),
#: DEPTH_TO_SPACE, SPACE_TO_DEPTH, L2_NORMALIZATION (type checks in Prepare); SUM runs but TF
#: does not quantize it to int16 and its reference kernel is wrong in int8 and int16 alike
#: (measured: thousands of codes off in int16).

#: LiteRT's int16 LOGISTIC / TANH / SOFTMAX produce Q0.15 (op_resolver checks, tfl_ops.td).
FIXED_INT16 = {"LOGISTIC": (1 / 32768, 0), "SOFTMAX": (1 / 32768, 0), "TANH": (1 / 32768, 0)}

INT16X8 = Scheme("int16", DType.INT16, params.activation_int16, FIXED_INT16, bias_bits=64, ops=INT16_OPS,
                 bias_by_reciprocal=True)


def quantize_int16x8(model: Model, dataset: Any, **options) -> StaticReport:
    """Rewrite ``model`` to 16x8 with calibration on ``dataset`` (options as
    `kiln.quant.static.quantize_static`; I/O types float32 or int16)."""
    return quantize_static(model, dataset, INT16X8, **options)
