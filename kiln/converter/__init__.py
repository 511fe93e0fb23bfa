"""TensorFlow -> LiteRT conversion: `TFLiteConverter` and its `ConversionReport`."""

from .api import Optimize, OpsSet, TargetSpec, TFLiteConverter
from .report import ConversionReport

__all__ = ["ConversionReport", "Optimize", "OpsSet", "TFLiteConverter", "TargetSpec"]
