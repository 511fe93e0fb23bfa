"""Lowerings of the quantized sequence LSTMs: their reference kernels themselves, traced over
jax.numpy (each direction one lax.scan over time: float_math's `recur`), so bit-exact with them:

- the full-integer UNIDIRECTIONAL_SEQUENCE_LSTM (LiteRT's 8x8->16 kernel): kiln.kernels.lstm
  on jax.numpy int64 (the delegate traces under x64) with the gemmlowp sigmoid / tanh tables
  as constants. Prepare-time constants (multipliers, zero-point-folded biases) come from the
  static weights and the node's quantization parameters, as LiteRT's Prepare computes them.
- the hybrid (dynamic-range) UNIDIRECTIONAL_ and BIDIRECTIONAL_SEQUENCE_LSTM (float input and
  states, int8 weights): kiln.kernels.hybrid_lstm on jax.numpy — XLA's float32 arithmetic
  (lower_families.FLOAT32) and kiln.kernels.hybrid's row quantization, exact int8 products.

Float nodes have lower_seq's lowerings.
"""

from __future__ import annotations

from ..kernels import hybrid_lstm
from ..kernels import lstm as il
from ..schema import BIDIRECTIONAL_LSTM_BW, BIDIRECTIONAL_LSTM_FW, UNIDIRECTIONAL_LSTM, DType
from .lower_seq import uni_lstm_check
from .lowering import Rows, all_of, on_jnp

#: This module's entries of the XLA table (kiln/xla/table.py's `fill` registers them).
ROWS = Rows()


def _check(op, opts):
    x = op.inputs[0] if op.inputs else None
    if x is None or x.dtype != DType.INT8:
        return (f"{op.name}: only the full-integer (int8 input) LSTM has a quantized lowering "
                f"(input is {None if x is None else x.dtype.name})")
    return None


ROWS.add(il.NAME, on_jnp(il.uni_lstm_int8), types=("int8",), static=tuple(UNIDIRECTIONAL_LSTM.weights),
                  check=all_of(uni_lstm_check, _check))


# -- hybrid (dynamic-range) sequence LSTMs -------------------------------------------------------

def _hybrid_check(op, opts):
    """None for a hybrid LSTM node this lowers, else why not."""
    x = op.inputs[0] if op.inputs else None
    if x is None or x.dtype != DType.FLOAT32 or any(t is not None and t.dtype != DType.FLOAT32 for t in op.outputs):
        return f"{op.name}: the hybrid LSTM takes float32 input and outputs"
    if getattr(opts, "diagonal_recurrent_tensors", False):
        return f"{op.name}: diagonal recurrent weights have no hybrid kernel"
    return None


ROWS.add(il.NAME, on_jnp(hybrid_lstm.uni_lstm_hybrid), types=("hybrid",), static=tuple(UNIDIRECTIONAL_LSTM.weights),
                  check=_hybrid_check)
ROWS.add("BIDIRECTIONAL_SEQUENCE_LSTM", on_jnp(hybrid_lstm.bidi_lstm_hybrid), types=("hybrid",),
                  static=tuple(BIDIRECTIONAL_LSTM_FW.weights + BIDIRECTIONAL_LSTM_BW.weights), check=_hybrid_check)
