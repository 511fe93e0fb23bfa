"""kiln's built-in fusions, listed in one table (the registry loads it on first lookup).

Each row: (implements name, fusion, whether the name is a prefix). User fusions registered
with `register_fusion` take precedence over these.
"""

from __future__ import annotations

from . import custom, embedding, keras, lingvo

FUSIONS = (
    ("embedding_lookup", embedding.fuse_embedding_lookup, False),
    ("embedding_matmul", embedding.fuse_embedding_lookup, False),  # TensorFlow's older name
    ("lstm_", keras.fuse_tf_keras_lstm, True),                     # tf_keras api_implements
    ("gru_", keras.fuse_tf_keras_gru, True),                       # said why, then inlined
    (keras.KERAS_LSTM, keras.fuse_keras_lstm, False),
    (keras.KERAS_BIDIRECTIONAL_LSTM, keras.fuse_keras_bidirectional_lstm, False),
    (lingvo.LSTM_CELL_SIMPLE, lingvo.fuse_lstm_cell_simple, True),  # "...,couple_input_forget_gates"
    (lingvo.LAYER_NORM_LSTM_CELL_SIMPLE, lingvo.fuse_layer_norm_lstm_cell_simple, True),
)

#: Tried for any name nothing else matches: a custom op when the attrs say tfl_fusable_op.
FALLBACK = custom.fuse_tfl_fusable_op
