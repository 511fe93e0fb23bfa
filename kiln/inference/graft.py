"""Keeping the model whole through TensorFlow's quantizer.

``quantize_saved_model`` writes a model with only the listed signatures, inlines every function it
has no alias for and every function marked ``_XlaMustCompile`` (aliases of those then name
functions that no longer exist), and drops jit marks. kiln therefore quantizes a prepared copy (jit
marks removed, every function below the listed signatures given a temporary alias, so all of them
survive as functions) and grafts the result into the *original* model: the quantized functions
are added under fresh names, each listed signature's wrapper function calls the quantized one,
the jit marks and real aliases are put back on the quantized twins of the functions that had them
(the quantizer records ``_original_func_name``), and every other signature, function, alias and
object is left as it was. The float variables stay in the checkpoint: the object graph and the
signatures not quantized still use them.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import KilnError
from .savedmodel import CALL_OPS, prefixed_copy, read, signature_wrapper

PREFIX = "__kiln_int8_"
KEEP_ALIAS = "__kiln_keep_"
_JIT_ATTRS = ("_XlaMustCompile",)
_TABLE_OPS = {"HashTableV2", "MutableHashTableV2", "MutableHashTableOfTensorsV2", "MutableDenseHashTableV2",
              "InitializeTableV2", "InitializeTableFromTextFileV2", "LookupTableImportV2"}


class GraftError(KilnError, RuntimeError):
    """The quantized model cannot be put back into the original."""


def _functions_below(model, keys) -> set[str]:
    """Functions the listed signatures reach through call ops (control-flow branches stay as they are)."""
    found, todo = set(), []
    for key in keys:
        wrapper = model.functions[signature_wrapper(model, key)]
        todo += [n.attr["f"].func.name for n in wrapper.node_def if n.op in CALL_OPS]
    while todo:
        name = todo.pop()
        if name in found or name not in model.functions:
            continue
        found.add(name)
        todo += [n.attr["f"].func.name for n in model.functions[name].node_def if n.op in CALL_OPS]
    return found


def prepare(model, keys, directory) -> dict[str, dict]:
    """Write the copy the quantizer sees to ``directory``; returns function -> its removed jit attributes."""
    proto = type(model.proto)()
    proto.CopyFrom(model.proto)
    meta = next(m for m in proto.meta_graphs if list(m.meta_info_def.tags) == list(model.meta.meta_info_def.tags))
    removed: dict[str, dict] = {}
    for fdef in meta.graph_def.library.function:
        for attr in _JIT_ATTRS:
            if attr in fdef.attr:
                removed.setdefault(fdef.signature.name, {})[attr] = fdef.attr[attr].b
                del fdef.attr[attr]
        for node in fdef.node_def:
            for attr in _JIT_ATTRS:
                if attr in node.attr:
                    del node.attr[attr]
    aliases = meta.meta_info_def.function_aliases
    for k, name in enumerate(sorted(_functions_below(model, keys))):
        if name not in aliases:
            aliases[name] = f"{KEEP_ALIAS}{k}"
    path = Path(directory)
    path.mkdir(parents=True)
    (path / "saved_model.pb").write_bytes(proto.SerializeToString())
    for sub in ("variables", "assets"):
        if (model.path / sub).exists():
            os.symlink((model.path / sub).resolve(), path / sub)
    return removed


def _producer(graph_nodes: dict, tensor: str) -> tuple[str, int]:
    """(call node, output index) behind a top-level tensor name, through Identity/IdentityN."""
    name, _, index = tensor.partition(":")
    index = int(index or 0)
    for _ in range(len(graph_nodes) + 1):
        node = graph_nodes.get(name)
        if node is None or node.op in CALL_OPS:
            return name, index
        data = [i for i in node.input if not i.startswith("^")]
        if node.op == "IdentityN":
            name, _, rest = data[index].partition(":")
            index = int(rest or 0)
        elif node.op == "Identity":
            name, _, rest = data[0].partition(":")
            index = int(rest or 0)
        else:
            return name, index
    return name, index


def _plumbing(meta, key: str) -> tuple[str, dict, dict]:
    """(function the signature's graph node calls, {input: argument index}, {output: result index})."""
    nodes = {n.name: n for n in meta.graph_def.node}
    sig = meta.signature_def[key]
    outputs, call = {}, None
    for out, info in sig.outputs.items():
        node_name, index = _producer(nodes, info.name)
        node = nodes.get(node_name)
        if node is None or node.op not in CALL_OPS:
            raise GraftError(f"signature {key!r}: output {out!r} ({info.name}) does not come from a function call")
        if call is not None and node_name != call:
            raise GraftError(f"signature {key!r}: its outputs come from two function calls ({call}, {node_name})")
        call, outputs[out] = node_name, index
    data = [i.split(":")[0] for i in nodes[call].input if not i.startswith("^")]
    inputs = {}
    for name, info in sig.inputs.items():
        source = info.name.split(":")[0]
        if source not in data:
            raise GraftError(f"signature {key!r}: input {name!r} does not feed the function call {call!r}")
        inputs[name] = data.index(source)
    return nodes[call].attr["f"].func.name, inputs, outputs


def graft(model, quantized_dir, keys, removed: dict) -> dict[str, list[str]]:
    """Put the quantized signatures of ``quantized_dir`` into ``model`` (edited in place).

    Returns original function -> its quantized twins (for ``concrete_function_name`` selection)."""
    quantized = read(quantized_dir)
    tables = sorted({n.op for f in quantized.functions.values() for n in f.node_def if n.op in _TABLE_OPS})
    if tables or "__saved_model_init_op" in quantized.meta.signature_def:
        raise GraftError(f"TensorFlow's quantizer froze lookup tables ({', '.join(tables) or 'an init op'}) into "
                         f"signatures {list(keys)}; quantize only signatures without tables (signature_keys)")
    names = set(quantized.functions)
    library = model.meta.graph_def.library
    for fdef in quantized.meta.graph_def.library.function:
        library.function.add().CopyFrom(prefixed_copy(fdef, names, PREFIX))
    model.reindex()
    model.twins = {}
    for key in keys:
        _rewire(model, quantized, key)
    aliases = model.meta.meta_info_def.function_aliases
    twins: dict[str, list[str]] = model.twins
    jit = {}
    for name in names:
        fdef = model.functions[PREFIX + name]
        original = fdef.attr["_original_func_name"].s.decode() if "_original_func_name" in fdef.attr else None
        if original is None:
            continue
        twins.setdefault(original, []).append(fdef.signature.name)
        if original in aliases and not aliases[original].startswith(KEEP_ALIAS):
            aliases[fdef.signature.name] = aliases[original]
        for attr, value in removed.get(original, {}).items():
            fdef.attr[attr].b = value
            jit[fdef.signature.name] = value
    for fdef in library.function:  # call sites of restored jit functions carry the mark, as TF writes them
        if fdef.signature.name.startswith(PREFIX):
            for node in fdef.node_def:
                if node.op in CALL_OPS and jit.get(node.attr["f"].func.name):
                    node.attr["_XlaMustCompile"].b = True
    return twins


def _rewire(model, quantized, key: str) -> None:
    """The signature's wrapper function calls the quantized signature function instead of its own body."""
    wrapper_name, wrapper_inputs, wrapper_outputs = _plumbing(model.meta, key)
    q_name, q_inputs, q_outputs = _plumbing(quantized.meta, key)
    wrapper = model.functions[wrapper_name]
    target = model.functions[PREFIX + q_name]
    if set(q_inputs) != set(wrapper_inputs) or set(q_outputs) != set(wrapper_outputs):
        raise GraftError(f"signature {key!r}: the quantizer changed its inputs or outputs ({sorted(q_inputs)} -> "
                         f"{sorted(q_outputs)})")
    order = sorted(q_inputs, key=q_inputs.get)
    args = wrapper.signature.input_arg
    shapes = _result_shapes(wrapper)
    original = [n.attr["f"].func.name for n in wrapper.node_def if n.op in CALL_OPS]
    del wrapper.node_def[:]
    wrapper.ClearField("control_ret")
    wrapper.signature.ClearField("control_output")
    call = wrapper.node_def.add(name="kiln_int8", op="StatefulPartitionedCall")
    call.input.extend(args[wrapper_inputs[name]].name for name in order)
    call.attr["f"].func.name = target.signature.name
    call.attr["Tin"].list.type.extend(args[wrapper_inputs[name]].type for name in order)
    call.attr["Tout"].list.type.extend(o.type for o in target.signature.output_arg)
    for out, index in wrapper_outputs.items():
        result = wrapper.signature.output_arg[index]
        produced = target.signature.output_arg[q_outputs[out]]
        if produced.type != result.type:
            raise GraftError(f"signature {key!r}: output {out!r} is dtype {produced.type} after quantization, "
                             f"{result.type} before")
        wrapper.ret[result.name] = f"kiln_int8:output:{q_outputs[out]}"
    known = {q_outputs[out]: shapes.get(wrapper.signature.output_arg[index].name)
             for out, index in wrapper_outputs.items()}
    if all(known.get(k) is not None for k in range(len(target.signature.output_arg))):
        call.attr["_output_shapes"].list.shape.extend(known[k] for k in range(len(target.signature.output_arg)))
    if len(original) == 1:  # the signature's own function: the quantized one is its twin
        model.twins.setdefault(original[0], []).append(target.signature.name)


def _result_shapes(fdef) -> dict:
    """result name -> the TensorShapeProto its producing node recorded (``_output_shapes``)."""
    nodes = {n.name: n for n in fdef.node_def}
    out = {}
    for result, tensor in fdef.ret.items():
        parts = tensor.split(":")
        node = nodes.get(parts[0])
        if node is not None and len(parts) == 3 and "_output_shapes" in node.attr:
            shapes = node.attr["_output_shapes"].list.shape
            if int(parts[2]) < len(shapes):
                out[result] = shapes[int(parts[2])]
    return out

