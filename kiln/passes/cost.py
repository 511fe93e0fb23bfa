"""Multiply-accumulate counts of a model: the cost rewrites must never raise.

Counts the ops that carry a model's arithmetic (convolutions, matrix products, fused
RNNs), once per subgraph — a loop body counts once, whatever its trip count. Shapes are
the stored ones unless the caller hands in the shapes a run produced (``shapes``: id of a
tensor -> shape): a stored dynamic dim is only a placeholder, so two conversions of one
model compare fairly only at run-time shapes, which is how the tests and benchmark use it.
"""

from __future__ import annotations

from .. import ops
from ..ir import Model, Operator
from ..ops.traits import Shapes


def op_macs(op: Operator, shapes: Shapes | None = None) -> int:
    """Multiply-accumulates one execution of ``op`` performs: its record's ``macs`` rule
    (0 for ops that carry none)."""
    record = ops.get(op.op_type)
    if record is None or record.macs is None or not op.outputs or op.outputs[0] is None:
        return 0
    return record.macs(op, shapes)


def model_macs(model: Model, shapes: Shapes | None = None) -> int:
    """Total multiply-accumulates over every operator of every subgraph."""
    return sum(op_macs(op, shapes) for sg in model.subgraphs for op in sg.operators)
