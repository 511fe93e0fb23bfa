"""LiteRT's hybrid (dynamic-range) sequence LSTM: float input, output and states, int8
weights with one scale per matrix.

What dynamic-range quantization writes for a fused LSTM (UNIDIRECTIONAL_SEQUENCE_LSTM v2 / v3,
BIDIRECTIONAL_SEQUENCE_LSTM v2 / v3), as LiteRT runs it (lstm_eval.cc EvalHybrid,
LstmStepHybrid, CalculateLstmGateHybrid, UpdateLstmCellFloat, CalculateLstmOutputHybrid).
Per time step, each batch row of the input and of the output state is quantized to int8 on
its own — asymmetrically (v3, ``asymmetric_quantize_inputs``) or symmetrically (v2) — and
every gate accumulates in float32, in this order::

    gate = bias                         (0 with layer norm)
    gate += float(W_x·x_q − zp_x·ΣW_x) · (s_x · s_Wx)      input
    gate += float(W_a·a_q − zp_a·ΣW_a) · (s_a · s_Wa)      aux input (bidirectional)
    gate += float(W_h·h_q − zp_h·ΣW_h) · (s_h · s_Wh)      output state
    gate += (w_c · s_c) · c             peephole: i, f on the old cell, o on the new one
    gate = norm(gate) · ln + bias       layer norm (LiteRT's MeanStddevNormalization)

then ``c = f·c + g·i`` (``g·(1 − f)`` for CIFG), clipped; ``m = o · act(c)``; with a
projection the rows of ``m`` are quantized again and ``h = b_p + float(W_p·m_q − zp·ΣW_p) ·
(s_m · s_Wp)``, clipped. The integer dot products are exact; every float step is one
float32 operation in LiteRT's order, and sigmoid / tanh are Eigen's (kiln.kernels.float_math)
— whose logistic depends on where a gate's values sit in LiteRT's scratch buffer, so the
buffer layout (gate slots, time- or batch-major stepping) is reproduced for it. A step whose
input (or output state, or projection input) is all zeros skips its product in LiteRT; the
product is exactly zero then, so computing it changes nothing.

LiteRT's quirk with activation NONE is kept: the cell activation leaves its buffer alone, so
``m = o · g`` (the raw cell gate), not ``o · c``.

The arithmetic (`input_part`, `step`, `run` and the kernels) is written once over an array
namespace: NumPy's here (`run` loops over time), jax.numpy's in kiln.xla (one lax.scan); the
scratch-buffer layout is static, so the logistic's scalar positions are constant masks under
tracing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..errors import OpError
from ..schema import (
    BIDIRECTIONAL_LSTM_AUX_INPUT,
    BIDIRECTIONAL_LSTM_BW,
    BIDIRECTIONAL_LSTM_FW,
    UNIDIRECTIONAL_LSTM,
    LstmLayout,
)
from . import float_math
from .family import params, with_state
from .fixedpoint import ExactProduct
from .hybrid import quantize_rows

F32 = np.float32
#: LiteRT's TfLiteFusedActivation codes used by the LSTM (the schema's ActivationFunctionType).
NONE, RELU, RELU_N1_TO_1, RELU6, TANH, SIGN_BIT, SIGMOID = 0, 1, 2, 3, 4, 5, 6


@dataclass(frozen=True)
class Matrix:
    """Gate matrices stacked along rows (int8 [rows, cols]), each row's weight scale (one per
    gate tensor, repeated) and row sums (the asymmetric offset's ΣW)."""

    q: np.ndarray
    scale: np.ndarray
    row_sums: np.ndarray

    @cached_property
    def product(self) -> ExactProduct:
        """``q_rows @ W^T`` exactly, for int8 rows (|q| <= 128)."""
        return ExactProduct(self.q.T, 128)

    @classmethod
    def stack(cls, parts: list[tuple[np.ndarray, float]]) -> "Matrix":
        q = np.concatenate([np.asarray(w, np.int8) for w, _ in parts])
        scale = np.concatenate([np.full(np.shape(w)[0], s, F32) for w, s in parts]).astype(F32)
        return cls(q, scale, q.astype(np.int64).sum(axis=1))


@dataclass(frozen=True)
class Cell:
    """One direction's operands. Gate-wise arrays are stacked in ``gates`` order ("ifco", or
    "fco" for CIFG) along their first axis, ``n_cell`` rows per gate."""

    gates: str
    input: Matrix
    recurrent: Matrix
    bias: np.ndarray                        # [G*C] float32
    aux: Matrix | None = None
    peephole: dict = field(default_factory=dict)     # gate -> float32 [C] (w · s, LiteRT's recovered weights)
    layer_norm: dict = field(default_factory=dict)   # gate -> float32 [C]
    projection: Matrix | None = None
    projection_bias: np.ndarray | None = None
    activation: int = TANH
    cell_clip: float = 0.0
    proj_clip: float = 0.0
    asymmetric: bool = True

    @property
    def n_cell(self) -> int:
        return self.bias.size // len(self.gates)


def activate(x, activation: int, scalar: np.ndarray | None = None, f: float_math.Float32 = float_math.NUMPY):
    """ApplyActivationToVector (NONE is handled by the caller: LiteRT leaves the buffer);
    ``scalar``: the positions Eigen's logistic computes one by one (`float_math.logistic`)."""
    xp = f.xp
    if activation == TANH:
        return float_math.tanh(x, f)
    if activation == SIGMOID:
        return float_math.logistic(x, scalar, f)
    if activation == RELU:
        return xp.maximum(x, F32(0))
    if activation == RELU6:
        return xp.clip(x, F32(0), F32(6))
    if activation == RELU_N1_TO_1:
        return xp.clip(x, F32(-1), F32(1))
    if activation == SIGN_BIT:
        return xp.signbit(x).astype(F32)
    raise ValueError(f"activation {activation} has no LSTM meaning")


def scalar_masks(gates: str, batch: int, n_cell: int, time_major: bool) -> dict[str, np.ndarray]:
    """Per gate, the [batch, n_cell] positions Eigen's logistic computes one at a time in
    LiteRT's scratch buffer: gate slots of batch·n_cell floats (CIFG: c, f, o; else i, c, f,
    o), activated whole when time-major, one batch row at a time when batch-major."""
    slots = "cfo" if "i" not in gates else "icfo"
    masks = {}
    for slot, g in enumerate(slots):
        base = slot * batch * n_cell
        if time_major:
            masks[g] = float_math.scalar_positions(batch * n_cell, base % float_math.PACKET).reshape(batch, n_cell)
        else:
            masks[g] = np.stack([float_math.scalar_positions(n_cell, (base + b * n_cell) % float_math.PACKET)
                                 for b in range(batch)])
    return masks


def _quantized_product(xp, rows, m: Matrix, asymmetric: bool):
    """``float32(W·q − zp·ΣW) · (s_row · s_W)`` for every row of float ``rows`` [n, cols]
    (BatchQuantizeFloats, then MatrixBatchVectorMultiplyAccumulate's product)."""
    f = float_math.arithmetic(xp)
    q, sf, zp = quantize_rows(xp, rows, asymmetric)
    dot = m.product(xp, q) - zp.astype(xp.int64)[:, None] * m.row_sums[None, :]
    # int32 in LiteRT; its conversion to float rounds to nearest
    scale = f.mul(sf[:, None], m.scale[None, :])
    return f.mul(dot.astype(xp.int32).astype(F32), scale)


def _mean_stddev_normalization(f: float_math.Float32, x):
    """LiteRT's MeanStddevNormalization over the last axis: sequential float32 sums."""
    n = F32(x.shape[-1])
    mean = f.div(f.sum_last(x), n)
    diff = f.sub(x, mean)
    variance = f.div(f.sum_last(f.mul(diff, diff)), n)
    inv = f.div(F32(1), f.sqrt(f.add(variance, F32(1e-8))))
    return f.mul(diff, inv)


def _finish(f: float_math.Float32, cell: Cell, g: str, value, k: int, activation: int, scalar):
    """Layer norm (if any), then the gate's activation (NONE: the value itself)."""
    if g in cell.layer_norm:
        n = cell.n_cell
        value = f.mul(_mean_stddev_normalization(f, value), cell.layer_norm[g])
        value = f.add(value, cell.bias[k * n:(k + 1) * n])
    return value if activation == NONE else activate(value, activation, scalar, f)


def input_part(xp, cell: Cell, x, aux=None):
    """The gates' input (and aux input) contributions, which do not depend on the recurrence,
    for every step at once: time-major ``x`` [T, B, I] (``aux`` [T, B, A]) -> [T, B, G*C],
    the bias in (unless layer norm adds it later)."""
    steps, batch = x.shape[:2]
    start = np.zeros_like(cell.bias) if cell.layer_norm else cell.bias
    f = float_math.arithmetic(xp)
    pre = f.add(start, _quantized_product(xp, x.reshape(steps * batch, -1), cell.input, cell.asymmetric))
    if aux is not None and cell.aux is not None:
        pre = f.add(pre, _quantized_product(xp, aux.reshape(steps * batch, -1), cell.aux, cell.asymmetric))
    return pre.reshape(steps, batch, -1)


def step(xp, cell: Cell, masks: dict, pre_x, h, c):
    """One time step for the batch: ``pre_x`` [B, G*C] from `input_part`, states ``h`` [B, O]
    and ``c`` [B, C] float32; returns the new (h, c) (h is also the step's output).
    ``masks``: `scalar_masks` for the node's batch and layout."""
    f, n = float_math.arithmetic(xp), cell.n_cell
    pre = f.add(pre_x, _quantized_product(xp, h, cell.recurrent, cell.asymmetric))
    column = {g: j for j, g in enumerate(cell.gates)}

    def gate(g: str, activation: int, state):
        value = pre[:, column[g] * n:(column[g] + 1) * n]
        if g in cell.peephole:           # i and f see the old cell, o the new one
            value = f.add(value, f.mul(cell.peephole[g], state))
        return _finish(f, cell, g, value, column[g], activation, masks[g])

    forget = gate("f", SIGMOID, c)
    i = gate("i", SIGMOID, c) if "i" in column else f.sub(F32(1), forget)
    g_raw = gate("c", cell.activation, None)
    c = f.add(f.mul(forget, c), f.mul(g_raw, i))
    if cell.cell_clip > 0:
        c = xp.clip(c, F32(-cell.cell_clip), F32(cell.cell_clip))
    o = gate("o", SIGMOID, c)
    # act(c) is written into the cell gate's slot (CalculateLstmOutputHybrid's scratch0)
    m = f.mul(o, g_raw if cell.activation == NONE else activate(c, cell.activation, masks["c"], f))
    if cell.projection is not None:
        # LiteRT fills the output with the bias (or zeros) and accumulates the product into it
        base = F32(0) if cell.projection_bias is None else cell.projection_bias
        m = f.add(base, _quantized_product(xp, m, cell.projection, cell.asymmetric))
        if cell.proj_clip > 0:
            m = xp.clip(m, F32(-cell.proj_clip), F32(cell.proj_clip))
    return m, c


def run(xp, cell: Cell, x, h, c, *, aux=None, reverse: bool = False,
        time_major: bool = True) -> tuple:
    """One direction over time-major float32 ``x`` [T, B, I] (``aux`` [T, B, A]) from states
    ``h`` [B, O] and ``c`` [B, C], over array namespace ``xp`` (NumPy loops over time, a traced
    backend scans); returns (outputs [T, B, O], h, c). ``time_major``: the node's layout, which
    decides how LiteRT steps the batch (`scalar_masks`)."""
    pre_x = input_part(xp, cell, x, aux)
    masks = scalar_masks(cell.gates, x.shape[1], cell.n_cell, time_major)
    out, (h, c) = float_math.arithmetic(xp).recur(lambda state, pre_t: step(xp, cell, masks, pre_t, *state),
                                                  (h, c), pre_x, reverse=reverse)
    return out, h, c


# -- a node's operands, read and checked as LiteRT's Prepare reads them; the records' kernels -------

def _operand(inputs, i):
    return inputs[i] if i < len(inputs) else None


def _hybrid_matrix(call, inputs, i: int, what: str, shape: tuple) -> tuple[np.ndarray, float]:
    """Operand ``i``: int8 weights of ``shape`` with one scale (LiteRT reads params.scale)."""
    w = _operand(inputs, i)
    if w is None:
        raise OpError(f"{call.op.name}: operand {i} ({what}) is missing")
    if w.dtype != np.int8:
        raise OpError(f"{call.op.name}: hybrid LSTM operand {i} ({what}) must be int8, got {w.dtype}")
    if w.shape != shape:
        raise OpError(f"{call.op.name}: operand {i} ({what}) has shape {list(w.shape)}, expected {list(shape)}")
    q = params(call, i, what)
    return w, float(np.float32(q.scale[0]))


def _float_operand(call, inputs, i: int, what: str, size: int) -> np.ndarray | None:
    a = _operand(inputs, i)
    if a is None:
        return None
    if a.dtype != np.float32 or a.size != size:
        raise OpError(f"{call.op.name}: operand {i} ({what}) must be float32 with {size} values, got "
                      f"{a.dtype} {list(a.shape)}")
    return a.reshape(-1)


def hybrid_lstm_cell(call, inputs, lay: LstmLayout, n_input: int, n_aux: int | None) -> Cell:
    """One direction's operands, checked as LiteRT's Prepare checks them (sizes, types)."""
    name, opts = call.op.name, call.opts
    forget = _operand(inputs, lay.input_weights[1])
    recurrent = _operand(inputs, lay.recurrent_weights[1])
    if forget is None or recurrent is None or forget.ndim != 2 or recurrent.ndim != 2:
        raise OpError(f"{name}: input_to_forget and recurrent_to_forget weights (operands {lay.input_weights[1]}, "
                      f"{lay.recurrent_weights[1]}) must be 2-D (diagonal recurrent weights have no hybrid kernel)")
    n_cell, n_output = recurrent.shape
    cifg = _operand(inputs, lay.input_weights[0]) is None
    gates = "fco" if cifg else "ifco"
    if cifg and any(_operand(inputs, i) is not None for i in (lay.recurrent_weights[0], lay.biases[0])):
        raise OpError(f"{name}: a CIFG LSTM (no input_to_input weights) must have no input gate recurrent weights "
                      "or bias")
    first = 1 if cifg else 0
    pick = range(first, 4)
    x_parts = [_hybrid_matrix(call, inputs, lay.input_weights[g], f"input_to_{'ifco'[g]} weights", (n_cell, n_input))
               for g in pick]
    h_parts = [_hybrid_matrix(call, inputs, lay.recurrent_weights[g], f"recurrent_to_{'ifco'[g]} weights",
                              (n_cell, n_output)) for g in pick]
    biases = []
    for g in pick:
        b = _float_operand(call, inputs, lay.biases[g], f"{'ifco'[g]} gate bias", n_cell)
        if b is None:
            raise OpError(f"{name}: operand {lay.biases[g]} ({'ifco'[g]} gate bias) is missing")
        biases.append(b)
    aux = None
    if n_aux is not None and lay.aux_weights:
        aux = Matrix.stack([_hybrid_matrix(call, inputs, lay.aux_weights[g], f"aux_input_to_{'ifco'[g]} "
                                                       "weights", (n_cell, n_aux)) for g in pick])
    peephole = {}
    for g, i in zip("ifo", lay.peepholes):
        w = _operand(inputs, i)
        if w is None or (cifg and g == "i"):
            continue
        q, scale = _hybrid_matrix(call, inputs, i, f"cell_to_{g} weights", (n_cell,))
        peephole[g] = (q.astype(np.float32) * np.float32(scale)).astype(np.float32)
    if peephole and len(peephole) != (2 if cifg else 3):
        raise OpError(f"{name}: peephole weights must be given for every gate or none")
    layer_norm = {}
    for g, i in zip("ifco", lay.layer_norm):
        coefficients = _float_operand(call, inputs, i, f"{g} layer norm coefficients", n_cell)
        if coefficients is not None and not (cifg and g == "i"):
            layer_norm[g] = coefficients
    if layer_norm and set(layer_norm) != set(gates):
        raise OpError(f"{name}: layer norm coefficients must be given for every gate or none")
    projection = projection_bias = None
    if _operand(inputs, lay.projection_weights) is not None:
        projection = Matrix.stack([_hybrid_matrix(call, inputs, lay.projection_weights,
                                                              "projection weights", (n_output, n_cell))])
        projection_bias = _float_operand(call, inputs, lay.projection_bias, "projection bias", n_output)
    elif _operand(inputs, lay.projection_bias) is not None:
        raise OpError(f"{name}: projection bias given without projection weights")
    elif n_output != n_cell:
        raise OpError(f"{name}: {n_output} outputs for {n_cell} cells without a projection")
    if opts.cell_clip < 0 or opts.proj_clip < 0:
        raise OpError(f"{name}: cell_clip and proj_clip must be >= 0, got {opts.cell_clip} and {opts.proj_clip}")
    return Cell(
        gates, Matrix.stack(x_parts), Matrix.stack(h_parts),
        np.concatenate(biases).astype(np.float32), aux=aux, peephole=peephole, layer_norm=layer_norm,
        projection=projection, projection_bias=projection_bias, activation=int(opts.fused_activation_function),
        cell_clip=float(np.float32(opts.cell_clip)), proj_clip=float(np.float32(opts.proj_clip)),
        asymmetric=bool(opts.asymmetric_quantize_inputs))


def hybrid_lstm_states(call, inputs, lay: LstmLayout, batch: int, cell: Cell):
    h, c = _operand(inputs, lay.output_state), _operand(inputs, lay.cell_state)
    n_output = cell.recurrent.q.shape[1]
    for a, what, size in ((h, "output state", n_output), (c, "cell state", cell.n_cell)):
        if a is None:
            raise OpError(f"{call.op.name}: the {what} operand (a variable tensor) is missing")
        if a.dtype != np.float32 or a.size != batch * size:
            raise OpError(f"{call.op.name}: the hybrid LSTM's {what} must be float32 with batch {batch} x {size} "
                          f"values, got {a.dtype} {list(a.shape)}")
    return h.reshape(batch, -1), c.reshape(batch, -1)


def hybrid_lstm_input(call, x) -> np.ndarray:
    if x is None or x.dtype != np.float32 or x.ndim != 3:
        raise OpError(f"{call.op.name}: the hybrid LSTM takes a 3-D float32 input, got "
                      f"{None if x is None else (x.dtype, list(x.shape))}")
    return x if call.opts.time_major else x.transpose(1, 0, 2)


def hybrid_bidi_lstm_sources(call, inputs):
    """What feeds each direction of a hybrid BIDIRECTIONAL_SEQUENCE_LSTM: (the input
    time-major, the aux input time-major or None, whether it is cross-linked — the aux input
    feeding both directions through aux weights, or absent — and the aux width the cells take).
    Not cross-linked, the aux input is the backward direction's input. Over any array type."""
    xt = hybrid_lstm_input(call, inputs[0])
    aux_in = _operand(inputs, BIDIRECTIONAL_LSTM_AUX_INPUT)
    aux_t = None if aux_in is None else hybrid_lstm_input(call, aux_in)
    if aux_t is not None and aux_t.shape[:2] != xt.shape[:2]:
        raise OpError(f"{call.op.name}: aux input shape {list(aux_in.shape)} does not match the input's time and "
                      f"batch dims {list(inputs[0].shape)}")
    has_aux_weights = _operand(inputs, BIDIRECTIONAL_LSTM_FW.aux_weights[1]) is not None
    if has_aux_weights and aux_t is None:
        raise OpError(f"{call.op.name}: aux weights given but no aux input (operand {BIDIRECTIONAL_LSTM_AUX_INPUT})")
    cross_linked = aux_t is None or has_aux_weights
    n_aux = aux_t.shape[2] if cross_linked and aux_t is not None else None
    return xt, aux_t, cross_linked, n_aux


def uni_lstm_hybrid(xp, call, *inputs):
    """UNIDIRECTIONAL_SEQUENCE_LSTM v2 / v3: float input, int8 weights (lstm_eval.cc EvalHybrid),
    over array namespace ``xp`` (NumPy here, jax.numpy in kiln.xla)."""
    if call.opts.diagonal_recurrent_tensors:
        raise OpError(f"{call.op.name}: diagonal recurrent weights have no hybrid kernel")
    xt = hybrid_lstm_input(call, inputs[0])
    cell = hybrid_lstm_cell(call, inputs, UNIDIRECTIONAL_LSTM, xt.shape[2], None)
    h0, c0 = hybrid_lstm_states(call, inputs, UNIDIRECTIONAL_LSTM, xt.shape[1], cell)
    out, h, c = run(xp, cell, xt, h0, c0, time_major=bool(call.opts.time_major))
    out = out if call.opts.time_major else out.transpose(1, 0, 2)
    lay = UNIDIRECTIONAL_LSTM
    return with_state(call, [out], (h.reshape(inputs[lay.output_state].shape), c.reshape(inputs[lay.cell_state].shape)))


def bidi_lstm_hybrid(xp, call, *inputs):
    """BIDIRECTIONAL_SEQUENCE_LSTM v2 / v3 (bidirectional_sequence_lstm.cc's hybrid path), over
    array namespace ``xp``: the aux input feeds both directions when aux weights are given, else
    it is the backward direction's input (stacked layers without cross links)."""
    xt, aux_t, cross_linked, n_aux = hybrid_bidi_lstm_sources(call, inputs)
    outs, states = [], []
    for lay, reverse in ((BIDIRECTIONAL_LSTM_FW, False), (BIDIRECTIONAL_LSTM_BW, True)):
        src = xt if (cross_linked or not reverse) else aux_t
        cell = hybrid_lstm_cell(call, inputs, lay, src.shape[2], n_aux)
        h0, c0 = hybrid_lstm_states(call, inputs, lay, xt.shape[1], cell)
        out, h, c = run(xp, cell, src, h0, c0, aux=aux_t if cross_linked else None, reverse=reverse,
                        time_major=bool(call.opts.time_major))
        outs.append(out if call.opts.time_major else out.transpose(1, 0, 2))
        states += [h.reshape(inputs[lay.output_state].shape), c.reshape(inputs[lay.cell_state].shape)]
    if call.opts.merge_outputs:
        outs = [xp.concatenate(outs, axis=-1)]
    return with_state(call, outs, states)
