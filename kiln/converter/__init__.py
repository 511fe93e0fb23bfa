"""TensorFlow -> LiteRT conversion: `TFLiteConverter`, the `ConversionOptions` and `Pipeline`
it runs, its `ConversionReport`, and `prepare_keras_model` (trace or export a Keras model so
its LSTMs fuse). See docs/architecture.md for how the pieces fit."""

from .api import TargetSpec, TFLiteConverter
from .keras import KerasFusionReport, prepare_keras_model
from .options import ConversionOptions, Optimize, OpsSet
from .pipeline import Pipeline, Stage
from .report import ConversionReport

__all__ = ["ConversionOptions", "ConversionReport", "KerasFusionReport", "Optimize", "OpsSet", "Pipeline",
           "Stage", "TFLiteConverter", "TargetSpec", "prepare_keras_model"]
