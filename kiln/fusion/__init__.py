"""Composite-op fusion: turn ``tf.function(experimental_implements=...)`` calls into fused
LiteRT ops — kiln's built-in fusions and the plugin API for your own (docs/fusion_plugins.md).

Nothing here imports TensorFlow; `prepare_keras_model` does so when it is used.
"""

from .helpers import FusionBuilder, Operand, gate_blocks, implements, reject, shape_of, value_of
from .keras_layers import KerasFusionReport, prepare_keras_model
from .lstm import LstmOptions, LstmResult, LstmWeights, emit_bidirectional_lstm, emit_lstm
from .registry import (
    CompositeCall,
    NotFusable,
    find_fusion,
    fuse_call,
    register_fusion,
    unregister_fusion,
)

__all__ = [
    "CompositeCall", "FusionBuilder", "KerasFusionReport", "LstmOptions", "LstmResult",
    "LstmWeights", "NotFusable", "Operand", "emit_bidirectional_lstm", "emit_lstm", "find_fusion",
    "fuse_call", "gate_blocks", "implements", "prepare_keras_model", "register_fusion", "reject",
    "shape_of", "value_of", "unregister_fusion",
]
