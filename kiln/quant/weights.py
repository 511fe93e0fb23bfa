"""Weight-only quantization modes that need no calibration: float16 and dynamic range.

Both rewrite constants in the IR and leave activations float, as TensorFlow 2.21's converter
does (measured, shared/quantization.md §3):

- float16: every float32 constant becomes a float16 constant read through one DEQUANTIZE
  (version 3) placed at the start of its subgraph.
- dynamic range: the weights of FULLY_CONNECTED, CONV_2D, DEPTHWISE_CONV_2D and
  TRANSPOSE_CONV with at least 1024 elements become symmetric int8, per output channel;
  LiteRT runs those ops with its hybrid kernels (inputs quantized on the fly), and
  FULLY_CONNECTED quantizes its inputs asymmetrically (``asymmetric_quantize_inputs``).
  Biases stay float.
- weight-only int8 (kiln's extension): the same weights stored as per-channel int8 and read
  through one DEQUANTIZE each (version 5), so every op still computes in float — the
  size of dynamic range with float accuracy of the dequantized weights, on any runtime
  that has DEQUANTIZE (kiln's interpreter included).
- the fused sequence LSTMs (kiln's extension: TF 2.21's default quantizer leaves them float,
  size ratio 1.00): every weight matrix of an LSTM whose weights reach the threshold
  together becomes per-tensor symmetric int8 — LiteRT's hybrid LSTM kernel reads all of
  them as int8 — with asymmetric input quantization (versions 3). Biases and layer-norm
  coefficients stay float. kiln's runtime runs them with LiteRT's hybrid LSTM kernel
  (kiln.kernels.hybrid_lstm). In weight-only mode the same matrices become int8 (per row
  for matrices, per tensor for peephole vectors) behind DEQUANTIZE, and the LSTM stays float.
  LSTMs with diagonal recurrent weights keep them float (LiteRT's hybrid kernel would read
  int8 ones as float).
- lookup tables (an Embedding's GATHER: the record's ``Quantization.table``) of at least 1024
  elements become int8, symmetric per tensor, with the GATHER on the codes (version 2) and a
  DEQUANTIZE after it, as TF 2.21 writes them (a 205 MB float table becomes 51 MB). The same
  in weight-only mode: gathering codes then dequantizing is dequantizing then gathering,
  exactly. Tables kept float are reported with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import ops
from ..ir import Model, Operator, QuantParams, Subgraph, Tensor
from ..ops.traits import Weights
from ..schema import DType
from . import params

#: TensorFlow's ``minimum_elements_for_weights`` for dynamic-range quantization.
MIN_WEIGHT_ELEMENTS = 1024

def hybrid_weights(op_type: str) -> Weights | None:
    """The weights a dynamic-range mode makes int8 for ``op_type``: the record's ``weights``
    where its quantization trait says LiteRT has a hybrid kernel (None: it keeps float
    weights). Fused LSTMs (``axis`` None: per tensor) are rewritten all or nothing."""
    record = ops.get(op_type)
    if record is None or record.weights is None or record.quantization is None or not record.quantization.hybrid:
        return None
    return record.weights


def _is_table(op_type: str) -> bool:
    record = ops.get(op_type)
    return record is not None and record.quantization is not None and record.quantization.table


def _int8_table(sg: Subgraph, op: Operator, min_elements: int, denylist, report: WeightReport) -> None:
    """A constant float lookup table as int8 (per tensor), the op selecting codes and a
    DEQUANTIZE restoring its float output; or the reason it stays float, in ``report``."""
    table = op.inputs[0] if op.inputs else None
    out = op.outputs[0] if op.outputs else None
    name = out.name if out is not None else ""
    if table is None or not table.is_constant:
        return                                  # a GATHER of activations: not a table
    if op.op_type in denylist or name in denylist:
        reason = "denylisted"
    elif not _float_constant(table) or out is None or out.dtype != DType.FLOAT32:
        reason = "table or output is not float"
    elif table.data.size < min_elements:
        reason = f"{table.data.size} table elements < {min_elements}"
    else:
        reason = None
    if reason is not None:
        report.skipped.append((op.op_type, name, reason))
        return
    q, affine = params.symmetric_weights(table.data, None)
    qp = QuantParams(affine.scale, affine.zero_point)
    op.set_input(0, sg.add_constant(table.name, q, quantization=qp))
    codes = sg.add_tensor(sg.unique_name(f"{name}_int8"), DType.INT8, out.shape, shape_signature=out.shape_signature,
                          quantization=qp)
    op.set_outputs([codes] + list(op.outputs[1:]))
    sg.add_operator("DEQUANTIZE", [codes], [out], index=sg.operators.index(op) + 1)
    report.quantized.append((op.op_type, table.name))


def _is_sequence_lstm(op_type: str) -> bool:
    weights = hybrid_weights(op_type)
    return weights is not None and weights.axis is None


@dataclass
class WeightReport:
    """What a weight-only mode changed: (op, tensor name) quantized, and what it skipped
    with the reason."""

    quantized: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str, str]] = field(default_factory=list)


def _float_constant(t: Tensor | None) -> bool:
    return t is not None and t.is_constant and t.dtype == DType.FLOAT32 and \
        (t.quantization is None or t.quantization.is_empty)


def _refresh_versions(sg: Subgraph) -> None:
    for op in sg.operators:
        record = ops.get(op.op_type)
        if record is not None:
            op.version = record.version(op)


def quantize_float16(model: Model) -> WeightReport:
    """Every float32 constant → float16 + DEQUANTIZE, in every subgraph."""
    report = WeightReport()
    for sg in model.subgraphs:
        constants = [t for t in sg.tensors if _float_constant(t) and t.users]
        for position, t in enumerate(constants):
            half = sg.add_constant(f"{t.name}_float16", t.data.astype(np.float16))
            restored = sg.add_tensor(f"{t.name}_dequantized", DType.FLOAT32, t.shape,
                                     shape_signature=t.shape_signature)
            t.replace_all_uses_with(restored)
            sg.add_operator("DEQUANTIZE", [half], [restored], index=position)
            report.quantized.append(("DEQUANTIZE", t.name))
        sg.remove_unused_tensors()
        _refresh_versions(sg)
    return report


def _int8_weights(sg: Subgraph, w: Tensor, axis: int) -> Tensor:
    q, affine = params.symmetric_weights(w.data, axis)
    return sg.add_constant(w.name, q, quantization=QuantParams(
        affine.scale, affine.zero_point, quantized_dimension=axis))


def _weight_sites(model: Model, min_elements: int, denylist, report: WeightReport, lstm):
    """(subgraph, op, weight operand, quantized dimension, weights) of every op whose float
    weights a weight mode rewrites; skipped ops go into ``report`` with the reason. Fused
    LSTMs go to ``lstm(sg, op, min_elements, denylist, report)`` on the way. Each subgraph is
    tidied (unused tensors, versions) once its ops were rewritten."""
    for sg in model.subgraphs:
        for op in list(sg.operators):
            if _is_sequence_lstm(op.op_type):
                lstm(sg, op, min_elements, denylist, report)
                continue
            if _is_table(op.op_type):
                _int8_table(sg, op, min_elements, denylist, report)
                continue
            reason = _hybrid_refusal(op, min_elements, denylist)
            if reason is None:
                weights = hybrid_weights(op.op_type)
                yield sg, op, weights.first, weights.axis, op.inputs[weights.first]
            elif hybrid_weights(op.op_type) is not None:
                report.skipped.append((op.op_type, op.outputs[0].name if op.outputs else "", reason))
        sg.remove_unused_tensors()
        _refresh_versions(sg)


def ensure_bias(sg: Subgraph, op: Operator, weights: Weights) -> None:
    """Give ``op`` a zero float bias where its record says LiteRT's quantized kernels need one
    and it has none (a Conv2D with use_bias=False): TF's converter writes the zeros too."""
    b = weights.bias
    if not weights.bias_required or (b < len(op.inputs) and op.inputs[b] is not None):
        return
    w = op.inputs[weights.first]
    zeros = sg.add_constant(f"{w.name}_bias", np.zeros(w.shape[weights.axis], np.float32))
    op.set_inputs(list(op.inputs) + [None] * (b + 1 - len(op.inputs)))
    op.set_input(b, zeros)


