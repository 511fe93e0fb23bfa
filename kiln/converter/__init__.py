"""TensorFlow -> LiteRT conversion: `TFLiteConverter` and its `ConversionReport`, and
`prepare_keras_model` (trace or export a Keras model so its LSTMs fuse)."""

from .api import Optimize, OpsSet, TargetSpec, TFLiteConverter
from .keras import KerasFusionReport, prepare_keras_model
from .report import ConversionReport

__all__ = ["ConversionReport", "KerasFusionReport", "Optimize", "OpsSet", "TFLiteConverter", "TargetSpec",
           "prepare_keras_model"]
