"""Reading a TF2 SavedModel as protobuf: validation, the function call graph, function selection.

kiln edits the SavedModel's FunctionDefs directly (instead of load -> wrap -> re-save) so every
function keeps its name, ``function_aliases`` survive, and nested functions can be placed on XLA.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import KilnError

SERVE_TAG = "serve"
CALL_OPS = ("StatefulPartitionedCall", "PartitionedCall")
DT_RESOURCE = 20
_INTERNAL = ("__inference__traced_save", "__inference__traced_restore")


class InputModelError(KilnError, ValueError):
    """The input SavedModel is missing, TF1, or lacks what the options ask for."""


class SelectionError(KilnError, ValueError):
    """Accelerator or batch functions selected wrongly (unknown, twice, nested)."""


@dataclass
class SavedModelFile:
    """The parsed ``saved_model.pb`` plus indexes over its serving MetaGraph."""

    path: Path
    proto: object  # saved_model_pb2.SavedModel
    meta: object  # the MetaGraphDef tagged "serve"
    functions: dict = field(default_factory=dict)  # name -> FunctionDef
    twins: dict = field(default_factory=dict)  # function -> its quantized copies (graft.py)

    @property
    def aliases(self) -> dict:
        return dict(self.meta.meta_info_def.function_aliases)

    @property
    def signatures(self) -> dict:
        return {k: v for k, v in self.meta.signature_def.items() if not k.startswith("__")}

    def public_functions(self) -> list[str]:
        return sorted(n for n in self.functions if not n.startswith(_INTERNAL))

    def reindex(self) -> None:
        self.functions = {f.signature.name: f for f in self.meta.graph_def.library.function}


def read(model_dir) -> SavedModelFile:
    """Parse and validate ``model_dir``: a TF2 SavedModel with a "serve" MetaGraph and signatures."""
    from tensorflow.core.protobuf import saved_model_pb2

    path = Path(model_dir)
    pb = path / "saved_model.pb"
    if not path.is_dir():
        raise InputModelError(f"input_model_dir {str(path)!r} is not a directory")
    if not pb.is_file():
        raise InputModelError(f"{str(path)!r} is not a SavedModel: it has no saved_model.pb"
                              + (" (saved_model.pbtxt is not supported)" if (path / "saved_model.pbtxt").exists()
                                 else ""))
    proto = saved_model_pb2.SavedModel()
    try:
        proto.ParseFromString(pb.read_bytes())
    except Exception as exc:  # DecodeError
        raise InputModelError(f"{str(pb)!r} is not a valid SavedModel protobuf: {exc}") from None
    tag_sets = [sorted(m.meta_info_def.tags) for m in proto.meta_graphs]
    serving = [m for m in proto.meta_graphs if set(m.meta_info_def.tags) == {SERVE_TAG}]
    serving = serving or [m for m in proto.meta_graphs if SERVE_TAG in m.meta_info_def.tags]
    if not serving:
        raise InputModelError(f"{str(path)!r} has no MetaGraph tagged {SERVE_TAG!r}; its tag sets are {tag_sets}")
    meta = serving[0]
    if len(meta.object_graph_def.nodes) == 0 and len(meta.graph_def.library.function) == 0:
        raise InputModelError(
            f"kiln infer-convert needs a TensorFlow 2 SavedModel; {str(path)!r} was written by the TF1 "
            f"SavedModel builder (no object graph, no TF2 functions). Migrate it to TF2 "
            f"(https://www.tensorflow.org/guide/migrate/saved_model) and save it with tf.saved_model.save")
    model = SavedModelFile(path, proto, meta)
    model.reindex()
    if not model.signatures:
        raise InputModelError(f"{str(path)!r} has no serving signatures; save it with "
                              f"tf.saved_model.save(..., signatures=...)")
    return model


# -- call graph ------------------------------------------------------------------------------

def called_functions(node) -> list[str]:
    """Every function a NodeDef refers to through a func or list(func) attribute."""
    names = []
    for value in node.attr.values():
        if value.HasField("func"):
            names.append(value.func.name)
        elif value.HasField("list"):
            names.extend(f.name for f in value.list.func)
    return names


def callees(model: SavedModelFile, name: str) -> set[str]:
    fdef = model.functions.get(name)
    if fdef is None:
        return set()
    return {c for n in fdef.node_def for c in called_functions(n) if c in model.functions}


def reachable(model: SavedModelFile, start: str) -> set[str]:
    """Functions ``start`` calls directly or through other functions (not itself unless recursive)."""
    seen, todo = set(), list(callees(model, start))
    while todo:
        f = todo.pop()
        if f not in seen:
            seen.add(f)
            todo.extend(callees(model, f))
    return seen


def signature_wrapper(model: SavedModelFile, key: str) -> str:
    """The function the graph node behind signature ``key``'s outputs calls."""
    sig = model.meta.signature_def[key]
    by_name = {n.name: n for n in model.meta.graph_def.node}
    for info in list(sig.outputs.values()) + list(sig.inputs.values()):
        node = by_name.get(info.name.split(":")[0])
        if node is not None and node.op in CALL_OPS:
            return node.attr["f"].func.name
    # the outputs may hang off Identity nodes: search the consumers of the inputs
    inputs = {info.name.split(":")[0] for info in sig.inputs.values()}
    for node in model.meta.graph_def.node:
        if node.op in CALL_OPS and any(i.split(":")[0] in inputs for i in node.input):
            return node.attr["f"].func.name
    raise InputModelError(f"cannot find the function behind signature {key!r}")


