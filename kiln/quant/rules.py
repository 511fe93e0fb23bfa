"""How each op is quantized to int8 (TensorFlow 2.21's MLIR quantizer, measured).

A rule says where an op's output parameters come from:

- ``weights``: an op with constant weights (per-channel symmetric int8 along ``axis``) and
  an int32 bias; its output has its own calibrated range.
- ``own``: the output has its own calibrated range; inputs keep theirs.
- ``same``: the output shares input 0's parameters (reshapes, pools, slices, max/min...).
- ``fixed``: the output parameters are fixed by the op's range (sigmoid, softmax, tanh...).
- ``requantize``: the inputs take the output's calibrated parameters (CONCATENATION,
  PACK): LiteRT's int8 kernels requantize nothing and refuse inputs whose scale or zero
  point differ (measured), so, as in TensorFlow's quantizer, the inputs' producers write
  the output's parameters and an input that cannot is requantized by a QUANTIZE.
- ``lstm``: TF's full-integer LSTM layout (kiln.quant.lstm).

An op without a rule has no int8 kernel in LiteRT: it stays float between DEQUANTIZE and
QUANTIZE, or is refused in integer-only mode.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    kind: str
    #: ``weights``: (weight operand, quantized dimension, bias operand, activation operand).
    weights: tuple[int, int, int, int] | None = None
    #: ``fixed``: (scale, zero point) of the int8 output.
    fixed: tuple[float, int] | None = None
    #: Operand positions that are activations (the rest are left alone: shapes, axes...).
    activations: tuple[int, ...] = (0,)
    #: Activation positions whose constant operand TF quantizes like a weight: int8, symmetric
    #: per tensor (PRELU's alpha; LiteRT's int16 PRELU also reads an int8 alpha).
    symmetric: tuple[int, ...] = ()


def _weights(w: int, axis: int, bias: int, x: int = 0) -> Rule:
    return Rule("weights", weights=(w, axis, bias, x), activations=(x,))


RULES: dict[str, Rule] = {
    "CONV_2D": _weights(1, 0, 2),
    "DEPTHWISE_CONV_2D": _weights(1, 3, 2),
    "FULLY_CONNECTED": _weights(1, 0, 2),
    "TRANSPOSE_CONV": _weights(1, 0, 3, x=2),
    "ADD": Rule("own", activations=(0, 1)),
    "SUB": Rule("own", activations=(0, 1)),
    "MUL": Rule("own", activations=(0, 1)),
    "SQUARED_DIFFERENCE": Rule("own", activations=(0, 1)),
    "BATCH_MATMUL": Rule("own", activations=(0, 1)),
    "MEAN": Rule("own"),
    "SUM": Rule("own"),
    "RELU": Rule("own"),
    "RELU6": Rule("own"),
    "RELU_N1_TO_1": Rule("own"),
    "LEAKY_RELU": Rule("own"),
    "HARD_SWISH": Rule("own"),
    "GELU": Rule("own"),
    "PRELU": Rule("own", activations=(0, 1), symmetric=(1,)),
    "ELU": Rule("own"),   # TF 2.21 keeps ELU float (even integer-only); LiteRT has an int8 LUT kernel
    "EXP": Rule("own"),
    "LOG": Rule("own"),
    "ABS": Rule("own"),
    "SQRT": Rule("own"),
    "RSQRT": Rule("own"),
    "RESHAPE": Rule("same"),
    "SQUEEZE": Rule("same"),
    "EXPAND_DIMS": Rule("same"),
    "TRANSPOSE": Rule("same"),
    "MAX_POOL_2D": Rule("same"),
    "AVERAGE_POOL_2D": Rule("same"),
    "PAD": Rule("same"),
    "PADV2": Rule("same", activations=(0, 2)),   # the pad value too: LiteRT wants its type
    "STRIDED_SLICE": Rule("same"),
    "SLICE": Rule("same"),
    "SPLIT": Rule("same", activations=(1,)),
    "SPLIT_V": Rule("same"),
    "GATHER": Rule("same"),
    "RESIZE_BILINEAR": Rule("same"),
    "RESIZE_NEAREST_NEIGHBOR": Rule("same"),
    "DEPTH_TO_SPACE": Rule("same"),
    "SPACE_TO_DEPTH": Rule("same"),
    "SPACE_TO_BATCH_ND": Rule("same"),
    "BATCH_TO_SPACE_ND": Rule("same"),
    "REDUCE_MAX": Rule("same"),
    "REDUCE_MIN": Rule("same"),
    # Both inputs at the output's parameters: clipping them to the output's range leaves the
    # max / min unchanged, where input 0's parameters would clip a wider input 1.
    "MAXIMUM": Rule("requantize", activations=()),
    "MINIMUM": Rule("requantize", activations=()),
    "TILE": Rule("same"),
    "REVERSE_V2": Rule("same"),
    "BROADCAST_TO": Rule("same"),
    "PACK": Rule("requantize", activations=()),
    "CONCATENATION": Rule("requantize", activations=()),
    "LOGISTIC": Rule("fixed", fixed=(1 / 256, -128)),
    "SOFTMAX": Rule("fixed", fixed=(1 / 256, -128)),
    "TANH": Rule("fixed", fixed=(1 / 128, 0)),
    "LOG_SOFTMAX": Rule("fixed", fixed=(16 / 256, 127)),
    "L2_NORMALIZATION": Rule("fixed", fixed=(1 / 128, 0)),
    "UNIDIRECTIONAL_SEQUENCE_LSTM": Rule("lstm"),
}
