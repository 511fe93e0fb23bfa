"""Lowerings of WHILE and IF: lax.while_loop / lax.cond over their subgraphs, each subgraph
traced like a partition (kiln/ops/control_flow.py runs them through the interpreter).

A node is claimed only when every op of the subgraphs it calls (and of the subgraphs those
call) can itself be lowered; their inputs count as run-time values. `to_jax` hands their
float constants in as parameters (`subgraph_parameters`). XLA needs loop-carried
values of one shape and type on every trip, and both IF branches to return the same shapes:
a loop whose file says it changes them is not claimed; one whose shapes settle after a few
trips its condition decides while tracing (TensorLists the converter built for batch 1) has
those trips peeled off; and one that still changes them while tracing is handed back
(NodesRefused) to the reference kernel, which runs it.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..errors import OpError
from ..schema import DType
from .graph import is_resource_op, prepare_nodes, run_nodes, static_tensors, why_not_lowered
from .lowering import FLOAT_POLICY, Rows, node_options

#: This module's entries of the XLA table (kiln/xla/table.py's `fill` registers them).
ROWS = Rows()


#: Constants of called subgraphs that a trace passes as parameters (to_jax's ``params``):
#: id(tensor) -> value, read by the subgraphs' traces instead of the constant.
_PARAMETERS: ContextVar[dict] = ContextVar("kiln_xla_subgraph_parameters", default={})


@contextmanager
def subgraph_parameters(values: dict):
    """Trace WHILE / IF subgraphs with ``values`` (id(tensor) -> array) for their constants."""
    token = _PARAMETERS.set(values)
    try:
        yield
    finally:
        _PARAMETERS.reset(token)


def _subgraph(op, index: int):
    model = op.subgraph.model if op.subgraph is not None else None
    if model is None or not 0 <= index < len(model.subgraphs):
        raise OpError(f"{op.name}: subgraph {index} does not exist")
    return model.subgraphs[index]


def _subgraph_problem(sg, seen: set, variables: bool = False) -> str | None:
    """Why a subgraph cannot be traced, or None. Resource variables only where ``variables``
    (CALL_ONCE's init): inside a loop or branch their values would be traced ones."""
    if id(sg) in seen:
        return f"subgraph {sg.name!r} calls itself"
    seen = seen | {id(sg)}
    static = static_tensors(sg)
    for i, op in enumerate(sg.operators):
        reason = why_not_lowered(op, None, static)
        if reason is None and not variables and is_resource_op(op.op_type):
            reason = f"{op.name} inside a WHILE / IF subgraph is not lowered"
        if reason is None and op.op_type in ("WHILE", "IF"):
            reason = _calls_problem(op, seen)
        if reason is not None:
            return f"node {i} of subgraph {sg.name!r}: {reason}"
    return None


def _calls_problem(op, seen: set = frozenset()) -> str | None:
    opts = node_options(op)
    keys = ("cond_subgraph_index", "body_subgraph_index") if op.op_type == "WHILE" else \
        ("then_subgraph_index", "else_subgraph_index")
    for key in keys:
        try:
            sg = _subgraph(op, int(getattr(opts, key)))
        except OpError as exc:
            return str(exc)
        problem = _subgraph_problem(sg, set(seen))
        if problem is not None:
            return f"{op.name} calls {problem}"
    return None


def _traced(op, index: int, label: str, keep_static: bool = False):
    """A function of the subgraph's input values returning its output values (JAX arrays;
    with ``keep_static``, values known while tracing stay NumPy)."""
    sg = _subgraph(op, index)
    where = {id(o): k for k, o in enumerate(sg.operators)}
    nodes = prepare_nodes(sg.operators, lambda o: f"{label} > subgraph {index}, node {where[id(o)]} ({o.name})")

    def run(values):
        if len(values) != len(sg.inputs):
            raise OpError(f"subgraph {index} takes {len(sg.inputs)} inputs, got {len(values)}")
        env = {**_PARAMETERS.get(), **{id(t): v for t, v in zip(sg.inputs, values)}}
        run_nodes(nodes, env)
        out = []
        for t in sg.outputs:
            value = env[id(t)] if id(t) in env else np.asarray(t.data)
            if keep_static and isinstance(value, np.ndarray):
                out.append(value.astype(t.dtype.numpy, copy=False))
            else:
                policy = FLOAT_POLICY.get()  # a float32 output stays in the policy's type
                want = policy if policy is not None and t.dtype == DType.FLOAT32 else t.dtype.numpy
                out.append(jnp.asarray(value, dtype=want))
        return out

    return run


#: Trips a WHILE may run while tracing, its condition known then, before its carried shapes
#: settle (a TensorList the converter built for batch 1 takes the real batch on its first
#: write): peeled off the loop, the rest runs as lax.while_loop.
PEELED_TRIPS = 4


def _peel(call, values: list) -> tuple[list, bool]:
    """Run the loop's first trips inline while its carried shapes change and its condition is
    known while tracing; (values, whether the loop may still run)."""
    opts = call.opts
    cond = _traced(call.op, opts.cond_subgraph_index, call.label, keep_static=True)
    body = _traced(call.op, opts.body_subgraph_index, call.label, keep_static=True)
    for _ in range(PEELED_TRIPS):
        shapes = [np.shape(v) for v in values]
        after = jax.eval_shape(lambda *vs: body(list(vs)), *values)
        if [tuple(a.shape) for a in after] == shapes:
            return values, True
        (flag, *_) = cond(values)
        if not isinstance(flag, np.ndarray) or flag.size != 1:
            return values, True  # not known while tracing: lax.while_loop names the change
        if not bool(flag.reshape(())):
            return values, False
        values = body(values)
    return values, True


def _while(call, *loop_vars):
    opts = call.opts
    values, may_run = _peel(call, list(loop_vars))
    if not may_run:
        return tuple(values)
    cond = _traced(call.op, opts.cond_subgraph_index, call.label)
    body = _traced(call.op, opts.body_subgraph_index, call.label)
    init = tuple(jnp.asarray(v) for v in values)

    def keep_going(values):
        (flag, *_) = cond(list(values))
        if flag.size != 1:
            raise OpError(f"WHILE condition must be a single boolean, got shape {list(flag.shape)}")
        return flag.reshape(()).astype(bool)

    def step(values):
        out = body(list(values))
        if len(out) != len(values):
            raise OpError(f"WHILE body returned {len(out)} values for {len(values)} loop variables")
        for k, (new, old) in enumerate(zip(out, values)):
            if new.shape != old.shape:
                raise OpError(f"WHILE loop variable {k} changes shape {list(old.shape)} -> {list(new.shape)}, "
                              "which XLA's while loop cannot carry")
        return tuple(o.astype(v.dtype) for o, v in zip(out, values))

    return lax.while_loop(keep_going, step, init)


def _if(call, cond, *args):
    opts = call.opts
    if np.size(cond) != 1:
        raise OpError(f"IF condition must be a single boolean, got shape {list(np.shape(cond))}")
    then_fn = _traced(call.op, opts.then_subgraph_index, call.label)
    else_fn = _traced(call.op, opts.else_subgraph_index, call.label)
    values = [jnp.asarray(a) for a in args]
    if isinstance(cond, np.ndarray):  # known while tracing: only the branch taken is traced
        return tuple((then_fn if bool(cond.reshape(())) else else_fn)(values))
    return tuple(lax.cond(jnp.asarray(cond).reshape(()).astype(bool), lambda v: then_fn(list(v)),
                          lambda v: else_fn(list(v)), tuple(values)))


def _loop_shapes_problem(op) -> str | None:
    """XLA carries loop variables of one shape: refuse loops whose files say they change it.
    A dimension the file leaves dynamic (-1, a TensorList with a free batch) is the trace's
    to check: a loop that does change it there is handed back to the reference kernel."""
    body = _subgraph(op, int(node_options(op).body_subgraph_index))
    for k, t in enumerate(op.inputs):
        if t is None or k >= len(body.outputs):
            continue
        out = body.outputs[k]
        if len(out.signature) != len(t.signature) or any(
                a != b and a != -1 and b != -1 for a, b in zip(t.signature, out.signature)):
            return (f"WHILE loop variable {k} ({t.name!r}) changes shape between trips "
                    f"({list(t.signature)} -> {list(out.signature)}); XLA's while loop needs one shape")
    return None


def _check(op, opts):
    problem = _calls_problem(op)
    if problem is None and op.op_type == "WHILE":
        problem = _loop_shapes_problem(op)
    return problem


ROWS.add("WHILE", _while, check=_check)
ROWS.add("IF", _if, check=_check)
