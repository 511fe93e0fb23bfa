"""The bfloat16 stage: float32 ops of the functions in scope run in bfloat16, signatures unchanged.

TensorFlow's own mixed-precision rewrite (grappler's auto_mixed_precision) runs only inside a
session and rewrote nothing on this CPU (inference.md E3a), so kiln edits the FunctionDefs: each
float32 op whose type attributes allow bfloat16 (and, outside XLA, that has a bfloat16 CPU kernel)
gets ``T: DT_BFLOAT16``; constants that feed only converted ops are stored in bfloat16; a Cast is
inserted on every edge whose two ends now disagree, so function arguments, results, variable reads
and calls into other functions stay float32. Kept in float32: the ops of grappler's bfloat16
deny list, Softmax/LogSoftmax/Mean/Sum whose result reaches a signature output through
identity-like ops, ops computing a value written back into a variable (a state update would
drift by a rounding error per call), stateful ops and ops on resources, and the ``filterlist``.
"""

from __future__ import annotations

import difflib

from ..errors import KilnError
from . import effects
from .options import OptionsError
from .savedmodel import CALL_OPS, bound_inputs, reachable, signature_wrapper

DT_FLOAT, DT_BFLOAT16, DT_RESOURCE = 1, 14, 20
#: grappler's bfloat16 deny list (auto_mixed_precision_lists.h, AutoMixedPrecisionListsMkl).
DENY = ("Exp", "Expm1", "L2Loss", "Pow", "SoftmaxCrossEntropyWithLogits", "SparseSoftmaxCrossEntropyWithLogits")
#: kept in float32 when their result reaches a signature output ("numeric stability", TF's guide).
OUTPUT_REDUCTIONS = ("Softmax", "LogSoftmax", "Mean", "Sum")
_PASS_THROUGH = ("Identity", "IdentityN", "Reshape", "Squeeze", "ExpandDims", "StopGradient", "Snapshot")
# ops whose float type only describes their input: converted only when that input is
_FOLLOWERS = _PASS_THROUGH + ("Shape", "ShapeN", "Size", "Rank")
_NEVER = {"Placeholder", "_Arg", "_Retval", "NoOp", "Cast", "BatchFunction"}


class BFloat16Error(KilnError, ValueError):
    """The model cannot take the bfloat16 rewrite (it already holds bfloat16 ops)."""


def _op_def(op: str):
    from tensorflow.python.framework import op_def_registry

    return op_def_registry.get(op)


def check_filterlist(names) -> None:
    """Every filterlist entry must be a TensorFlow op type."""
    import tensorflow as tf

    for name in names:
        if _op_def(name) is None:
            known = [n for n in dir(tf.raw_ops) if not n.startswith("_")]
            near = difflib.get_close_matches(name, known, n=1)
            raise OptionsError(f"bfloat16_optimization_options.filterlist: {name!r} is not a TensorFlow op type"
                               + (f" (did you mean {near[0]!r}?)" if near else ""))


def _attr_type(node, op_def, name: str) -> int:
    if name in node.attr:
        return node.attr[name].type
    for a in op_def.attr:
        if a.name == name and a.HasField("default_value"):
            return a.default_value.type
    return 0


def _arg_types(node, op_def, args) -> list[tuple[str, int]]:
    """(arg name, dtype) for each flat input or output of ``node``."""
    out = []
    for arg in args:
        if arg.type_list_attr:
            types = list(node.attr[arg.type_list_attr].list.type) if arg.type_list_attr in node.attr else []
        else:
            t = arg.type or _attr_type(node, op_def, arg.type_attr)
            n = node.attr[arg.number_attr].i if arg.number_attr else 1
            types = [t] * n
        out += [(arg.name, t) for t in types]
    return out


def _float_attrs(node, op_def) -> list[str]:
    return [a.name for a in op_def.attr if a.type == "type" and _attr_type(node, op_def, a.name) == DT_FLOAT]


