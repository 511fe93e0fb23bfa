"""Full-integer UNIDIRECTIONAL_SEQUENCE_LSTM: TF's int8 LSTM layout, which LiteRT's
8x8→16 integer kernel runs (kernels/unidirectional_sequence_lstm.cc, lstm_eval.cc).

Layout (TF 2.21's MLIR quantizer, measured on a tf_keras LSTM): input and output int8
(calibrated); gate weights int8, symmetric, **per tensor**; gate biases int32 at
``input_scale · input_to_gate_weight_scale``; the output state a variable int8 tensor with the
output's parameters (without projection the kernel writes the hidden value straight into
it); the cell state a variable int16 tensor, zero point 0, scale ``2^p / 2^15`` with
``p = ceil(log2 max|c|)`` (a power of two: the kernel shifts it into Q3.12 for tanh); five
intermediates — four float placeholders (used only with layer norm) and the hidden state, int8
at the output's parameters. Gates run at the kernel's fixed Q3.12.

Two deliberate differences from TF: ``p`` is at least 0, as in TF's older quantizer — TF 2.21
writes 2^-16 for cells within ±0.5, and LiteRT's kernel then computes garbage (measured: error
0.2 on outputs of 0.12, 0.3 on a tf_keras LSTM); and the cell range is recorded at every time
step (`CellRange`), where TF's calibrator sees the state only after the op ran. Only the cell
Keras builds is handled — sigmoid gates, tanh, no peephole, layer norm or projection, state
in variable tensors; other LSTMs stay float.
"""

from __future__ import annotations

import math

import numpy as np

from ..ir import Operator, QuantParams, Tensor
from ..schema import UNIDIRECTIONAL_LSTM as LAYOUT
from ..schema import Activation, DType
from . import params
from .calibrate import Range

#: The Q3.12 tanh input takes the cell state at most 2^6 (cell scale 2^-9).
MAX_CELL_POWER = 6


def _operand(op: Operator, i: int) -> Tensor | None:
    return op.inputs[i] if i < len(op.inputs) else None


#: BIDIRECTIONAL_SEQUENCE_LSTM: (first weight operand, output state, cell state) per direction.
_BIDI_HALVES = ((1, 35, 36), (18, 37, 38))
_BIDI_AUX = range(39, 48)


def _bidi_half(op: Operator, base: int, h: int, c: int) -> list:
    """One direction of a bidirectional LSTM as a unidirectional LSTM's operand list."""
    return [op.inputs[0], *(_operand(op, i) for i in range(base, base + 17)), _operand(op, h), _operand(op, c)]


def split_bidirectional(op: Operator) -> bool:
    """Replace a BIDIRECTIONAL_SEQUENCE_LSTM (which LiteRT runs in float or hybrid only) by two
    UNIDIRECTIONAL_SEQUENCE_LSTMs, the backward one between REVERSE_V2s along time, when both
    halves can take the integer layout. Float-equivalent; returns whether it split."""
    if any(_operand(op, i) is not None for i in _BIDI_AUX):
        return False
    halves = [_bidi_half(op, *half) for half in _BIDI_HALVES]
    if any(_cell_refusal(half, op.options, op) is not None for half in halves):
        return False
    sg, x, opts = op.subgraph, op.inputs[0], op.options
    merged = bool(opts["merge_outputs"])
    originals = list(op.outputs)
    op.set_outputs([sg.add_tensor(sg.unique_name(f"{t.name}_split"), t.dtype, t.shape) for t in originals])
    index = sg.operators.index(op)
    sg.remove_operator(op)

    def sequence(name: str, width: int) -> Tensor:
        signature = None if x.shape_signature is None else [*x.shape_signature[:2], width]
        return sg.add_tensor(sg.unique_name(name), DType.FLOAT32, [*x.shape[:2], width], shape_signature=signature)

    widths = [half[LAYOUT.recurrent_weights[0]].shape[1] for half in halves]
    fw_out = sequence(f"{originals[0].name}_fw", widths[0]) if merged else originals[0]
    bw_out = sequence(f"{originals[0].name}_bw", widths[1]) if merged else originals[1]
    time_axis = np.asarray([0 if opts["time_major"] else 1], np.int32)
    axis = sg.add_constant(sg.unique_name(f"{x.name}_time_axis"), time_axis)
    x_reversed = sequence(f"{x.name}_reversed", x.shape[2])
    bw_reversed = sequence(f"{bw_out.name}_reversed", widths[1])
    uni = {"fused_activation_function": opts["fused_activation_function"], "cell_clip": opts["cell_clip"],
           "proj_clip": opts["proj_clip"], "time_major": bool(opts["time_major"])}
    steps = [("REVERSE_V2", [x, axis], [x_reversed], {}),
             ("UNIDIRECTIONAL_SEQUENCE_LSTM", halves[0] + [None] * 4, [fw_out], uni),
             ("UNIDIRECTIONAL_SEQUENCE_LSTM", [x_reversed, *halves[1][1:]] + [None] * 4, [bw_reversed], uni),
             ("REVERSE_V2", [bw_reversed, axis], [bw_out], {})]
    if merged:
        steps.append(("CONCATENATION", [fw_out, bw_out], [originals[0]], {"axis": 2}))
    for k, (op_type, inputs, outputs, options) in enumerate(steps):
        sg.add_operator(op_type, inputs, outputs, index=index + k, options=options)
    return True


