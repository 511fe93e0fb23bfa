"""Helpers every pass uses to inspect and rewrite the IR without breaking its order."""

from __future__ import annotations

import numpy as np

from ..ir import Operator, Subgraph, Tensor
from ..schema import DType


def writes_variable(op: Operator) -> bool:
    """Whether ``op`` writes a variable tensor (e.g. the state of a fused LSTM)."""
    return any(t is not None and t.is_variable for t in op.outputs)


def describe(op: Operator) -> str:
    """How decisions name an operator: its type and first output ("CONV_2D 'conv/Relu'")."""
    out = op.outputs[0] if op.outputs else None
    return f"{op.op_type} {out.name!r}" if out is not None else op.op_type


def is_output(t: Tensor) -> bool:
    sg = t.subgraph
    return sg is not None and any(o is t for o in sg.outputs)


def sole_user(t: Tensor) -> Operator | None:
    """The operator reading ``t`` when it is the only reader (and ``t`` is not an output)."""
    if len(t.users) != 1 or is_output(t):
        return None
    return t.users[0][0]


def const(t: Tensor | None) -> np.ndarray | None:
    """The value of a constant tensor, else None."""
    if t is None or not t.is_constant or t.quantization is not None and not t.quantization.is_empty:
        return None
    return t.data


def add_constant(sg: Subgraph, name: str, value, dtype: DType | None = None) -> Tensor:
    """A new constant tensor named ``name`` (uniquified) holding ``value``."""
    arr = np.asarray(value)
    if dtype is not None and dtype != DType.STRING:
        arr = arr.astype(DType(dtype).numpy, copy=False)
    return sg.add_constant(sg.unique_name(name), arr, dtype)


def bypass(sg: Subgraph, op: Operator, source: Tensor) -> bool:
    """Remove a one-output no-op whose output equals ``source``; False when not possible.

    When the output is a subgraph output and the source is a subgraph input or constant,
    the op must stay (a subgraph output cannot alias an input in LiteRT).
    """
    out = op.outputs[0]
    if out.is_variable:
        return False  # an op writing a variable tensor is an effect, not a copy
    if is_output(out):
        if source.producer is None or is_output(source):
            return False
        # Keep the user-visible name of the output on the surviving tensor.
        source.name, out.name = out.name, source.name
    out.replace_all_uses_with(source)  # the subgraph's and signatures' outputs too
    sg.remove_operator(op)
    return True


def broadcastable_to_last(value: np.ndarray, channels: int) -> np.ndarray | None:
    """``value`` as a per-channel vector of length ``channels`` when it only varies along the
    last axis (or is a scalar); None otherwise."""
    v = np.asarray(value)
    if v.size == 1:
        return np.full(channels, v.reshape(()), dtype=v.dtype)
    if v.ndim >= 1 and v.shape[-1] == channels and v.size == channels:
        return v.reshape(channels)
    return None
