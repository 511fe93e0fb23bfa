"""Op family: the plain RNN ops — RNN, UNIDIRECTIONAL_SEQUENCE_RNN, BIDIRECTIONAL_SEQUENCE_RNN.

State handling and numerics as the LSTMs' (kiln/ops/lstm.py, whose helpers they share): the
hidden state is a variable tensor (the records' ``state_operands``), returned after the outputs.
"""

from __future__ import annotations

import numpy as np

from ..errors import OpError
from ..kernels.float_math import arithmetic
from ..schema import Activation
from .lstm import (
    _check_float,
    _check_shape,
    optional_operand,
    _hybrid_version,
    _swap_time_batch,
)
from .record import KernelCall, OpDef, OptionsSpec, apply_activation, on_numpy, with_state


def _rnn_operands(xp, name: str, x, w, r, b, h_in, batch: int):
    """Check one RNN cell's operands; returns (w, r, b, h0 [batch, units]) as float32."""
    if any(a is None for a in (x, w, r, b)):
        raise OpError(f"{name}: input, weights, recurrent weights and bias are all required")
    _check_float(name, x, w)
    w, r, b = (xp.asarray(a, np.float32) for a in (w, r, b))
    units = w.shape[0]
    _check_shape(name, "weights", w, (units, x.shape[-1]))
    _check_shape(name, "recurrent weights", r, (units, units))
    _check_shape(name, "bias", b, (units,))
    if h_in is None:
        raise OpError(f"{name}: the hidden state operand (a variable tensor) is missing")
    _check_shape(name, "hidden state", h_in, (batch, units))
    return w, r, b, xp.asarray(h_in, np.float32)


def _run_rnn(xp, x, w, r, b, h, act, *, reverse=False, aux=None, aux_w=None):
    """h_t = act(W·x_t [+ W_aux·aux_t] + R·h_{t-1} + b) over time-major ``x``: (outputs, last h).
    The products and the loop over time are the namespace's own (`arithmetic`)."""
    f = arithmetic(xp)
    part = f.matmul(x, w.T) + b
    if aux is not None and aux_w is not None:
        part = part + f.matmul(aux, aux_w.T)

    def step(h, part_t):
        return apply_activation(xp.asarray(part_t + f.matmul(h, r.T), np.float32), act, xp)

    return f.recur(step, h, part, reverse=reverse)


def rnn(xp, call: KernelCall, x, w, r, b, h_in):
    """RNN (one step) over array namespace ``xp`` (NumPy here, jax.numpy in kiln.xla)."""
    name = "RNN"
    if x is None or x.ndim != 2:
        raise OpError(f"{name}: input must be 2-D [batch, input], got {list(np.shape(x))}")
    w, r, b, h0 = _rnn_operands(xp, name, x, w, r, b, h_in, x.shape[0])
    out, h = _run_rnn(xp, xp.asarray(x, np.float32)[None], w, r, b, h0, call.opts.fused_activation_function)
    return with_state(call, [out[0]], [h])


def uni_rnn(xp, call: KernelCall, x, w, r, b, h_in):
    """UNIDIRECTIONAL_SEQUENCE_RNN over array namespace ``xp``."""
    name = "UNIDIRECTIONAL_SEQUENCE_RNN"
    if x is None or x.ndim != 3:
        raise OpError(f"{name}: input must be 3-D, got {list(np.shape(x))}")
    time_major = bool(call.opts.time_major)
    xt = _swap_time_batch(xp.asarray(x, np.float32), time_major)
    w, r, b, h0 = _rnn_operands(xp, name, x, w, r, b, h_in, xt.shape[1])
    out, h = _run_rnn(xp, xt, w, r, b, h0, call.opts.fused_activation_function)
    return with_state(call, [_swap_time_batch(out, time_major)], [h])


