"""The full-integer UNIDIRECTIONAL_SEQUENCE_LSTM, bit-exact with LiteRT's 8x8->16 kernel.

LiteRT (kernels/unidirectional_sequence_lstm.cc Prepare, lstm_eval.cc EvalInteger8x8_16)
runs an LSTM whose input is int8 this way: int8 input, output state and weights; int32
biases; an int16 cell state whose scale is a power of two ``2^cell_scale``; gates in Q3.12
(the four float "intermediates" give their scales only with layer norm); the fifth
intermediate holds the hidden state's (= the output's) parameters. Per step and gate::

    gate = sat16(sat16(xp_rescale(W_x·x + b − zp_x·ΣW_x)) + xp_rescale(W_h·h − zp_h·ΣW_h))

with ``rescale`` LiteRT's MultiplyByQuantizedMultiplier by ``s_w·s_x / 2^-12`` (float32
arithmetic, then QuantizeMultiplier), sigmoid / tanh by gemmlowp's int16 fixed point
(kiln.kernels.gemmlowp), then ``c = wrap16(f·c >> 15) ⊕ wrap16(i·g >> (30 + cell_scale))``
(rounding shifts, saturating add, optional clip) and ``h = sat8(xp_rescale(o·tanh(c)) + zp)``
with ``tanh`` taking the cell at ``15 + cell_scale`` integer bits.

Quirk reproduced on purpose: for a cell scale below 2^-15 LiteRT's ApplyTanh does nothing
and the hidden state is computed from the buffer it would have written — the input gate of
the same step. TF 2.21 writes such scales; kiln matches LiteRT's result on them.

The step is written once over an array namespace ``xp`` (NumPy here, jax.numpy in the XLA
lowering): integers are int64 throughout, as LiteRT's int32 arithmetic never overflows
there on these operand ranges.

CIFG (i = 1 − f), peephole (int16 weights; i and f see the old cell, o the new one) and
projection (LiteRT subtracts the hidden zero point before it) LSTMs are computed as LiteRT
does. Not implemented (refused): layer-norm LSTMs, int16 activations (LiteRT's Prepare sets
its integer parameters up only for int8 inputs) and CIFG with a cell scale below 2^-15 (LiteRT
then reads a buffer it never wrote).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import OpError
from ..schema import UNIDIRECTIONAL_LSTM as LAYOUT
from . import float_math
from .family import with_state
from .fixedpoint import quantize_multiplier, xp_clamp, xp_divide_by_pot, xp_rescale
from .gemmlowp import logistic_table, tanh_table

NAME = "UNIDIRECTIONAL_SEQUENCE_LSTM"
_GATE_NAMES = ("input", "forget", "cell", "output")


@dataclass(frozen=True)
class Prepared:
    """What LiteRT's Prepare precomputes, as NumPy constants. Gate arrays are stacked along a
    first axis in ``gates`` order ("i" absent for CIFG)."""

    gates: str               # "ifco", or "fco" (CIFG: i = 1 - f)
    w_x: np.ndarray          # [G, n_cell, n_input] int64
    w_h: np.ndarray          # [G, n_cell, n_output] int64
    bias_x: np.ndarray       # [G, n_cell]: bias − zp_x·ΣW_x
    bias_h: np.ndarray       # [G, n_cell]: −zp_h·ΣW_h
    mult_x: np.ndarray       # [G, 1] multipliers and shifts of the input and recurrent parts
    shift_x: np.ndarray
    mult_h: np.ndarray
    shift_h: np.ndarray
    hidden_mult: int
    hidden_shift: int
    hidden_zp: int
    cell_shift: int          # 30 + cell_scale: the i·g product's shift into the cell scale
    cell_clip: int           # 0: none
    sigmoid: np.ndarray      # gemmlowp tables, indexed by raw + 32768
    tanh_gate: np.ndarray
    tanh_cell: np.ndarray | None   # None: LiteRT's skipped tanh (the input gate is used)
    #: peephole: gate -> (int16 weights [n_cell], multiplier, shift)
    peephole: dict = field(default_factory=dict)
    #: projection: (int8 weights [n_output, n_cell], bias + hidden_zp·ΣW, multiplier, shift)
    projection: tuple | None = None
    output_zp: int = 0       # the output state's zero point (projection output)
    proj_clip: int = 0

    @property
    def n_cell(self) -> int:
        return self.w_x.shape[1]

    @property
    def n_output(self) -> int:
        return self.w_h.shape[2]


def _scale(t) -> float:
    return float(np.float32(t.quantization.scale[0]))


def _zero_point(t) -> int:
    return int(t.quantization.zero_point[0])


def _has_params(t) -> bool:
    return t is not None and t.quantization is not None and t.quantization.scale.size > 0


def _checked_log2(scale: float) -> int | None:
    """LiteRT's CheckedLog2: the exponent of a power-of-two scale, else None."""
    log = math.log(scale) / math.log(2.0)
    rounded = round(log)
    return int(rounded) if abs(log - rounded) < 1e-3 else None


