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
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import float_math
from .hybrid import int_matmul, quantize_rows_asymmetric, quantize_rows_symmetric

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


def activate(x: np.ndarray, activation: int, scalar: np.ndarray | None = None) -> np.ndarray:
    """ApplyActivationToVector (NONE is handled by the caller: LiteRT leaves the buffer);
    ``scalar``: the positions Eigen's logistic computes one by one (`float_math.logistic`)."""
    if activation == TANH:
        return float_math.tanh(x)
    if activation == SIGMOID:
        return float_math.logistic(x, scalar)
    if activation == RELU:
        return np.maximum(x, F32(0))
    if activation == RELU6:
        return np.clip(x, F32(0), F32(6))
    if activation == RELU_N1_TO_1:
        return np.clip(x, F32(-1), F32(1))
    if activation == SIGN_BIT:
        return np.signbit(x).astype(F32)
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


def _quantized_product(rows: np.ndarray, m: Matrix, asymmetric: bool) -> np.ndarray:
    """``float32(W·q − zp·ΣW) · (s_row · s_W)`` for every row of float ``rows`` [n, cols]
    (BatchQuantizeFloats, then MatrixBatchVectorMultiplyAccumulate's product)."""
    if asymmetric:
        q, sf, zp = quantize_rows_asymmetric(rows)
    else:
        q, sf = quantize_rows_symmetric(rows)
        zp = np.zeros(rows.shape[0], np.int32)
    dot = int_matmul(q, m.q.T) - zp.astype(np.int64)[:, None] * m.row_sums[None, :]
    # int32 in LiteRT; its conversion to float rounds to nearest as NumPy's does
    scale = (sf[:, None].astype(F32) * m.scale[None, :]).astype(F32)
    return (dot.astype(np.int32).astype(F32) * scale).astype(F32)


def _mean_stddev_normalization(x: np.ndarray) -> np.ndarray:
    """LiteRT's MeanStddevNormalization over the last axis: sequential float32 sums."""
    n = x.shape[-1]
    total = np.cumsum(x, axis=-1, dtype=F32)[..., -1:]
    mean = (total / F32(n)).astype(F32)
    diff = (x - mean).astype(F32)
    variance = (np.cumsum((diff * diff).astype(F32), axis=-1, dtype=F32)[..., -1:] / F32(n)).astype(F32)
    inv = (F32(1) / np.sqrt((variance + F32(1e-8)).astype(F32))).astype(F32)
    return (diff * inv).astype(F32)


def _gate(cell: Cell, pre: np.ndarray, k: int) -> np.ndarray:
    """Gate ``k``'s columns of ``pre`` [B, G*C] (bias and products in), after its peephole."""
    n = cell.n_cell
    return pre[:, k * n:(k + 1) * n]


def _finish(cell: Cell, g: str, value: np.ndarray, k: int, activation: int, scalar) -> np.ndarray:
    """Layer norm (if any), then the gate's activation (NONE: the value itself)."""
    if g in cell.layer_norm:
        n = cell.n_cell
        value = (_mean_stddev_normalization(value) * cell.layer_norm[g]).astype(F32)
        value = (value + cell.bias[k * n:(k + 1) * n]).astype(F32)
    return value if activation == NONE else activate(value, activation, scalar)


def run(cell: Cell, x: np.ndarray, h: np.ndarray, c: np.ndarray, *, aux: np.ndarray | None = None,
        reverse: bool = False, time_major: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One direction over time-major ``x`` [T, B, I] (``aux`` [T, B, A]) from states ``h``
    [B, O] and ``c`` [B, C]; returns (outputs [T, B, O], h, c), all float32. ``time_major``:
    the node's layout, which decides how LiteRT steps the batch (`scalar_masks`)."""
    x = np.asarray(x, F32)
    steps, batch = x.shape[:2]
    # The input's (and aux input's) products do not depend on the recurrence: all steps at once.
    start = np.zeros_like(cell.bias) if cell.layer_norm else cell.bias
    pre_x = (start + _quantized_product(x.reshape(steps * batch, -1), cell.input, cell.asymmetric)).astype(F32)
    if aux is not None and cell.aux is not None:
        aux = np.asarray(aux, F32)
        pre_x = (pre_x + _quantized_product(aux.reshape(steps * batch, -1), cell.aux, cell.asymmetric)).astype(F32)
    pre_x = pre_x.reshape(steps, batch, -1)
    h, c = np.asarray(h, F32).copy(), np.asarray(c, F32).copy()
    out = np.empty((steps, batch, h.shape[1]), F32)
    column = {g: k for k, g in enumerate(cell.gates)}
    masks = scalar_masks(cell.gates, batch, cell.n_cell, time_major)
    for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
        pre = (pre_x[t] + _quantized_product(h, cell.recurrent, cell.asymmetric)).astype(F32)
        gates = {}
        for g in "if":
            if g not in column:
                continue
            value = _gate(cell, pre, column[g])
            if g in cell.peephole:
                value = (value + (cell.peephole[g] * c).astype(F32)).astype(F32)
            gates[g] = _finish(cell, g, value, column[g], SIGMOID, masks[g])
        g_raw = _finish(cell, "c", _gate(cell, pre, column["c"]), column["c"], cell.activation, masks["c"])
        c = (gates["f"] * c).astype(F32)
        i = (F32(1) - gates["f"]).astype(F32) if "i" not in column else gates["i"]
        c = (c + (g_raw * i).astype(F32)).astype(F32)
        if cell.cell_clip > 0:
            c = np.clip(c, F32(-cell.cell_clip), F32(cell.cell_clip)).astype(F32)
        value = _gate(cell, pre, column["o"])
        if "o" in cell.peephole:
            value = (value + (cell.peephole["o"] * c).astype(F32)).astype(F32)
        o = _finish(cell, "o", value, column["o"], SIGMOID, masks["o"])
        # act(c) is written into the cell gate's slot (CalculateLstmOutputHybrid's scratch0)
        m = (o * (g_raw if cell.activation == NONE else activate(c, cell.activation, masks["c"]))).astype(F32)
        if cell.projection is not None:
            base = np.zeros((batch, cell.projection.q.shape[0]), F32) if cell.projection_bias is None else \
                np.broadcast_to(cell.projection_bias, (batch, cell.projection.q.shape[0])).astype(F32)
            m = (base + _quantized_product(m, cell.projection, cell.asymmetric)).astype(F32)
            if cell.proj_clip > 0:
                m = np.clip(m, F32(-cell.proj_clip), F32(cell.proj_clip)).astype(F32)
        h = m
        out[t] = h
    return out, h, c
