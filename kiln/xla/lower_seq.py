"""Lowerings of the LSTM and RNN ops (UNIDIRECTIONAL_ and BIDIRECTIONAL_SEQUENCE_LSTM, LSTM (one
step), RNN, UNIDIRECTIONAL_ and BIDIRECTIONAL_SEQUENCE_RNN): their reference arithmetic, written
once over an array namespace in kiln/ops/lstm.py and kiln/ops/rnn.py, traced over jax.numpy.
Each direction is one lax.scan over time (XlaFloat32.recur); the products are the bfloat16
dtype_policy's (XlaFloat32.matmul), gates and states stay float32, as LiteRT keeps them.

LiteRT's quirks come with the shared arithmetic: an aux input without aux weights is the
backward direction's input (time-major only, for the RNN), and with weights it feeds both
directions. The weights may be constants or traced parameters (`to_jax` hands them in
``params``). States are variable tensors (the op records' ``state_operands``): a lowering
reads them and returns their final values after its outputs, which the delegate writes back.
Not covered, and left to the reference kernel with that reason: an LSTM's fused activation
NONE (LiteRT's buffer ping-pong quirk) and the unidirectional LSTM's diagonal recurrent weights.
"""

from __future__ import annotations

import jax.numpy as jnp

from ..ops.lstm import bidi_lstm, lstm_step, uni_lstm
from ..ops.rnn import bidi_rnn, rnn, uni_rnn
from ..schema import Activation
from .lowering import Rows, on_jnp, policy_float

#: This module's entries of the XLA table (kiln/xla/table.py's `fill` registers them).
ROWS = Rows()


def _widened(fn):
    """``fn``'s lowering with operands in the bfloat16 dtype_policy's type widened to float32:
    the shared arithmetic takes float32, and its products (XlaFloat32.matmul) narrow them
    again to bfloat16, accumulating in float32 — the policy's mode, state kept in float32."""
    lower = on_jnp(fn)

    def widened(call, *inputs):
        return lower(call, *[x if x is None or x.dtype == jnp.float32 or not policy_float(x.dtype)
                             else jnp.asarray(x).astype(jnp.float32) for x in inputs])
    widened.__qualname__ = lower.__qualname__
    return widened


def _not_none(op, opts):
    if opts.fused_activation_function == Activation.NONE:
        return f"{op.op_type} with fused activation NONE reproduces a LiteRT buffer quirk that is not lowered"
    return None


def uni_lstm_check(op, opts):
    reason = _not_none(op, opts)
    if reason is None and opts.diagonal_recurrent_tensors:
        return f"{op.op_type} with diagonal recurrent weights is not lowered"
    return reason


def _lstm_step_check(op, opts):
    if opts.kernel_type != 0:
        return "LSTM with the BASIC kernel type is not lowered (nor run by the reference kernel)"
    return _not_none(op, opts)


ROWS.add("UNIDIRECTIONAL_SEQUENCE_LSTM", _widened(uni_lstm), check=uni_lstm_check)
ROWS.add("BIDIRECTIONAL_SEQUENCE_LSTM", _widened(bidi_lstm), check=_not_none)
ROWS.add("LSTM", _widened(lstm_step), check=_lstm_step_check)

ROWS.add("RNN", _widened(rnn))
ROWS.add("UNIDIRECTIONAL_SEQUENCE_RNN", _widened(uni_rnn))
ROWS.add("BIDIRECTIONAL_SEQUENCE_RNN", _widened(bidi_rnn))
