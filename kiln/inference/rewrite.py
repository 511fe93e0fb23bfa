"""Graph edits on the SavedModel's FunctionDefs: XLA placement and in-graph BatchFunction ops.

Measured (docs inference.md, E2/E5): TensorFlow compiles a function with XLA only when the *call
site* carries ``_XlaMustCompile``, and a jit function used directly as ``BatchFunction.f`` is not
compiled, so batching goes BatchFunction -> wrapper function -> call site marked for XLA.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import options as opts
from .savedmodel import (
    CALL_OPS,
    DT_RESOURCE,
    SelectionError,
    arg_shape,
    bound_inputs,
    reachable,
    rename_output_port,
    user_name,
)

BATCH_OP = "BatchFunction"
DT_INT64 = 9


class BatchingError(SelectionError):
    """A function cannot be wrapped in a BatchFunction op."""


def _set_bool(attr_map, key, value=True):
    attr_map[key].b = value


def call_sites(model, target: str):
    """(container, node) for every call node of ``target`` in the library and the top-level graph."""
    for fdef in model.meta.graph_def.library.function:
        for node in fdef.node_def:
            if node.op in CALL_OPS and node.attr["f"].func.name == target:
                yield fdef, node
    for node in model.meta.graph_def.node:
        if node.op in CALL_OPS and node.attr["f"].func.name == target:
            yield None, node


def place_on_xla(model, names) -> dict[str, int]:
    """Mark every call site of each function (and the function) for XLA; returns call-site counts."""
    counts = {}
    for name in names:
        fdef = model.functions[name]
        _set_bool(fdef.attr, "_XlaMustCompile")
        _set_bool(fdef.attr, "_noinline")
        n = 0
        for _, node in call_sites(model, name):
            _set_bool(node.attr, "_XlaMustCompile")
            n += 1
        counts[name] = n
    return counts


def existing_batch_ops(model):
    """(container FunctionDef or None, node) for every BatchFunction already in the model."""
    for fdef in model.meta.graph_def.library.function:
        for node in fdef.node_def:
            if node.op == BATCH_OP:
                yield fdef, node
    for node in model.meta.graph_def.node:
        if node.op == BATCH_OP:
            yield None, node


def _set_batch_attrs(node, batch, shared_name: str) -> dict:
    attrs = {
        "num_batch_threads": batch.num_batch_threads,
        "max_batch_size": batch.max_batch_size,
        "batch_timeout_micros": batch.batch_timeout_micros,
        "max_enqueued_batches": batch.max_enqueued_batches or opts.DEFAULT_MAX_ENQUEUED_BATCHES,
        "allowed_batch_sizes": list(batch.allowed_batch_sizes),
        "enable_large_batch_splitting": not batch.disable_large_batch_splitting,
        "shared_name": shared_name,
    }
    for key in ("num_batch_threads", "max_batch_size", "batch_timeout_micros", "max_enqueued_batches"):
        node.attr[key].i = attrs[key]
    node.attr["allowed_batch_sizes"].list.Clear()
    node.attr["allowed_batch_sizes"].list.i.extend(attrs["allowed_batch_sizes"])
    node.attr["enable_large_batch_splitting"].b = attrs["enable_large_batch_splitting"]
    node.attr["shared_name"].s = shared_name.encode()
    return attrs


@dataclass
class BatchedSite:
    """One BatchFunction op kiln added or updated (for the report and the warm-up records)."""

    function: str
    caller: str
    node: str
    shared_name: str
    attrs: dict
    updated: bool = False
    inputs: list = field(default_factory=list)


def update_existing(model, batch, token: str, index: int) -> list[BatchedSite]:
    """Apply ``batch`` to every BatchFunction already in the model ("update existing batch options")."""
    sites = []
    for n, (fdef, node) in enumerate(existing_batch_ops(model)):
        shared = f"kiln/{token}/{node.attr['f'].func.name}/{n}"
        attrs = _set_batch_attrs(node, batch, shared)
        caller = fdef.signature.name if fdef is not None else "(graph)"
        sites.append(BatchedSite(node.attr["f"].func.name, caller, node.name, shared, attrs, updated=True))
    return sites


def composite_inputs(model, name: str) -> dict[int, tuple[str, str]]:
    """arg index -> (input name, type) for the flat components of composite inputs (SparseTensor,
    RaggedTensor, ...), from the function's saved input signature."""
    saved = model.meta.object_graph_def.concrete_functions.get(name)
    fdef = model.functions[name]
    out = {}
    if saved is not None and saved.HasField("canonicalized_input_signature"):
        import tensorflow as tf
        from tensorflow.python.saved_model import nested_structure_coder

        try:
            structure = nested_structure_coder.decode_proto(saved.canonicalized_input_signature)
        except Exception:  # noqa: BLE001 (a spec this TensorFlow cannot rebuild: fall back below)
            structure = None
        if structure is not None:
            pos = 0
            for spec in tf.nest.flatten(structure):
                width = len(tf.nest.flatten(spec, expand_composites=True)) if isinstance(spec, tf.TypeSpec) else 1
                if width > 1 or (isinstance(spec, tf.TypeSpec) and not isinstance(spec, tf.TensorSpec)):
                    for k in range(pos, min(pos + width, len(fdef.signature.input_arg))):
                        out[k] = (user_name(fdef, pos), type(spec).__name__.replace("Spec", ""))
                pos += width
            return out
    names = [user_name(fdef, i) for i in range(len(fdef.signature.input_arg))]  # components share a name
    for label in {n for n in names if names.count(n) > 1}:
        group = [i for i, n in enumerate(names) if n == label and fdef.signature.input_arg[i].type != DT_RESOURCE]
        types = [fdef.signature.input_arg[i].type for i in group]
        ranks = [len(arg_shape(fdef, i) or []) for i in group]
        sparse = len(group) == 3 and types[0] == types[2] == DT_INT64 and ranks == [2, 1, 1]
        for i in group:
            out[i] = (label, "SparseTensor" if sparse else "composite tensor (e.g. a RaggedTensor)")
    return out


