"""Which tensor of the float model each tensor of the quantized model stands for.

Quantizers keep most names (kiln's, TensorFlow's), but insert QUANTIZE / DEQUANTIZE
tensors, rename model outputs (``x_int8``) and sometimes everything else. So names are
a hint checked against the graph: model inputs pair up by position; a QUANTIZE,
DEQUANTIZE or CAST output carries its input's value; an op's outputs pair with those of the
float op of the same type and name, or else of the float op of the same type reading the
same (paired) activations, looking through reshapes one converter emits and another folds
(TensorFlow's RESHAPE before FULLY_CONNECTED). What cannot be paired is listed, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ... import ops
from ...errors import KilnError
from ...ir import Operator, Subgraph, Tensor
from ...schema import DType


def _converts(op: Operator) -> bool:
    """It moves a value between representations, computing nothing (QUANTIZE, DEQUANTIZE, CAST)."""
    return ops.states(op.op_type, "converts")


def _reshapes(op: Operator) -> bool:
    """It only reshapes: one converter may emit it where another folds it away."""
    return ops.states(op.op_type, "reshapes")


class MismatchError(KilnError, ValueError):
    """The float and quantized models are not two versions of one model."""


@dataclass
class Matching:
    """``float_of[id(q)]`` is the float-model tensor a quantized-model tensor stands for;
    ``ops`` pairs each computing quantized op with its float op; ``unmatched`` lists
    (op type, tensor name, reason) for quantized ops without a float counterpart, and
    ``float_only`` the float ops no quantized op stands for."""

    float_of: dict[int, Tensor] = field(default_factory=dict)
    ops: list[tuple[Operator, Operator]] = field(default_factory=list)
    unmatched: list[tuple[str, str, str]] = field(default_factory=list)
    float_only: list[tuple[str, str]] = field(default_factory=list)


def _describe(t: Tensor) -> str:
    return f"{t.name!r} {list(t.signature)}"


def constant_derived(sg: Subgraph) -> set[int]:
    """ids of tensors computed from constants only (e.g. DEQUANTIZE of float16 weights)."""
    derived: set[int] = set()
    for op in sg.operators:
        ins = [t for t in op.inputs if t is not None]
        if ins and all(t.is_constant or id(t) in derived for t in ins):
            derived.update(id(t) for t in op.outputs if t is not None)
    return derived


def _check_io(fsg: Subgraph, qsg: Subgraph) -> None:
    for what, fs, qs in (("inputs", fsg.inputs, qsg.inputs), ("outputs", fsg.outputs, qsg.outputs)):
        if len(fs) != len(qs):
            raise MismatchError(f"the float model has {len(fs)} {what} and the quantized model {len(qs)}: "
                                "they are not the same model")
        for k, (f, q) in enumerate(zip(fs, qs)):
            if f.signature != q.signature:
                raise MismatchError(f"{what[:-1]} {k}: float {_describe(f)} vs quantized {_describe(q)}: "
                                    "they are not the same model")


def match(fsg: Subgraph, qsg: Subgraph) -> Matching:
    """Pair the quantized subgraph's tensors and ops with the float subgraph's."""
    _check_io(fsg, qsg)
    return _Matcher(fsg, qsg).run()


def _source(t: Tensor) -> Tensor:
    """The tensor ``t`` reshapes (through any chain of shape-only ops), else ``t``."""
    while t.producer is not None and _reshapes(t.producer) and t.producer.inputs[0] is not None:
        t = t.producer.inputs[0]
    return t


def real_valued(t: Tensor) -> bool:
    """A float tensor or a quantized one: a value quantization can change (int32 shape
    arithmetic is exact in both models)."""
    return t.dtype in (DType.FLOAT32, DType.FLOAT16) or (
        t.dtype in (DType.INT8, DType.UINT8, DType.INT16) and t.quantization is not None
        and t.quantization.scale.size > 0)


def _activations(op: Operator, derived: set[int]) -> list[Tensor | None]:
    return [t if t is not None and not t.is_constant and not t.is_variable and id(t) not in derived
            and real_valued(t) else None for t in op.inputs]


def _fits(q_op: Operator, f_op: Operator) -> bool:
    qs, fs = list(q_op.outputs), list(f_op.outputs)
    return len(qs) == len(fs) and all((a is None) == (b is None) and (a is None or a.signature == b.signature)
                                      for a, b in zip(qs, fs))


class _Matcher:
    def __init__(self, fsg: Subgraph, qsg: Subgraph):
        self.fsg, self.qsg, self.m = fsg, qsg, Matching()
        self.by_name = {t.name: t for t in fsg.tensors if not t.is_constant}
        self.f_derived, self.q_derived = constant_derived(fsg), constant_derived(qsg)
        self.by_type: dict[str, list[Operator]] = {}
        for op in fsg.operators:
            self.by_type.setdefault(op.op_type, []).append(op)
        self.taken: set[int] = set()

    def run(self) -> Matching:
        m = self.m
        for f, q in zip(self.fsg.inputs, self.qsg.inputs):
            m.float_of[id(q)] = f
        for op in self.qsg.operators:
            outs = [t for t in op.outputs if t is not None]
            if not outs or all(id(t) in self.q_derived or not real_valued(t) for t in outs):
                continue
            source = op.inputs[0] if op.inputs else None
            carried = m.float_of.get(id(source)) if source is not None else None
            if _converts(op):
                if carried is not None:
                    m.float_of[id(outs[0])] = carried
                else:
                    m.unmatched.append((op.op_type, outs[0].name, "its input has no float counterpart"))
                continue
            partner, why = self.partner(op)
            if partner is None:
                if _reshapes(op) and carried is not None:  # a reshape the float model does not have
                    m.float_of[id(outs[0])] = carried
                else:
                    m.unmatched.append((op.op_type, outs[0].name, why))
                continue
            self.taken.add(id(partner))
            m.ops.append((op, partner))
            for q, f in zip(op.outputs, partner.outputs):
                if q is not None and f is not None:
                    m.float_of[id(q)] = f
        for op in self.fsg.operators:
            if id(op) not in self.taken and not (_converts(op) or _reshapes(op)) and op.outputs and \
                    not all(t is None or id(t) in self.f_derived or not real_valued(t) for t in op.outputs):
                m.float_only.append((op.op_type, op.outputs[0].name))
        return m

    def partner(self, op: Operator) -> tuple[Operator | None, str]:
        """The float op ``op`` stands for: same type and output name, else same type reading
        the same values (reshapes on either side looked through)."""
        named = self.by_name.get(op.outputs[0].name) if op.outputs[0] is not None else None
        if named is not None and named.producer is not None and id(named.producer) not in self.taken and \
                named.producer.op_type == op.op_type and _fits(op, named.producer):
            return named.producer, ""
        mine = [t for t in _activations(op, self.q_derived) if t is not None]
        wanted = [self.m.float_of.get(id(t)) for t in mine]
        if any(w is None for w in wanted):
            return None, "an input has no float counterpart"
        wanted = [_source(w) for w in wanted]
        for f_op in self.by_type.get(op.op_type, ()):
            if id(f_op) in self.taken or not _fits(op, f_op):
                continue
            theirs = [_source(t) for t in _activations(f_op, self.f_derived) if t is not None]
            if len(wanted) == len(theirs) and all(a is b for a, b in zip(wanted, theirs)):
                return f_op, ""
        return None, f"no float {op.op_type} with the same name or the same inputs"
