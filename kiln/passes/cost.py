"""Multiply-accumulate counts of a model: the cost rewrites must never raise.

Counts the ops that carry a model's arithmetic (convolutions, matrix products, fused
RNNs), once per subgraph — a loop body counts once, whatever its trip count. Shapes are
the stored ones unless the caller hands in the shapes a run produced (``shapes``: id of a
tensor -> shape): a stored dynamic dim is only a placeholder, so two conversions of one
model compare fairly only at run-time shapes, which is how the tests and benchmark use it.
"""

from __future__ import annotations

import math

from typing import Mapping

from ..ir import Model, Operator

Shapes = Mapping[int, tuple]


def _shape(t, shapes: Shapes | None) -> tuple:
    if shapes is not None and id(t) in shapes:
        return tuple(shapes[id(t)])
    return t.shape


def _elements(t, shapes: Shapes | None = None) -> int:
    return math.prod(_shape(t, shapes)) if t is not None else 0


def _lstm_macs(op: Operator, first_weight: int, shapes: Shapes | None) -> int:
    x, rec = op.inputs[0], op.inputs[first_weight + 5]   # input, recurrent_to_forget weights
    x_shape = _shape(x, shapes)
    steps_batch = math.prod(x_shape[:-1])
    n_cell, n_output = rec.shape if rec is not None else (0, 0)
    gates = 4 if op.inputs[first_weight] is not None else 3   # CIFG has no input gate
    macs = steps_batch * gates * n_cell * (x_shape[-1] + n_output)
    projection = op.inputs[first_weight + 15]
    if projection is not None:
        macs += steps_batch * _elements(projection)
    return macs


def op_macs(op: Operator, shapes: Shapes | None = None) -> int:
    """Multiply-accumulates one execution of ``op`` performs (0 for ops that carry none)."""
    kind = op.op_type
    if not op.outputs or op.outputs[0] is None:
        return 0
    out = _elements(op.outputs[0], shapes)
    w = op.inputs[1] if len(op.inputs) > 1 else None
    if kind == "CONV_2D" and w is not None:
        return out * math.prod(w.shape[1:])
    if kind == "DEPTHWISE_CONV_2D" and w is not None:
        return out * w.shape[1] * w.shape[2]
    if kind == "CONV_3D" and w is not None:
        return out * math.prod(w.shape[:4])
    if kind == "FULLY_CONNECTED" and w is not None:
        return out * w.shape[-1]
    if kind == "BATCH_MATMUL" and op.inputs[0] is not None:
        x = _shape(op.inputs[0], shapes)
        return out * (x[-2] if op.options["adj_x"] else x[-1])
    if kind == "TRANSPOSE_CONV" and w is not None:
        return _elements(op.inputs[2], shapes) * w.shape[0] * w.shape[1] * w.shape[2]
    if kind == "CONV_3D_TRANSPOSE" and w is not None:
        return _elements(op.inputs[2], shapes) * math.prod(w.shape[:4])
    if kind == "UNIDIRECTIONAL_SEQUENCE_LSTM":
        return _lstm_macs(op, 1, shapes)
    if kind == "BIDIRECTIONAL_SEQUENCE_LSTM":
        return _lstm_macs(op, 1, shapes) + _lstm_macs(op, 18, shapes)
    return 0


def model_macs(model: Model, shapes: Shapes | None = None) -> int:
    """Total multiply-accumulates over every operator of every subgraph."""
    return sum(op_macs(op, shapes) for sg in model.subgraphs for op in sg.operators)
