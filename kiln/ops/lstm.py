"""Op family: LSTM ops — LSTM, one-directional and bidirectional sequence LSTMs (the RNN ops,
which share the state handling and helpers below, are in kiln/ops/rnn.py).

LiteRT runs a whole sequence inside one fused node. Its state operands (LSTM activation and
cell state, RNN hidden state) are *variable tensors*: the node reads them at the start and
leaves the final states in them. Kernels here never write their inputs: each record declares
its state operands (``state_operands``) and the kernel returns the final states after its
outputs, which the interpreter writes into the variable tensors after the node ran.

Numerics follow LiteRT's float path (kernels/lstm_eval.cc, internal/kernel_utils.cc). Where
LiteRT's result is deterministic but not what the math says — an LSTM whose fused activation
is NONE (see `_none_cell_gate`), a batch-major BIDIRECTIONAL_SEQUENCE_RNN whose aux input
should feed the backward cell — kiln reproduces it on purpose, so that kiln and LiteRT agree
on every model both run. Where LiteRT reads outside a tensor (batch-major merged
BIDIRECTIONAL_SEQUENCE_LSTM with batch > 1; time-major BIDIRECTIONAL_SEQUENCE_RNN with an aux
input narrower or wider than the input) kiln computes the intended result instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from ..errors import OpError
from ..schema import (
    BIDIRECTIONAL_LSTM_AUX_INPUT,
    BIDIRECTIONAL_LSTM_BW,
    BIDIRECTIONAL_LSTM_FW,
    UNIDIRECTIONAL_LSTM,
    Activation,
    DType,
    LstmLayout,
)
from ..kernels import hybrid_lstm
from ..kernels.float_math import arithmetic
from ..kernels import lstm as lstm_kernels
from .record import (
    HYBRID,
    INT8,
    KernelCall,
    OpDef,
    OptionsSpec,
    apply_activation,
    input_dtype,
    on_numpy,
    output_dtype,
    with_state,
)
from .traits import INT8_ONLY, OutputScale, Quantization, Shapes, Weights, elements, shape_of

GATES = ("i", "f", "c", "o")  # input, forget, cell (candidate), output — LiteRT's operand order
_QUANTIZED = (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16))


# -- small numeric helpers -------------------------------------------------------------------

def sigmoid(x, xp=np):
    """The gates' logistic in float32 over array namespace ``xp`` (exp may overflow to inf:
    `_run_lstm` ignores that warning)."""
    if xp is not np:
        return (1.0 / (1.0 + xp.exp(-x))).astype(np.float32, copy=False)
    s = np.exp(-x)  # the same operations in place: a recurrent step's hot path
    s += 1.0
    return np.divide(1.0, s, out=s).astype(np.float32, copy=False)  # float32 whatever x was, as above


def layer_norm(x, xp=np):
    """LiteRT's MeanStddevNormalization over the last axis (population variance, eps 1e-8)."""
    mean = x.mean(axis=-1, keepdims=True, dtype=np.float32)
    diff = x - mean
    var = xp.mean(diff * diff, axis=-1, keepdims=True, dtype=np.float32)
    return (diff / xp.sqrt(var + np.float32(1e-8))).astype(np.float32, copy=False)


def clip(x, limit: float):
    """LiteRT's cell / projection clip: none when ``limit`` is 0."""
    return x.clip(-limit, limit) if limit > 0 else x


def _f32(a, xp=np):
    return None if a is None else xp.asarray(a, dtype=np.float32)


def _check_float(op_name: str, x: np.ndarray, weights: np.ndarray) -> None:
    """Refuse integer-quantized and hybrid (int8 weights) operands the float kernel got: the
    node's quantized kernels (chosen by operand types) run those that carry quantization
    parameters."""
    if x.dtype in _QUANTIZED:
        raise OpError(f"{op_name}: {x.dtype} (integer-quantized) input: quantized kernel not "
                      "implemented yet")
    if weights.dtype in _QUANTIZED:
        hybrid = " (the sequence LSTMs' hybrid kernels need each int8 weight's scale)" if "LSTM" in op_name else ""
        raise OpError(f"{op_name}: float input with {weights.dtype} weights without quantization parameters "
                      f"(hybrid): quantized kernel not implemented yet{hybrid}")
    if x.dtype != np.float32:
        raise OpError(f"{op_name}: input must be float32, got {x.dtype}")


