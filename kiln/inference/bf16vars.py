"""Variables stored in bfloat16: half the memory, and no float32 -> bfloat16 cast of every weight
on every call.

A variable qualifies when every op that touches it, in every function, is a ``ReadVariableOp``
of a function the bfloat16 stage converts and every consumer of those reads is converted too
(a variable that is assigned, gathered from or read in float32 somewhere stays float32). For each
one kiln rewrites all that names its dtype: the reads, the object graph's ``SavedVariable``, the
graph's ``VarHandleOp`` (what TF Serving's loader creates), the restore function's ``RestoreV2``
/ ``AssignVariableOp`` and the save function's reads and ``SaveV2``; and writes a new checkpoint
with those values rounded to bfloat16 (the same rounding the cast did at run time).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .bfloat16 import DT_BFLOAT16, DT_FLOAT, consumers_of
from .savedmodel import CALL_OPS, bound_inputs


def _readers(model) -> dict:
    """object-graph node id -> [(function, node name, op)] of every node taking the variable."""
    bindings = bound_inputs(model)
    out: dict = {}
    for fdef in model.meta.graph_def.library.function:
        name = fdef.signature.name
        args = {a.name: i for i, a in enumerate(fdef.signature.input_arg)}
        for node in fdef.node_def:
            if node.op in CALL_OPS or node.op == "BatchFunction":
                continue  # passes the handle on: the callee's own nodes are counted
            for inp in node.input:
                i = args.get(inp)
                if i is not None and (name, i) in bindings:
                    out.setdefault(bindings[(name, i)], []).append((name, node.name, node.op))
    return out


def _saver_functions(model) -> set[str]:
    saver = model.meta.saver_def
    names = set()
    for tensor in (saver.restore_op_name, saver.save_tensor_name):
        node_name = tensor.split(":")[0]
        for node in model.meta.graph_def.node:
            if node.name == node_name and node.op in CALL_OPS:
                names.add(node.attr["f"].func.name)
    return names


def select(model, plans: dict) -> dict:
    """node id -> [(function, ReadVariableOp node)] for the variables to store in bfloat16."""
    savers = _saver_functions(model)
    graph = model.meta.object_graph_def
    chosen = {}
    for node_id, readers in _readers(model).items():
        if node_id >= len(graph.nodes) or not graph.nodes[node_id].HasField("variable"):
            continue
        if graph.nodes[node_id].variable.dtype != DT_FLOAT:
            continue
        reads, ok = [], True
        for fn, node, op in readers:
            if fn in savers:
                continue
            if op != "ReadVariableOp" or fn not in plans:
                ok = False
                break
            users = consumers_of(model.functions[fn]).get(node, set())
            if not users or not users <= set(plans[fn]):
                ok = False
                break
            reads.append((fn, node))
        if ok and reads:
            chosen[node_id] = reads
    return chosen


def _graph_handles(model, bindings) -> dict:
    """object-graph node id -> the top-level VarHandleOp node names that create it."""
    by_name = {n.name: n for n in model.meta.graph_def.node}
    out: dict = {}
    for node in model.meta.graph_def.node:
        if node.op not in CALL_OPS:
            continue
        fn = node.attr["f"].func.name
        for k, inp in enumerate(i for i in node.input if not i.startswith("^")):
            src = by_name.get(inp.split(":")[0])
            if src is not None and src.op == "VarHandleOp" and (fn, k) in bindings:
                out.setdefault(bindings[(fn, k)], set()).add(src.name)
    return out


def _retype_saver(model, handles: set[str]) -> None:
    """RestoreV2/AssignVariableOp and ReadVariableOp/SaveV2 of the saver functions, for ``handles``."""
    by_name = {n.name: n for n in model.meta.graph_def.node}
    for call in model.meta.graph_def.node:
        if call.op not in CALL_OPS or call.attr["f"].func.name not in _saver_functions(model):
            continue
        fdef = model.functions[call.attr["f"].func.name]
        data = [i.split(":")[0] for i in call.input if not i.startswith("^")]
        args = {fdef.signature.input_arg[k].name for k, src in enumerate(data)
                if src in handles and by_name.get(src) is not None and k < len(fdef.signature.input_arg)}
        nodes = {n.name: n for n in fdef.node_def}
        for node in fdef.node_def:
            if node.op == "AssignVariableOp" and node.input[0] in args:
                node.attr["dtype"].type = DT_BFLOAT16
                _retype_back(nodes, node.input[1])
            elif node.op == "ReadVariableOp" and node.input[0] in args:
                node.attr["dtype"].type = DT_BFLOAT16
                _retype_forward(fdef, nodes, node.name)


def _retype_back(nodes, tensor: str) -> None:
    """Identity chain back to RestoreV2: its dtype entry for that output becomes bfloat16."""
    parts = tensor.split(":")
    node = nodes.get(parts[0])
    while node is not None and node.op == "Identity":
        node.attr["T"].type = DT_BFLOAT16
        parts = node.input[0].split(":")
        node = nodes.get(parts[0])
    if node is not None and node.op == "RestoreV2" and len(parts) == 3:
        node.attr["dtypes"].list.type[int(parts[2])] = DT_BFLOAT16


def _retype_forward(fdef, nodes, start: str) -> None:
    """Identity chain forward to SaveV2: its dtype entry for that input becomes bfloat16."""
    frontier = [start]
    while frontier:
        name = frontier.pop()
        for node in fdef.node_def:
            data = [i for i in node.input if not i.startswith("^")]
            for pos, inp in enumerate(data):
                if inp.split(":")[0] != name:
                    continue
                if node.op == "Identity":
                    node.attr["T"].type = DT_BFLOAT16
                    frontier.append(node.name)
                elif node.op == "SaveV2" and pos >= 3:
                    node.attr["dtypes"].list.type[pos - 3] = DT_BFLOAT16


def _rewrite_checkpoint(model, node_ids, directory: Path) -> None:
    import tensorflow as tf
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    prefix = str(model.path / "variables" / "variables")
    reader = tf.train.load_checkpoint(prefix)
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    keys = {attr.checkpoint_key for i in node_ids for attr in graph.nodes[i].attributes
            if attr.name == "VARIABLE_VALUE"}
    names, tensors = [], []
    for key in sorted(reader.get_variable_to_dtype_map()):
        value = reader.get_tensor(key)
        names.append(key)
        tensors.append(tf.cast(value, tf.bfloat16) if key in keys else tf.constant(value))
    (directory / "variables").mkdir(parents=True)
    tf.raw_ops.SaveV2(prefix=str(directory / "variables" / "variables"), tensor_names=names,
                      shape_and_slices=[""] * len(names), tensors=tensors)


def store(model, chosen: dict, directory) -> str:
    """Retype the chosen variables everywhere and move the model to ``directory``; a report line."""
    directory = Path(directory)
    bindings = bound_inputs(model)
    handles = _graph_handles(model, bindings)
    graph = model.meta.object_graph_def
    by_name = {n.name: n for n in model.meta.graph_def.node}
    names = []
    for node_id in chosen:
        var = graph.nodes[node_id].variable
        var.dtype = DT_BFLOAT16
        names.append(f"{var.name or node_id} {[d.size for d in var.shape.dim]}")
        for handle in handles.get(node_id, ()):
            by_name[handle].attr["dtype"].type = DT_BFLOAT16
    all_handles = {h for i in chosen for h in handles.get(i, ())}
    for node in model.meta.graph_def.node:  # the graph's own reads (TF1-style loaders import them)
        if node.op == "ReadVariableOp" and node.input and node.input[0].split(":")[0] in all_handles:
            node.attr["dtype"].type = DT_BFLOAT16
    _retype_saver(model, all_handles)
    shutil.copytree(model.path, directory, ignore=shutil.ignore_patterns("variables", "saved_model.pb"))
    _rewrite_checkpoint(model, list(chosen), directory)
    model.path = directory
    return f"variables stored in bfloat16: {', '.join(sorted(names))}"