def refusal(op: Operator) -> str | None:
    """Why LiteRT's integer kernel cannot run ``op`` as kiln quantizes it (None: it can)."""
    if op.op_type != "UNIDIRECTIONAL_SEQUENCE_LSTM":
        return "only UNIDIRECTIONAL_SEQUENCE_LSTM has an integer kernel"
    return _cell_refusal(list(op.inputs), op.options, op)


def _cell_refusal(inputs: list, opts, owner: Operator) -> str | None:
    """`refusal` on a unidirectional LSTM's operand list (also one half of a bidirectional one)."""
    def operand(i: int) -> Tensor | None:
        return inputs[i] if i < len(inputs) else None

    optional = (*LAYOUT.peepholes, LAYOUT.projection_weights, LAYOUT.projection_bias, *LAYOUT.layer_norm)
    gates = (*LAYOUT.input_weights, *LAYOUT.recurrent_weights, *LAYOUT.biases)
    if any(operand(i) is not None for i in optional):
        return "peephole, projection or layer-norm LSTM (kiln quantizes the plain cell only)"
    if any(operand(i) is None or not operand(i).is_constant for i in gates):
        return "gate weights and biases must all be constants (no CIFG)"
    if opts["fused_activation_function"] != Activation.TANH or opts.get("diagonal_recurrent_tensors", False):
        return "the integer kernel computes tanh cells only"
    for i in LAYOUT.states:
        t = operand(i)
        if t is None or not t.is_variable or t.dtype != DType.FLOAT32:
            return f"operand {i} (state) must be a float variable tensor"
        if t.producer is not None and zero_fill(t) is None:
            return f"operand {i} (state) starts from a given initial state (only zero states are quantized)"
        if any(user is not owner for user, _ in t.users):
            return f"operand {i} (state) is read by other nodes (an LSTM returning its states stays float)"
    return None


def zero_fill(state: Tensor) -> Operator | None:
    """The FILL(dims, 0) that zeroes ``state`` before each run (how kiln's LSTM fusion resets
    a state with a free batch), or None."""
    writer = state.producer
    if writer is None or writer.op_type != "FILL" or len(writer.inputs) < 2:
        return None
    value = writer.inputs[1]
    return writer if value is not None and value.is_constant and not np.any(value.data) else None


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


class CellRange:
    """A calibration observer: the range of one LSTM's cell state over every time step,
    recomputed in float from the op's input (states start at zero, as calibration resets
    the variables before each sample)."""

    def __init__(self, op: Operator):
        self.op, self.cell = op, op.inputs[LAYOUT.cell_state]
        self.range = Range(np.inf, -np.inf)
        self.w = np.concatenate([op.inputs[i].data for i in LAYOUT.input_weights]).astype(np.float32)
        self.r = np.concatenate([op.inputs[i].data for i in LAYOUT.recurrent_weights]).astype(np.float32)
        self.b = np.concatenate([op.inputs[i].data for i in LAYOUT.biases]).astype(np.float32)
        self.clip = float(op.options["cell_clip"])

    def __call__(self, value_of) -> None:
        x = np.asarray(value_of(self.op.inputs[0]), np.float32)
        if not self.op.options["time_major"]:
            x = np.swapaxes(x, 0, 1)                      # [T, B, I]
        n = self.b.size // 4
        h = np.zeros((x.shape[1], self.r.shape[1]), np.float32)
        c = np.zeros((x.shape[1], n), np.float32)
        peak = 0.0
        with np.errstate(over="ignore"):
            for x_t in x:
                z = x_t @ self.w.T + h @ self.r.T + self.b
                i, f, g, o = _sigmoid(z[:, :n]), _sigmoid(z[:, n:2 * n]), np.tanh(z[:, 2 * n:3 * n]), \
                    _sigmoid(z[:, 3 * n:])
                c = f * c + i * g
                if self.clip > 0:
                    c = np.clip(c, -self.clip, self.clip)
                h = o * np.tanh(c)
                peak = max(peak, float(np.abs(c).max(initial=0.0)))
        self.range.update(np.asarray([-peak, peak], np.float32))


