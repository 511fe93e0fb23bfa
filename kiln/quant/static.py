"""Full-integer (static range) quantization of a float model, as TF 2.21's converter.

Calibrate, then give every activation an integer type (int8, or int16 in 16x8 mode: a
`Scheme`) with parameters as its op record's quantization trait says
(`kiln.ops.traits.Quantization`): calibrated, shared with the input, fixed, or requantized
to the output. An op is quantized to a type only where its record says LiteRT has a kernel
for it (``Quantization.types``). Weights become per-channel int8 and biases int32
(int64 in 16x8; kiln.quant.params). Ops without a kernel for the activation type stay float
between DEQUANTIZE and QUANTIZE — or, in integer-only mode, the whole conversion is refused
with the list of them (TensorFlow silently keeps them float), after ops with a float-exact
integer equivalent (NEG as ``0 − x``, SQUARE as ``x · x``: kiln.quant.rewrites) were rewritten.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from .. import ops
from ..errors import KilnError
from ..ir import Model, Operator, QuantParams, Tensor
from ..kernels.fixedpoint import round_half_away
from ..ops.traits import OutputScale, Quantization, Weights
from ..schema import DType
from . import lstm as lstm_layout
from . import params, rewrites
from .calibrate import Range, calibrate
from .weights import ensure_bias

#: Largest calibrated magnitude an activation may have (`_Rewriter`).
MAX_RANGE = 1e30


class QuantizationError(KilnError):
    """The model cannot be quantized as asked (e.g. integer-only with float-only ops)."""


@dataclass(frozen=True)
class Scheme:
    """What the activation type changes: its dtype (``name`` is the records' type key,
    "int8" or "int16"), how a calibrated range becomes parameters, the bias width, and
    whether weights become int4 where LiteRT has an int8 x int4 kernel."""

    name: str
    dtype: DType
    activation: Callable[[float, float], params.Affine]
    bias_bits: int
    #: Biases quantized through the scale's float reciprocal (`params.bias`).
    bias_by_reciprocal: bool = False
    #: int4 weights (per channel, [-7, 7]) for the ops whose record allows them.
    int4_weights: bool = False

    def fixed(self, op_type: str) -> tuple[float, int]:
        """The fixed output parameters of a ``FIXED`` op in this scheme."""
        return ops.require(op_type).quantization.fixed_params(self.name)


INT8 = Scheme("int8", DType.INT8, params.activation_int8, bias_bits=32)
#: kiln's extension: int8 activations with int4 weights where LiteRT 2.3 has an int8 x int4
#: kernel (FULLY_CONNECTED v10, CONV_2D v7, DEPTHWISE_CONV_2D v7 — the last only in its
#: optimized resolvers: BUILTIN_REF registers DEPTHWISE_CONV_2D up to v6; docs/int4_weights.md).
INT4_WEIGHTS = dataclasses.replace(INT8, int4_weights=True)


def quantization_of(op: Operator) -> Quantization | None:
    """The quantization trait of ``op``'s record (None: no record, or the op stays float)."""
    record = ops.get(op.op_type)
    return None if record is None else record.quantization


def _is_lstm(q: Quantization | None) -> bool:
    return q is not None and q.output == OutputScale.LSTM


@dataclass
class StaticReport:
    """What the integer rewrite did: quantized ops, ops left float (with the reason)."""

    quantized: list[tuple[str, str]] = field(default_factory=list)
    float_ops: list[tuple[str, str, str]] = field(default_factory=list)
    #: (op type, output name) of ops rewritten to an integer equivalent (kiln.quant.rewrites)
    rewritten: list[tuple[str, str]] = field(default_factory=list)


def _qp(a: params.Affine) -> QuantParams:
    return QuantParams(a.scale, a.zero_point, quantized_dimension=a.axis)


def _same(a: QuantParams, b: QuantParams) -> bool:
    return np.array_equal(a.scale, b.scale) and np.array_equal(a.zero_point, b.zero_point)


