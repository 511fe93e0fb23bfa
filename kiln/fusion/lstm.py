"""Emit LiteRT's fused sequence LSTMs (UNIDIRECTIONAL_ / BIDIRECTIONAL_SEQUENCE_LSTM).

Every LSTM fusion (Keras, lingvo cells, user plugins) ends here: it describes each direction
as an `LstmWeights` (per-gate blocks in LiteRT's layout) and calls `emit_lstm` or
`emit_bidirectional_lstm`.

State. LiteRT keeps an LSTM's activation and cell state in *variable tensors* that persist
across invocations: the op reads them at the start and leaves the final states there. A
TensorFlow function starts every call from its initial state, so for an ordinary (not
stateful) LSTM kiln writes the initial state into the variables with one op before the
LSTM, each invocation. TensorFlow's converter does not, so its models continue from the
previous call's state on the second invoke. A *stateful* LSTM leaves the variables alone:
consecutive invocations continue the sequence and ``reset_all_variables()`` starts over.

Final states. The op has no state outputs. The final activation is the last step of the
output sequence (a STRIDED_SLICE, as TensorFlow emits). The final cell state is read back
from the cell-state variable by an op that also depends on the LSTM's output, so that every
scheduler (LiteRT's delegate partitioner included) runs it after the LSTM.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ..errors import KilnError
from ..ir import Operator, Tensor
from ..schema import Activation, DType
from .helpers import FusionBuilder, Operand, shape_of, value_of

GATES = "ifco"  # LiteRT's operand order: input, forget, cell candidate, output

#: Keras activation names the fused op can express as its fused activation. LiteRT's gates
#: are always sigmoid; "linear" maps to NONE, which LiteRT does not compute as identity.
ACTIVATIONS = {"tanh": Activation.TANH, "relu": Activation.RELU, "relu6": Activation.RELU6}


@dataclass
class LstmWeights:
    """One LSTM direction in LiteRT's operand layout (everything per gate).

    Attributes:
      input: gate -> [n_cell, n_input] input weights; no "i" entry means CIFG (i = 1 - f).
      recurrent: gate -> [n_cell, n_output] recurrent weights (same gates as ``input``).
      bias: gate -> [n_cell] (same gates).
      peephole: optional "i"/"f"/"o" -> [n_cell] diagonal cell-to-gate weights.
      projection: optional [n_output, n_cell]; projection_bias optional [n_output].
      layer_norm: optional gate -> [n_cell] coefficients (the gates of ``input``, all or none);
        LiteRT normalises W·x + R·h per gate, scales, then adds the bias.
    """

    input: Mapping[str, Operand]
    recurrent: Mapping[str, Operand]
    bias: Mapping[str, Operand]
    peephole: Mapping[str, Operand] = field(default_factory=dict)
    projection: Operand | None = None
    projection_bias: Operand | None = None
    layer_norm: Mapping[str, Operand] = field(default_factory=dict)

    @classmethod
    def from_stacked(cls, b: FusionBuilder, kernel: Operand, recurrent_kernel: Operand,
                     bias: Operand | None = None, *, layout: str = "ifco",
                     **extra) -> "LstmWeights":
        """From Keras-style stacked matrices: ``kernel`` [n_input, G*n_cell],
        ``recurrent_kernel`` [n_output, G*n_cell], ``bias`` [G*n_cell] (None: zeros), gates
        stacked in ``layout`` order. Transposed and cut into gates (folded when constant)."""
        k_t = b.transpose(kernel, what="kernel_t")
        r_t = b.transpose(recurrent_kernel, what="recurrent_kernel_t")
        n_gates = len(layout)
        if bias is None:
            bias = np.zeros(shape_of(kernel)[1], np.float32)
        return cls(
            input=b.split_gates(k_t, layout, 0, what="input_w_"),
            recurrent=b.split_gates(r_t, layout, 0, what="recurrent_w_"),
            bias=b.split_gates(bias, layout, 0, what="bias_") if n_gates else {},
            **extra,
        )

    # -- derived sizes ---------------------------------------------------------------------
    @property
    def cifg(self) -> bool:
        return "i" not in self.input

    @property
    def gates(self) -> str:
        return "fco" if self.cifg else GATES

    @property
    def n_cell(self) -> int:
        return shape_of(self.input["f"])[0]

    @property
    def n_input(self) -> int:
        return shape_of(self.input["f"])[1]

    @property
    def n_output(self) -> int:
        return self.n_cell if self.projection is None else shape_of(self.projection)[0]

    def check(self, what: str = "LSTM") -> None:
        """Refuse operands whose shapes do not fit together (a KilnError saying which)."""
        need = {"input": (self.n_cell, self.n_input), "recurrent": (self.n_cell, self.n_output),
                "bias": (self.n_cell,)}
        for part, shape in need.items():
            blocks = getattr(self, part)
            if set(blocks) != set(self.gates):
                raise KilnError(f"{what}: {part} blocks for gates {sorted(blocks)}, expected "
                                f"{sorted(self.gates)}")
            for g, t in blocks.items():
                if shape_of(t) != shape:
                    raise KilnError(f"{what}: {part} block of gate {g!r} has shape "
                                    f"{list(shape_of(t))}, expected {list(shape)}")
        if self.layer_norm and set(self.layer_norm) != set(self.gates):
            raise KilnError(f"{what}: layer-norm coefficients for gates {sorted(self.layer_norm)},"
                            f" expected {sorted(self.gates)}")
        for g, t in {**self.peephole, **self.layer_norm}.items():
            if shape_of(t) != (self.n_cell,):
                raise KilnError(f"{what}: per-cell vector for gate {g!r} has shape "
                                f"{list(shape_of(t))}, expected [{self.n_cell}]")
        if self.projection is not None and shape_of(self.projection)[1] != self.n_cell:
            raise KilnError(f"{what}: projection has shape {list(shape_of(self.projection))}, "
                            f"expected [n_output, {self.n_cell}]")

    def operands(self, b: FusionBuilder) -> list[Tensor | None]:
        """Operands 1-17 of UNIDIRECTIONAL_SEQUENCE_LSTM (None where absent)."""
        def t(x, what):
            return None if x is None else b.operand(x, what)

        ops = [t(self.input.get(g), f"input_w_{g}") for g in GATES]
        ops += [t(self.recurrent.get(g), f"recurrent_w_{g}") for g in GATES]
        ops += [t(self.peephole.get(g), f"peephole_{g}") for g in "ifo"]
        ops += [t(self.bias.get(g), f"bias_{g}") for g in GATES]
        ops += [t(self.projection, "projection_w"), t(self.projection_bias, "projection_b")]
        return ops

    def layer_norm_operands(self, b: FusionBuilder) -> list[Tensor | None]:
        return [None if g not in self.layer_norm else b.operand(self.layer_norm[g], f"ln_{g}")
                for g in GATES]


@dataclass
class LstmOptions:
    """The fused op's options: cell activation, clips (0 = none) and the input layout."""

    activation: Activation = Activation.TANH
    cell_clip: float = 0.0
    proj_clip: float = 0.0
    time_major: bool = False