def cell_state_params(r: Range) -> QuantParams:
    """int16, zero point 0, scale a power of two covering the calibrated cell range, at least
    2^-15 (LiteRT's integer kernel mis-computes finer cell scales: measured)."""
    peak = max(abs(r.min), abs(r.max), 2.0 ** -15)
    power = min(max(math.ceil(math.log2(peak)), 0), MAX_CELL_POWER)
    return QuantParams([np.float32(2.0 ** power / 32768)], [0])


def quantize_lstm(rewriter, op: Operator) -> None:
    """Rewrite ``op`` (checked by `refusal`, input and output calibrated) into TF's int8
    layout. ``rewriter`` is kiln.quant.static's rewriter: it supplies int8 tensors for the
    input and turns the output int8."""
    sg = rewriter.sg
    x = op.inputs[0]
    r = rewriter.ranges[id(x)]
    x_qp = QuantParams(*_affine(params.activation_int8(r.min, r.max)))
    x_q = rewriter.quantized_input(op, x, x_qp, DType.INT8)
    op.set_input(0, x_q)
    x_scale = np.float32(x_q.quantization.scale[0])
    out = op.outputs[0]
    r = rewriter.ranges[id(out)]
    out_qp = QuantParams(*_affine(params.activation_int8(r.min, r.max)))
    for gate, (w_i, b_i) in enumerate(zip(LAYOUT.input_weights, LAYOUT.biases)):
        w = op.inputs[w_i]
        qw, wa = params.symmetric_weights(w.data, None)
        op.set_input(w_i, sg.add_constant(w.name, qw, quantization=QuantParams(wa.scale, wa.zero_point)))
        b = op.inputs[b_i]
        qb, ba = params.bias(b.data, float(x_scale), wa.scale)
        op.set_input(b_i, sg.add_constant(b.name, qb, quantization=QuantParams(ba.scale[:1], ba.zero_point[:1])))
    for w_i in LAYOUT.recurrent_weights:
        w = op.inputs[w_i]
        qw, wa = params.symmetric_weights(w.data, None)
        op.set_input(w_i, sg.add_constant(w.name, qw, quantization=QuantParams(wa.scale, wa.zero_point)))
    _state(op.inputs[LAYOUT.output_state], DType.INT8, out_qp)
    cell = op.inputs[LAYOUT.cell_state]
    _state(cell, DType.INT16, cell_state_params(rewriter.ranges.get(id(cell), Range(-1.0, 1.0))))
    names = ("input_to_input", "input_to_forget", "input_to_cell", "input_to_output")
    op.intermediates = [sg.add_tensor(sg.unique_name(f"{n}_intermediate"), DType.FLOAT32, (0,)) for n in names]
    op.intermediates.append(sg.add_tensor(sg.unique_name("effective_hidden_scale_intermediate"), DType.INT8, (0,),
                                          quantization=out_qp))
    rewriter.make_quantized(out, out_qp, DType.INT8)


def _affine(a: params.Affine):
    return a.scale, a.zero_point


def _state(t: Tensor, dtype: DType, qp: QuantParams) -> None:
    """Turn a state variable integer; its zero FILL writes the quantized zero (LiteRT's FILL
    wants the value's parameters to be the output's)."""
    t.dtype, t.quantization = dtype, qp
    if t.data is not None:
        t.data = np.zeros(t.data.shape, dtype.numpy)
    writer = zero_fill(t)
    if writer is not None:
        zero = np.asarray(qp.zero_point[0], dtype.numpy)
        writer.set_input(1, t.subgraph.add_constant(t.subgraph.unique_name(f"{t.name}_zero"), zero, quantization=qp))