def _check_shape(op_name: str, what: str, a: np.ndarray | None, shape: tuple[int, ...]) -> None:
    if a is not None and a.shape != shape:
        raise OpError(f"{op_name}: {what} has shape {list(a.shape)}, expected {list(shape)}")


def state_operand(op_name: str, what: str, a, rows: int, cols: int, xp=np):
    """A state operand as [rows, cols]; LiteRT accepts any shape with that many elements."""
    if a is None:
        raise OpError(f"{op_name}: the {what} operand (a variable tensor) is missing")
    if a.size != rows * cols:
        raise OpError(f"{op_name}: {what} has {a.size} elements ({list(a.shape)}), expected "
                      f"batch {rows} x {cols} = {rows * cols}")
    return xp.asarray(a, dtype=np.float32).reshape(rows, cols)


def _swap_time_batch(x: np.ndarray, time_major: bool) -> np.ndarray:
    """Batch-major [B, T, ...] <-> time-major [T, B, ...] (its own inverse); no-op if time-major."""
    return x if time_major else x.transpose(1, 0, 2)


def _zero_steps(x: np.ndarray | None, time_major: bool) -> np.ndarray:
    """[T, B] flags: is the input LiteRT hands one step all zeros? (see `_none_cell_gate`).

    Time-major LiteRT steps the whole batch at once, batch-major one row at a time.
    """
    if x is None:
        return np.bool_(True)
    zero = ~np.any(x, axis=-1)  # [T, B] (x is time-major here)
    if time_major:
        zero = np.broadcast_to(zero.all(axis=1, keepdims=True), zero.shape)
    return zero


# -- LSTM ------------------------------------------------------------------------------------

@dataclass
class _Lstm:
    """One direction's LSTM operands (float32), keyed by gate ("i", "f", "c", "o").

    A gate absent from ``input_w`` is not computed: CIFG drops "i" and uses i = 1 - f.
    """

    input_w: dict[str, np.ndarray]
    recurrent_w: dict[str, np.ndarray]      # [n_cell, n_output], or [n_cell] when diagonal
    bias: dict[str, np.ndarray]
    peephole: dict[str, np.ndarray] = field(default_factory=dict)
    layer_norm: dict[str, np.ndarray] = field(default_factory=dict)
    aux_w: dict[str, np.ndarray] = field(default_factory=dict)
    projection_w: np.ndarray | None = None
    projection_b: np.ndarray | None = None
    diagonal: bool = False

    @property
    def gates(self) -> tuple[str, ...]:
        return tuple(g for g in GATES if g in self.input_w)

    @property
    def cifg(self) -> bool:
        return "i" not in self.input_w

    @property
    def n_cell(self) -> int:
        return self.input_w["o"].shape[0]

    @property
    def n_output(self) -> int:
        rec = self.recurrent_w["o"]
        return rec.shape[0] if self.diagonal else rec.shape[1]


def _gather(xp, inputs, indices, names=GATES) -> dict:
    found = {}
    for name, idx in zip(names, indices):
        a = inputs[idx] if idx < len(inputs) else None
        if a is not None:
            found[name] = _f32(a, xp)
    return found


def read_operands(op_name: str, inputs, lay: LstmLayout, diagonal: bool = False, xp=np) -> _Lstm:
    """Collect and check one direction's operands (the checks LiteRT's Prepare makes) as
    float32 arrays of namespace ``xp``."""
    def get(i):
        return inputs[i] if i < len(inputs) else None

    for idx, what in zip(lay.input_weights[1:] + lay.recurrent_weights[1:] + lay.biases[1:],
                         ("input_to_forget", "input_to_cell", "input_to_output",
                          "recurrent_to_forget", "recurrent_to_cell", "recurrent_to_output",
                          "forget_gate_bias", "cell_gate_bias", "output_gate_bias")):
        if get(idx) is None:
            raise OpError(f"{op_name}: required operand {idx} ({what}) is missing")
    p = _Lstm(
        input_w=_gather(xp, inputs, lay.input_weights),
        recurrent_w=_gather(xp, inputs, lay.recurrent_weights),
        bias=_gather(xp, inputs, lay.biases),
        peephole=_gather(xp, inputs, lay.peepholes, ("i", "f", "o")),
        layer_norm=_gather(xp, inputs, lay.layer_norm),
        aux_w=_gather(xp, inputs, lay.aux_weights),
        projection_w=_f32(get(lay.projection_weights), xp),
        projection_b=_f32(get(lay.projection_bias), xp),
        diagonal=diagonal,
    )
    if ("i" in p.input_w) != ("i" in p.recurrent_w):
        raise OpError(f"{op_name}: input_to_input and recurrent_to_input weights must be both "
                      "present (LSTM) or both absent (CIFG)")
    if p.cifg and "i" in p.bias:
        raise OpError(f"{op_name}: a CIFG LSTM (no input gate weights) must not have an input "
                      "gate bias")
    if not p.cifg and "i" not in p.bias:
        raise OpError(f"{op_name}: the input gate bias is missing")
    if p.projection_b is not None and p.projection_w is None:
        raise OpError(f"{op_name}: projection bias given without projection weights")
    return p