def bfloat16_ops(model) -> list[str]:
    """'function/node (Op)' for every node already computing in bfloat16."""
    found = []
    for fdef in model.meta.graph_def.library.function:
        for node in fdef.node_def:
            if any(v.type == DT_BFLOAT16 or DT_BFLOAT16 in v.list.type for v in node.attr.values()):
                found.append(f"{fdef.signature.name}/{node.name} ({node.op})")
    return found


def _cpu_has_bf16_kernel(op: str, attrs: list[str], cache={}) -> bool:  # noqa: B006 (a per-process cache)
    from tensorflow.python.framework import kernels

    key = (op, tuple(attrs))
    if key not in cache:
        ok = False
        for k in kernels.get_registered_kernels_for_op(op).kernel:
            if k.device_type != "CPU":
                continue
            cons = {c.name: set(c.allowed_values.list.type) for c in k.constraint}
            if all(DT_BFLOAT16 in cons.get(a, {DT_BFLOAT16}) for a in attrs):
                ok = True
                break
        cache[key] = ok
    return cache[key]


def output_feeders(model) -> set[tuple[str, str]]:
    """(function, node) of ops whose result reaches a signature output through identity-like ops."""
    found, todo, seen = set(), [], set()
    for key in model.signatures:
        wrapper = signature_wrapper(model, key)
        todo += [(wrapper, t) for t in model.functions[wrapper].ret.values()]
    while todo:
        fn, tensor = todo.pop()
        if (fn, tensor) in seen or fn not in model.functions:
            continue
        seen.add((fn, tensor))
        parts = tensor.split(":")
        if len(parts) < 3:
            continue  # a function argument
        nodes = {n.name: n for n in model.functions[fn].node_def}
        node = nodes.get(parts[0])
        if node is None:
            continue
        if node.op in OUTPUT_REDUCTIONS:
            found.add((fn, node.name))
        elif node.op in _PASS_THROUGH and node.input:
            todo.append((fn, node.input[0]))
        elif node.op in CALL_OPS:
            callee = model.functions.get(node.attr["f"].func.name)
            k = int(parts[2])
            if callee is not None and k < len(callee.signature.output_arg):
                todo.append((callee.signature.name, callee.ret[callee.signature.output_arg[k].name]))
    return found


def _convertible(node, op_def, on_xla: bool, keep: set[str]) -> list[str]:
    """The type attributes to set to bfloat16 ([] when the node stays as it is)."""
    if node.op in keep or node.op in _NEVER or node.op in CALL_OPS or op_def is None or op_def.is_stateful:
        return []
    if any(t == DT_RESOURCE for _, t in _arg_types(node, op_def, op_def.input_arg)):
        return []
    attrs = _float_attrs(node, op_def)
    if not attrs:
        return []
    for a in op_def.attr:
        if a.name in attrs and a.allowed_values.list.type and DT_BFLOAT16 not in a.allowed_values.list.type:
            return []
    if not on_xla and node.op != "Const" and not _cpu_has_bf16_kernel(node.op, attrs):
        return []
    return attrs


def _tensor_type(fdef, tensor: str, nodes, arg_types) -> int:
    parts = tensor.split(":")
    if len(parts) == 1:
        return arg_types.get(tensor, 0)
    node = nodes[parts[0]]
    op_def = _op_def(node.op)
    if op_def is None:
        return 0
    outs = [t for name, t in _arg_types(node, op_def, op_def.output_arg) if name == parts[1]]
    k = int(parts[2])
    return outs[k] if k < len(outs) else 0


def _convert_const(node) -> None:
    import tensorflow as tf

    value = tf.make_ndarray(node.attr["value"].tensor)
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value.astype(tf.bfloat16.as_numpy_dtype)))
    node.attr["dtype"].type = DT_BFLOAT16


def plan_function(fdef, on_xla: bool, keep: set[str], keep_nodes: set[str]) -> dict[str, list[str]]:
    """Node name -> the type attributes to set to bfloat16, for one FunctionDef (nothing changed yet)."""
    plan, follow = {}, []
    for node in fdef.node_def:
        if node.name in keep_nodes or node.op == "Const":
            continue
        attrs = _convertible(node, _op_def(node.op), on_xla, keep)
        if attrs and node.op in _FOLLOWERS:
            follow.append((node, attrs))  # converted only when their input is: no cast pairs around them
        elif attrs:
            plan[node.name] = attrs
    changed = True
    while changed:
        changed = False
        for node, attrs in follow:
            src = node.input[0].split(":")[0] if node.input else ""
            if node.name not in plan and src in plan:
                plan[node.name] = attrs
                changed = True
    return plan


