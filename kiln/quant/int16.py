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

#: The ops quantized to int16 are those whose record lists INT16 among the types LiteRT runs
#: (`kiln.ops.traits.Quantization.types`, measured op by op with BUILTIN_REF on kiln-quantized
#: models; see tests/quant/test_16x8.py); their fixed Q0.15 outputs (LOGISTIC, TANH, SOFTMAX)
#: are the records' too. Measured without an int16 kernel in LiteRT 2.3, so kept float:
#: SQUARED_DIFFERENCE ("SquaredDifference only supports FLOAT32 and INT32"), HARD_SWISH,
#: RELU_N1_TO_1, LOG_SOFTMAX ("Only float32, uint8 and int8 are supported"), DEPTH_TO_SPACE,
#: SPACE_TO_DEPTH, L2_NORMALIZATION (type checks in Prepare); SUM runs but TF does not
#: quantize it to int16 (its reference kernel is wrong in int8 and int16 alike, measured:
#: thousands of codes off in int16; int8 SUM runs LiteRT's optimized kernel, kiln.kernels.nn).
INT16X8 = Scheme("int16", DType.INT16, params.activation_int16, bias_bits=64, bias_by_reciprocal=True)


def quantize_int16x8(model: Model, dataset: Any, **options) -> StaticReport:
    """Rewrite ``model`` to 16x8 with calibration on ``dataset`` (options as
    `kiln.quant.static.quantize_static`; I/O types float32 or int16)."""
    return quantize_static(model, dataset, INT16X8, **options)