def check_lstm_sizes(op_name: str, p: _Lstm, n_input: int, n_aux: int | None) -> None:
    n_cell, n_output = p.n_cell, p.n_output
    if p.diagonal and n_output != n_cell:
        raise OpError(f"{op_name}: diagonal recurrent weights need n_output == n_cell")
    for g in p.gates:
        _check_shape(op_name, f"input_to_{g} weights", p.input_w[g], (n_cell, n_input))
        rec_shape = (n_cell,) if p.diagonal else (n_cell, n_output)
        _check_shape(op_name, f"recurrent_to_{g} weights", p.recurrent_w[g], rec_shape)
        _check_shape(op_name, f"{g} gate bias", p.bias[g], (n_cell,))
        if g in p.aux_w and n_aux is not None:
            _check_shape(op_name, f"aux_input_to_{g} weights", p.aux_w[g], (n_cell, n_aux))
    for g, a in {**p.peephole, **p.layer_norm}.items():
        _check_shape(op_name, f"{g} gate peephole/layer-norm vector", a, (n_cell,))
    if p.projection_w is not None:
        _check_shape(op_name, "projection weights", p.projection_w, (n_output, n_cell))
    _check_shape(op_name, "projection bias", p.projection_b, (n_output,))


def finish_gate(p: _Lstm, g: str, pre, xp=np):
    """Layer norm (if this gate has coefficients): normalise, scale, then add the bias."""
    if g in p.layer_norm:
        return layer_norm(pre, xp) * p.layer_norm[g] + p.bias[g]
    return pre


def _none_cell_gate(xp, p: _Lstm, full, x_part, n_inputs):
    """The cell-gate value LiteRT ends up using when the fused activation is NONE.

    LiteRT accumulates each gate by ping-ponging between the gate buffer and a scratch buffer
    (one swap per non-zero input and aux input matmul) and relies on the activation to copy
    the result back into the gate buffer — which NONE does not do. So the gate buffer keeps an
    earlier partial sum unless the swaps happen to land the result there, and the cell output
    h = o * act(c) becomes o * (that buffer), because NONE leaves the scratch holding the cell
    gate. ``n_inputs`` [B, 1] counts the matmuls LiteRT made for the step (0, 1 or 2).
    """
    if p.diagonal:  # the recurrent product adds one more swap
        partial = p.bias["c"] if "c" not in p.layer_norm else np.float32(0)
        return xp.where(n_inputs == 1, partial, full)
    return xp.where(n_inputs == 1, full, x_part)  # n == 0: x_part is the bias alone


def pack_gates(p: _Lstm, xp=np) -> tuple:
    """Gate weights side by side: input [G*C, I], bias [G*C], aux [G*C, A] (None without aux
    weights), recurrent [O, G*C] ([G*C] when diagonal). A layer-normalised gate's bias comes
    after the normalisation: its share of ``bias`` is -0.0, which adding leaves every value as is."""
    gates = p.gates
    stacked = xp.concatenate([p.input_w[g] for g in gates])
    bias = xp.concatenate([xp.full(p.n_cell, -0.0, np.float32) if g in p.layer_norm else p.bias[g] for g in gates])
    aux = xp.concatenate([p.aux_w[g] for g in gates]) if all(g in p.aux_w for g in gates) else None
    recurrent = xp.concatenate([p.recurrent_w[g] for g in gates]).T
    return stacked, bias, aux, recurrent