def check_batchable(model, name: str, where: str) -> list[int]:
    """Indices of the batched inputs; TensorFlow's batching errors, at conversion.

    Resources and captured tensors (a ``tf.constant``, a lookup table's default value: bound to the
    object graph) are not batched: they become the BatchFunction's captured_tensors."""
    fdef = model.functions[name]
    bound = {i for (f, i) in bound_inputs(model) if f == name}
    composites = composite_inputs(model, name)
    batched = []
    for i, arg in enumerate(fdef.signature.input_arg):
        if arg.type == DT_RESOURCE or i in bound:
            continue
        if i in composites:
            label, kind = composites[i]
            raise BatchingError(f"{where}: cannot batch function {name!r}: input {label!r} is a {kind}; "
                                f"BatchFunction batches dense tensors along dimension 0 only. Convert it to a "
                                f"dense tensor before the batched function (e.g. tf.sparse.to_dense) or batch "
                                f"a function that takes dense tensors")
        shape = arg_shape(fdef, i)
        label = user_name(fdef, i)
        if shape is not None and len(shape) == 0:
            raise BatchingError(f"{where}: cannot batch function {name!r}: Batching input tensors must have at "
                                f"least one dimension.\nBelow are the input tensors: \n - {label} has shape []")
        if shape is not None and shape[0] is not None:
            raise BatchingError(f"{where}: cannot batch function {name!r}: input {label!r} has shape {shape} with "
                                f"a fixed 0th dimension; Batching input tensors supplied in a given op invocation "
                                f"must have equal 0th-dimension size, so the batch dimension must be None")
        batched.append(i)
    if not batched:
        raise BatchingError(f"{where}: cannot batch function {name!r}: it has no tensor inputs to batch")
    return batched