def quantize_dynamic_range(model: Model, *, min_elements: int = MIN_WEIGHT_ELEMENTS,
                           denylist: frozenset[str] = frozenset()) -> WeightReport:
    """int8 per-channel weights for the ops with hybrid kernels; activations stay float.

    ``denylist`` holds op types or output tensor names to leave float.
    """
    report = WeightReport()
    quantized: dict[int, Tensor] = {}   # id(float weights) -> int8 copy, shared by users
    for sg, op, index, axis, w in _weight_sites(model, min_elements, denylist, report, _hybrid_lstm):
        if id(w) not in quantized:
            quantized[id(w)] = _int8_weights(sg, w, axis)
        op.set_input(index, quantized[id(w)])
        ensure_bias(sg, op, hybrid_weights(op.op_type))
        if op.op_type == "FULLY_CONNECTED":
            op.options["asymmetric_quantize_inputs"] = True
        report.quantized.append((op.op_type, w.name))
    return report


def _hybrid_refusal(op: Operator, min_elements: int, denylist) -> str | None:
    """Why ``op`` keeps float weights, or None when it gets int8 ones."""
    weights = hybrid_weights(op.op_type)
    if weights is None:
        return "no hybrid kernel"
    if op.op_type in denylist or any(t is not None and t.name in denylist for t in op.outputs):
        return "denylisted"
    index = weights.first
    w = op.inputs[index] if index < len(op.inputs) else None
    if not _float_constant(w):
        return "weights are not a float constant"
    x = op.inputs[weights.input]
    if x is None or x.dtype != DType.FLOAT32:
        return "input is not float"
    if w.data.size < min_elements:
        return f"{w.data.size} weights < {min_elements}"
    return None