@dataclass
class LstmResult:
    """What an emitted LSTM offers to the composite's outputs; derived values are emitted on
    first use only."""

    builder: FusionBuilder
    op: Operator
    sequence: Tensor            # [batch, time, n_output] (time-major: [time, batch, n_output])
    time_major: bool
    states: list[tuple[Tensor, Tensor]]   # (activation variable, cell variable) per direction
    outputs: list[Tensor]       # the op's outputs: one per direction, or the merged one
    split: int | None = None    # merged outputs: where the backward features start
    merged: Tensor | None = None  # both directions concatenated (bidirectional, when asked)
    _cache: dict = field(default_factory=dict)

    @property
    def time_axis(self) -> int:
        return 0 if self.time_major else 1

    def direction_output(self, d: int = 0) -> Tensor:
        """Output sequence of direction ``d`` (sliced out of a merged output on first use)."""
        if self.split is None:
            return self.outputs[d]
        key = ("direction", d)
        if key not in self._cache:
            merged = self.outputs[0]
            begin, size = [0, 0, 0], [-1, -1, -1]
            if d == 0:
                size[2] = self.split
            else:
                begin[2] = self.split
            self._cache[key] = self.builder.slice(merged, begin, size,
                                                  what="fw_sequence" if d == 0 else "bw_sequence")
        return self._cache[key]

    def last_output(self, d: int = 0) -> Tensor:
        """Final activation of direction ``d``: the last step it processed (the backward
        direction of the bidirectional op ends at time 0)."""
        key = ("last", d)
        if key not in self._cache:
            index = 0 if d == 1 else -1
            self._cache[key] = self.builder.step(self.direction_output(d), index, self.time_axis,
                                                 what="last_output" if d == 0 else "bw_last_output")
        return self._cache[key]

    def final_cell_state(self, d: int = 0) -> Tensor:
        """Final cell state of direction ``d``, read from its variable after the LSTM ran."""
        key = ("cell", d)
        if key not in self._cache:
            self._cache[key] = _read_after(self, self.states[d][1], d)
        return self._cache[key]


