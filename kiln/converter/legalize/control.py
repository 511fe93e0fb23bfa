"""Function calls (fused or inlined) and control flow (While / If / Case -> WHILE / IF)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ...errors import ConversionError
from ...fusion.registry import CompositeCall, NotFusable, composite_rule
from ...ir import Subgraph, Tensor
from ...schema import DType
from ..context import EmitContext
from ..scope import Scope, distinct_outputs
from ..tfutil import function_def, function_graph, implements_name, shape_signature, static_shape, to_dtype
from ..values import ResourceRef, TensorListValue
from .common import emitter_table

EMITTERS, emits = emitter_table()

CALL_OPS = ("PartitionedCall", "StatefulPartitionedCall")


# -- calls ------------------------------------------------------------------------------------

@emits(*CALL_OPS)
def emit_function_op(ctx: EmitContext):
    name = ctx.op.get_attr("f").name if ctx.type in CALL_OPS else ctx.type
    importer = ctx.scope.importer
    impl, attrs = implements_name(function_def(ctx.scope.graph, name))
    if impl is not None:
        tracer = importer.stats.tracer
        try:
            call = _composite_call(ctx, name, impl, attrs)
        except NotFusable as exc:   # an argument no fusion can take: same rule, same record
            tracer.declined("fusion", exc.subject or ctx.op.name, impl, exc.reason)
        else:
            fused = composite_rule(impl).apply(call, tracer)
            if fused is not None:
                return _check_fused(ctx, fused.values)
    importer.stats.inlined.append(name)
    return inline(ctx, name, [ctx.value(i) for i in range(ctx.num_inputs)])


def _composite_call(ctx: EmitContext, fname: str, impl: str, attrs: dict) -> CompositeCall:
    fg = function_graph(ctx.scope.graph, fname)
    inputs = []
    for i in range(ctx.num_inputs):
        v = ctx.value(i)
        if isinstance(v, ResourceRef):
            if v.var.mutable:
                raise NotFusable(f"argument {i} is a variable the model assigns", ctx.op.name)
            v = ctx.scope.importer.variable_constant(ctx.scope, v.var, None, f"{ctx.name}/arg{i}")
        elif isinstance(v, TensorListValue):
            raise NotFusable(f"argument {i} is a TensorList", ctx.op.name)
        inputs.append(v)
    return CompositeCall(
        name=impl, attrs=attrs, inputs=inputs,
        output_dtypes=[to_dtype(t.dtype) for t in ctx.op.outputs],
        output_shapes=[shape_signature(t.shape) or () for t in ctx.op.outputs],
        subgraph=ctx.sg, function=fg, label=ctx.op.name)


def _check_fused(ctx: EmitContext, outs: list) -> list:
    for i, (t, v) in enumerate(zip(ctx.op.outputs, outs)):
        if v is None and t.consumers():
            raise ConversionError(f"fusion of {ctx.op.name!r} produced no value for its used output {i}")
    return outs


def inline(ctx: EmitContext, fname: str, args: Sequence) -> list:
    """Import library function ``fname`` in place, its arguments bound to ``args``."""
    fg = function_graph(ctx.scope.graph, fname)
    if len(fg.inputs) != len(args):
        raise ConversionError(f"call of {fname!r}: {len(args)} arguments for {len(fg.inputs)} parameters")
    child = Scope(ctx.scope.importer, fg, ctx.sg, ctx.scope.prefix)
    for ph, v in zip(fg.inputs, args):
        child.bind(ph, v)
    return child.run(fg.outputs)


# -- subgraphs for control flow ----------------------------------------------------------------

def _localize(sg: Subgraph, value):
    """A static (not carried) value as seen inside subgraph ``sg``: constants are copied."""
    if isinstance(value, Tensor):
        if not value.is_constant:
            raise ConversionError(f"tensor {value.name!r} cannot be used inside a control-flow body")
        return sg.add_constant(value.name, value.data, value.dtype)
    return value


def _carried_input(sg: Subgraph, value, signature, name: str):
    """A subgraph input standing for a carried value (a TensorList stays a TensorList)."""
    if isinstance(value, TensorListValue):
        sig = value.signature if signature is None else signature
        t = sg.add_tensor(name, value.tensor.dtype, static_shape(sig), shape_signature=sig)
        return t, TensorListValue(t, value.element_dtype, value.element_signature)
    sig = tuple(value.signature) if signature is None else signature
    t = sg.add_tensor(name, value.dtype, static_shape(sig), shape_signature=sig)
    return t, t


def _unwrap(value, what: str) -> Tensor:
    if isinstance(value, TensorListValue):
        return value.tensor
    if isinstance(value, ResourceRef):
        raise ConversionError(f"{what} is a resource handle")
    return value


def build_subgraph(ctx: EmitContext, fname: str, args: Sequence, carried: Sequence[int],
                   signatures: dict[int, tuple], out_indices: Sequence[int], name: str) -> Subgraph:
    """Import function ``fname`` as a new subgraph: arguments at ``carried`` positions become
    subgraph inputs, the others are bound statically; outputs are ``out_indices``."""
    importer = ctx.scope.importer
    fg = function_graph(ctx.scope.graph, fname)
    if len(fg.inputs) != len(args):
        raise ConversionError(f"{fname!r}: {len(args)} arguments for {len(fg.inputs)} parameters")
    sg = importer.new_subgraph(name)
    scope = Scope(importer, fg, sg)
    for i, (ph, v) in enumerate(zip(fg.inputs, args)):
        if i in carried:
            t, bound = _carried_input(sg, v, signatures.get(i), f"{name}/arg{i}")
            sg.inputs.append(t)
            scope.bind(ph, bound)
        else:
            scope.bind(ph, _localize(sg, v))
    values = scope.run([fg.outputs[j] for j in out_indices])
    outs = [_unwrap(v, f"{name} output {j}") for v, j in zip(values, out_indices)]
    sg.outputs = distinct_outputs(sg, outs, ["out"] * len(outs))
    return sg


def _passthrough(fg, i: int) -> bool:
    """Whether body output ``i`` is body input ``i`` unchanged (through Identity ops)."""
    t = fg.outputs[i]
    while t.op.type in ("Identity", "IdentityN"):
        t = t.op.inputs[t.value_index if t.op.type == "IdentityN" else 0]
    return t is fg.inputs[i]


def _is_static(value) -> bool:
    return isinstance(value, ResourceRef) or (isinstance(value, Tensor) and value.is_constant)


@emits("While", "StatelessWhile")
def emit_while(ctx: EmitContext):
    fused = _fused_loop(ctx)
    if fused is not None:
        return fused
    cond_name, body_name = ctx.attr("cond").name, ctx.attr("body").name
    args = [ctx.value(i) for i in range(ctx.num_inputs)]
    body_fg = function_graph(ctx.scope.graph, body_name)
    carried = []
    for i, v in enumerate(args):
        if _is_static(v):
            if _passthrough(body_fg, i):
                continue
            if isinstance(v, ResourceRef):
                raise ctx.fail(f"loop variable {i} is a resource the loop replaces")
        carried.append(i)
    signatures = {}
    for i in carried:
        v = args[i]
        if isinstance(v, TensorListValue):
            signatures[i] = v.signature
        else:
            sig = ctx.out_signature(i)
            signatures[i] = tuple(v.signature) if sig is None else sig
    importer = ctx.scope.importer
    base = ctx.name
    cond_sg = build_subgraph(ctx, cond_name, args, carried, signatures, [0], f"{base}_cond")
    body_sg = build_subgraph(ctx, body_name, args, carried, signatures, carried, f"{base}_body")
    inputs = [_unwrap(args[i], f"loop variable {i}") for i in carried]
    outputs = []
    for i in carried:
        v = args[i]
        dtype = v.tensor.dtype if isinstance(v, TensorListValue) else to_dtype(ctx.op.outputs[i].dtype)
        outputs.append(ctx.out(i, dtype=dtype, signature=signatures[i]))
    ctx.emit("WHILE", inputs, outputs, fold=False,
             cond_subgraph_index=importer.model.subgraph_index(cond_sg),
             body_subgraph_index=importer.model.subgraph_index(body_sg))
    results = list(args)
    for i, out in zip(carried, outputs):
        v = args[i]
        results[i] = TensorListValue(out, v.element_dtype, v.element_signature) if isinstance(v, TensorListValue) else out
    return results


def _fused_loop(ctx: EmitContext) -> list | None:
    """The While's outputs from one fused op when a loop fusion of the importer's
    `Legalization` (a `kiln.rules.Rule` over the While's context: the Keras 3 LSTM loop,
    kiln/converter/keras/lstm_loop.py) fires, else None; a sequence loop left as a loop gets
    its reason in the report."""
    tracer = ctx.scope.importer.stats.tracer
    for rule in ctx.scope.importer.legalization.loop_fusions:
        fused = rule.apply(ctx, tracer)
        if fused is not None:
            return fused.values
    return None


@emits("If", "StatelessIf")
def emit_if(ctx: EmitContext):
    then_name, else_name = ctx.attr("then_branch").name, ctx.attr("else_branch").name
    args = [ctx.value(i) for i in range(1, ctx.num_inputs)]
    cond = ctx.const(0)
    if cond is not None:
        return inline(ctx, then_name if bool(np.asarray(cond).reshape(-1)[0]) else else_name, args)
    return _emit_if(ctx, ctx.input(0), then_name, else_name, args)


def _emit_if(ctx: EmitContext, cond: Tensor, then_name: str, else_name: str, args: list):
    carried = [i for i, v in enumerate(args) if not _is_static(v)]
    n_out = len(ctx.op.outputs)
    base = ctx.name
    then_sg = build_subgraph(ctx, then_name, args, carried, {}, list(range(n_out)), f"{base}_then")
    else_sg = build_subgraph(ctx, else_name, args, carried, {}, list(range(n_out)), f"{base}_else")
    return _if_op(ctx, cond, [_unwrap(args[i], f"branch argument {i}") for i in carried], then_sg, else_sg)


def _if_op(ctx: EmitContext, cond: Tensor, inputs: list, then_sg: Subgraph, else_sg: Subgraph):
    model = ctx.scope.importer.model
    if cond.dtype != DType.BOOL:
        zero = ctx.constant(np.zeros((), cond.dtype.numpy), cond.dtype)
        cond = ctx.emit1("NOT_EQUAL", [cond, zero], ctx.temp("cond", DType.BOOL, cond.signature))
    if cond.rank:
        shape = ctx.constant(np.asarray([], np.int32), DType.INT32)
        cond = ctx.emit1("RESHAPE", [cond, shape], ctx.temp("cond_scalar", DType.BOOL, ()))
    outputs = [ctx.out(i) for i in range(len(ctx.op.outputs))]
    ctx.emit("IF", [cond, *inputs], outputs, fold=False,
             then_subgraph_index=model.subgraph_index(then_sg),
             else_subgraph_index=model.subgraph_index(else_sg))
    return outputs


@emits("Case", "StatelessCase")
def emit_case(ctx: EmitContext):
    """Case as a chain of IFs: branch k runs when index == k; out-of-range picks the last."""
    branches = [f.name for f in ctx.attr("branches")]
    args = [ctx.value(i) for i in range(1, ctx.num_inputs)]
    index = ctx.const(0)
    if index is not None:
        k = int(index)
        return inline(ctx, branches[k if 0 <= k < len(branches) else -1], args)
    if len(branches) == 1:
        return inline(ctx, branches[0], args)
    idx = ctx.input(0)
    carried = [i for i, v in enumerate(args) if not _is_static(v)]
    n_out = len(ctx.op.outputs)
    subgraphs = [build_subgraph(ctx, b, args, carried, {}, list(range(n_out)), f"{ctx.name}_branch{k}")
                 for k, b in enumerate(branches)]
    inputs = [_unwrap(args[i], f"branch argument {i}") for i in carried]
    # Build from the last branch backwards: else_k = "index == k ? branch_k : else_{k+1}".
    rest = subgraphs[-1]
    for k in range(len(branches) - 2, 0, -1):
        rest = _case_link(ctx, k, subgraphs[k], rest, inputs)
    zero = ctx.constant(np.zeros((), idx.dtype.numpy), idx.dtype)
    cond = ctx.emit1("EQUAL", [idx, zero], ctx.temp("is_branch0", DType.BOOL, idx.signature))
    if rest is subgraphs[-1]:
        return _if_op(ctx, cond, inputs, subgraphs[0], rest)
    return _if_op(ctx, cond, [idx, *inputs], _with_leading_input(ctx, subgraphs[0], idx), rest)


def _case_link(ctx: EmitContext, k: int, then_sg: Subgraph, else_sg: Subgraph, inputs: list) -> Subgraph:
    """A subgraph taking (index, *args) that runs ``then_sg`` when index == k, else ``else_sg``."""
    model = ctx.scope.importer.model
    sg = model.add_subgraph(f"{ctx.name}_case{k}")
    idx_in = ctx.input(0)
    idx = sg.add_tensor(f"{sg.name}/index", idx_in.dtype, ())
    args = [sg.add_tensor(f"{sg.name}/arg{i}", t.dtype, t.shape, shape_signature=t.shape_signature)
            for i, t in enumerate(inputs)]
    sg.inputs = [idx, *args]
    kc = sg.add_constant(f"{sg.name}/k", np.asarray(k, idx.dtype.numpy))
    cond = sg.add_tensor(f"{sg.name}/cond", DType.BOOL, ())
    sg.add_operator("EQUAL", [idx, kc], [cond])
    outs = [sg.add_tensor(f"{sg.name}/out{i}", t.dtype, t.shape, shape_signature=t.shape_signature)
            for i, t in enumerate(then_sg.outputs)]
    else_takes_index = len(else_sg.inputs) == len(args) + 1
    then_idx = model.subgraph_index(then_sg)
    else_idx = model.subgraph_index(else_sg)
    if else_takes_index:
        then_idx = model.subgraph_index(_with_leading_input(ctx, then_sg, idx_in))
        sg.add_operator("IF", [cond, idx, *args], outs,
                        options={"then_subgraph_index": then_idx, "else_subgraph_index": else_idx})
    else:
        sg.add_operator("IF", [cond, *args], outs,
                        options={"then_subgraph_index": then_idx, "else_subgraph_index": else_idx})
    sg.outputs = outs
    return sg


def _with_leading_input(ctx: EmitContext, sg: Subgraph, idx: Tensor) -> Subgraph:
    """``sg`` with an extra (unused) first input, so both IF branches take the same inputs."""
    extra = sg.add_tensor(f"{sg.name}/unused_index", idx.dtype, ())
    sg.inputs = [extra, *sg.inputs]
    return sg
