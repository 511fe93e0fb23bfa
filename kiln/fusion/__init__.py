"""Composite-op fusion: turn ``tf.function(experimental_implements=...)`` calls into fused
LiteRT ops — kiln's built-in fusions and the plugin API for your own (docs/fusion_plugins.md).

IR only: nothing here imports TensorFlow or the converter. The registry is imported at once
(it is small); the fusion helpers and LSTM emitters load on first use (PEP 562), so code that
only registers fusions does not pay for them. Keras-specific code (routing Keras layers,
recognising Keras 3 loops) lives under kiln/converter/keras.
"""

from __future__ import annotations

import importlib

from .registry import (
    CompositeCall,
    NotFusable,
    find_fusion,
    fuse_call,
    register_fusion,
    unregister_fusion,
)

#: name -> module (under kiln.fusion) that defines it, imported on first access.
_LAZY = {
    **dict.fromkeys(("FusionBuilder", "Operand", "gate_blocks", "implements", "reject", "shape_of",
                     "value_of"), "helpers"),
    **dict.fromkeys(("LstmOptions", "LstmResult", "LstmWeights", "emit_bidirectional_lstm",
                     "emit_lstm"), "lstm"),
}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CompositeCall", "FusionBuilder", "LstmOptions", "LstmResult", "LstmWeights", "NotFusable",
    "Operand", "emit_bidirectional_lstm", "emit_lstm", "find_fusion", "fuse_call", "gate_blocks",
    "implements", "register_fusion", "reject", "shape_of", "value_of", "unregister_fusion",
]