def consumers_of(fdef) -> dict[str, set[str]]:
    """Node name -> the nodes reading one of its outputs (data edges only)."""
    out: dict[str, set[str]] = {}
    for node in fdef.node_def:
        for inp in node.input:
            if not inp.startswith("^"):
                out.setdefault(inp.split(":")[0], set()).add(node.name)
    return out


def apply_plan(fdef, plan: dict[str, list[str]]) -> dict:
    """Set the planned attributes, store constants feeding only converted ops in bfloat16, add the
    casts; returns counts of converted ops by type and casts added."""
    nodes = {n.name: n for n in fdef.node_def}
    arg_types = {a.name: a.type for a in fdef.signature.input_arg}
    consumers = consumers_of(fdef)
    returned = {v.split(":")[0] for v in fdef.ret.values()}
    converted: dict[str, int] = {}
    for node in fdef.node_def:
        if node.name in plan:
            for a in plan[node.name]:
                node.attr[a].type = DT_BFLOAT16
            converted[node.op] = converted.get(node.op, 0) + 1
        elif (node.op == "Const" and node.attr["dtype"].type == DT_FLOAT and node.name not in returned
              and consumers.get(node.name) and consumers[node.name] <= set(plan)):
            _convert_const(node)
            converted["Const"] = converted.get("Const", 0) + 1
    casts = _insert_casts(fdef, nodes, arg_types)
    return {"ops": converted, "casts": casts}


def _cast(fdef, name: str, source: str, src: int, dst: int):
    node = fdef.node_def.add(name=name, op="Cast")
    node.input.append(source)
    node.attr["SrcT"].type = src
    node.attr["DstT"].type = dst
    node.attr["Truncate"].b = False
    return f"{name}:y:0"


def _insert_casts(fdef, nodes, arg_types) -> int:
    made: dict[tuple[str, int], str] = {}
    taken = set(nodes)

    def cast_of(tensor: str, src: int, dst: int) -> str:
        if (tensor, dst) not in made:
            base = f"{tensor.replace(':', '_')}/kiln_to_{'bf16' if dst == DT_BFLOAT16 else 'f32'}"
            name, k = base, 0
            while name in taken:
                k += 1
                name = f"{base}_{k}"
            taken.add(name)
            made[(tensor, dst)] = _cast(fdef, name, tensor, src, dst)
        return made[(tensor, dst)]

    floats = (DT_FLOAT, DT_BFLOAT16)
    for node in list(fdef.node_def):
        op_def = _op_def(node.op)
        if op_def is None:
            continue
        if node.op in CALL_OPS:
            expected = [t for t in node.attr["Tin"].list.type]
        else:
            expected = [t for _, t in _arg_types(node, op_def, op_def.input_arg)]
        data = [i for i, inp in enumerate(node.input) if not inp.startswith("^")]
        for pos, want in zip(data, expected):
            have = _tensor_type(fdef, node.input[pos], nodes, arg_types)
            if have in floats and want in floats and have != want:
                node.input[pos] = cast_of(node.input[pos], have, want)
    for out in fdef.signature.output_arg:
        tensor = fdef.ret[out.name]
        have = _tensor_type(fdef, tensor, nodes, arg_types)
        if have in floats and out.type in floats and have != out.type:
            fdef.ret[out.name] = cast_of(tensor, have, out.type)
    return len(made)


def scope_functions(model, accelerator, scope: str) -> dict[str, bool]:
    """Function name -> compiled by XLA, for the functions the rewrite covers."""
    on_xla = set(accelerator)
    for name in accelerator:
        on_xla |= reachable(model, name)
    if scope != "ALL":
        return {name: True for name in sorted(on_xla)}
    served = set()
    for key in model.signatures:
        wrapper = signature_wrapper(model, key)
        served |= reachable(model, wrapper) | {wrapper}
    return {name: name in on_xla for name in sorted(served | on_xla)}