def signatures_reaching(model: SavedModelFile, functions) -> list[str]:
    """The signature keys whose call graph holds one of ``functions``: the ones a stage changing
    those functions can change (the others need no measurement)."""
    functions = set(functions)
    keys = []
    for key in sorted(model.signatures):
        wrapper = signature_wrapper(model, key)
        if functions & (reachable(model, wrapper) | {wrapper}):
            keys.append(key)
    return keys


def live_functions(model: SavedModelFile) -> set[str]:
    """Functions a loaded model can run: those the signatures reach and the object graph's saved
    functions with what they call. (Quantization leaves the old bodies of quantized signatures dead.)"""
    starts = {signature_wrapper(model, key) for key in model.signatures}
    starts |= {n for n in model.meta.object_graph_def.concrete_functions if n in model.functions}
    live = set(starts)
    for name in starts:
        live |= reachable(model, name)
    return live


def signature_function(model: SavedModelFile, key: str) -> str:
    """The function signature ``key`` calls: the wrapper's only callee, else the wrapper itself."""
    if key not in model.signatures:
        raise SelectionError(f"signature_name {key!r} does not exist; the model's signatures are "
                             f"{sorted(model.signatures)}")
    wrapper = signature_wrapper(model, key)
    inner = [c for n in model.functions[wrapper].node_def if n.op in CALL_OPS for c in called_functions(n)]
    return inner[0] if len(inner) == 1 else wrapper


def _argument_passing(node) -> list[tuple[str, int]]:
    """(function, inputs to skip) for each function a node passes its inputs on to, in order."""
    if node.op in CALL_OPS or node.op == "BatchFunction":
        return [(node.attr["f"].func.name, 0)]
    if node.op in ("Case", "StatelessCase"):
        return [(f.name, 1) for f in node.attr["branches"].list.func]
    if node.op in ("If", "StatelessIf"):
        return [(node.attr[k].func.name, 1) for k in ("then_branch", "else_branch")]
    if node.op in ("While", "StatelessWhile"):
        return [(node.attr[k].func.name, 0) for k in ("cond", "body")]
    return []


def bound_inputs(model) -> dict:
    """(function, arg index) -> object-graph node id of what is captured there: a variable, a constant
    (``tf.constant``, a table's default value) or another resource (a lookup table)."""
    binding = {}
    for name, saved in model.meta.object_graph_def.concrete_functions.items():
        fdef = model.functions.get(name)
        if fdef is None or not saved.bound_inputs:
            continue
        first = len(fdef.signature.input_arg) - len(saved.bound_inputs)
        for k, node_id in enumerate(saved.bound_inputs):
            binding[(name, first + k)] = node_id
    changed = True
    while changed:  # push bindings down direct call edges until nothing new appears
        changed = False
        for fdef in model.meta.graph_def.library.function:
            caller = fdef.signature.name
            arg_index = {a.name: i for i, a in enumerate(fdef.signature.input_arg)}
            for node in fdef.node_def:
                targets = _argument_passing(node)
                if not targets:
                    continue
                data = [i for i in node.input if not i.startswith("^")]
                for callee, skip in targets:
                    for pos, inp in enumerate(data[skip:]):
                        src = arg_index.get(inp)
                        if src is not None and (caller, src) in binding and (callee, pos) not in binding:
                            binding[(callee, pos)] = binding[(caller, src)]
                            changed = True
    return binding


# -- selection -------------------------------------------------------------------------------

def _by_alias(model: SavedModelFile, alias: str, field_name: str) -> list[str]:
    names = sorted(c for c, a in model.aliases.items() if a == alias and c in model.functions)
    if not names:
        available = sorted({a for c, a in model.aliases.items() if c in model.functions})
        raise SelectionError(f"{field_name} {alias!r} does not exist; the model's function aliases are "
                             f"{available or '(none: save with SaveOptions(function_aliases=...))'}")
    return names


def _by_name(model: SavedModelFile, name: str, field_name: str) -> list[str]:
    if name not in model.functions:
        raise SelectionError(f"{field_name} {name!r} does not exist; the model's concrete functions are "
                             f"{model.public_functions()}")
    return [name] + model.twins.get(name, [])  # a quantized function is selected by its original name too


