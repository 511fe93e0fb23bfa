"""Keras LSTM composites -> fused sequence LSTMs.

Three contracts arrive here:

* ``lstm_<uuid>`` — tf_keras' own ``api_implements`` function (``standard_lstm``): arguments
  (inputs, init_h, init_c, kernel, recurrent_kernel, bias[, mask, sequence_lengths]),
  function attrs ``time_major`` and ``go_backwards``, five results (last output, outputs,
  final h, final c, runtime). This is what a tf_keras SavedModel or concrete function holds.
* ``kiln_keras_lstm`` — the composite `kiln.converter.keras.layers` wraps around each Keras 3
  or tf_keras LSTM layer while a Keras model is converted: arguments (inputs, h0, c0, kernel,
  recurrent_kernel, bias), attrs describing the layer, results (output, final h, final c).
* ``kiln_keras_bidirectional_lstm`` — the same for a Bidirectional(LSTM) layer: arguments
  (inputs, then h0, c0, kernel, recurrent_kernel, bias of the forward and of the backward
  layer), results (the merged output — two outputs when merge_mode is None — then final h
  and c of the forward and of the backward layer). ONE BIDIRECTIONAL_SEQUENCE_LSTM.

Keras stacks gates as i, f, c, o — LiteRT's order — so kernels are only transposed and cut.
No cell clip is set: Keras does not clip (TensorFlow's converter sets 10, which changes
results once |c| > 10).
"""

from __future__ import annotations

import numpy as np

from ..schema import DType
from .helpers import FusionBuilder, note_fused, reject
from .lstm import ACTIVATIONS, LstmOptions, LstmResult, LstmWeights, emit_bidirectional_lstm, \
    emit_lstm
from .registry import CompositeCall

KERAS_LSTM = "kiln_keras_lstm"
KERAS_BIDIRECTIONAL_LSTM = "kiln_keras_bidirectional_lstm"
MERGE_MODES = ("concat", "sum", "mul", "ave", "none")
_RUNTIME_CPU = 1.0  # tf_keras' gru_lstm_utils.RUNTIME_CPU: the value standard_lstm returns


def _text(value, default: str = "") -> str:
    if value is None:
        return default
    return value.decode() if isinstance(value, bytes) else str(value)


def _options(call: CompositeCall, op_name: str, prefix: str = "") -> LstmOptions:
    """The fused op's options from the layer attrs, or NotFusable saying what LiteRT lacks."""
    act = _text(call.attrs.get(f"{prefix}activation"), "tanh")
    rec = _text(call.attrs.get(f"{prefix}recurrent_activation"), "sigmoid")
    if rec != "sigmoid":
        raise reject(call, f"recurrent_activation={rec!r} is not expressible in {op_name} "
                           "(its gates are always sigmoid)")
    if act not in ACTIVATIONS:
        raise reject(call, f"activation={act!r} is not expressible in {op_name} (its cell "
                           f"activation is one of {', '.join(ACTIVATIONS)})")
    return LstmOptions(activation=ACTIVATIONS[act], cell_clip=0.0,
                       time_major=bool(call.attrs.get("time_major", False)))


def _check_sequence(call: CompositeCall, x, op_name: str) -> None:
    if x.dtype != DType.FLOAT32:
        raise reject(call, f"{op_name} is float32; the layer computes in {x.dtype.name}")
    if x.rank != 3:
        raise reject(call, f"the LSTM input must be 3-D, got shape {list(x.signature)}")


def _weights(call: CompositeCall, b: FusionBuilder, kernel, recurrent, bias) -> LstmWeights:
    for t, what in ((kernel, "kernel"), (recurrent, "recurrent_kernel"), (bias, "bias")):
        if t.dtype != DType.FLOAT32:
            raise reject(call, f"{what} is {t.dtype.name}; the fused LSTM is float32")
        if any(d < 0 for d in t.signature):
            raise reject(call, f"{what} has an unknown shape {list(t.signature)}")
    return LstmWeights.from_stacked(b, kernel, recurrent, bias, layout="ifco")


def _run_uni(call: CompositeCall, b: FusionBuilder, x, h0, c0, kernel, recurrent, bias,
             options: LstmOptions, *, go_backwards: bool, stateful: bool) -> LstmResult:
    """One LSTM layer; Keras' go_backwards reverses the input and keeps the outputs in
    processing order, so only the input is reversed."""
    weights = _weights(call, b, kernel, recurrent, bias)
    if go_backwards:
        x = b.reverse(x, 0 if options.time_major else 1, what="reversed_input")
    return emit_lstm(b, x, weights, options, initial_state=(h0, c0), stateful=stateful)