def _read_after(res: LstmResult, var: Tensor, d: int) -> Tensor:
    """``var + 0 * (something computed from the LSTM's output)``: the value of ``var`` once the
    LSTM has run, in an op that no scheduler can move before the LSTM."""
    b = res.builder
    n = var.signature[-1]
    last = res.last_output(d)
    if last.signature[-1] != n:  # projection: a [batch, 1] column broadcasts instead
        last = b.slice(last, [0, 0], [-1, 1], what="dependency")
    zero = b.mul(last, np.zeros((), np.float32), what="dependency")
    out = b.tensor("final_cell_state" if d == 0 else "bw_final_cell_state", DType.FLOAT32,
                   var.signature)
    b.emit("ADD", [var, zero], [out])
    return out


# -- state variables -----------------------------------------------------------------------

def _batch_dims(b: FusionBuilder, x: Tensor, n: int, time_major: bool) -> Tensor | np.ndarray:
    """The shape ``[batch, n]`` of a state for input ``x``: a constant when the batch is
    static, else computed from ``SHAPE(x)`` at run time (shared by every state of ``x``)."""
    batch_axis = 1 if time_major else 0
    batch = x.signature[batch_axis]
    if batch >= 0:
        return np.asarray([batch, n], np.int32)
    key = ("batch_dims", id(x), n)
    if key not in b.cache:
        col_key = ("batch_size", id(x))
        if col_key not in b.cache:
            shape = b.tensor("input_shape", DType.INT32, [len(x.signature)])
            b.emit("SHAPE", [x], [shape], {"out_type": int(DType.INT32)})
            size = b.tensor("batch_size", DType.INT32, [1])
            b.emit("STRIDED_SLICE", [shape, np.asarray([batch_axis], np.int32),
                                     np.asarray([batch_axis + 1], np.int32),
                                     np.ones(1, np.int32)], [size])
            b.cache[col_key] = size
        dims = b.tensor("state_shape", DType.INT32, [2])
        b.emit("CONCATENATION", [b.cache[col_key], np.asarray([n], np.int32)], [dims],
               {"axis": 0})
        b.cache[key] = dims
    return b.cache[key]


def _is_zero_fill(t: Operand | None) -> bool:
    """True for no initial state, an all-zero constant, or ``FILL(dims, 0)`` (how Keras and
    TensorFlow build a zero state): the state is then written by one FILL of zeros."""
    if t is None:
        return True
    value = value_of(t)
    if value is not None:
        return not np.any(value)
    producer = t.producer if isinstance(t, Tensor) else None
    if producer is None or producer.op_type != "FILL":
        return False
    fill_value = value_of(producer.inputs[1])
    return fill_value is not None and not np.any(fill_value)


def state_variable(b: FusionBuilder, what: str, x: Tensor, n: int, *, time_major: bool,
                   initial: Operand | None = None, stateful: bool = False) -> Tensor:
    """The [batch, n] variable tensor holding one LSTM state.

    Not stateful: one op writes ``initial`` (zeros when None) into the variable before the
    LSTM on every invocation. LiteRT allocates a variable tensor once, in its persistent
    arena, at the size of the first allocation, so with a dynamic batch the writer must be an
    op whose output LiteRT makes a *dynamic* tensor (reallocated when it grows): FILL or
    BROADCAST_TO with a shape computed at run time. Any other writer (an ADD, a MUL) would
    resize the variable past its buffer once the batch grows — wrong rows, heap corruption.

    Stateful: no op; LiteRT zeroes variables when tensors are allocated and on
    ``reset_all_variables()``, and the LSTM carries them forward.
    """
    batch = x.signature[1 if time_major else 0]
    if stateful and batch < 0:
        raise KilnError("a stateful LSTM needs a fixed batch size (the state variables have "
                        "one); give the model's input a static batch dimension")
    var = b.tensor(what, DType.FLOAT32, [batch, n], is_variable=True)
    if stateful:
        return var
    dims = _batch_dims(b, x, n, time_major)
    if _is_zero_fill(initial):
        b.emit("FILL", [dims, np.zeros((), np.float32)], [var])
    elif batch < 0:
        b.emit("BROADCAST_TO", [initial, dims], [var])
    else:  # static batch: LiteRT's plain copy-by-ADD keeps the variable at its one size
        b.emit("ADD", [initial, np.zeros((), np.float32)], [var])
    return var


# -- the ops -------------------------------------------------------------------------------

