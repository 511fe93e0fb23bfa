"""Keras-specific recognisers of the converter: they read Keras models and TensorFlow graphs,
so they live here rather than in kiln/fusion (which only sees IR and composite calls).

* `prepare_keras_model` (layers.py): while active, Keras recurrent layers trace through
  kiln's composites, which kiln/fusion's ``kiln_keras_*`` fusions turn into fused ops.
* `fuse_lstm_loop` (lstm_loop.py): recognises the Keras 3 LSTM While loop in a SavedModel
  exported without that hook; the importer's While emitter asks it first.
"""

from .layers import KerasFusionReport, prepare_keras_model

__all__ = ["KerasFusionReport", "prepare_keras_model"]
