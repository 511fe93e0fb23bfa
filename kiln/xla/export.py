"""to_jax: a whole .tflite subgraph as a pure JAX function of its inputs.

``fn(params, *inputs)`` returns the subgraph's outputs (a tuple, in the model's output
order; a dict by name for a signature). ``params`` maps constant tensor names to arrays —
every floating-point weight the computation reads (fused-RNN weights and those of WHILE /
IF bodies included; 0-d scalars stay literals), a pytree a user may train, shard, cast or
replace. ``fn`` is not jitted: wrap it in
jax.jit / vmap / pjit as needed. 64-bit types are on while it traces, as in the delegate.
Variable tensors (sequence-LSTM states) start from their initial values on every call, as
in a freshly made interpreter; their final values are not returned.

A subgraph with resource variables (VAR_HANDLE / READ_VARIABLE / ASSIGN_VARIABLE) gives a
stateful function instead: ``fn(params, state, *inputs) -> (outputs, state)``, where
``state`` maps variable names to values; ``fn.initial_state()`` runs the model's CALL_ONCE
initializers and returns the first state. Functions of different signatures of one model
share variables by name, so one state can be threaded through all of them.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import KilnError, UnsupportedError
from ..runtime.environment import reset_value
from ._jax import x64
from .graph import is_resource_op, param_tensors, prepare_nodes, run_nodes, static_tensors, why_not_lowered
from .table import fill


def _load(model):
    from ..format import read_model
    from ..ir import Model

    if isinstance(model, Model):
        return model
    if isinstance(model, (str, os.PathLike)):
        with open(model, "rb") as f:
            return read_model(f.read())
    return read_model(bytes(model))


def _called_subgraphs(model, sg) -> list:
    """The subgraphs ``sg``'s WHILE / IF nodes call, directly or through each other."""
    from .. import ops

    found, pending = {}, [sg]
    while pending:
        for op in pending.pop().operators:
            if op.op_type not in ("WHILE", "IF"):
                continue
            for field in ops.subgraph_fields(op):
                index = int(op.options[field])
                if 0 <= index < len(model.subgraphs) and id(model.subgraphs[index]) not in found:
                    found[id(model.subgraphs[index])] = model.subgraphs[index]
                    pending.append(model.subgraphs[index])
    return [callee for callee in found.values() if callee is not sg]


def to_jax(model, signature_key: str | None = None):
    """(fn, params) for the main subgraph of ``model`` (a Model, .tflite bytes or path), or for
    the subgraph of signature ``signature_key``. Raises a KilnError naming every op it
    cannot lower."""
    fill()
    from .lower_control import subgraph_parameters
    from .lower_vars import VariableStore, using

    m = _load(model)
    if signature_key is None:
        sg, sig = m.subgraphs[0], None
    else:
        sig = next((s for s in m.signatures if s.key == signature_key), None)
        if sig is None:
            raise KilnError(f"to_jax: the model has no signature {signature_key!r} "
                            f"(has: {[s.key for s in m.signatures]})")
        sg = sig.subgraph
    static = static_tensors(sg)
    problems = []
    for i, op in enumerate(sg.operators):
        reason = why_not_lowered(op, None, static)
        if reason is not None:
            problems.append(f"node {i} ({op.name}): {reason}")
    if problems:
        names = sorted({p.split("(", 1)[1].split(")", 1)[0] for p in problems})
        raise UnsupportedError(f"to_jax: {len(problems)} node(s) cannot be lowered to JAX (ops {names}):\n  "
                               + "\n  ".join(problems))
    index = {id(op): i for i, op in enumerate(sg.operators)}
    nodes = prepare_nodes(sg.operators, lambda op: f"to_jax, node {index[id(op)]} ({op.name})")
    # every float weight, those of the subgraphs WHILE / IF call included
    called = _called_subgraphs(m, sg)
    inner = [n for callee in called for n in prepare_nodes(callee.operators, lambda op: op.name)]
    params_t = param_tensors(nodes + inner, every_weight=True)
    inner_params = {id(t) for t in params_t} - {id(t) for n in nodes for t in n.op.inputs if t is not None}
    names = []
    for t in params_t:
        name = t.name or f"tensor_{id(t)}"
        while name in names:
            name += "_"
        names.append(name)
    params = {name: np.asarray(t.data) for name, t in zip(names, params_t)}
    inputs, outputs = list(sg.inputs), list(sg.outputs)
    if sig is not None:
        by_id = {id(t): k for k, t in sig.inputs.items()}
        input_names = [by_id[id(t)] for t in inputs]
    n_inputs = len(inputs)
    variables = [t for t in sg.tensors if t.is_variable]

    stateful = any(is_resource_op(op.op_type) for op in sg.operators)
    inits = [n for n in nodes if n.op.op_type == "CALL_ONCE"]

    def run(params, args, store):
        if len(args) != n_inputs:
            raise KilnError(f"to_jax function takes {n_inputs} inputs{' after the state' if stateful else ''}, "
                            f"got {len(args)}")
        import jax.numpy as jnp

        with x64(), using(store), subgraph_parameters(
                {id(t): jnp.asarray(params[name]) for name, t in zip(names, params_t) if id(t) in inner_params}):
            env = {id(t): params[name] for name, t in zip(names, params_t)}
            for t in variables:  # every call starts from the initial states (a fresh interpreter)
                env[id(t)] = jnp.asarray(t.data if t.data is not None else reset_value(t))
            for t, value in zip(inputs, args):
                env[id(t)] = jnp.asarray(value)
            run_nodes(nodes, env)
            results = []
            for t in outputs:
                value = env.get(id(t))
                if value is None:
                    value = np.asarray(t.data)
                results.append(jnp.asarray(value, dtype=t.dtype.numpy))
        if sig is not None:
            return {k: results[outputs.index(t)] for k, t in sig.outputs.items()}
        return tuple(results)

    if not stateful:
        def fn(params, *args):
            return run(params, args, VariableStore())
    else:
        def fn(params, state, *args):
            if not isinstance(state, dict):
                raise KilnError(f"this model has resource variables: call fn(params, state, *inputs) with the "
                                f"state a dict of variable values (fn.initial_state() gives the first), "
                                f"got {type(state).__name__}")
            # The state already holds what the CALL_ONCE initializers set.
            store = VariableStore(state, {int(n.call.opts.init_subgraph_index) for n in inits})
            out = run(params, args, store)
            return out, dict(sorted(store.values.items()))

        def initial_state() -> dict:
            """The variables' values after the model's CALL_ONCE initializers ran."""
            store = VariableStore()
            with x64(), using(store):
                run_nodes(inits, {})
            return {k: np.asarray(v) for k, v in sorted(store.values.items())}

        fn.initial_state = initial_state
    fn.stateful = stateful
    fn.input_names = input_names if sig is not None else [t.name for t in inputs]
    return fn, params
