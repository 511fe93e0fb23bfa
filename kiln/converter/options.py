"""`ConversionOptions`: everything a conversion is parameterised by, in one frozen value.

`TFLiteConverter` reads its (mutable, tf.lite-compatible) attributes into one of these when
``convert()`` starts; the `Pipeline` (kiln/converter/pipeline.py) is assembled from it. A new
option is a field here and, where it changes what runs, a stage there — not one more keyword
argument threaded through several signatures.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable

from ..errors import ConversionError, UnsupportedError
from .metadata import ModelType


class Optimize(enum.Enum):
    """Optimisation goals (``tf.lite.Optimize``); any of them asks for quantization."""

    DEFAULT = "DEFAULT"
    OPTIMIZE_FOR_SIZE = "OPTIMIZE_FOR_SIZE"
    OPTIMIZE_FOR_LATENCY = "OPTIMIZE_FOR_LATENCY"
    EXPERIMENTAL_SPARSITY = "EXPERIMENTAL_SPARSITY"


class OpsSet(enum.Enum):
    """Operator sets a model may use (``tf.lite.OpsSet``)."""

    TFLITE_BUILTINS = "TFLITE_BUILTINS"
    TFLITE_BUILTINS_INT8 = "TFLITE_BUILTINS_INT8"
    SELECT_TF_OPS = "SELECT_TF_OPS"
    EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8 = (
        "EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8")


#: Operator sets that only an integer-quantized model can use.
_INTEGER_OPS = frozenset({OpsSet.TFLITE_BUILTINS_INT8,
                          OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8})
_INFERENCE_TYPES = ("float32", "int8", "uint8", "int16")


@dataclass(frozen=True)
class ConversionOptions:
    """What to convert to, checked on construction the way TF's converter checks it.

    Attributes:
      model_type: where the functions came from (written into CONVERSION_METADATA).
      allow_custom_ops: TF ops without a builtin become CUSTOM ops instead of failing.
      enable_resource_variables: assigned variables stay resource variables (else refused).
      verify_passes: check the IR's invariants after every pass (slower; for debugging).
      conversion_metadata: write the CONVERSION_METADATA entry (TF's exclude_conversion_metadata
        turns it off; min_runtime_version is written either way, as TF writes it).
      optimizations: `Optimize` goals; any of them asks for quantization.
      supported_ops: `OpsSet` values the target runtime supports.
      supported_types: dtype names ("float16", "int8", ...) the target supports besides float32.
      inference_input_type / inference_output_type: dtype names of the model's inputs / outputs.
      representative_dataset: calibration samples for integer quantization (a callable).
      denylist: op types or output tensor names kept float by quantization (kiln's extension;
        `QuantizationDebugger.suggest_denylist` finds one).
      allow_integer_samples: accept integer representative samples for float inputs as they
        are (refused by default: usually un-normalised data; kiln.quant.calibrate).

    Raises:
      ConversionError: inconsistent options (as TF's converter reports them).
      UnsupportedError: SELECT_TF_OPS (TensorFlow kernels inside LiteRT).
    """

    model_type: ModelType
    allow_custom_ops: bool = False
    enable_resource_variables: bool = True
    verify_passes: bool = False
    conversion_metadata: bool = True
    optimizations: frozenset = frozenset()
    supported_ops: frozenset = frozenset({OpsSet.TFLITE_BUILTINS})
    supported_types: frozenset = frozenset()
    inference_input_type: str = "float32"
    inference_output_type: str = "float32"
    representative_dataset: Callable | None = None
    denylist: tuple[str, ...] = ()
    allow_integer_samples: bool = False

    def __post_init__(self):
        if self.representative_dataset is not None and not callable(self.representative_dataset):
            raise ConversionError("Representative dataset is not a callable (a generator function of samples).")
        for name in ("inference_input_type", "inference_output_type"):
            value = getattr(self, name)
            if value not in _INFERENCE_TYPES:
                raise ConversionError(f"Unsupported {name} value 'tf.{value}'.")
        if OpsSet.SELECT_TF_OPS in self.supported_ops:
            raise UnsupportedError(
                "SELECT_TF_OPS (TensorFlow kernels inside LiteRT) is not supported by kiln; set "
                "allow_custom_ops=True and register a Python kernel for the op instead")
        integer_io = self._integer_io()
        if integer_io and not self.optimizations:
            raise ConversionError(
                f"The inference_input_type and inference_output_type must be tf.float32 unless the model is "
                f"integer-quantized (got {self.inference_input_type} / {self.inference_output_type}); set "
                "optimizations={Optimize.DEFAULT} and a representative_dataset")
        if self.denylist and not self.optimizations:
            raise ConversionError(
                f"denylist {list(self.denylist)} keeps ops float during quantization, but no quantization was "
                "asked for; set optimizations=[Optimize.DEFAULT] (and a representative_dataset for integer modes)")

    def _integer_io(self) -> set[str]:
        return {self.inference_input_type, self.inference_output_type} - {"float32"}

    @property
    def quantization(self) -> list[str]:
        """What asks for quantization ("optimizations=DEFAULT", ...); empty for a float model.

        The pipeline gets a "quantize" stage exactly when this is not empty.
        """
        what = []
        unsupported_types = set(self.supported_types) - {"float32"}
        integer_io = self._integer_io()
        integer_ops = self.supported_ops & _INTEGER_OPS
        if not (self.optimizations or unsupported_types or integer_io or integer_ops):
            return what
        if self.optimizations:
            what.append("optimizations=" + ",".join(sorted(o.name for o in self.optimizations)))
        if unsupported_types:
            what.append("supported_types=" + ",".join(sorted(unsupported_types)))
        if integer_io:
            what.append(f"inference types {self.inference_input_type}/{self.inference_output_type}")
        other_ops = self.supported_ops - {OpsSet.TFLITE_BUILTINS}
        if other_ops:
            what.append("supported_ops=" + ",".join(sorted(o.name for o in other_ops)))
        if self.representative_dataset is not None:
            what.append("representative_dataset")
        return what