def _run_lstm(
    xp, p: _Lstm, x, aux, h, c, opts, *, reverse: bool, n_inputs=None, packed: tuple | None = None,
):
    """Run one direction over time-major ``x`` [T, B, I]; returns (outputs [T, B, O], h, c).

    The gates sit side by side in one [B, G*C] array, so a step is a handful of array calls;
    the products and the loop over time are the namespace's own (`arithmetic`). ``n_inputs``
    [T, B] (only needed when the activation is NONE) counts, per step and row, the input
    matmuls LiteRT performs (it skips all-zero inputs). ``packed``: `pack_gates(p)`, when the
    caller already has it (the compiled delegate packs constant weights once).
    """
    fm = arithmetic(xp)
    act = opts.fused_activation_function
    cell_clip, proj_clip = float(opts.cell_clip), float(opts.proj_clip)
    stacked, bias, stacked_aux, recurrent = packed if packed is not None else pack_gates(p, xp)
    T, B, _ = x.shape
    n, gates = p.n_cell, p.gates
    part = fm.matmul(x.reshape(T * B, -1), stacked.T)
    if aux is not None:
        part = part + fm.matmul(aux.reshape(T * B, -1), stacked_aux.T)
    part = (part + bias).reshape(T, B, stacked.shape[0])
    cols = {g: slice(k * n, (k + 1) * n) for k, g in enumerate(gates)}
    # No peephole or layer norm: every gate's logistic at once, before the cell update.
    plain = not (p.peephole or p.layer_norm)
    none = act == Activation.NONE
    # xp.tanh keeps float32, so apply_activation's cast would be a no-op.
    activate = xp.tanh if act == Activation.TANH else partial(apply_activation, act=act, xp=xp)
    matmul = np.matmul if xp is np else fm.matmul  # NumPy's float32 product is BLAS's, as fm's is
    proj_w = None if p.projection_w is None else p.projection_w.T

    def gate(g, pre, c):
        """Gate g's logistic in a cell with peepholes or layer norm."""
        value = pre[:, cols[g]]
        if g in p.peephole:
            value = value + p.peephole[g] * c
        return sigmoid(finish_gate(p, g, value, xp), xp)

    f_cols, i_cols, c_cols, o_cols = cols["f"], cols.get("i"), cols["c"], cols["o"]  # no "i" under CIFG
    # what each of the T steps would otherwise look up again
    cifg, diagonal, projection_b = p.cifg, p.diagonal, p.projection_b

    def step(state, inputs):
        h, c = state
        part_t, count = inputs if none else (inputs, None)
        pre = part_t + (xp.tile(h, len(gates)) * recurrent if diagonal else matmul(h, recurrent))
        if plain:
            sig = sigmoid(pre, xp)
            f, o = sig[:, f_cols], sig[:, o_cols]
            i = 1.0 - f if cifg else sig[:, i_cols]
        else:
            f = gate("f", pre, c)
            i = 1.0 - f if cifg else gate("i", pre, c)
        g_val = pre[:, c_cols] if plain else finish_gate(p, "c", pre[:, c_cols], xp)
        g_val = _none_cell_gate(xp, p, g_val, part_t[:, c_cols], count[:, None]) if none else activate(g_val)
        c = clip(f * c + i * g_val, cell_clip)
        if not plain:
            o = gate("o", pre, c)  # its peephole sees the new cell state
        m = o * (g_val if none else activate(c))
        if proj_w is not None:
            m = matmul(m, proj_w)
            if projection_b is not None:
                m = m + projection_b
            m = clip(m, proj_clip)
        return m.astype(np.float32, copy=False), c

    with np.errstate(over="ignore"):
        out, (h, c) = fm.recur(step, (h, c), (part, n_inputs) if none else part, reverse=reverse)
    return out, h, c.astype(np.float32, copy=False)


def _matmul_counts(x: np.ndarray, aux: np.ndarray | None, time_major: bool) -> np.ndarray:
    """[T, B] number of input matmuls LiteRT makes per step (it skips all-zero inputs)."""
    return (~_zero_steps(x, time_major)).astype(np.int8) + \
        (~_zero_steps(aux, time_major)).astype(np.int8)