def _lstm_weights(op: Operator, min_elements: int, denylist, report: WeightReport) -> list[int] | None:
    """The weight-matrix operands of a fused LSTM a weight mode rewrites — all of them or
    none; None (and the reason in ``report``) when it keeps them float."""
    positions = [i for i in hybrid_weights(op.op_type).operands if i < len(op.inputs) and op.inputs[i] is not None]
    weights = [op.inputs[i] for i in positions]
    name = op.outputs[0].name if op.outputs and op.outputs[0] is not None else ""
    if op.op_type in denylist or name in denylist:
        reason = "denylisted"
    elif not all(_float_constant(w) for w in weights) or op.inputs[0].dtype != DType.FLOAT32:
        reason = "weights or input are not float"
    elif op.options.get("diagonal_recurrent_tensors"):
        reason = "diagonal recurrent weights: LiteRT's hybrid LSTM kernel reads them as float"
    elif sum(w.data.size for w in weights) < min_elements:
        reason = f"{sum(w.data.size for w in weights)} weights < {min_elements}"
    else:
        return positions
    report.skipped.append((op.op_type, name, reason))
    return None


def _hybrid_lstm(sg: Subgraph, op: Operator, min_elements: int, denylist, report: WeightReport) -> None:
    """int8 weights for a fused LSTM: all of them or none (LiteRT's hybrid kernel)."""
    positions = _lstm_weights(op, min_elements, denylist, report)
    if positions is None:
        return
    for i in positions:
        w = op.inputs[i]
        op.set_input(i, _int8_weights(sg, w, None))
        report.quantized.append((op.op_type, w.name))
    op.options["asymmetric_quantize_inputs"] = True


def quantize_weight_only(model: Model, *, min_elements: int = MIN_WEIGHT_ELEMENTS,
                         denylist: frozenset[str] = frozenset()) -> WeightReport:
    """Per-channel int8 weights behind DEQUANTIZE for the ops with hybrid weights
    (`hybrid_weights`); the ops themselves stay float."""
    report = WeightReport()
    restored: dict[int, Tensor] = {}   # id(float weights) -> their DEQUANTIZE output

    def dequantized(sg: Subgraph, op: Operator, w: Tensor, axis: int | None) -> Tensor:
        if id(w) not in restored:
            q = _int8_weights(sg, w, axis)
            q.name = f"{w.name}_int8"
            out = sg.add_tensor(w.name, DType.FLOAT32, w.shape, shape_signature=w.shape_signature)
            sg.add_operator("DEQUANTIZE", [q], [out], index=sg.operators.index(op))
            restored[id(w)] = out
        return restored[id(w)]

    def lstm(sg: Subgraph, op: Operator, min_elements: int, denylist, report: WeightReport) -> None:
        positions = _lstm_weights(op, min_elements, denylist, report)
        for i in positions or ():
            w = op.inputs[i]
            op.set_input(i, dequantized(sg, op, w, 0 if w.data.ndim == 2 else None))
            report.quantized.append((op.op_type, w.name))

    for sg, op, index, axis, w in _weight_sites(model, min_elements, denylist, report, lstm):
        op.set_input(index, dequantized(sg, op, w, axis))
        report.quantized.append((op.op_type, w.name))
    return report