def _dtype(a) -> np.dtype:
    """An operand's dtype (a NumPy array or a JAX tracer)."""
    return np.dtype(a.dtype) if hasattr(a, "dtype") else np.asarray(a).dtype


def check_operands(op, inputs) -> None:
    """Refuse what LiteRT's integer Prepare refuses or kiln does not implement, by operand."""
    def tensor(i):
        return op.inputs[i] if i < len(op.inputs) else None

    def present(i):
        return i < len(inputs) and inputs[i] is not None

    def typed(i, what, dtype, params=True):
        if _dtype(inputs[i]) != dtype:
            raise OpError(f"{NAME}: operand {i} ({what}) must be {np.dtype(dtype)}, got {_dtype(inputs[i])}")
        if params and not _has_params(tensor(i)):
            raise OpError(f"{NAME}: operand {i} ({what}) has no quantization parameters")

    x = inputs[0]
    if x is None or _dtype(x) != np.int8:
        raise OpError(f"{NAME}: integer LSTM input must be int8, got "
                      f"{None if x is None else _dtype(x)} (LiteRT prepares its integer kernel "
                      "for int8 activations only)")
    if np.ndim(x) != 3:
        raise OpError(f"{NAME}: input must have rank 3, got shape {list(np.shape(x))}")
    if any(present(i) for i in LAYOUT.layer_norm):
        raise OpError(f"{NAME}: layer-norm integer LSTM: not implemented yet (operands {list(LAYOUT.layer_norm)})")
    cifg = not present(LAYOUT.input_weights[0])
    if cifg and (present(LAYOUT.recurrent_weights[0]) or present(LAYOUT.biases[0]) or present(LAYOUT.peepholes[0])):
        raise OpError(f"{NAME}: a CIFG LSTM (no input_to_input weights, operand 1) must have no input gate "
                      "recurrent weights, bias or peephole (operands 5, 12, 9)")
    for g, (w, r, b) in enumerate(zip(LAYOUT.input_weights, LAYOUT.recurrent_weights, LAYOUT.biases)):
        if cifg and g == 0:
            continue
        for i, kind, dtype in ((w, "input_to_", np.int8), (r, "recurrent_to_", np.int8), (b, "bias of ", np.int32)):
            what = f"{kind}{_GATE_NAMES[g]}"
            if not present(i):
                raise OpError(f"{NAME}: operand {i} ({what}) is missing")
            typed(i, what, dtype, params=dtype == np.int8)
    peepholes = [i for i in LAYOUT.peepholes if present(i)]
    if peepholes and len(peepholes) != (2 if cifg else 3):
        raise OpError(f"{NAME}: peephole weights (operands 9-11) must be given for every gate or none")
    for i in peepholes:
        typed(i, "peephole weights", np.int16)
    if present(LAYOUT.projection_bias) and not present(LAYOUT.projection_weights):
        raise OpError(f"{NAME}: projection bias (operand 17) without projection weights (operand 16)")
    if present(LAYOUT.projection_weights):
        typed(LAYOUT.projection_weights, "projection weights", np.int8)
        if present(LAYOUT.projection_bias):
            typed(LAYOUT.projection_bias, "projection bias", np.int32, params=False)
    for i, dtype, what in ((LAYOUT.output_state, np.int8, "output state"), (LAYOUT.cell_state, np.int16, "cell state")):
        t = tensor(i)
        if not present(i) or t is None:
            raise OpError(f"{NAME}: the {what} operand {i} (a variable tensor) is missing")
        if _dtype(inputs[i]) != dtype or not _has_params(t):
            raise OpError(f"{NAME}: the {what} operand {i} must be quantized {np.dtype(dtype)}, got "
                          f"{_dtype(inputs[i])}")
    if len(op.intermediates) != 5:
        raise OpError(f"{NAME}: the integer kernel needs 5 intermediate tensors, the node has "
                      f"{len(op.intermediates)}")
    if not _has_params(op.intermediates[4]):
        raise OpError(f"{NAME}: intermediate 4 (the hidden state) has no quantization parameters")
    if not _has_params(op.outputs[0]):
        raise OpError(f"{NAME}: output 0 has no quantization parameters")
    cell_scale = _checked_log2(_scale(op.inputs[LAYOUT.cell_state]))
    if cell_scale is None:
        raise OpError(f"{NAME}: the cell state's scale {_scale(op.inputs[LAYOUT.cell_state])} is not a power of two")
    if cifg and not 0 <= 15 + cell_scale <= 6:
        raise OpError(f"{NAME}: CIFG LSTM with cell scale 2^{cell_scale}: LiteRT's hidden state then reads "
                      "a buffer it never wrote (not reproducible)")