def _lstm_pass(xp, name: str, inputs, lay: LstmLayout, p: _Lstm, x, aux, opts, *, time_major: bool,
               reverse: bool = False, packed: tuple | None = None):
    """One direction over time-major ``x`` from its states. Returns the outputs
    [T, B, n_output] and the final (output, cell) states, shaped like the state operands."""
    batch = x.shape[1]
    h_in, c_in = optional_operand(inputs, lay.output_state), optional_operand(inputs, lay.cell_state)
    h0 = state_operand(name, f"output/activation state (operand {lay.output_state})", h_in, batch,
                       p.n_output, xp)
    c0 = state_operand(name, f"cell_state (operand {lay.cell_state})", c_in, batch, p.n_cell, xp)
    counts = None
    if opts.fused_activation_function == Activation.NONE:
        counts = _matmul_counts(x, aux, time_major)
    out, h, c = _run_lstm(xp, p, x, aux, h0, c0, opts, reverse=reverse, n_inputs=counts, packed=packed)
    return out, (h.reshape(np.shape(h_in)), c.reshape(np.shape(c_in)))


def _lstm_input(xp, name: str, inputs, rank: int):
    x, w = optional_operand(inputs, 0), optional_operand(inputs, 4)
    if x is None or w is None:
        raise OpError(f"{name}: the input (operand 0) and input_to_output weights (operand 4) "
                      "are required")
    x = xp.asarray(x)
    _check_float(name, x, xp.asarray(w))
    if x.ndim != rank:
        raise OpError(f"{name}: input must be {rank}-D, got shape {list(x.shape)}")
    return x


def uni_lstm(xp, call: KernelCall, *inputs):
    """UNIDIRECTIONAL_SEQUENCE_LSTM over array namespace ``xp`` (NumPy here, jax.numpy in kiln.xla)."""
    name = "UNIDIRECTIONAL_SEQUENCE_LSTM"
    opts = call.opts
    time_major = bool(opts.time_major)
    xt = _swap_time_batch(_lstm_input(xp, name, inputs, 3), time_major)
    check_clips(name, opts)
    p = read_operands(name, inputs, UNIDIRECTIONAL_LSTM, diagonal=bool(opts.diagonal_recurrent_tensors), xp=xp)
    check_lstm_sizes(name, p, xt.shape[2], None)
    return uni_lstm_run(xp, call, inputs, p)


def uni_lstm_run(xp, call: KernelCall, inputs, p: _Lstm, packed: tuple | None = None):
    """UNIDIRECTIONAL_SEQUENCE_LSTM on checked operands ``p`` (`read_operands`, sizes checked):
    the kernel after its checks, also run by the compiled delegate with ``packed`` weights."""
    time_major = bool(call.opts.time_major)
    xt = _swap_time_batch(inputs[0], time_major)
    out, states = _lstm_pass(xp, "UNIDIRECTIONAL_SEQUENCE_LSTM", inputs, UNIDIRECTIONAL_LSTM, p, xt, None,
                             call.opts, time_major=time_major, packed=packed)
    return with_state(call, [_swap_time_batch(out, time_major)], states)


def lstm_step(xp, call: KernelCall, *inputs):
    """LSTM: one step of the full LSTM kernel on a [batch, input] input (same operands as the
    unidirectional sequence op), over array namespace ``xp``."""
    name = "LSTM"
    opts = call.opts
    if opts.kernel_type != 0:
        raise OpError(f"{name}: the BASIC kernel type (kernel_type=1) is not implemented yet; "
                      "kiln runs the FULL kernel")
    x = _lstm_input(xp, name, inputs, 2)
    check_clips(name, opts)
    p = read_operands(name, inputs, UNIDIRECTIONAL_LSTM, xp=xp)
    check_lstm_sizes(name, p, x.shape[1], None)
    out, states = _lstm_pass(xp, name, inputs, UNIDIRECTIONAL_LSTM, p, x[None], None, opts, time_major=True)
    return with_state(call, [out[0]], states)


