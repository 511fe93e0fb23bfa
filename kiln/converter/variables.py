"""Variable-mutability analysis: which captured variables does any function assign?

Read-only variables are folded into constants (what freezing does); a variable written
anywhere — in the function itself, in a called function or in a loop body — stays a
resource variable. Resource handles are followed through Identity, call arguments and
While loop variables.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .scope import WRITE_TF_OPS
from .tfutil import function_graph
from .values import VarInfo

if TYPE_CHECKING:  # pragma: no cover
    from .importer import Importer

_CALLS = ("PartitionedCall", "StatefulPartitionedCall")


def _resolve(t, bindings: dict[str, VarInfo]) -> VarInfo | None:
    seen = 0
    while seen < 64:
        seen += 1
        op = t.op
        if op.type in ("Identity", "IdentityN"):
            t = op.inputs[t.value_index if op.type == "IdentityN" else 0]
            continue
        if op.type in ("While", "StatelessWhile"):
            t = op.inputs[t.value_index]
            continue
        return bindings.get(t.name)
    return None


def _callees(graph, op) -> list[tuple[str, int]]:
    """(function name, index of the first op input bound to its first parameter)."""
    t = op.type
    if t in _CALLS:
        return [(op.get_attr("f").name, 0)]
    if t in ("While", "StatelessWhile"):
        return [(op.get_attr("cond").name, 0), (op.get_attr("body").name, 0)]
    if t in ("If", "StatelessIf"):
        return [(op.get_attr("then_branch").name, 1), (op.get_attr("else_branch").name, 1)]
    if t in ("Case", "StatelessCase"):
        return [(f.name, 1) for f in op.get_attr("branches")]
    g = graph
    while g is not None:
        if g._get_function(t) is not None:  # noqa: SLF001 - direct call of a library function
            return [(t, 0)]
        g = getattr(g, "outer_graph", None)
    return []


def mark_mutable_variables(importer: "Importer", fn) -> None:
    """Set ``VarInfo.mutable`` for every variable ``fn`` (or anything it calls) writes."""
    graph = fn.graph
    bindings = {}
    for external, internal in graph.captures:
        if internal.dtype.name == "resource":
            bindings[internal.name] = importer.var_for(external, internal.op.name)
    _walk(graph, bindings, set())


def _walk(graph, bindings: dict[str, VarInfo], seen: set) -> None:
    if not bindings:
        return
    for op in graph.get_operations():
        if op.type in WRITE_TF_OPS and op.inputs:
            var = _resolve(op.inputs[0], bindings)
            if var is not None:
                var.mutable = True
            continue
        for fname, offset in _callees(graph, op):
            fg = function_graph(graph, fname)
            child = {}
            for ph, arg in zip(fg.inputs, op.inputs[offset:]):
                if arg.dtype.name != "resource":
                    continue
                var = _resolve(arg, bindings)
                if var is not None:
                    child[ph.name] = var
            key = (fname, tuple(sorted((k, id(v)) for k, v in child.items())))
            if key in seen:
                continue
            seen.add(key)
            _walk(fg, child, seen)