def _whole_callees(model, updates: dict) -> None:
    """A call whose result feeds a state update keeps its callee (and what that calls) float32 too."""
    todo = [(f, n) for f in updates for n in model.functions[f].node_def if n.name in updates[f] and n.op in CALL_OPS]
    while todo:
        _, node = todo.pop()
        callee = node.attr["f"].func.name
        if callee not in updates or callee not in model.functions:
            continue
        every = {n.name for n in model.functions[callee].node_def}
        if every <= updates[callee]:
            continue
        updates[callee] |= every
        todo += [(callee, n) for n in model.functions[callee].node_def if n.op in CALL_OPS]


def rewrite(model, accelerator, options, workdir) -> tuple[list[str], set[str]]:
    """The stage: convert the functions in scope; (report lines, functions changed). Refuses a model
    that already holds bfloat16 ops unless ``skip_safety_checks``. Variables stored in bfloat16 are
    written to a copy of the model under ``workdir``, which becomes ``model.path``."""
    bo = options.bfloat16_optimization_options
    scope = bo.DESCRIPTOR.fields_by_name["scope"].enum_type.values_by_number[bo.scope].name
    check_filterlist(bo.filterlist)
    existing = bfloat16_ops(model)
    if existing and not bo.skip_safety_checks:
        shown = ", ".join(existing[:8]) + (f" and {len(existing) - 8} more" if len(existing) > 8 else "")
        raise BFloat16Error(f"bfloat16_optimization: the model already holds bfloat16 ops ({shown}); converting "
                            f"it again can produce invalid graphs. Set bfloat16_optimization_options "
                            f"{{ skip_safety_checks: true }} to convert anyway, or bfloat16_optimization: DISABLED")
    functions = scope_functions(model, accelerator, scope)
    if not functions:
        return [f"scope {scope}: no accelerator functions, nothing converted (scope ALL converts CPU "
                f"functions too)"], set()
    keep = set(DENY) | set(bo.filterlist)
    feeders = output_feeders(model)
    from . import bf16vars  # it uses this module's helpers

    lines, total_ops, total_casts, changed = [], 0, 0, set()
    bindings = bound_inputs(model)
    updates = {name: effects.state_update_nodes(model.functions[name], effects.writers(model, name, bindings))
               for name in functions}
    _whole_callees(model, updates)
    plans = {name: plan_function(model.functions[name], on_xla, keep,
                                 {n for f, n in feeders if f == name} | updates[name])
             for name, on_xla in functions.items()}
    stored = bf16vars.select(model, plans)  # variables read only by converted ops: stored in bfloat16
    for reads in stored.values():
        for fn, node in reads:
            plans[fn][node] = ["dtype"]
    for name, on_xla in functions.items():
        keep_nodes = {n for f, n in feeders if f == name}
        result = apply_plan(model.functions[name], plans[name])
        n_ops = sum(result["ops"].values())
        total_ops += n_ops
        total_casts += result["casts"]
        if n_ops:
            changed.add(name)
            ops = ", ".join(f"{op} x{k}" for op, k in sorted(result["ops"].items()))
            lines.append(f"{name} ({'XLA' if on_xla else 'CPU'}): {ops} to bfloat16, {result['casts']} cast(s)")
        kept = sorted({n for n in keep_nodes})
        if kept:
            lines.append(f"{name}: kept float32 (feed a signature output): {', '.join(kept)}")
        if updates[name]:
            lines.append(f"{name}: kept float32 (compute a state update, which would drift in bfloat16): "
                         f"{', '.join(sorted(updates[name]))}")
    lines.insert(0, f"scope {scope}: {total_ops} op(s) in {len(functions)} function(s) to bfloat16, "
                    f"{total_casts} cast(s); kept float32: {', '.join(sorted(keep))}"
                    + (" (skip_safety_checks: the model already held bfloat16 ops)" if existing else ""))
    if stored:
        lines.insert(1, bf16vars.store(model, stored, workdir))
    return lines, changed