def prepare(op, inputs, cell_clip: float = 0.0, proj_clip: float = 0.0) -> Prepared:
    """LiteRT's PopulateQuantizedLstmParams8x8_16 and PopulatePrecomputedZPTimesWeightsWithBias
    on operands `check_operands` accepted."""
    x_t, h_t, c_t = op.inputs[0], op.inputs[LAYOUT.output_state], op.inputs[LAYOUT.cell_state]
    x_scale, h_scale = np.float32(_scale(x_t)), np.float32(_scale(h_t))
    gate_scale = np.float32(2.0 ** -12)          # Q3.12, no layer norm
    present = [g for g in range(4) if inputs[LAYOUT.input_weights[g]] is not None]
    gates = "".join("ifco"[g] for g in present)
    w_x = np.stack([np.asarray(inputs[LAYOUT.input_weights[g]], np.int64) for g in present])
    w_h = np.stack([np.asarray(inputs[LAYOUT.recurrent_weights[g]], np.int64) for g in present])
    n_cell, n_input = w_x.shape[1:]
    n_output = w_h.shape[2]
    projection_w = inputs[LAYOUT.projection_weights] if len(inputs) > LAYOUT.projection_weights else None
    sizes_ok = (w_h.shape[1] == n_cell and all(np.shape(inputs[LAYOUT.biases[g]]) == (n_cell,) for g in present)
                and (n_output == n_cell if projection_w is None else np.shape(projection_w) == (n_output, n_cell)))
    if not sizes_ok:
        raise OpError(f"{NAME}: gate weights, biases and projection disagree on the cell and output sizes: "
                      f"weights {[list(a.shape) for a in (*w_x, *w_h)][:2]}, biases "
                      f"{[list(np.shape(inputs[LAYOUT.biases[g]])) for g in present]}")
    if projection_w is not None and n_output != n_cell and any(
            len(inputs) > i and inputs[i] is not None for i in LAYOUT.peepholes):
        raise OpError(f"{NAME}: peephole with a projection to {n_output} != {n_cell} cells: LiteRT's integer "
                      "peephole then walks the cell state in rows of n_output (not reproduced)")
    if np.shape(inputs[0])[-1] != n_input:
        raise OpError(f"{NAME}: input has {np.shape(inputs[0])[-1]} features, the weights take {n_input}")
    bias = np.stack([np.asarray(inputs[LAYOUT.biases[g]], np.int64) for g in present])

    def multipliers(indices, state_scale):
        pairs = [quantize_multiplier(float(np.float32(np.float32(_scale(op.inputs[i]) * state_scale) / gate_scale)))
                 for i in indices]
        return (np.asarray([m for m, _ in pairs], np.int64)[:, None],
                np.asarray([s for _, s in pairs], np.int64)[:, None])

    mult_x, shift_x = multipliers([LAYOUT.input_weights[g] for g in present], x_scale)
    mult_h, shift_h = multipliers([LAYOUT.recurrent_weights[g] for g in present], h_scale)
    hidden = op.intermediates[4]
    hidden_scale = np.float32(_scale(hidden))
    hidden_mult, hidden_shift = quantize_multiplier(float(np.float32(2.0 ** -15 / float(hidden_scale) * 2.0 ** -15)))
    cell_scale = _checked_log2(_scale(c_t))
    tanh_bits = 15 + cell_scale
    peephole = {}
    for g, i in zip("ifo", LAYOUT.peepholes):
        if len(inputs) > i and inputs[i] is not None:
            m, s = quantize_multiplier(float(np.float32(2.0 ** cell_scale * _scale(op.inputs[i]) / float(gate_scale))))
            peephole[g] = (np.asarray(inputs[i], np.int64), m, s)
    projection = None
    if projection_w is not None:
        w = np.asarray(projection_w, np.int64)
        b = inputs[LAYOUT.projection_bias] if len(inputs) > LAYOUT.projection_bias else None
        b = np.zeros(n_output, np.int64) if b is None else np.asarray(b, np.int64)
        scale = np.float32(np.float32(_scale(op.inputs[LAYOUT.projection_weights]) * hidden_scale) / h_scale)
        projection = (w, b + _zero_point(hidden) * w.sum(axis=1), *quantize_multiplier(float(scale)))
    return Prepared(
        gates=gates, w_x=w_x, w_h=w_h,
        bias_x=bias - _zero_point(x_t) * w_x.sum(axis=2),
        bias_h=-_zero_point(h_t) * w_h.sum(axis=2),
        mult_x=mult_x, shift_x=shift_x, mult_h=mult_h, shift_h=shift_h,
        hidden_mult=hidden_mult, hidden_shift=hidden_shift, hidden_zp=_zero_point(hidden),
        cell_shift=30 + cell_scale, cell_clip=_quantized_clip(cell_clip, _scale(c_t), 32767),
        sigmoid=logistic_table(3), tanh_gate=tanh_table(3),
        tanh_cell=tanh_table(tanh_bits) if 0 <= tanh_bits <= 6 else None,
        peephole=peephole, projection=projection, output_zp=_zero_point(h_t),
        proj_clip=_quantized_clip(proj_clip, _scale(op.outputs[0]), 127),
    )