def _constant_refusal(t: Tensor) -> str | None:
    """Why a float constant cannot take integer parameters of its own range (None: it can)."""
    data = np.asarray(t.data)
    if data.size == 0:
        return "is empty"
    if not np.all(np.isfinite(data)):
        return "holds NaN or Inf"
    return None


def _label(op: Operator) -> str:
    out = op.outputs[0] if op.outputs and op.outputs[0] is not None else None
    return f"{op.op_type} '{out.name}'" if out is not None else op.op_type


class _Rewriter:
    """One subgraph's integer rewrite; ``q_of[id(t)]`` is the integer tensor standing for ``t``."""

    def __init__(self, model: Model, ranges: dict[int, Range], denylist: frozenset[str],
                 input_type: DType, output_type: DType, scheme: Scheme = INT8):
        self.model, self.sg, self.scheme = model, model.main, scheme
        # a copy: shared ranges rewrite it. Ranges past ±MAX_RANGE (an overflow, or an
        # infinity LiteRT's float kernels clamp to ±FLT_MAX) would give scales whose rescaling
        # multipliers LiteRT's Prepare aborts on: those tensors count as uncalibrated.
        self.overflowed = {k for k, r in ranges.items() if max(abs(r.min), abs(r.max)) > MAX_RANGE}
        self.ranges = {k: r for k, r in ranges.items() if k not in self.overflowed}
        self.denylist = denylist
        self.input_type, self.output_type = input_type, output_type
        self.q_of: dict[int, Tensor] = {}
        self.float_of: dict[int, Tensor] = {}
        self.requantized: dict[tuple, Tensor] = {}
        self.report = StaticReport()

    # -- parameters ----------------------------------------------------------------------
    def calibrated(self, t: Tensor) -> QuantParams | None:
        r = self.ranges.get(id(t))
        return None if r is None else _qp(self.scheme.activation(r.min, r.max))

    def refusal(self, op: Operator) -> str | None:
        rule = quantization_of(op)
        if rule is None or not rule.quantized_in(self.scheme.name):
            return f"no {self.scheme.name} kernel"
        if op.op_type in self.denylist or any(t is not None and t.name in self.denylist for t in op.outputs):
            return "denylisted"
        if rule.output == OutputScale.LSTM:
            reason = lstm_layout.refusal(op)
            if reason is None:
                reason = self.uncalibrated(op.inputs[0], "input") or self.uncalibrated(op.outputs[0], "output")
            return reason
        if any(t is None or t.dtype != DType.FLOAT32 for t in op.outputs):
            return "output is not float"
        positions = self._activation_positions(op, rule)
        for i in positions:
            t = op.inputs[i]
            if t.dtype != DType.FLOAT32 and id(t) not in self.q_of:
                return f"input {i} is not float"
            if t.is_constant:
                reason = _constant_refusal(t)
                if reason is not None:
                    return f"constant input {i} {reason}"
            elif id(t) not in self.ranges:
                return self.uncalibrated(t, f"input {i}")
        if rule.output == OutputScale.SAME and positions and op.inputs[positions[0]].is_constant:
            for t in op.outputs:   # the constant takes the output's range
                if t is not None and id(t) not in self.ranges:
                    return f"constant input {positions[0]} and " + self.uncalibrated(t, "output")
        weights = ops.require(op.op_type).weights
        if weights is not None:
            w_index = weights.first
            if not (op.inputs[w_index] is not None and op.inputs[w_index].is_constant):
                return "weights are not constant"
        if op.op_type == "PRELU" and self.scheme.dtype == DType.INT16 and not op.inputs[1].is_constant:
            return "16x8 PRELU needs a constant alpha (LiteRT reads alpha as int8)"
        if rule.output not in (OutputScale.SAME, OutputScale.FIXED):
            for t in op.outputs:
                if t is not None and id(t) not in self.ranges:
                    return self.uncalibrated(t, "output")
        return None

    def uncalibrated(self, t: Tensor, what: str) -> str | None:
        """Why ``t`` has no usable calibrated range (None: it has one)."""
        if id(t) in self.ranges:
            return None
        if id(t) in self.overflowed:
            return f"{what} overflowed in calibration (values beyond ±{MAX_RANGE:g})"
        return f"{what} was not calibrated"

    def _activation_positions(self, op: Operator, rule: Quantization) -> list[int]:
        if rule.output == OutputScale.REQUANTIZE:   # every real-valued input, also those already turned integer
            return [i for i, t in enumerate(op.inputs)
                    if t is not None and (t.dtype == DType.FLOAT32 or id(t) in self.q_of)]
        return [i for i in rule.activations if i < len(op.inputs) and op.inputs[i] is not None]

    # -- tensors ------------------------------------------------------------------------
    def _insert_before(self, anchor: Operator, op_type: str, src: Tensor, dst: Tensor) -> None:
        self.sg.add_operator(op_type, [src], [dst], index=self.sg.operators.index(anchor))

    def quantized_input(self, op: Operator, t: Tensor, need: QuantParams, dtype: DType | None = None) -> Tensor:
        """An integer tensor (the scheme's type unless ``dtype``) holding ``t`` with parameters
        ``need`` (QUANTIZE inserted as needed)."""
        dtype = dtype or self.scheme.dtype
        name = dtype.name.lower()
        if t.is_constant:
            scaled = t.data.astype(np.float64) / np.float64(need.scale[0])
            info = np.iinfo(dtype.numpy)
            q = np.clip(round_half_away(scaled) + need.zero_point[0], info.min, info.max)
            return self.sg.add_constant(f"{t.name}_{name}", q.astype(dtype.numpy), quantization=need)
        have = self.q_of.get(id(t))
        if have is not None and have.dtype == dtype and _same(have.quantization, need):
            return have
        key = (id(t), dtype, float(need.scale[0]), int(need.zero_point[0]))
        if key not in self.requantized:
            out = self.sg.add_tensor(f"{t.name}_requantized" if have is not None else f"{t.name}_{name}",
                                     dtype, t.shape, shape_signature=t.shape_signature, quantization=need)
            if have is None and t.producer is not None:   # a float op's result: right after it
                self.sg.add_operator("QUANTIZE", [t], [out], index=self.sg.operators.index(t.producer) + 1)
            else:
                self._insert_before(op, "QUANTIZE", have if have is not None else t, out)
            self.requantized[key] = out
        return self.requantized[key]

    def float_input(self, op: Operator, t: Tensor) -> Tensor:
        """The float value of an activation that was turned integer (DEQUANTIZE, once)."""
        if id(t) not in self.float_of:
            out = self.sg.add_tensor(f"{t.name}_dequantized", DType.FLOAT32, t.shape,
                                     shape_signature=t.shape_signature)
            self._insert_before(op, "DEQUANTIZE", t, out)
            self.float_of[id(t)] = out
        return self.float_of[id(t)]

    def make_quantized(self, t: Tensor, qp: QuantParams, dtype: DType | None = None) -> None:
        """Turn op output ``t`` integer; a float model output keeps its tensor behind a DEQUANTIZE."""
        dtype = dtype or self.scheme.dtype
        if t in self.sg.outputs and self.output_type == DType.FLOAT32:
            q = self.sg.add_tensor(f"{t.name}_{dtype.name.lower()}", dtype, t.shape,
                                   shape_signature=t.shape_signature, quantization=qp)
            producer = t.producer
            producer.set_outputs([q if o is t else o for o in producer.outputs])
            self.sg.add_operator("DEQUANTIZE", [q], [t], index=self.sg.operators.index(producer) + 1)
            self.q_of[id(t)] = q
            return
        t.dtype, t.quantization = dtype, qp
        self.q_of[id(t)] = t

    # -- the rewrite --------------------------------------------------------------------
    def model_inputs(self) -> None:
        for x in self.sg.inputs:
            qp = self.calibrated(x) if x.dtype == DType.FLOAT32 else None
            if qp is None:
                continue
            if self.input_type == DType.FLOAT32:
                q = self.sg.add_tensor(f"{x.name}_{self.scheme.name}", self.scheme.dtype, x.shape,
                                       shape_signature=x.shape_signature, quantization=qp)
                self.sg.add_operator("QUANTIZE", [x], [q], index=0)
                self.q_of[id(x)] = q
            elif self.input_type == self.scheme.dtype:
                x.dtype, x.quantization = self.scheme.dtype, qp
                self.q_of[id(x)] = x
            else:  # uint8 at the edge, int8 inside
                q = self.sg.add_tensor(f"{x.name}_int8", DType.INT8, x.shape, shape_signature=x.shape_signature,
                                       quantization=qp)
                x.dtype = DType.UINT8
                x.quantization = QuantParams(qp.scale, qp.zero_point + 128)
                self.sg.add_operator("QUANTIZE", [x], [q], index=0)
                self.q_of[id(x)] = q

    def share_output_ranges(self) -> None:
        """Give a requantize op's (CONCATENATION, PACK) inputs its output's calibrated range,
        as TensorFlow's quantizer does: their producers then write the output's parameters
        and LiteRT's int8 kernel, which requantizes nothing, accepts them. Last ops first,
        so a range flows down a chain of concatenations; an input whose parameters still
        differ (shared with another op, fixed by its producer) gets a requantizing QUANTIZE."""
        for op in reversed(self.sg.operators):
            rule = quantization_of(op)
            shared = self.ranges.get(id(op.outputs[0])) if op.outputs and op.outputs[0] is not None else None
            if rule is None or rule.output != OutputScale.REQUANTIZE or shared is None:
                continue
            for t in op.inputs:
                if t is not None and not t.is_constant and t.dtype == DType.FLOAT32 and id(t) in self.ranges:
                    self.ranges[id(t)] = shared

    def run(self) -> StaticReport:
        self.share_output_ranges()
        self.model_inputs()
        # The zero FILLs of the LSTMs that will be quantized: rewritten with their LSTM.
        state_writers = {id(w) for op in self.sg.operators
                         if _is_lstm(quantization_of(op)) and self.refusal(op) is None
                         for w in (lstm_layout.zero_fill(op.inputs[i])
                                   for i in lstm_layout.LAYOUT.states) if w is not None}
        for op in list(self.sg.operators):
            if id(op) in state_writers:
                continue
            reason = self.refusal(op)
            if reason is None:
                self.quantize_op(op)
                self.report.quantized.append((op.op_type, op.outputs[0].name))
            else:
                self.keep_float(op, reason)
        self.model_outputs()
        for op in [op for op in self.sg.operators if op.op_type == "QUANTIZE"]:   # e.g. of an input only float
            if not op.outputs[0].users and op.outputs[0] not in self.sg.outputs:  # ops read: nothing to feed
                self.sg.remove_operator(op)
        self.sg.remove_unused_tensors()
        for op in self.sg.operators:
            record = ops.get(op.op_type)
            if record is not None:
                op.version = record.version(op)
        return self.report

    def _own_type(self, t: Tensor) -> Tensor | None:
        """The integer tensor for ``t`` if it has the scheme's type (an int8 LSTM output in a
        16x8 model does not: its consumers requantize it)."""
        have = self.q_of.get(id(t))
        return have if have is not None and have.dtype == self.scheme.dtype else None

    def quantize_op(self, op: Operator) -> None:
        rule = quantization_of(op)
        if rule.output == OutputScale.LSTM:
            lstm_layout.quantize_lstm(self, op)
            return
        positions = self._activation_positions(op, rule)
        if rule.output == OutputScale.FIXED:
            scale, zero_point = self.scheme.fixed(op.op_type)
            out_qp = QuantParams([np.float32(scale)], [zero_point])
        elif rule.output == OutputScale.SAME:
            first = op.inputs[positions[0]]
            src = self._own_type(first)
            if src is not None:
                out_qp = src.quantization
            elif first.is_constant:   # e.g. an embedding table: TF gives it the output's range
                out_qp = self.calibrated(op.outputs[0])
            else:
                out_qp = self.calibrated(first)
        else:
            out_qp = self.calibrated(op.outputs[0])
        for i in positions:
            t = op.inputs[i]
            if rule.output in (OutputScale.SAME, OutputScale.REQUANTIZE):
                need = out_qp
            elif t.is_constant and i in rule.symmetric:
                q, affine = params.symmetric_weights(t.data, None)
                op.set_input(i, self.sg.add_constant(f"{t.name}_int8", q, dtype=DType.INT8, quantization=_qp(affine)))
                continue
            elif t.is_constant:
                need = _qp(self.scheme.activation(float(t.data.min()), float(t.data.max())))
            else:
                src = self._own_type(t)
                need = src.quantization if src is not None else self.calibrated(t)
            op.set_input(i, self.quantized_input(op, t, need))
        weights = ops.require(op.op_type).weights
        if weights is not None:
            self._weights(op, weights, rule)
        if self.scheme.dtype == DType.INT16 and op.op_type in ("ADD", "SUB"):
            op.options["pot_scale_int16"] = False   # general scales: TF's 16x8 sets the same
        for t in op.outputs:
            if t is not None:
                self.make_quantized(t, out_qp)

    def _weights(self, op: Operator, weights: Weights, rule: Quantization) -> None:
        ensure_bias(self.sg, op, weights)
        w_index, axis, b_index, x_index = weights.first, weights.axis, weights.bias, weights.input
        w = op.inputs[w_index]
        b = op.inputs[b_index] if b_index < len(op.inputs) else None
        x_scale = float(op.inputs[x_index].quantization.scale[0])
        bits = 4 if self.scheme.int4_weights and rule.int4_weights else 8
        qw, wa, qb, ba = params.weights_and_bias(w.data, axis, None if b is None else b.data, x_scale, bits=bits,
                                                 bias_bits=self.scheme.bias_bits,
                                                 bias_by_reciprocal=self.scheme.bias_by_reciprocal)
        w_type = DType.INT4 if bits == 4 else DType.INT8
        op.set_input(w_index, self.sg.add_constant(w.name, qw, dtype=w_type, quantization=_qp(wa)))
        if b is not None:
            op.set_input(b_index, self.sg.add_constant(b.name, qb, quantization=_qp(ba)))

    def keep_float(self, op: Operator, reason: str) -> None:
        if ops.states(op.op_type, "reads_shape_only"):   # it takes an integer tensor as it is
            return
        for i, t in enumerate(op.inputs):
            if t is not None and self.q_of.get(id(t)) is t:   # turned integer in place
                op.set_input(i, self.float_input(op, t))
            elif t is not None and id(t) in self.q_of and t.dtype == DType.FLOAT32:
                continue                                      # a float model input: still float
            elif t is not None and t.dtype == DType.UINT8 and id(t) in self.q_of and \
                    self.q_of[id(t)].producer is not op:      # a uint8 model input: its int8 copy, dequantized
                op.set_input(i, self.float_input(op, self.q_of[id(t)]))
        if any(t is not None and t.dtype == DType.FLOAT32 for t in op.outputs):
            self.report.float_ops.append((op.op_type, op.outputs[0].name if op.outputs else "", reason))

    def model_outputs(self) -> None:
        for t in {id(t): t for t in self.sg.outputs}.values():  # an output listed twice: one QUANTIZE
            qp = self.calibrated(t) if t.dtype == DType.FLOAT32 else None
            if self.output_type != DType.FLOAT32 and qp is not None:   # made by an op kept float
                out = self.sg.add_tensor(f"{t.name}_{self.scheme.name}", self.scheme.dtype, t.shape,
                                         shape_signature=t.shape_signature, quantization=qp)
                self.sg.add_operator("QUANTIZE", [t], [out])
                self.sg.replace_output(t, out)
                t = out
            if self.output_type == DType.UINT8 and t.dtype == DType.INT8 and t.quantization is not None:
                out = self.sg.add_tensor(f"{t.name}_uint8", DType.UINT8, t.shape, shape_signature=t.shape_signature,
                                         quantization=QuantParams(t.quantization.scale,
                                                                  t.quantization.zero_point + 128))
                self.sg.add_operator("QUANTIZE", [t], [out])
                self.sg.replace_output(t, out)


