"""Lowerings of BIDIRECTIONAL_SEQUENCE_LSTM, LSTM (one step) and the plain RNN ops (RNN,
UNIDIRECTIONAL_ and BIDIRECTIONAL_SEQUENCE_RNN), each direction one lax.scan over time.

They mirror kiln/ops/lstm.py and kiln/ops/rnn.py, LiteRT's quirks included: an aux input
without aux weights is the backward direction's input (time-major only, for the RNN), and
with weights it feeds both directions. The LSTM reuses lower_rnn's scan with the aux weights
appended to the input weights — W·x + W_aux·aux as one product over [x, aux]. States are
variable tensors (the op records' ``state_operands``); their new values follow the outputs.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from .. import ops
from ..errors import OpError
from ..ops.lstm import check_clips, check_lstm_sizes, optional_operand, state_operand, bidi_aux_routing
from ..ops.record import with_state
from ..ops.rnn import bidi_rnn, rnn, uni_rnn
from ..schema import (BIDIRECTIONAL_LSTM_AUX_INPUT, BIDIRECTIONAL_LSTM_BW, BIDIRECTIONAL_LSTM_FW, UNIDIRECTIONAL_LSTM,
                      Activation)
from .lower_rnn import lstm_scan, read_lstm
from .lowering import Rows, on_jnp, policy_float

_BIDI_LSTM = "BIDIRECTIONAL_SEQUENCE_LSTM"

#: This module's entries of the XLA table (kiln/xla/table.py's `fill` registers them).
ROWS = Rows()


def _time_major(x, time_major: bool):
    return x if time_major else jnp.swapaxes(x, 0, 1)


def _f32(x):
    return jnp.asarray(x).astype(jnp.float32)


def _state0(name, what, value, rows, cols):
    state_operand(name, what, np.zeros(np.shape(value)) if value is not None else None, rows, cols)  # size check
    return _f32(value).reshape(rows, cols)


def _with_aux(p):
    """The direction's operands with W_aux appended to W (per gate), for an input [x, aux]."""
    return dataclasses.replace(p, input_w={g: jnp.concatenate([w, p.aux_w[g]], axis=1) for g, w in p.input_w.items()})


def _bidi_lstm(call, *inputs):
    opts = call.opts
    x = inputs[0]
    if x is None or optional_operand(inputs, 4) is None:
        raise OpError(f"{_BIDI_LSTM}: the input (operand 0) and input_to_output weights (operand 4) are required")
    if not (policy_float(x.dtype) and policy_float(inputs[4].dtype)):
        raise OpError(f"{_BIDI_LSTM}: input and weights must be float32, got {x.dtype} and {inputs[4].dtype}")
    if x.ndim != 3:
        raise OpError(f"{_BIDI_LSTM}: input must be 3-D, got shape {list(x.shape)}")
    time_major = bool(opts.time_major)
    check_clips(_BIDI_LSTM, opts)
    xt = _time_major(_f32(x), time_major)
    fw, bw = read_lstm(_BIDI_LSTM, inputs, BIDIRECTIONAL_LSTM_FW), read_lstm(_BIDI_LSTM, inputs, BIDIRECTIONAL_LSTM_BW)
    aux_in = optional_operand(inputs, BIDIRECTIONAL_LSTM_AUX_INPUT)
    cross_linked = bidi_aux_routing(_BIDI_LSTM, fw, bw, x.shape, None if aux_in is None else aux_in.shape)
    aux_t = None if aux_in is None else _time_major(_f32(aux_in), time_major)
    bw_x = xt if cross_linked else aux_t
    aux = aux_t if cross_linked else None
    batch = xt.shape[1]
    updates, outs = {}, []
    for p, lay, src, reverse in ((fw, BIDIRECTIONAL_LSTM_FW, xt, False), (bw, BIDIRECTIONAL_LSTM_BW, bw_x, True)):
        h0 = _state0(_BIDI_LSTM, f"output/activation state (operand {lay.output_state})",
                     optional_operand(inputs, lay.output_state), batch, p.n_output)
        c0 = _state0(_BIDI_LSTM, f"cell_state (operand {lay.cell_state})", optional_operand(inputs, lay.cell_state),
                     batch, p.n_cell)
        if aux is not None:
            p, src = _with_aux(p), jnp.concatenate([src, aux], axis=-1)
        out, h, c = lstm_scan(p, src, h0, c0, opts, reverse=reverse)
        updates[lay.output_state], updates[lay.cell_state] = h, c
        outs.append(_time_major(out, time_major))
    states = [updates[k] for k in ops.require(_BIDI_LSTM).state_operands]
    return with_state(call, [jnp.concatenate(outs, axis=-1)] if opts.merge_outputs else outs, states)


def _bidi_lstm_check(op, opts):
    if opts.fused_activation_function == Activation.NONE:
        return f"{_BIDI_LSTM} with fused activation NONE reproduces a LiteRT buffer quirk that is not lowered"
    return None


ROWS.add(_BIDI_LSTM, _bidi_lstm, check=_bidi_lstm_check)


def _lstm_step(call, *inputs):
    """LSTM: one step of the full kernel on a [batch, input] input (the unidirectional op's operands)."""
    x = inputs[0]
    if call.opts.kernel_type != 0:
        raise OpError("LSTM: only the FULL kernel type is lowered")
    if x is None or x.ndim != 2 or not policy_float(x.dtype):
        raise OpError(f"LSTM: input must be 2-D float32, got {None if x is None else (list(x.shape), x.dtype)}")
    check_clips("LSTM", call.opts)
    p = read_lstm("LSTM", inputs, UNIDIRECTIONAL_LSTM)
    check_lstm_sizes("LSTM", p, x.shape[1], None)
    batch = x.shape[0]
    h0 = _state0("LSTM", "output/activation state", optional_operand(inputs, UNIDIRECTIONAL_LSTM.output_state), batch, p.n_output)
    c0 = _state0("LSTM", "cell_state", optional_operand(inputs, UNIDIRECTIONAL_LSTM.cell_state), batch, p.n_cell)
    out, h, c = lstm_scan(p, _f32(x)[None], h0, c0, call.opts)
    return with_state(call, [out[0]], (h, c))


def _lstm_step_check(op, opts):
    if opts.kernel_type != 0:
        return "LSTM with the BASIC kernel type is not lowered (nor run by the reference kernel)"
    if opts.fused_activation_function == Activation.NONE:
        return "LSTM with fused activation NONE reproduces a LiteRT buffer quirk that is not lowered"
    return None


ROWS.add("LSTM", _lstm_step, check=_lstm_step_check)


# -- the plain RNN ops: their reference arithmetic over jax.numpy ----------------------------------

def _widened(fn):
    """``fn``'s lowering with operands in the bfloat16 dtype_policy's type widened to float32:
    the shared RNN arithmetic takes float32, and its products (XlaFloat32.matmul) narrow them
    again to bfloat16, accumulating in float32 — the policy's mode, state kept in float32."""
    lower = on_jnp(fn)

    def widened(call, *inputs):
        return lower(call, *[x if x is None or x.dtype == jnp.float32 or not policy_float(x.dtype) else _f32(x)
                             for x in inputs])
    widened.__qualname__ = lower.__qualname__
    return widened


ROWS.add("RNN", _widened(rnn))
ROWS.add("UNIDIRECTIONAL_SEQUENCE_RNN", _widened(uni_rnn))
ROWS.add("BIDIRECTIONAL_SEQUENCE_RNN", _widened(bidi_rnn))
