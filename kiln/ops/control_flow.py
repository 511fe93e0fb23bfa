"""Control flow: WHILE, IF, CALL_ONCE — kernels that run other subgraphs through the runtime."""

from __future__ import annotations

import numpy as np

from ..errors import OpError
from .record import OpDef, OptionsSpec, on_codes

#: Hard stop for loops whose condition never turns false (a hostile or broken model).
MAX_WHILE_ITERATIONS = 10_000_000


def _truth(value, what: str) -> bool:
    arr = np.asarray(value)
    if arr.size != 1:
        raise OpError(f"{what} must be a single boolean, got shape {list(arr.shape)}")
    return bool(arr.reshape(()))


def _while(call, *loop_vars):
    rt = call.runtime
    cond, body = call.opts.cond_subgraph_index, call.opts.body_subgraph_index
    values = list(loop_vars)
    for _ in range(MAX_WHILE_ITERATIONS):
        if not _truth(rt.call_subgraph(cond, values)[0], "WHILE condition"):
            return tuple(values)
        values = list(rt.call_subgraph(body, values))
        if len(values) != len(loop_vars):
            raise OpError(f"WHILE body subgraph {body} returned {len(values)} values for {len(loop_vars)} loop variables")
    raise OpError(f"WHILE did not finish after {MAX_WHILE_ITERATIONS} iterations")


def _if(call, cond, *args):
    branch = call.opts.then_subgraph_index if _truth(cond, "IF condition") else call.opts.else_subgraph_index
    return tuple(call.runtime.call_subgraph(branch, list(args)))


def _call_once(call):
    rt = call.runtime
    index = call.opts.init_subgraph_index
    if index not in rt.call_once_done:
        rt.call_once_done.add(index)
        rt.call_subgraph(index, [])
    return ()


OPS = (
    OpDef("WHILE", _while, OptionsSpec("WhileOptions", {"cond_subgraph_index": 0, "body_subgraph_index": 0}),
          runtime_versions=("1.15.0",), subgraph_fields=("cond_subgraph_index", "body_subgraph_index"),
          quantized=on_codes(_while)),
    OpDef("IF", _if, OptionsSpec("IfOptions", {"then_subgraph_index": 0, "else_subgraph_index": 0}),
          runtime_versions=("1.15.0",), subgraph_fields=("then_subgraph_index", "else_subgraph_index"),
          quantized=on_codes(_if)),
    OpDef("CALL_ONCE", _call_once, OptionsSpec("CallOnceOptions", {"init_subgraph_index": 0}),
          runtime_versions=("2.5.0",), side_effects=True, subgraph_fields=("init_subgraph_index",),
          resource=True),
)