def bidi_rnn_routing(name: str, inputs, xt, time_major: bool, to_time_major):
    """BIDIRECTIONAL_SEQUENCE_RNN's aux input (operands 9-11), checked and routed as LiteRT
    routes it: (the backward direction's input, the aux input both directions add through
    their aux weights or None, the forward and backward aux weights). ``xt``: the time-major
    input; ``to_time_major``: the caller's conversion of the aux input."""
    aux_in, fw_aux_w, bw_aux_w = (optional_operand(inputs, i) for i in (9, 10, 11))
    if (fw_aux_w is None) != (bw_aux_w is None):
        raise OpError(f"{name}: aux weights (operands 10, 11) must be given for both directions "
                      "or for neither")
    if fw_aux_w is not None and aux_in is None:
        raise OpError(f"{name}: aux weights given but no aux input (operand 9)")
    aux_t = None if aux_in is None else to_time_major(aux_in)
    cross_linked = aux_t is None or fw_aux_w is not None
    # LiteRT quirk, reproduced: batch-major, an aux input without aux weights is *not* used as
    # the backward input (only the time-major path reads it); the backward cell reads `input`.
    bw_x = xt if (cross_linked or not time_major) else aux_t
    return bw_x, aux_t if cross_linked else None, fw_aux_w, bw_aux_w


def bidi_rnn(xp, call: KernelCall, *inputs):
    """BIDIRECTIONAL_SEQUENCE_RNN over array namespace ``xp``."""
    name = "BIDIRECTIONAL_SEQUENCE_RNN"
    opts = call.opts
    x = inputs[0]
    if x is None or x.ndim != 3:
        raise OpError(f"{name}: input must be 3-D, got {list(np.shape(x))}")
    time_major = bool(opts.time_major)
    xt = _swap_time_batch(xp.asarray(x, np.float32), time_major)
    batch = xt.shape[1]
    bw_x, real_aux, fw_aux_w, bw_aux_w = bidi_rnn_routing(
        name, inputs, xt, time_major, lambda a: _swap_time_batch(xp.asarray(a, np.float32), time_major))
    fw_w, fw_r, fw_b, fw_h0 = _rnn_operands(xp, name, x, *inputs[1:5], batch)
    bw_w, bw_r, bw_b, bw_h0 = _rnn_operands(xp, name, bw_x, *inputs[5:9], batch)
    act = opts.fused_activation_function
    fw_aux_w, bw_aux_w = (None if a is None else xp.asarray(a, np.float32) for a in (fw_aux_w, bw_aux_w))
    fw_out, fw_h = _run_rnn(xp, xt, fw_w, fw_r, fw_b, fw_h0, act, aux=real_aux, aux_w=fw_aux_w)
    bw_out, bw_h = _run_rnn(xp, bw_x, bw_w, bw_r, bw_b, bw_h0, act, reverse=True, aux=real_aux, aux_w=bw_aux_w)
    outs = [xp.concatenate([fw_out, bw_out], axis=-1)] if opts.merge_outputs else [fw_out, bw_out]
    return with_state(call, [_swap_time_batch(o, time_major) for o in outs], [fw_h, bw_h])


OPS: tuple = (
    OpDef(
        "UNIDIRECTIONAL_SEQUENCE_RNN", on_numpy(uni_rnn),
        OptionsSpec("SequenceRNNOptions", {
            "time_major": False, "fused_activation_function": Activation.NONE,
            "asymmetric_quantize_inputs": False,
        }),
        version=_hybrid_version(1), max_version=3,
        runtime_versions=("1.14.0", "1.14.0", "2.3.0"),
        state_operands=(4,),
    ),
    OpDef(
        "BIDIRECTIONAL_SEQUENCE_RNN", on_numpy(bidi_rnn),
        OptionsSpec("BidirectionalSequenceRNNOptions", {
            "time_major": False, "fused_activation_function": Activation.NONE,
            "merge_outputs": False, "asymmetric_quantize_inputs": False,
        }),
        version=_hybrid_version(1), max_version=3,
        runtime_versions=("1.14.0", "1.14.0", "2.3.0"),
        state_operands=(4, 8),
    ),
    OpDef(
        "RNN", on_numpy(rnn),
        OptionsSpec("RNNOptions", {
            "fused_activation_function": Activation.NONE, "asymmetric_quantize_inputs": False,
        }),
        version=_hybrid_version(1), max_version=3,
        runtime_versions=("1.5.0", "1.14.0", "2.3.0"),
        state_operands=(4,),
    ),
)