IO_TYPES = {"float32": DType.FLOAT32, "int8": DType.INT8, "uint8": DType.UINT8, "int16": DType.INT16}


def quantize_static(model: Model, dataset: Any, scheme: Scheme, *, integer_only: bool = False,
                    input_type: str = "float32", output_type: str = "float32", denylist: Iterable[str] = (),
                    progress: bool = True, ranges: dict[int, Range] | None = None,
                    allow_integer_samples: bool = False) -> StaticReport:
    """Rewrite ``model`` (main subgraph) to ``scheme``'s integer type, calibrating on ``dataset``
    (or using ``ranges`` from an earlier calibration; ``allow_integer_samples``: accept integer
    samples for float inputs, kiln.quant.calibrate)."""
    allowed = ("float32", "uint8", scheme.name) if scheme.dtype == DType.INT8 else ("float32", scheme.name)
    for what, value in (("input", input_type), ("output", output_type)):
        if value not in allowed:
            raise QuantizationError(f"inference_{what}_type must be one of {list(allowed)} for {scheme.name} "
                                    f"activations, got {value!r}")
    denylist = frozenset(denylist)
    rewritten = rewrites.integer_equivalents(model, scheme.name, denylist) if integer_only and ranges is None else []
    # Zero biases first where LiteRT's kernels need one (its float depthwise kernel crashes the
    # process without: calibration may run on LiteRT; the quantized kernels refuse the op).
    for op in model.main.operators:
        record = ops.get(op.op_type)
        if record is not None and record.weights is not None:
            ensure_bias(model.main, op, record.weights)
    if ranges is None:
        if not {"BIDIRECTIONAL_SEQUENCE_LSTM", "UNIDIRECTIONAL_SEQUENCE_LSTM"} & denylist and \
                ops.require("UNIDIRECTIONAL_SEQUENCE_LSTM").quantization.quantized_in(scheme.name):
            for op in [op for op in model.main.operators if op.op_type == "BIDIRECTIONAL_SEQUENCE_LSTM"]:
                lstm_layout.split_bidirectional(op)
        ranges = calibrate_for(model, dataset, progress=progress, allow_integer_samples=allow_integer_samples)
    rewriter = _Rewriter(model, ranges, denylist, IO_TYPES[input_type], IO_TYPES[output_type],
                         scheme)
    report = rewriter.run()
    report.rewritten = rewritten
    if integer_only and report.float_ops:
        listed = "; ".join(f"{op} '{name}' ({why})" for op, name, why in report.float_ops)
        raise QuantizationError(f"integer-only quantization: {len(report.float_ops)} op(s) have no "
                                f"{scheme.name} kernel and would stay float: {listed}. Denylist them and "
                                "allow float fallback (TFLITE_BUILTINS) to keep them float, or change the model.")
    return report


