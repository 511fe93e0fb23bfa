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

The arithmetic (`input_part`, `step`) is written once over a `Backend`: NumPy's here (`run`
loops over time), XLA's in kiln.xla.lower_quant_lstm (one lax.scan); the scratch-buffer
layout is static, so the logistic's scalar positions are constant masks under tracing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

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


@dataclass(frozen=True)
class Backend:
    """What the step needs of an array backend: float32 arithmetic rounded as LiteRT's
    (`float_math.Float32`, whose ``xp`` is the namespace), LiteRT's per-row quantization of
    float rows ``quantize_rows(rows, asymmetric) -> (q, scale float32, zero_point)`` and an
    exact integer product ``int_dot(q [n, k], w int8 [m, k]) -> [n, m]``."""

    f: float_math.Float32
    quantize_rows: Callable
    int_dot: Callable


def _numpy_rows(rows: np.ndarray, asymmetric: bool):
    if asymmetric:
        return quantize_rows_asymmetric(rows)
    q, scale = quantize_rows_symmetric(rows)
    return q, scale, np.zeros(rows.shape[0], np.int32)


#: kiln's NumPy kernels (BatchQuantizeFloats of kernels.hybrid, products through float64 BLAS).
NUMPY = Backend(float_math.NUMPY, _numpy_rows, lambda q, w: int_matmul(q, w.T))


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


def _quantized_product(k: Backend, rows, m: Matrix, asymmetric: bool):
    """``float32(W·q − zp·ΣW) · (s_row · s_W)`` for every row of float ``rows`` [n, cols]
    (BatchQuantizeFloats, then MatrixBatchVectorMultiplyAccumulate's product)."""
    q, sf, zp = k.quantize_rows(rows, asymmetric)
    dot = k.int_dot(q, m.q) - zp.astype(np.int64)[:, None] * m.row_sums[None, :]
    # int32 in LiteRT; its conversion to float rounds to nearest
    scale = k.f.mul(sf[:, None], m.scale[None, :])
    return k.f.mul(dot.astype(np.int32).astype(F32), scale)


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


def input_part(k: Backend, cell: Cell, x, aux=None):
    """The gates' input (and aux input) contributions, which do not depend on the recurrence,
    for every step at once: time-major ``x`` [T, B, I] (``aux`` [T, B, A]) -> [T, B, G*C],
    the bias in (unless layer norm adds it later)."""
    steps, batch = x.shape[:2]
    start = np.zeros_like(cell.bias) if cell.layer_norm else cell.bias
    pre = k.f.add(start, _quantized_product(k, x.reshape(steps * batch, -1), cell.input, cell.asymmetric))
    if aux is not None and cell.aux is not None:
        pre = k.f.add(pre, _quantized_product(k, aux.reshape(steps * batch, -1), cell.aux, cell.asymmetric))
    return pre.reshape(steps, batch, -1)


def step(k: Backend, cell: Cell, masks: dict, pre_x, h, c):
    """One time step for the batch: ``pre_x`` [B, G*C] from `input_part`, states ``h`` [B, O]
    and ``c`` [B, C] float32; returns the new (h, c) (h is also the step's output).
    ``masks``: `scalar_masks` for the node's batch and layout."""
    f, xp, n = k.f, k.f.xp, cell.n_cell
    pre = f.add(pre_x, _quantized_product(k, h, cell.recurrent, cell.asymmetric))
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
        m = f.add(base, _quantized_product(k, m, cell.projection, cell.asymmetric))
        if cell.proj_clip > 0:
            m = xp.clip(m, F32(-cell.proj_clip), F32(cell.proj_clip))
    return m, c


def run(cell: Cell, x: np.ndarray, h: np.ndarray, c: np.ndarray, *, aux: np.ndarray | None = None,
        reverse: bool = False, time_major: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One direction over time-major ``x`` [T, B, I] (``aux`` [T, B, A]) from states ``h``
    [B, O] and ``c`` [B, C], in NumPy; returns (outputs [T, B, O], h, c), all float32.
    ``time_major``: the node's layout, which decides how LiteRT steps the batch (`scalar_masks`)."""
    x = np.asarray(x, F32)
    pre_x = input_part(NUMPY, cell, x, None if aux is None else np.asarray(aux, F32))
    steps, batch = x.shape[:2]
    h, c = np.array(h, F32), np.array(c, F32)
    out = np.empty((steps, batch, h.shape[1]), F32)
    masks = scalar_masks(cell.gates, batch, cell.n_cell, time_major)
    for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
        h, c = step(NUMPY, cell, masks, pre_x[t], h, c)
        out[t] = h
    return out, h, c
