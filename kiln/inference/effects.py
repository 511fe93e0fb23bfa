"""Side effects of functions: which ops change state that outlives a call.

Three parts of the converter depend on it. TF Serving replays the warm-up records at every load,
so a record must never call a signature that assigns a variable or writes a file (a ``set_w``
signature replayed with zeros left a model answering zeros). Batching groups requests, so a
batched function that keeps state sees batches (and padding rows) instead of requests. And the
bfloat16 stage must not round a value that is written back into a variable: the state would drift
by a rounding error on every call.

A state change is a stateful op that takes a resource *captured from outside the function* (a
variable, a lookup table, a random generator) and is not a known reader, or an op whose effect
leaves the process (files, checkpoints, Python callbacks). Resources created inside a function
(a TensorArray, a local table) are not state that outlives the call.
"""

from __future__ import annotations

from dataclasses import dataclass

from .savedmodel import DT_RESOURCE, bound_inputs, reachable

#: stateful ops on a resource that only read it
READERS = frozenset({
    "ReadVariableOp", "ResourceGather", "ResourceGatherNd", "VariableShape", "VarIsInitializedOp",
    "LookupTableFindV2", "LookupTableSizeV2", "LookupTableExportV2", "DisableCopyOnRead",
    "_ReadVariablesOp", "ReadVariableXlaSplitND",
})
#: ops whose effect leaves the process, whatever their inputs
OUTSIDE = {
    "WriteFile": "writes a file", "SaveV2": "writes a checkpoint", "Save": "writes a checkpoint",
    "SaveSlices": "writes a checkpoint", "MergeV2Checkpoints": "writes a checkpoint",
    "PyFunc": "calls Python (its effects are unknown)", "EagerPyFunc": "calls Python (its effects are unknown)",
    "WriteSummary": "writes a summary", "WriteScalarSummary": "writes a summary",
    "WriteHistogramSummary": "writes a summary", "WriteImageSummary": "writes a summary",
}
_PASS = ("Identity", "IdentityN")


@dataclass(frozen=True)
class Effect:
    """One op that changes state outliving the call."""

    function: str
    node: str
    op: str
    what: str  # e.g. "AssignVariableOp on variable 'w'", "writes a file"

    def __str__(self) -> str:
        where = self.function if self.node.split("/")[-1].split("_")[0] == self.op else f"{self.node} in {self.function}"
        return f"{self.what}, in {where}"


def _op_def(op: str):
    from tensorflow.python.framework import op_def_registry

    return op_def_registry.get(op)


def _arg_of(fdef, tensor: str, nodes: dict) -> int | None:
    """The function argument a (resource) tensor comes from, through Identity ops; None if made inside."""
    args = {a.name: i for i, a in enumerate(fdef.signature.input_arg)}
    seen = set()
    while tensor not in seen:
        seen.add(tensor)
        name = tensor.split(":")[0]
        if name in args and ":" not in tensor:
            return args[name]
        node = nodes.get(name)
        if node is None or node.op not in _PASS or not node.input:
            return None
        if node.op == "IdentityN":
            parts = tensor.split(":")
            tensor = node.input[int(parts[2]) if len(parts) == 3 else 0]
        else:
            tensor = node.input[0]
    return None


def _resource_inputs(node, op_def) -> list[int]:
    """Positions (among data inputs) of the node's resource inputs."""
    out, pos = [], 0
    for arg in op_def.input_arg:
        if arg.type_list_attr or arg.number_attr:
            n = len(node.attr[arg.type_list_attr].list.type) if arg.type_list_attr else node.attr[arg.number_attr].i
            pos += n
            continue
        if arg.type == DT_RESOURCE:
            out.append(pos)
        pos += 1
    return out


def _variable_name(model, function: str, index: int, bindings: dict) -> str:
    node_id = bindings.get((function, index))
    graph = model.meta.object_graph_def
    if node_id is not None and node_id < len(graph.nodes):
        node = graph.nodes[node_id]
        if node.HasField("variable"):
            return f"variable {node.variable.name or node_id!r}"
        kind = node.WhichOneof("kind")
        return f"a captured {kind or 'resource'} (object {node_id})"
    return "a captured resource"


def writers(model, name: str, bindings: dict | None = None) -> list[Effect]:
    """The ops of function ``name`` itself (not its callees) that change outliving state."""
    fdef = model.functions[name]
    nodes = {n.name: n for n in fdef.node_def}
    bindings = bound_inputs(model) if bindings is None else bindings
    found = []
    for node in fdef.node_def:
        if node.op in OUTSIDE:
            found.append(Effect(name, node.name, node.op, OUTSIDE[node.op]))
            continue
        if node.op in READERS or node.op in model.functions:
            continue
        op_def = _op_def(node.op)
        if op_def is None or not op_def.is_stateful:
            continue
        data = [i for i in node.input if not i.startswith("^")]
        for pos in _resource_inputs(node, op_def):
            if pos < len(data):
                arg = _arg_of(fdef, data[pos], nodes)
                if arg is not None:
                    found.append(Effect(name, node.name, node.op,
                                        f"{node.op} on {_variable_name(model, name, arg, bindings)}"))
                    break
    return found


def effects(model, start: str) -> list[Effect]:
    """Every state change ``start`` makes, itself or through the functions it calls."""
    bindings = bound_inputs(model)
    return [e for name in sorted({start} | reachable(model, start)) for e in writers(model, name, bindings)]


def signature_effects(model) -> dict[str, list[Effect]]:
    """signature key -> the state changes calling it makes (only signatures that make some)."""
    from .savedmodel import signature_wrapper

    out = {}
    for key in sorted(model.signatures):
        found = effects(model, signature_wrapper(model, key))
        if found:
            out[key] = found
    return out


def describe(found: list[Effect], limit: int = 3) -> str:
    shown = "; ".join(str(e) for e in found[:limit])
    return shown + (f"; and {len(found) - limit} more" if len(found) > limit else "")


def state_update_nodes(fdef, found: list[Effect]) -> set[str]:
    """Nodes of ``fdef`` whose value is written into state by one of ``found`` (its data ancestors):
    they stay float32 under bfloat16, so a state update does not drift."""
    nodes = {n.name: n for n in fdef.node_def}
    todo = []
    for effect in found:
        if effect.function == fdef.signature.name and effect.node in nodes:
            node = nodes[effect.node]
            todo += [i.split(":")[0] for i in node.input if not i.startswith("^")]
    keep = set()
    while todo:
        name = todo.pop()
        if name in keep or name not in nodes:
            continue
        keep.add(name)
        todo += [i.split(":")[0] for i in nodes[name].input if not i.startswith("^")]
    return keep