def calibrate_for(model: Model, dataset: Any, *, progress: bool = True,
                  allow_integer_samples: bool = False) -> dict[int, Range]:
    """`calibrate`, plus what the integer rewrite needs from inside fused ops: each quantizable
    LSTM's cell state range over every time step."""
    cells = [lstm_layout.CellRange(op) for op in model.main.operators
             if _is_lstm(quantization_of(op)) and lstm_layout.refusal(op) is None]
    ranges = calibrate(model, dataset, progress=progress, observers=cells,
                       allow_integer_samples=allow_integer_samples)
    for cell in cells:
        if cell.range.min <= cell.range.max:
            ranges[id(cell.cell)] = cell.range
    return ranges


def quantize_int8(model: Model, dataset: Any, **options) -> StaticReport:
    """Rewrite ``model`` (main subgraph) to int8 with calibration on ``dataset`` (options as
    `quantize_static`)."""
    return quantize_static(model, dataset, INT8, **options)


def quantize_int4_weights(model: Model, dataset: Any, **options) -> StaticReport:
    """`quantize_int8` with int4 FULLY_CONNECTED / CONV_2D / DEPTHWISE_CONV_2D weights (kiln's
    extension)."""
    return quantize_static(model, dataset, INT4_WEIGHTS, **options)
