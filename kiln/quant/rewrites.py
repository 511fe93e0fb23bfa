"""Float-exact rewrites that give ops without an integer kernel one that has it, for
integer-only quantization.

LiteRT has no int8 or int16 NEG, and LayerNormalization as TF converts it negates its mean:
TF 2.21's TFLITE_BUILTINS_INT8 conversion of a transformer quietly leaves those NEGs float
inside an "integer-only" model (DEQUANTIZE, NEG, QUANTIZE), which an integer-only target
cannot run. ``−x`` is ``0 − x`` exactly in IEEE arithmetic (but for the sign of a zero), and
SUB has integer kernels, so integer-only quantization rewrites NEG into SUB before it
calibrates; SQUARE likewise becomes ``MUL(x, x)``, and SQUARED_DIFFERENCE — which LiteRT runs
in int8 but not in 16x8 — becomes ``MUL(a − b, a − b)`` in 16x8 (LiteRT's float kernel
computes the same two float32 steps; the difference gets its own calibrated range). A
rewrite happens only where the op has no kernel for the activation type and the
replacement has one. The rewritten node keeps the original's
output tensor (so denylists and the report name it as before). Ops with no such equivalent
stay as they are: integer-only quantization then refuses them, naming each.

Only integer-only quantization rewrites: with float fallback the model keeps TF's ops.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .. import ops
from ..ir import Model, Operator, Subgraph
from ..schema import DType


def _neg_as_sub(sg: Subgraph, op: Operator) -> tuple[str, list]:
    zero = sg.add_constant(sg.unique_name(f"{op.outputs[0].name}_zero"), np.zeros((), np.float32))
    return "SUB", [zero, op.inputs[0]]


def _square_as_mul(sg: Subgraph, op: Operator) -> tuple[str, list]:
    return "MUL", [op.inputs[0], op.inputs[0]]


def _squared_difference_as_mul(sg: Subgraph, op: Operator) -> tuple[str, list]:
    a, b = op.inputs[0], op.inputs[1]
    shape = tuple(np.broadcast_shapes(tuple(a.shape), tuple(b.shape)))
    difference = sg.add_tensor(sg.unique_name(f"{op.outputs[0].name}_difference"), DType.FLOAT32, shape)
    sub = sg.add_operator(Operator("SUB", options={"fused_activation_function": 0}), [a, b], [difference],
                          index=sg.operators.index(op))
    sub.version = ops.require("SUB").version(sub)
    return "MUL", [difference, difference]


#: op type -> (the integer op it becomes, how its operands are built: the replacement's op
#: type and operands, after any helper op it inserted before the original).
EQUIVALENTS: dict[str, tuple[str, Callable[[Subgraph, Operator], tuple[str, list]]]] = {
    "NEG": ("SUB", _neg_as_sub),
    "SQUARE": ("MUL", _square_as_mul),
    "SQUARED_DIFFERENCE": ("MUL", _squared_difference_as_mul),
}


def integer_equivalents(model: Model, scheme: str, denylist: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """Rewrite, in ``model``'s main subgraph, every float op of `EQUIVALENTS` whose replacement
    has a ``scheme`` ("int8" / "int16") kernel and that is not denylisted (by op type or output
    name). Returns (op type, output name) of each op rewritten."""
    sg = model.main
    done = []
    for op in list(sg.operators):
        if op.op_type not in EQUIVALENTS or op.op_type in denylist:
            continue
        target, build = EQUIVALENTS[op.op_type]
        out = op.outputs[0] if op.outputs else None
        own = ops.require(op.op_type).quantization
        rule = ops.require(target).quantization
        if out is None or not op.inputs or any(t is None or t.dtype != DType.FLOAT32 for t in op.inputs) or \
                out.dtype != DType.FLOAT32 or out.name in denylist or target in denylist or \
                (own is not None and own.quantized_in(scheme)) or rule is None or not rule.quantized_in(scheme):
            continue
        op_type, operands = build(sg, op)
        index = sg.operators.index(op)
        op.set_outputs([sg.add_tensor(sg.unique_name(f"{out.name}_replaced"), out.dtype, out.shape)])
        sg.remove_operator(op)
        new = sg.add_operator(Operator(op_type, options={"fused_activation_function": 0}), operands, [out],
                              index=index)
        new.version = ops.require(op_type).version(new)
        done.append((op.op_type, out.name))
    sg.remove_unused_tensors()
    return done