def emit_lstm(b: FusionBuilder, x: Tensor, weights: LstmWeights,
              options: LstmOptions | None = None, *,
              initial_state: Sequence[Operand | None] | None = None,
              stateful: bool = False) -> LstmResult:
    """Emit one UNIDIRECTIONAL_SEQUENCE_LSTM over ``x`` ([batch, time, n_input], or
    time-major). ``initial_state`` is (activation, cell), each [batch, n] or None for zeros.
    """
    options = options or LstmOptions()
    weights.check("LSTM weights")
    _check_input(x, weights, "LSTM")
    h0, c0 = initial_state or (None, None)
    tm = options.time_major
    h_var = state_variable(b, "output_state", x, weights.n_output, time_major=tm, initial=h0,
                           stateful=stateful)
    c_var = state_variable(b, "cell_state", x, weights.n_cell, time_major=tm, initial=c0,
                           stateful=stateful)
    seq_sig = list(x.signature[:2]) + [weights.n_output]
    out = b.tensor("sequence", DType.FLOAT32, seq_sig)
    inputs = [x] + weights.operands(b) + [h_var, c_var] + weights.layer_norm_operands(b)
    op = b.emit("UNIDIRECTIONAL_SEQUENCE_LSTM", inputs, [out], {
        "fused_activation_function": int(options.activation),
        "cell_clip": float(options.cell_clip),
        "proj_clip": float(options.proj_clip),
        "time_major": bool(tm),
    })
    return LstmResult(b, op, out, tm, [(h_var, c_var)], [out])


def emit_bidirectional_lstm(b: FusionBuilder, x: Tensor, forward: LstmWeights,
                            backward: LstmWeights, options: LstmOptions | None = None, *,
                            initial_states: Sequence[Operand | None] | None = None,
                            stateful: bool = False, merge_outputs: bool = False) -> LstmResult:
    """Emit ONE BIDIRECTIONAL_SEQUENCE_LSTM. The backward direction's outputs are aligned
    with the input (step t at index t). ``initial_states``: (fw_h, fw_c, bw_h, bw_c).
    ``merge_outputs``: also give the two directions concatenated on the last axis
    (`LstmResult.merged`). The op's own merge_outputs is used for time-major input only:
    LiteRT 2.3 writes the backward half of a merged batch-major output wrongly, so
    batch-major outputs are concatenated by a CONCATENATION after the op."""
    options = options or LstmOptions()
    for w, side in ((forward, "forward"), (backward, "backward")):
        w.check(f"{side} weights")
        if w.layer_norm:
            raise KilnError("BIDIRECTIONAL_SEQUENCE_LSTM has no layer-norm operands")
        _check_input(x, w, f"{side} LSTM")
    if (forward.n_cell, forward.n_output) != (backward.n_cell, backward.n_output):
        raise KilnError("LiteRT's BIDIRECTIONAL_SEQUENCE_LSTM checks the backward "
                        "weights against the forward sizes, so both directions need the same "
                        f"number of units (got {forward.n_output} and {backward.n_output})")
    tm = options.time_major
    init = list(initial_states or (None,) * 4)
    states = []
    for k, (w, side) in enumerate(((forward, "fw"), (backward, "bw"))):
        h = state_variable(b, f"{side}_output_state", x, w.n_output, time_major=tm,
                           initial=init[2 * k], stateful=stateful)
        c = state_variable(b, f"{side}_cell_state", x, w.n_cell, time_major=tm,
                           initial=init[2 * k + 1], stateful=stateful)
        states.append((h, c))
    lead = list(x.signature[:2])
    fused_merge = merge_outputs and tm
    if fused_merge:
        outs = [b.tensor("sequence", DType.FLOAT32, lead + [forward.n_output + backward.n_output])]
    else:
        outs = [b.tensor("fw_sequence", DType.FLOAT32, lead + [forward.n_output]),
                b.tensor("bw_sequence", DType.FLOAT32, lead + [backward.n_output])]
    inputs = ([x] + forward.operands(b) + backward.operands(b)
              + [states[0][0], states[0][1], states[1][0], states[1][1]] + [None] * 9)
    op = b.emit("BIDIRECTIONAL_SEQUENCE_LSTM", inputs, outs, {
        "fused_activation_function": int(options.activation),
        "cell_clip": float(options.cell_clip),
        "proj_clip": float(options.proj_clip),
        "merge_outputs": bool(fused_merge),
        "time_major": bool(tm),
    })
    res = LstmResult(b, op, outs[0], tm, states, outs,
                     split=forward.n_output if fused_merge else None)
    if fused_merge:
        res.merged = outs[0]
    elif merge_outputs:
        res.merged = b.concat(outs, -1, what="sequence")
    return res


def _check_input(x: Tensor, w: LstmWeights, what: str) -> None:
    sig = x.signature
    if len(sig) != 3:
        raise KilnError(f"{what}: the sequence LSTM input must be 3-D, got shape {list(sig)}")
    if sig[2] != w.n_input:
        raise KilnError(f"{what}: input has {sig[2]} features, the weights expect {w.n_input}")
    if x.dtype != DType.FLOAT32:
        raise KilnError(f"{what}: fused LSTM input must be float32, got {x.dtype.name}")


__all__ = [
    "ACTIVATIONS", "GATES", "LstmOptions", "LstmResult", "LstmWeights", "emit_bidirectional_lstm",
    "emit_lstm", "state_variable",
]
