"""Turning a run of IR operators into one traced JAX computation.

Shared by the delegate (one partition) and `to_jax` (a whole subgraph). Values flowing
through a trace are either NumPy arrays — *static*: constants, shapes, and whatever is
computed from them only — or JAX arrays. A node whose inputs are all static runs its
reference kernel right there (constant folding with the kernel's own semantics); any other
node runs its lowering.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .. import ops
from ..ops.record import KernelCall, signature
from ..schema import DType
from .lowering import ALL_STATIC, FLOAT_POLICY, LOWERINGS, Lowering, LoweringCall, make_call


def is_resource_op(op_type: str) -> bool:
    """A resource-variable op (its record says so; kiln/xla/lower_vars.py: to_jax carries them
    as state): its RESOURCE tensors are handles known while tracing."""
    return ops.states(op_type, "resource")


def _stateful(op_type: str) -> bool:
    """It reads or writes state or runs subgraphs: never folded, even on static inputs."""
    return ops.states(op_type, "resource") or ops.states(op_type, "calls_subgraphs")
#: Element types XLA has no arrays of.
_NO_ARRAYS = frozenset({DType.STRING, DType.RESOURCE, DType.VARIANT, DType.COMPLEX64, DType.COMPLEX128})
#: Constants at least this big (floating point, not needed static) become parameters:
#: device arrays handed to the compiled function instead of literals baked into it.
PARAM_MIN_SIZE = 64


def static_tensors(subgraph) -> set[int]:
    """ids of the tensors whose values are known while tracing (no run-time data in them)."""
    static: set[int] = set()
    for op in subgraph.operators:
        for t in op.inputs:
            if t is not None and t.is_constant:
                static.add(id(t))
        if ops.states(op.op_type, "reads_shape_only"):
            known = True  # shapes are fixed per compile
        elif op.op_type == "CUSTOM" or _stateful(op.op_type) or ops.get(op.op_type) is None:
            known = False
        else:
            known = all(t is None or id(t) in static for t in op.inputs) and \
                not any(t is not None and t.is_variable for t in op.inputs)
        if known:
            static.update(id(t) for t in op.outputs if t is not None)
    return static


def why_not_lowered(op, registration, static: set[int]) -> str | None:
    """None if the backend can run ``op``, else the reason it cannot (said per node): the
    table's (kiln/xla/table.py, filled before any node is offered: no lowering for its op and operand types, or its check's),
    or an operand XLA cannot have (no arrays of its type, a value needed while tracing)."""
    name = op.name
    if op.op_type == "CUSTOM":
        return f"custom op {name} has no XLA lowering"
    record = ops.get(op.op_type)
    if registration is not None and (getattr(registration, "record", None) is None
                                     or record is None or registration.kernel is not record.kernel):
        return f"{name} is overridden by a Python registration"
    entry = LOWERINGS.entry_for(op)
    if entry is None:
        if not LOWERINGS.types_of(op.op_type):
            return f"{name} has no XLA lowering"
        return f"{name} with {signature(op)} operands: {LOWERINGS.why_not(op)}"
    for t in (*op.inputs, *op.outputs):
        if t is not None and t.dtype in _NO_ARRAYS and not (t.dtype == DType.RESOURCE and is_resource_op(op.op_type)):
            return f"{name} has a {t.dtype.name} tensor ({t.name!r}), which XLA has no arrays of"
    low = entry.value
    for k in low.static_operands(len(op.inputs)):
        t = op.inputs[k]
        if t is not None and id(t) not in static:
            why = "its output shape depends on the values" if low.static == ALL_STATIC else \
                "XLA compiles static shapes and needs the value"
            return (f"{name}: {why} of operand {k} ({t.name!r}), which is only known at run time")
    return entry.why_not(op)


@dataclass
class TracedNode:
    op: object
    call: LoweringCall
    lowering: Lowering


def prepare_nodes(operators: Sequence, label_of) -> list[TracedNode]:
    nodes = []
    for op in operators:
        nodes.append(TracedNode(op, make_call(op, label_of(op)), LOWERINGS.entry_for(op).value))
    return nodes


def param_tensors(nodes: Sequence[TracedNode], every_weight: bool = False) -> list:
    """Constants read by ``nodes`` that become parameters (first-use order, no repeats): the
    large floating-point ones, or with ``every_weight`` every floating-point one of rank >= 1
    (to_jax: the weights a user may train or share; 0-d scalars stay literals)."""
    needed_static = set()
    for n in nodes:
        for k in n.lowering.static_operands(len(n.op.inputs)):
            if n.op.inputs[k] is not None:
                needed_static.add(id(n.op.inputs[k]))
    seen, params = set(), []
    for n in nodes:
        for t in n.op.inputs:
            if t is None or not t.is_constant or id(t) in seen or id(t) in needed_static:
                continue
            seen.add(id(t))
            data = np.asarray(t.data)
            if data.dtype.kind == "f" and (data.ndim >= 1 and data.size >= 1 if every_weight
                                           else data.size >= PARAM_MIN_SIZE):
                params.append(t)
    return params


def _at(exc: Exception, op) -> Exception:
    """``exc`` marked with the node it failed in (``lowering_op``; the outermost traced node
    wins: a WHILE, for a failure in its body), so a caller can fall back for that node."""
    exc.lowering_op = op
    return exc


def _is_static(value) -> bool:
    return value is None or isinstance(value, np.ndarray)


def run_nodes(nodes: Sequence[TracedNode], env: dict, float_dtype=None) -> dict:
    """Evaluate ``nodes`` in order; ``env`` maps id(tensor) -> value, filled with the results.

    ``float_dtype`` (the bfloat16 policy) replaces float32 as the type of computed values; by
    default the policy of the trace this one runs in (a WHILE body's nodes: their loop's).
    Returns {id(variable tensor): final value} for the variables the nodes leave state in.
    """
    if float_dtype is None:
        float_dtype = FLOAT_POLICY.get()
    token = FLOAT_POLICY.set(float_dtype)
    try:
        return _run_nodes(nodes, env, float_dtype)
    finally:
        FLOAT_POLICY.reset(token)


def _run_nodes(nodes: Sequence[TracedNode], env: dict, float_dtype) -> dict:
    updates: dict = {}
    import jax.numpy as jnp

    from ..errors import KilnError, OpError

    for n in nodes:
        op = n.op
        args = []
        for t in op.inputs:
            if t is None:
                args.append(None)
            elif id(t) in env:
                args.append(env[id(t)])
            else:
                args.append(np.asarray(t.data))  # a constant that is not a parameter
        try:
            if all(_is_static(a) for a in args) and not _stateful(op.op_type):
                call = KernelCall(n.call.opts, op, list(n.call.out_dtypes))
                result = ops.require(op.op_type).kernel_for(op)(call, *args)
            else:
                result = n.lowering.lower(n.call, *args)
            state = n.lowering.state
            if state:  # the new state values follow the outputs (kiln.ops.record)
                n_out = len(n.call.out_dtypes)
                for k, value in zip(state, result[n_out:]):
                    t = op.inputs[k]
                    env[id(t)] = updates[id(t)] = value.reshape(np.shape(args[k]))
                result = result[:n_out]
        except KilnError as exc:
            raise _at(type(exc)(f"{n.call.label}: {exc}"), op) from exc
        except Exception as exc:
            raise _at(OpError(f"{n.call.label}: cannot lower for input shapes "
                              f"{[None if a is None else list(np.shape(a)) for a in args]}: "
                              f"{type(exc).__name__}: {exc}"), op) from exc
        if not isinstance(result, (tuple, list)):
            result = (result,)
        for t, value, dtype in zip(op.outputs, result, n.call.out_dtypes):
            if t is None or value is None:
                continue
            if dtype is not None:
                want = float_dtype if float_dtype is not None and dtype == np.float32 else dtype
                if isinstance(value, np.ndarray):
                    value = value.astype(dtype, copy=False)
                elif value.dtype != want:
                    value = value.astype(want)
            if not isinstance(value, np.ndarray) and not hasattr(value, "dtype"):
                value = jnp.asarray(value)
            env[id(t)] = value
    return updates