def resolve_target(model: SavedModelFile, kind: str, value, where: str) -> list[str]:
    """Concrete function names for one oneof choice (function_alias / concrete_function_name / ...)."""
    label = f"{where}.{kind}"
    if kind == "function_alias":
        return _by_alias(model, value, label)
    if kind == "concrete_function_name":
        return _by_name(model, value, label)
    if kind == "signature_name":
        return [signature_function(model, value)]
    if kind == "jit_compile_functions":
        if not value:
            return []
        names = sorted(n for n, f in model.functions.items()
                       if f.attr.get("_XlaMustCompile") is not None and f.attr["_XlaMustCompile"].b)
        if not names:
            raise SelectionError(f"{label}: no function in the model was exported with jit_compile=True")
        return names
    raise SelectionError(f"{where}: set one of function_alias, concrete_function_name, signature_name, "
                         f"jit_compile_functions")


def select_accelerator_functions(model: SavedModelFile, tpu_functions) -> dict[str, str]:
    """Concrete name -> how it was selected; checks duplicates and nesting."""
    chosen: dict[str, str] = {}
    for i, entry in enumerate(tpu_functions):
        kind = entry.WhichOneof("name")
        value = getattr(entry, kind) if kind else None
        how = f"tpu_functions[{i}] {kind}: {value!r}" if kind != "jit_compile_functions" \
            else f"tpu_functions[{i}] jit_compile_functions: true"
        for name in resolve_target(model, kind, value, f"tpu_functions[{i}]"):
            if name in chosen:
                raise SelectionError(f"function {name!r} is selected twice: by {chosen[name]} and by {how}")
            chosen[name] = how
    for a in chosen:
        for b in sorted(_reached_through_others(model, a, set(chosen))):
            if b in chosen:
                raise SelectionError(
                    f'Unable to place both "{a}" and "{b}" on the accelerator because "{a}" indirectly calls '
                    f'"{b}". This behavior is unsupported because it can cause invalid graphs to be generated.')
    return chosen


def _reached_through_others(model: SavedModelFile, start: str, selected: set) -> set[str]:
    """The selected functions ``start`` reaches through a function that is not selected. A selected
    function calling another one directly is allowed, as in the original (the callee compiles into
    the caller's XLA cluster); a call through an unselected function in between is not."""
    todo, seen = [c for c in callees(model, start) if c not in selected], set()
    while todo:
        f = todo.pop()
        if f not in seen:
            seen.add(f)
            todo += list(callees(model, f)) if f not in selected else []
    return seen & selected


def arg_shape(fdef, index: int):
    """The static shape of argument ``index`` as a list (None for unknown dims), or None if unknown rank."""
    attrs = fdef.arg_attr[index].attr if index in fdef.arg_attr else {}
    shapes = attrs["_output_shapes"].list.shape if "_output_shapes" in attrs else []
    if not shapes and "_input_shapes" in fdef.attr and index < len(fdef.attr["_input_shapes"].list.shape):
        shapes = [fdef.attr["_input_shapes"].list.shape[index]]
    if not shapes or shapes[0].unknown_rank:
        return None
    return [None if d.size < 0 else int(d.size) for d in shapes[0].dim]


def user_name(fdef, index: int) -> str:
    attrs = fdef.arg_attr[index].attr if index in fdef.arg_attr else {}
    if "_user_specified_name" in attrs:
        return attrs["_user_specified_name"].s.decode()
    return fdef.signature.input_arg[index].name


def prefixed_copy(fdef, names: set[str], prefix: str):
    """A copy of ``fdef`` named ``prefix + name``, whose calls to any function in ``names`` call
    the prefixed copies too: a whole library copied beside the original without clashing."""
    from tensorflow.core.framework import function_pb2

    copy = function_pb2.FunctionDef()
    copy.CopyFrom(fdef)
    copy.signature.name = prefix + fdef.signature.name
    for node in copy.node_def:
        for value in node.attr.values():
            if value.HasField("func") and value.func.name in names:
                value.func.name = prefix + value.func.name
            elif value.HasField("list"):
                for f in value.list.func:
                    if f.name in names:
                        f.name = prefix + f.name
    return copy


def rename_output_port(fdef, node_name: str, old: str, new: str) -> None:
    """Make every reader of ``node_name``'s ``old`` output port (node inputs and the function's
    returns) read port ``new``: after a node was replaced by one whose outputs are named
    otherwise (a call's ``output`` against a batch op's ``out_tensors``)."""
    old, new = f"{node_name}:{old}:", f"{node_name}:{new}:"
    for node in fdef.node_def:
        for i, inp in enumerate(node.input):
            if inp.startswith(old):
                node.input[i] = new + inp[len(old):]
    for key, value in fdef.ret.items():
        if value.startswith(old):
            fdef.ret[key] = new + value[len(old):]