def bidi_lstm(xp, call: KernelCall, *inputs):
    """BIDIRECTIONAL_SEQUENCE_LSTM over array namespace ``xp``."""
    name = "BIDIRECTIONAL_SEQUENCE_LSTM"
    opts = call.opts
    time_major = bool(opts.time_major)
    xt = _swap_time_batch(_lstm_input(xp, name, inputs, 3), time_major)
    check_clips(name, opts)
    fw = read_operands(name, inputs, BIDIRECTIONAL_LSTM_FW, xp=xp)
    bw = read_operands(name, inputs, BIDIRECTIONAL_LSTM_BW, xp=xp)
    aux_in = optional_operand(inputs, BIDIRECTIONAL_LSTM_AUX_INPUT)
    cross_linked = bidi_aux_routing(name, fw, bw, np.shape(inputs[0]), None if aux_in is None else np.shape(aux_in))
    aux_t = None if aux_in is None else _swap_time_batch(xp.asarray(aux_in, np.float32), time_major)
    bw_x = xt if cross_linked else aux_t
    aux = aux_t if cross_linked else None
    (fw_out, fw_states), (bw_out, bw_states) = (
        _lstm_pass(xp, name, inputs, lay, p, src, aux, opts, time_major=time_major, reverse=reverse)
        for p, lay, src, reverse in ((fw, BIDIRECTIONAL_LSTM_FW, xt, False),
                                     (bw, BIDIRECTIONAL_LSTM_BW, bw_x, True)))
    outs = [_swap_time_batch(fw_out, time_major), _swap_time_batch(bw_out, time_major)]
    if opts.merge_outputs:
        outs = [xp.concatenate(outs, axis=-1)]
    return with_state(call, outs, (*fw_states, *bw_states))


def bidi_aux_routing(name: str, fw: _Lstm, bw: _Lstm, x_shape, aux_shape) -> bool:
    """Check a bidirectional LSTM's aux input against its weights and sizes (``x_shape`` /
    ``aux_shape``: the operands' shapes, either layout); True when the aux input is cross
    linked (fed to both directions, or absent), False when it is the backward direction's
    input. LiteRT: an aux input without aux weights is the backward input (stacked
    bidirectional layers without cross links); with weights it feeds both directions."""
    has_aux_weights = _check_aux_weights(name, fw, bw)
    if has_aux_weights and aux_shape is None:
        raise OpError(f"{name}: aux weights given but no aux input (operand 39)")
    if aux_shape is not None and tuple(aux_shape[:2]) != tuple(x_shape[:2]):
        raise OpError(f"{name}: aux input shape {list(aux_shape)} does not match the input's "
                      f"time and batch dims {list(x_shape)}")
    cross_linked = aux_shape is None or has_aux_weights
    n_aux = aux_shape[2] if cross_linked and aux_shape is not None else None
    check_lstm_sizes(name, fw, x_shape[2], n_aux)
    check_lstm_sizes(name, bw, x_shape[2] if cross_linked else aux_shape[2], n_aux)
    return cross_linked


def _check_aux_weights(name: str, fw: _Lstm, bw: _Lstm) -> bool:
    """Aux weights come for all gates of both directions or not at all; True if present."""
    present = [g in p.aux_w for p in (fw, bw) for g in ("f", "c", "o")]
    if any(present) and not all(present):
        raise OpError(f"{name}: aux input weights (operands 40-47) must be given for the "
                      "forget, cell and output gates of both directions, or not at all")
    for p, side in ((fw, "forward"), (bw, "backward")):
        if all(present) and not p.cifg and "i" not in p.aux_w:
            raise OpError(f"{name}: {side} aux_input_to_input weights are missing")
    return all(present)


def check_clips(name: str, opts) -> None:
    if opts.cell_clip < 0 or opts.proj_clip < 0:
        raise OpError(f"{name}: cell_clip and proj_clip must be >= 0 (0 = no clipping), got "
                      f"{opts.cell_clip} and {opts.proj_clip}")


def optional_operand(inputs, i):
    return inputs[i] if i < len(inputs) else None


# -- version rules ---------------------------------------------------------------------------

def _hybrid(op, weight_operand: int) -> bool:
    """Float input/output with int8 weights: LiteRT's 'hybrid' kernels."""
    return input_dtype(op, weight_operand) == DType.INT8 and output_dtype(op, 0) == DType.FLOAT32


def _hybrid_version(weight_operand: int):
    def rule(op) -> int:
        if _hybrid(op, weight_operand):
            return 3 if op.options["asymmetric_quantize_inputs"] else 2
        return 1
    return rule


def _uni_lstm_version(op) -> int:
    if (input_dtype(op, 0) == DType.INT16 and input_dtype(op, 2) == DType.INT8
            and output_dtype(op, 0) == DType.INT16):
        return 5
    if op.options["diagonal_recurrent_tensors"]:
        return 4
    if input_dtype(op, 0) == DType.FLOAT32 and _hybrid(op, 2):
        return 3 if op.options["asymmetric_quantize_inputs"] else 2
    return 1