def _quantized_clip(clip: float, scale: float, limit: int) -> int:
    """LiteRT's quantized_cell_clip / quantized_proj_clip: float32 division, clamped, truncated."""
    if clip <= 0:
        return 0
    return int(min(max(np.float32(clip) / np.float32(scale), -limit - 1.0), float(limit)))


# -- the arithmetic, over an array namespace (numpy or jax.numpy) ------------------------------

def _wrap16(x):
    return ((x + (1 << 15)) & 0xFFFF) - (1 << 15)


def _lookup(xp, table, x):
    return xp.take(table, x + (1 << 15)).astype(x.dtype)


def input_part(xp, p: Prepared, x):
    """The gates' input contributions for every step at once: x [..., n_input] int64 ->
    [..., 4, n_cell], already rescaled and saturated to int16 (LiteRT adds the recurrent
    part to this saturated value)."""
    acc = xp.einsum("...i,gci->...gc", x, p.w_x) + p.bias_x
    return xp_clamp(xp, xp_rescale(xp, acc, p.mult_x, p.shift_x), -(1 << 15), (1 << 15) - 1)


def step(xp, p: Prepared, pre, h, c):
    """One time step for a batch: ``pre`` [B, G, n_cell] from `input_part`, ``h`` [B, n_output]
    and ``c`` [B, n_cell] int64 codes; returns the new (h, c)."""
    acc = xp.einsum("bo,gco->bgc", h, p.w_h) + p.bias_h
    gates = xp_clamp(xp, pre + xp_rescale(xp, acc, p.mult_h, p.shift_h), -(1 << 15), (1 << 15) - 1)

    def gate(name, table, cell):
        z = gates[:, p.gates.index(name)]
        if name in p.peephole:      # LiteRT: i and f see the old cell, o the new one
            w, m, s = p.peephole[name]
            z = xp_clamp(xp, z + xp_rescale(xp, w * cell, xp.asarray(m, z.dtype), xp.asarray(s, z.dtype)),
                        -(1 << 15), (1 << 15) - 1)
        return _lookup(xp, table, z)

    f = gate("f", p.sigmoid, c)
    g = gate("c", p.tanh_gate, c)
    i = (32767 - f) if "i" not in p.gates else gate("i", p.sigmoid, c)
    c = _wrap16(xp_divide_by_pot(xp, f * c, 15))
    c = xp_clamp(xp, c + _wrap16(xp_divide_by_pot(xp, i * g, p.cell_shift)), -(1 << 15), (1 << 15) - 1)
    if p.cell_clip > 0:
        c = xp_clamp(xp, c, -p.cell_clip, p.cell_clip)
    o = gate("o", p.sigmoid, c)
    t = i if p.tanh_cell is None else _lookup(xp, p.tanh_cell, c)
    hidden = xp_rescale(xp, o * t, xp.asarray(p.hidden_mult, c.dtype), xp.asarray(p.hidden_shift, c.dtype))
    if p.projection is None:
        return xp_clamp(xp, hidden + p.hidden_zp, -128, 127), c
    w, bias, m, s = p.projection     # LiteRT subtracts the hidden zero point here (b/246629213)
    hidden = xp_clamp(xp, hidden - p.hidden_zp, -128, 127)
    out = xp_rescale(xp, xp.einsum("bc,oc->bo", hidden, w) + bias, xp.asarray(m, c.dtype), xp.asarray(s, c.dtype))
    out = xp_clamp(xp, out + p.output_zp, -128, 127)
    if p.proj_clip > 0:
        out = xp_clamp(xp, out, -p.proj_clip, p.proj_clip)
    return out, c


