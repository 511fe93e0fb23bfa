"""Lowering of the full-integer UNIDIRECTIONAL_SEQUENCE_LSTM (LiteRT's 8x8->16 kernel) as one
lax.scan over time, bit-exact with kiln's reference kernel: both run the per-step integer
arithmetic of kiln.kernels.lstm (written once over an array namespace), here on
jax.numpy int64 (the delegate traces under x64) with the gemmlowp sigmoid / tanh tables as
constants. Prepare-time constants (multipliers, zero-point-folded biases) come from the
static weights and the node's quantization parameters, as LiteRT's Prepare computes them.
Nodes whose input 0 is float (hybrid LSTMs) are not registered; float nodes have lower_rnn's
lowering.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..errors import OpError
from ..kernels import lstm as il
from ..ops.record import with_state
from ..schema import DType
from ..schema import UNIDIRECTIONAL_LSTM
from .lower_rnn import uni_lstm_check
from .table import all_of, register_lowering

_I64 = jnp.int64


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


register_lowering(il.NAME, _uni_lstm_int8, types=("int8",), static=tuple(UNIDIRECTIONAL_LSTM.weights),
                  check=all_of(uni_lstm_check, _check))