def _lstm_version(op) -> int:
    full = not op.options["kernel_type"]
    if (full and input_dtype(op, 0) == DType.INT16 and input_dtype(op, 2) == DType.INT8
            and output_dtype(op, 0) == DType.INT16):
        return 5
    if full and input_dtype(op, 0) == DType.FLOAT32 and _hybrid(op, 2):
        return 4 if op.options["asymmetric_quantize_inputs"] else 3
    return 1 if full else 2


# -- records ---------------------------------------------------------------------------------

_LSTM_COMMON = {
    "fused_activation_function": Activation.NONE, "cell_clip": 0.0, "proj_clip": 0.0,
}


def _sequence_lstm_macs(*directions: LstmLayout):
    """MACs of a fused LSTM: per step and batch row, each gate's input and recurrent products
    (three gates under CIFG), plus the projection; summed over the directions."""
    def macs(op, shapes: Shapes | None = None) -> int:
        total = 0
        x_shape = shape_of(op.inputs[0], shapes)
        steps_batch = math.prod(x_shape[:-1])
        for lay in directions:
            recurrent = op.inputs[lay.recurrent_weights[1]]
            n_cell, n_output = recurrent.shape if recurrent is not None else (0, 0)
            gates = 4 if op.inputs[lay.input_weights[0]] is not None else 3
            total += steps_batch * gates * n_cell * (x_shape[-1] + n_output)
            projection = op.inputs[lay.projection_weights]
            if projection is not None:
                total += steps_batch * elements(projection)
        return total
    return macs


OPS: tuple = (
    OpDef(
        "UNIDIRECTIONAL_SEQUENCE_LSTM", on_numpy(uni_lstm),
        OptionsSpec("UnidirectionalSequenceLSTMOptions", {
            **_LSTM_COMMON, "time_major": False, "asymmetric_quantize_inputs": False,
            "diagonal_recurrent_tensors": False,
        }),
        version=_uni_lstm_version, max_version=4,
        runtime_versions=("1.13.1", "1.14.0", "2.3.0", "2.12.0"),
        state_operands=UNIDIRECTIONAL_LSTM.states,
        quantized={INT8: on_numpy(lstm_kernels.uni_lstm_int8), HYBRID: on_numpy(hybrid_lstm.uni_lstm_hybrid)},
        weights=Weights(UNIDIRECTIONAL_LSTM.matrices, axis=None),
        quantization=Quantization(OutputScale.LSTM, types=INT8_ONLY, hybrid=True),
        macs=_sequence_lstm_macs(UNIDIRECTIONAL_LSTM)
    ),
    OpDef(
        "LSTM", on_numpy(lstm_step),
        OptionsSpec("LSTMOptions", {
            **_LSTM_COMMON, "kernel_type": 0, "asymmetric_quantize_inputs": False,
        }),
        version=_lstm_version, max_version=4,
        runtime_versions=("1.7.0", "1.10.0", "1.14.0", "2.3.0"),
        state_operands=UNIDIRECTIONAL_LSTM.states,
    ),
    OpDef(
        "BIDIRECTIONAL_SEQUENCE_LSTM", on_numpy(bidi_lstm),
        OptionsSpec("BidirectionalSequenceLSTMOptions", {
            **_LSTM_COMMON, "merge_outputs": False, "time_major": True,
            "asymmetric_quantize_inputs": False,
        }),
        version=_hybrid_version(1), max_version=3,
        runtime_versions=("1.14.0", "1.14.0", "1.14.0"),
        state_operands=BIDIRECTIONAL_LSTM_FW.states + BIDIRECTIONAL_LSTM_BW.states,
        quantized={HYBRID: on_numpy(hybrid_lstm.bidi_lstm_hybrid)},
        weights=Weights(BIDIRECTIONAL_LSTM_FW.matrices + BIDIRECTIONAL_LSTM_BW.matrices, axis=None),
        # no integer kernel: the integer quantizer splits it into two unidirectional LSTMs
        quantization=Quantization(OutputScale.LSTM, types=frozenset(), hybrid=True),
        macs=_sequence_lstm_macs(BIDIRECTIONAL_LSTM_FW, BIDIRECTIONAL_LSTM_BW)
    ),

)