def fuse_tf_keras_lstm(call: CompositeCall) -> list:
    """tf_keras' ``lstm_<uuid>`` function (see the module docstring)."""
    op_name = "UNIDIRECTIONAL_SEQUENCE_LSTM"
    if len(call.inputs) != 6:
        raise reject(call, "the layer gets a mask or sequence lengths (masking or ragged input); "
                           f"{op_name} has no mask operand")
    x, h0, c0, kernel, recurrent, bias = call.inputs
    _check_sequence(call, x, op_name)
    options = LstmOptions(time_major=bool(call.attrs.get("time_major", False)))
    b = FusionBuilder(call)
    res = _run_uni(call, b, x, h0, c0, kernel, recurrent, bias, options,
                   go_backwards=bool(call.attrs.get("go_backwards", False)), stateful=False)
    last = res.last_output()
    seq = res.sequence
    t_axis = res.time_axis
    wanted = call.output_shapes[1] if len(call.output_shapes) > 1 else None
    if wanted is not None and len(wanted) == 3 and wanted[t_axis] == 1 and x.signature[t_axis] != 1:
        # return_sequences=False: standard_lstm's "outputs" is the last output as one step
        sig = list(seq.signature)
        sig[t_axis] = 1
        seq = b.reshape(last, sig, what="last_output_as_sequence")
    runtime = b.const(np.asarray(_RUNTIME_CPU, np.float32), "runtime")
    note_fused(call, op_name)
    return [last, seq, last, res.final_cell_state(), runtime]


def fuse_keras_lstm(call: CompositeCall) -> list:
    """kiln's per-layer composite (see the module docstring)."""
    op_name = "UNIDIRECTIONAL_SEQUENCE_LSTM"
    if len(call.inputs) != 6:
        raise reject(call, f"{KERAS_LSTM} takes 6 arguments, got {len(call.inputs)}")
    x, h0, c0, kernel, recurrent, bias = call.inputs
    _check_sequence(call, x, op_name)
    options = _options(call, op_name)
    b = FusionBuilder(call)
    stateful = bool(call.attrs.get("stateful", False))
    res = _run_uni(call, b, x, h0, c0, kernel, recurrent, bias, options,
                   go_backwards=bool(call.attrs.get("go_backwards", False)), stateful=stateful)
    out = res.sequence if call.attrs.get("return_sequences", False) else res.last_output()
    note_fused(call, op_name + (" (stateful)" if stateful else ""))
    return [out, res.last_output(), res.final_cell_state()]


def fuse_keras_bidirectional_lstm(call: CompositeCall) -> list:
    """kiln's Bidirectional(LSTM) composite -> ONE BIDIRECTIONAL_SEQUENCE_LSTM."""
    op_name = "BIDIRECTIONAL_SEQUENCE_LSTM"
    if len(call.inputs) != 11:
        raise reject(call, f"{KERAS_BIDIRECTIONAL_LSTM} takes 11 arguments, got {len(call.inputs)}")
    x, fw_args, bw_args = call.inputs[0], call.inputs[1:6], call.inputs[6:11]
    _check_sequence(call, x, op_name)
    fw_opts = _options(call, op_name, "forward_")
    bw_opts = _options(call, op_name, "backward_")
    if fw_opts.activation != bw_opts.activation:
        raise reject(call, f"the forward and backward layers use different activations; {op_name} "
                           "has one")
    merge = _text(call.attrs.get("merge_mode"), "concat").lower() or "none"
    if merge not in MERGE_MODES:
        raise reject(call, f"merge_mode={merge!r} is not one of {MERGE_MODES}")
    seqs = bool(call.attrs.get("return_sequences", False))
    stateful = bool(call.attrs.get("stateful", False))
    b = FusionBuilder(call)
    fw = _weights(call, b, *fw_args[2:])
    bw = _weights(call, b, *bw_args[2:])
    res = emit_bidirectional_lstm(
        b, x, fw, bw, fw_opts, initial_states=(fw_args[0], fw_args[1], bw_args[0], bw_args[1]),
        stateful=stateful, merge_outputs=seqs and merge == "concat")
    if seqs and merge == "concat":
        ys = [res.merged]
    else:
        pick = res.direction_output if seqs else res.last_output
        y_fw, y_bw = pick(0), pick(1)
        if merge == "none":
            ys = [y_fw, y_bw]
        elif merge == "concat":
            ys = [b.concat([y_fw, y_bw], -1, what="merged")]
        elif merge == "sum":
            ys = [b.add(y_fw, y_bw, what="merged")]
        elif merge == "mul":
            ys = [b.mul(y_fw, y_bw, what="merged")]
        else:  # ave: (y + y_rev) / 2, exactly a multiplication by one half
            ys = [b.mul(b.add(y_fw, y_bw, what="sum"), np.asarray(0.5, np.float32), what="merged")]
    states = [res.last_output(0), res.final_cell_state(0), res.last_output(1),
              res.final_cell_state(1)]
    note_fused(call, f"one {op_name} (merge_mode={merge})")
    return ys + states


def fuse_tf_keras_gru(call: CompositeCall) -> list:
    """tf_keras' ``gru_<uuid>`` functions: said so, then inlined (LiteRT has no fused GRU)."""
    raise reject(call, "LiteRT has no fused GRU op; the GRU is converted as a loop")