def run(xp, p: Prepared, x, h, c, time_major: bool):
    """The whole sequence over array namespace ``xp`` (NumPy loops over time, a traced backend
    scans: float_math's `recur`, which steps any dtype): x int8 [T, B, I] (time-major) or
    [B, T, I]; h, c the states' codes (any shape with batch x n_output / n_cell elements).
    Returns (output int8 in x's layout, final h int8, final c int16), the states in their
    operands' shapes."""
    xt = xp.asarray(x).astype(xp.int64)
    if not time_major:
        xt = xt.transpose(1, 0, 2)
    T, B, _ = xt.shape
    if np.size(h) != B * p.n_output or np.size(c) != B * p.n_cell:
        raise OpError(f"{NAME}: states have {np.size(h)} and {np.size(c)} elements, expected batch {B} x "
                      f"{p.n_output} and {B} x {p.n_cell}")
    hs = xp.asarray(h).astype(xp.int64).reshape(B, p.n_output)
    cs = xp.asarray(c).astype(xp.int64).reshape(B, p.n_cell)
    pre = input_part(xp, p, xt)
    out, (hs, cs) = float_math.arithmetic(xp).recur(lambda state, pre_t: step(xp, p, pre_t, *state), (hs, cs), pre)
    out = out.astype(xp.int8)
    if not time_major:
        out = out.transpose(1, 0, 2)
    return out, hs.astype(xp.int8).reshape(np.shape(h)), cs.astype(xp.int16).reshape(np.shape(c))


def uni_lstm_int8(xp, call, *inputs):
    """The int8 UNIDIRECTIONAL_SEQUENCE_LSTM over array namespace ``xp`` (NumPy here,
    jax.numpy under x64 in kiln.xla): Prepare's constants from the static operands, then `run`."""
    op, opts = call.op, call.opts
    check_operands(op, inputs)
    if opts.cell_clip < 0 or opts.proj_clip < 0:
        raise OpError(f"{NAME}: cell_clip and proj_clip must be >= 0, got {opts.cell_clip} "
                      f"and {opts.proj_clip}")
    p = prepare(op, inputs, cell_clip=float(opts.cell_clip), proj_clip=float(opts.proj_clip))
    out, h, c = run(xp, p, inputs[0], inputs[LAYOUT.output_state], inputs[LAYOUT.cell_state], bool(opts.time_major))
    return with_state(call, [out], (h, c))
