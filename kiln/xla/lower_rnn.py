"""Lowering of UNIDIRECTIONAL_SEQUENCE_LSTM as one lax.scan over time.

Mirrors kiln/ops/lstm.py's float path step for step (gate order i, f, c, o; CIFG; peephole;
layer norm with the bias added after it; projection; cell and projection clips). The weights
may be constants or traced parameters (`to_jax` hands them in ``params``): the reference
kernel's reader checks their shapes while tracing.
The state operands are variable tensors (the record's ``state_operands``): the lowering reads
them and, like the reference kernel, returns their final values after its output, which the
delegate writes back (LiteRT's semantics: the next invoke continues from them). Not covered, and left to the reference kernel with
that reason: the fused activation NONE (LiteRT's buffer ping-pong quirk) and diagonal
recurrent weights.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..errors import OpError
from ..ops.lstm import (GATES, check_clips, check_lstm_sizes, clip, finish_gate, read_operands, sigmoid,
                        state_operand)
from ..ops.record import apply_activation, with_state
from ..schema import UNIDIRECTIONAL_LSTM, Activation
from .lowering import Rows, policy_dot, policy_float

_NAME = "UNIDIRECTIONAL_SEQUENCE_LSTM"

#: This module's entries of the XLA table (kiln/xla/table.py's `fill` registers them).
ROWS = Rows()


def _weight(a):
    """A weight as float32: NumPy stays NumPy (a constant of the trace), a JAX array (a
    parameter `to_jax` passes) stays JAX."""
    if a is None:
        return None
    return np.asarray(a, np.float32) if isinstance(a, np.ndarray) else jnp.asarray(a).astype(jnp.float32)


def read_lstm(name: str, inputs, lay):
    """kiln.ops.lstm's reader for a lowering: its checks, made on the operands' shapes, and its
    structure, holding the weights as given (constants, or parameters being traced)."""
    stand_ins = [None if a is None else np.broadcast_to(np.float32(0), np.shape(a)) for a in inputs]
    checked = read_operands(name, stand_ins, lay)

    def get(i):
        return inputs[i] if i < len(inputs) else None

    def gather(indices, names=GATES):
        return {g: _weight(get(i)) for g, i in zip(names, indices) if get(i) is not None}

    return dataclasses.replace(
        checked, input_w=gather(lay.input_weights), recurrent_w=gather(lay.recurrent_weights), bias=gather(lay.biases),
        peephole=gather(lay.peepholes, ("i", "f", "o")), layer_norm=gather(lay.layer_norm),
        aux_w=gather(lay.aux_weights), projection_w=_weight(get(lay.projection_weights)),
        projection_b=_weight(get(lay.projection_bias)))


def lstm_scan(p, xt, h0, c0, opts, reverse: bool = False):
    """One direction over time-major ``xt`` [T, B, I]; returns (outputs [T, B, O], h, c). The
    products are `policy_dot`'s (bfloat16 under the dtype_policy); gates and states stay float32,
    as LiteRT keeps them."""
    gates = p.gates
    act = partial(apply_activation, act=opts.fused_activation_function, xp=jnp)
    cell_clip, proj_clip = float(opts.cell_clip), float(opts.proj_clip)
    n = p.n_cell
    stacked = jnp.concatenate([p.input_w[g] for g in gates])                  # [G*C, I]
    bias = jnp.concatenate([np.zeros(n, np.float32) if g in p.layer_norm else p.bias[g] for g in gates])
    recurrent = jnp.concatenate([p.recurrent_w[g] for g in gates]).T         # [O, G*C]
    T, B, _ = xt.shape
    part = policy_dot("ki,gi->kg", xt.reshape(T * B, -1), stacked) + bias
    part = part.reshape(T, B, len(gates) * n)
    column = {g: k for k, g in enumerate(gates)}
    proj_w = None if p.projection_w is None else p.projection_w.T

    def finish(g, pre):
        return finish_gate(p, g, pre, jnp)

    def step(carry, x_part):
        h, c = carry
        pre_all = x_part + policy_dot("bo,og->bg", h, recurrent)
        pre = {g: pre_all[:, column[g] * n:(column[g] + 1) * n] for g in gates}
        for g in ("i", "f"):
            if g in pre and g in p.peephole:
                pre[g] = pre[g] + p.peephole[g] * c
        f = sigmoid(finish("f", pre["f"]), jnp)
        i = 1.0 - f if p.cifg else sigmoid(finish("i", pre["i"]), jnp)
        g_val = act(finish("c", pre["c"]))
        c = clip(f * c + i * g_val, cell_clip)
        if "o" in p.peephole:
            pre["o"] = pre["o"] + p.peephole["o"] * c
        o = sigmoid(finish("o", pre["o"]), jnp)
        m = o * act(c)
        if proj_w is not None:
            m = policy_dot("bc,co->bo", m, proj_w)
            if p.projection_b is not None:
                m = m + p.projection_b
            m = clip(m, proj_clip)
        return (m, c), m

    (h, c), out = lax.scan(step, (h0, c0), part, reverse=reverse)
    return out, h, c


def _uni_lstm(call, *inputs):
    opts = call.opts
    time_major = bool(opts.time_major)
    x = inputs[0]
    if x is None or len(inputs) <= 4 or inputs[4] is None:
        raise OpError(f"{_NAME}: the input (operand 0) and input_to_output weights (operand 4) are required")
    if not (policy_float(x.dtype) and policy_float(inputs[4].dtype)):
        raise OpError(f"{_NAME}: input and weights must be float32, got {x.dtype} and {inputs[4].dtype}")
    if x.ndim != 3:
        raise OpError(f"{_NAME}: input must be 3-D, got shape {list(x.shape)}")
    xt = inputs[0] if time_major else jnp.swapaxes(inputs[0], 0, 1)
    check_clips(_NAME, opts)
    p = read_lstm(_NAME, inputs, UNIDIRECTIONAL_LSTM)
    check_lstm_sizes(_NAME, p, xt.shape[2], None)
    batch = xt.shape[1]
    h_in, c_in = inputs[UNIDIRECTIONAL_LSTM.output_state], inputs[UNIDIRECTIONAL_LSTM.cell_state]
    for what, a, cols in (("output/activation state", h_in, p.n_output), ("cell_state", c_in, p.n_cell)):
        state_operand(_NAME, what, np.zeros(np.shape(a)) if a is not None else None, batch, cols)  # size check
    h0 = jnp.asarray(h_in).astype(jnp.float32).reshape(batch, p.n_output)
    c0 = jnp.asarray(c_in).astype(jnp.float32).reshape(batch, p.n_cell)
    out, h, c = lstm_scan(p, jnp.asarray(xt).astype(jnp.float32), h0, c0, opts)
    return with_state(call, [out if time_major else jnp.swapaxes(out, 0, 1)], (h, c))


def uni_lstm_check(op, opts):
    if opts.fused_activation_function == Activation.NONE:
        return (f"{_NAME} with fused activation NONE reproduces a LiteRT buffer quirk that is not "
                "lowered")
    if opts.diagonal_recurrent_tensors:
        return f"{_NAME} with diagonal recurrent weights is not lowered"
    return None


ROWS.add(_NAME, _uni_lstm, check=uni_lstm_check)