def _wrapper(model, name: str, batched: list[int], xla: bool, wrapper_name: str):
    """FunctionDef (batched args..., captured args...) -> call of ``name`` (marked for XLA when placed)."""
    from tensorflow.core.framework import function_pb2

    target = model.functions[name]
    args = target.signature.input_arg
    order = batched + [i for i in range(len(args)) if i not in batched]
    w = function_pb2.FunctionDef()
    w.signature.name = wrapper_name
    for new_i, old_i in enumerate(order):
        w.signature.input_arg.add().CopyFrom(args[old_i])
        if old_i in target.arg_attr:
            w.arg_attr[new_i].CopyFrom(target.arg_attr[old_i])
    for out in target.signature.output_arg:
        w.signature.output_arg.add().CopyFrom(out)
    call = w.node_def.add(name="call", op="StatefulPartitionedCall")
    call.input.extend(a.name for a in args)
    call.attr["f"].func.name = name
    call.attr["Tin"].list.type.extend(a.type for a in args)
    call.attr["Tout"].list.type.extend(o.type for o in target.signature.output_arg)
    if xla:
        call.attr["_XlaMustCompile"].b = True
    for k, out in enumerate(target.signature.output_arg):
        w.ret[out.name] = f"call:output:{k}"
    w.signature.is_stateful = True
    return w, order


def batch_function(model, name: str, batch, token: str, accelerator: set, where: str,
                   callers: set | None = None) -> list[BatchedSite]:
    """Replace every call of ``name`` (inside ``callers`` when given: a signature's own call graph)
    by a BatchFunction op running it; one unique shared_name each."""
    batched = check_batchable(model, name, where)
    sites_found = [(c, n) for c, n in call_sites_in_functions(model, name)
                   if callers is None or c.signature.name in callers]
    if not sites_found:
        return []  # e.g. an alias's standalone trace: nothing in the graph calls it
    wrapper_name = f"__kiln_batched_{name}"
    wrapper, order = _wrapper(model, name, batched, name in accelerator, wrapper_name)
    if wrapper_name not in model.functions:
        model.meta.graph_def.library.function.add().CopyFrom(wrapper)
        model.reindex()
    args = model.functions[name].signature.input_arg
    done = []
    for n, (caller, node) in enumerate(sites_found):
        on_xla = [a for a in accelerator if a == caller.signature.name or caller.signature.name in reachable(model, a)]
        if on_xla:
            raise BatchingError(f"{where}: cannot batch {name!r} inside {caller.signature.name!r}, which runs on "
                                f"the accelerator ({on_xla[0]!r}); BatchFunction runs on the CPU. Batch "
                                f"{on_xla[0]!r} instead")
        data = [i for i in node.input if not i.startswith("^")]
        controls = [i for i in node.input if i.startswith("^")]
        shared = f"kiln/{token}/{name}/{caller.signature.name}/{n}"
        new = type(node)(name=node.name, op=BATCH_OP, device=node.device)
        new.input.extend([data[i] for i in order] + controls)
        new.attr["f"].func.name = wrapper_name
        new.attr["Tin"].list.type.extend(args[i].type for i in batched)
        new.attr["Tcaptured"].list.type.extend(args[i].type for i in order[len(batched):])
        new.attr["Tout"].list.type.extend(o.type for o in model.functions[name].signature.output_arg)
        new.attr["container"].s = b""
        new.attr["batching_queue"].s = b""
        if "_output_shapes" in node.attr:
            new.attr["_output_shapes"].CopyFrom(node.attr["_output_shapes"])
        attrs = _set_batch_attrs(new, batch, shared)
        node.CopyFrom(new)
        rename_output_port(caller, node.name, "output", "out_tensors")
        done.append(BatchedSite(name, caller.signature.name, node.name, shared, attrs,
                                inputs=[user_name(model.functions[name], i) for i in batched]))
    return done


def call_sites_in_functions(model, target: str):
    """Call sites inside functions, leaving out kiln's own batching wrappers."""
    for fdef, node in call_sites(model, target):
        if fdef is not None and not fdef.signature.name.startswith("__kiln_batched_"):
            yield fdef, node
