"""Lowerings of the quantized sequence LSTMs, each direction one lax.scan over time, bit-exact
with kiln's reference kernels because they run the same per-step arithmetic, written once:

- the full-integer UNIDIRECTIONAL_SEQUENCE_LSTM (LiteRT's 8x8->16 kernel): kiln.kernels.lstm
  on jax.numpy int64 (the delegate traces under x64) with the gemmlowp sigmoid / tanh tables
  as constants. Prepare-time constants (multipliers, zero-point-folded biases) come from the
  static weights and the node's quantization parameters, as LiteRT's Prepare computes them.
- the hybrid (dynamic-range) UNIDIRECTIONAL_ and BIDIRECTIONAL_SEQUENCE_LSTM (float input and
  states, int8 weights): the reference kernels of kiln.kernels.hybrid_lstm themselves, on
  jax.numpy — XLA's float32 arithmetic (lower_families.FLOAT32, whose `recur` is the scan) and
  kiln.kernels.hybrid's row quantization, exact int8 products.

Float nodes have lower_seq's lowerings.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..errors import OpError
from ..kernels import hybrid_lstm
from ..kernels import lstm as il
from ..ops.record import with_state
from ..schema import BIDIRECTIONAL_LSTM_BW, BIDIRECTIONAL_LSTM_FW, UNIDIRECTIONAL_LSTM, DType
from .lower_seq import uni_lstm_check
from .lowering import Rows, all_of, on_jnp

_I64 = jnp.int64

#: This module's entries of the XLA table (kiln/xla/table.py's `fill` registers them).
ROWS = Rows()


def _uni_lstm_int8(call, *inputs):
    op, opts = call.op, call.opts
    il.check_operands(op, inputs)
    if opts.cell_clip < 0 or opts.proj_clip < 0:
        raise OpError(f"{il.NAME}: cell_clip and proj_clip must be >= 0, got {opts.cell_clip} and {opts.proj_clip}")
    p = il.prepare(op, inputs, cell_clip=float(opts.cell_clip), proj_clip=float(opts.proj_clip))
    time_major = bool(opts.time_major)
    x, h_in, c_in = inputs[0], inputs[il.LAYOUT.output_state], inputs[il.LAYOUT.cell_state]
    batch = np.shape(x)[1 if time_major else 0]
    if np.size(h_in) != batch * p.n_output or np.size(c_in) != batch * p.n_cell:
        raise OpError(f"{il.NAME}: states have {np.size(h_in)} and {np.size(c_in)} elements, expected batch "
                      f"{batch} x {p.n_output} and {batch} x {p.n_cell}")
    xt = jnp.asarray(x).astype(_I64)
    if not time_major:
        xt = jnp.swapaxes(xt, 0, 1)
    pre = il.input_part(jnp, p, xt)
    h0 = jnp.asarray(h_in).astype(_I64).reshape(batch, p.n_output)
    c0 = jnp.asarray(c_in).astype(_I64).reshape(batch, p.n_cell)

    def body(carry, pre_t):
        h, c = il.step(jnp, p, pre_t, *carry)
        return (h, c), h

    (h, c), out = lax.scan(body, (h0, c0), pre)
    out = out.astype(jnp.int8)
    if not time_major:
        out = jnp.swapaxes(out, 0, 1)
    return with_state(call, [out], (h.astype(jnp.int8).reshape(np.shape(h_in)),
                                    c.astype(jnp.int16).reshape(np.shape(c_in))))


def _check(op, opts):
    x = op.inputs[0] if op.inputs else None
    if x is None or x.dtype != DType.INT8:
        return (f"{op.name}: only the full-integer (int8 input) LSTM has a quantized lowering "
                f"(input is {None if x is None else x.dtype.name})")
    return None


ROWS.add(il.NAME, _uni_lstm_int8, types=("int8",), static=tuple(UNIDIRECTIONAL_LSTM.weights),
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
