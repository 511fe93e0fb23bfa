"""What an op record says about its operands and number formats, beside its kernels.

These are facts about the op, not about one backend: which operand holds constant weights
(and along which axis they are quantized per channel), where its bias sits, how
TensorFlow's quantizer chooses its output parameters, which integer activation types and
which dynamic-range (hybrid) kernel LiteRT runs for it, and how many multiply-accumulates it
costs. The quantizer, the bias and cost passes and the support tests read them from the
record (`OpDef.weights`, `OpDef.quantization`, `OpDef.macs`) instead of keeping tables of
their own, so the quantizer cannot write an op kiln's runtime refuses without a record test
failing (tests/ops/test_traits.py).

The ways TF 2.21's quantizer chooses an op's integer output parameters (`OutputScale`):

- ``OWN``: the output has its own calibrated range (weighted ops: per-channel symmetric
  int8 weights and an int32 bias, too).
- ``SAME``: the output shares input 0's parameters (reshapes, pools, slices, max / min...).
- ``FIXED``: fixed by the op's range (sigmoid, softmax, tanh...), per activation type.
- ``REQUANTIZE``: the inputs take the output's calibrated parameters (CONCATENATION, PACK,
  MAXIMUM, MINIMUM): LiteRT's int8 kernels requantize nothing and refuse inputs whose scale
  or zero point differ, so the inputs' producers write the output's parameters and an
  input that cannot is requantized by a QUANTIZE.
- ``LSTM``: TF's full-integer LSTM layout (kiln.quant.lstm).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from ..ir import Operator

INT8, UINT8, INT16, HYBRID = "int8", "uint8", "int16", "hybrid"


class OutputScale(enum.Enum):
    """How the quantizer chooses an op's integer output parameters (module docstring)."""

    OWN = "own"
    SAME = "same"
    FIXED = "fixed"
    REQUANTIZE = "requantize"
    LSTM = "lstm"


@dataclass(frozen=True)
class Weights:
    """The operands of an op that hold its constant weights.

    ``operands``: the weight operand positions (one for FULLY_CONNECTED / convolutions, every
    gate, peephole and projection matrix for a fused LSTM); ``axis``: the dimension quantized
    per channel (None: per tensor); ``bias``: the bias operand (None: the op has none);
    ``input``: the activation operand the weights multiply (TRANSPOSE_CONV: 2); ``spatial``:
    a convolution filter's spatial dimensions (CONV_2D: 1, 2 — height, width);
    ``bias_required``: LiteRT's quantized and hybrid kernels need the bias operand (its float
    kernel does not), so a quantizer gives a bias-free op a zero bias, as TF's converter does.
    """

    operands: tuple[int, ...]
    axis: int | None
    bias: int | None = None
    input: int = 0
    spatial: tuple[int, ...] = ()
    bias_required: bool = False

    @property
    def first(self) -> int:
        return self.operands[0]


@dataclass(frozen=True)
class Quantization:
    """How an op is quantized, and the integer kernels LiteRT has for it.

    ``output``: how its output parameters are chosen (`OutputScale`); ``activations``: the
    operand positions that carry real values (the rest — shapes, axes — are left alone);
    ``symmetric``: activation positions whose constant operand is quantized like a weight,
    int8 symmetric per tensor (PRELU's alpha); ``fixed``: per activation type, the (scale,
    zero point) of a ``FIXED`` output; ``types``: the activation types LiteRT runs it with
    (INT8, INT16 for 16x8) — the quantizer writes no other; ``hybrid``: LiteRT has a
    dynamic-range kernel (float activations, int8 weights of the record's ``weights``);
    ``int4_weights``: LiteRT has an int8 x int4 kernel (kiln's int4 mode); ``table``: a
    constant operand 0 is a lookup table the op selects from (GATHER: an Embedding), which
    dynamic-range quantization stores as int8 (per tensor, as TF) with the op running on the
    codes and a DEQUANTIZE after it.
    """

    output: OutputScale
    activations: tuple[int, ...] = (0,)
    symmetric: tuple[int, ...] = ()
    fixed: Mapping[str, tuple[float, int]] = field(default_factory=dict, hash=False)
    types: frozenset[str] = frozenset({INT8})
    hybrid: bool = False
    int4_weights: bool = False
    table: bool = False

    def fixed_params(self, dtype: str) -> tuple[float, int]:
        return self.fixed[dtype]

    def quantized_in(self, scheme: str) -> bool:
        """Whether a model quantized with ``scheme``'s activation type ("int8", "int16") makes
        this op integer: where LiteRT has that kernel — and a fused LSTM, which runs its int8
        kernel in 16x8 models too, between QUANTIZEs (LiteRT has no 16x8 LSTM kernel)."""
        return scheme in self.types or (self.output == OutputScale.LSTM and INT8 in self.types)


#: Activation types of ops LiteRT runs both in int8 and in 16x8.
INT8_INT16 = frozenset({INT8, INT16})
#: Ops LiteRT runs in int8 only (no int16 kernel, measured with BUILTIN_REF).
INT8_ONLY = frozenset({INT8})


def own(*activations: int, types: frozenset[str] = INT8_INT16, **kw) -> Quantization:
    """An op whose output has its own calibrated range."""
    return Quantization(OutputScale.OWN, activations or (0,), types=types, **kw)


def same(*activations: int, types: frozenset[str] = INT8_INT16, table: bool = False) -> Quantization:
    """An op that moves or selects values: its output shares input 0's parameters."""
    return Quantization(OutputScale.SAME, activations or (0,), types=types, table=table)


def fixed(int8: tuple[float, int], int16: tuple[float, int] | None = None) -> Quantization:
    """An op whose output range is fixed by its function (int16: LiteRT's Q0.15 outputs)."""
    params = {INT8: int8} if int16 is None else {INT8: int8, INT16: int16}
    return Quantization(OutputScale.FIXED, fixed=params, types=frozenset(params))


def requantize(types: frozenset[str] = INT8_INT16) -> Quantization:
    """An op whose inputs take its output's calibrated parameters."""
    return Quantization(OutputScale.REQUANTIZE, (), types=types)


# -- multiply-accumulate counts ------------------------------------------------------------------

Shapes = Mapping[int, Sequence[int]]
#: (operator, optional run-time shapes by tensor id) -> multiply-accumulates of one execution.
MacRule = Callable[["Operator", "Shapes | None"], int]


def shape_of(t, shapes: Shapes | None) -> tuple[int, ...]:
    """A tensor's shape, the run-time one where known."""
    if shapes is not None and id(t) in shapes:
        return tuple(shapes[id(t)])
    return tuple(t.shape)


def elements(t, shapes: Shapes | None = None) -> int:
    return math.prod(shape_of(t, shapes)) if t is not None else 0


def output_times_weights(weight_dims: Callable[[tuple[int, ...]], int]) -> MacRule:
    """MACs = output elements × a product of the weights' dims (FULLY_CONNECTED, convolutions)."""
    def macs(op: "Operator", shapes: Shapes | None = None) -> int:
        w = op.inputs[1] if len(op.inputs) > 1 else None
        if w is None or not op.outputs or op.outputs[0] is None:
            return 0
        return elements(op.outputs[0], shapes) * weight_dims(tuple(w.shape))
    return macs
