"""TensorFlow graph -> kiln IR: walk a concrete function's live graph and legalise each op.

Each signature's function becomes one subgraph. Ops are visited in topological order; only
ops that feed an output (or have a side effect, such as a variable assignment) are imported.
Before emitting, TF-level patterns (GELU, ...) claim groups of ops. Function calls are either
fused through `kiln.fusion.registry` (functions carrying ``_implements``) or inlined;
While / If / Case become WHILE / IF ops over subgraphs imported the same way. The emitters and
patterns come in a `Legalization` (kiln/converter/scope.py): this module imports none of them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import ConversionError
from ..ir import Model, Subgraph, Tensor
from ..ops import subgraph_fields
from ..rules import Tracer
from ..schema import DType
from . import custom as custom_ops
from .context import EmitContext, Unsupported
from .scope import Legalization, Pending, Scope, distinct_outputs
from .tfutil import shape_signature, static_shape, to_dtype
from .values import ResourceRef, TensorListValue, VarInfo

_NO_LEGALISATION = "no legalisation"

@dataclass
class ImportStats:
    """What the importer saw: for the conversion report."""

    tf_ops: dict[str, int] = field(default_factory=dict)
    lowered: dict[str, set] = field(default_factory=dict)  # TF op type / pattern -> builtins emitted
    tracer: Tracer = field(default_factory=Tracer)   # fusion and pattern decisions (kiln.rules)
    inlined: list[str] = field(default_factory=list)
    custom: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


class Importer:
    """Imports concrete functions into one `Model` (one subgraph per signature).

    Args:
      legalization: the emitter and pattern tables (`kiln.converter.pipeline.legalization`).
      allow_custom_ops: unsupported TF ops become CUSTOM ops instead of an error.
      enable_resource_variables: mutable variables become LiteRT resource variables; when
        False a function that assigns a variable cannot be converted.
      fold_at_import: evaluate ops with constant inputs as they are emitted.
    """

    def __init__(self, legalization: Legalization, *, allow_custom_ops: bool = False,
                 enable_resource_variables: bool = True, fold_at_import: bool = True):
        self.model = Model("kiln converted")
        self.legalization = legalization
        self.allow_custom_ops = allow_custom_ops
        self.enable_resource_variables = enable_resource_variables
        self.fold_at_import = fold_at_import
        self.stats = ImportStats()
        self.unsupported: dict[str, list[str]] = {}
        self.variables: dict[int, VarInfo] = {}
        self._var_names: set[str] = set()
        self._sg_cache: dict[int, dict] = {}
        self._init_subgraph: Subgraph | None = None
        self._init_vars: list[VarInfo] = []

    # -- bookkeeping ------------------------------------------------------------------------
    def subgraph_cache(self, sg: Subgraph) -> dict:
        return self._sg_cache.setdefault(id(sg), {})

    # -- variables --------------------------------------------------------------------------
    def var_for(self, handle, name_hint: str = "") -> VarInfo:
        key = id(handle)
        var = self.variables.get(key)
        if var is None:
            name = _variable_name(handle, name_hint)
            base, i = name, 1
            while name in self._var_names:
                name = f"{base}_{i}"
                i += 1
            self._var_names.add(name)
            var = VarInfo(name=name, handle=handle)
            self.variables[key] = var
        return var

    def variable_constant(self, scope: Scope, var: VarInfo, tf_dtype, name: str) -> Tensor:
        """A read-only variable's value as a constant in ``scope``'s subgraph (one per var)."""
        key = ("var", id(var))
        t = scope.cache.get(key)
        if t is None:
            value = var.value(tf_dtype)
            t = scope.sg.add_constant(name, value)
            scope.cache[key] = t
        return t

    def var_handle(self, scope: Scope, var: VarInfo) -> Tensor:
        """The VAR_HANDLE output for a mutable variable in this subgraph (emitted once,
        at the front, after making sure the CALL_ONCE initialiser runs first)."""
        if not self.enable_resource_variables:
            raise ConversionError(
                f"variable {var.name!r} is assigned in the model but "
                "experimental_enable_resource_variables is False")
        key = ("handle", id(var))
        t = scope.cache.get(key)
        if t is not None:
            return t
        self._ensure_initialised(var)
        sg = scope.sg
        t = sg.add_tensor(var.name, DType.RESOURCE, ())
        index = 0
        while index < len(sg.operators) and sg.operators[index].op_type in ("CALL_ONCE", "VAR_HANDLE"):
            index += 1
        sg.add_operator("VAR_HANDLE", [], [t], index=index, options={"container": "", "shared_name": var.shared_name})
        scope.cache[key] = t
        return t

    def _ensure_initialised(self, var: VarInfo) -> None:
        if any(v is var for v in self._init_vars):
            return
        if self._init_subgraph is None:
            self._init_subgraph = Subgraph("kiln_init_variables")
        init = self._init_subgraph
        h = init.add_tensor(f"{var.name}/handle", DType.RESOURCE, ())
        value = init.add_constant(f"{var.name}/initial_value", var.value())
        init.add_operator("VAR_HANDLE", [], [h], options={"container": "", "shared_name": var.shared_name})
        init.add_operator("ASSIGN_VARIABLE", [h, value], [])
        self._init_vars.append(var)

    def finish_variables(self) -> None:
        """Append the initialiser subgraph and a CALL_ONCE at the front of every subgraph
        reached from a signature that handles variables."""
        if self._init_subgraph is None:
            return
        self.model.add_subgraph(self._init_subgraph)
        index = self.model.subgraph_index(self._init_subgraph)
        for sig in self.model.signatures:
            sg = sig.subgraph
            if any(op.op_type == "CALL_ONCE" for op in sg.operators):
                continue
            if self._uses_variables(sg, set()):
                sg.add_operator("CALL_ONCE", [], [], index=0, options={"init_subgraph_index": index})

    def _uses_variables(self, sg: Subgraph, seen: set) -> bool:
        if id(sg) in seen:
            return False
        seen.add(id(sg))
        for op in sg.operators:
            if op.op_type == "VAR_HANDLE":
                return True
            for key in subgraph_fields(op):
                if key in op.options and self._uses_variables(self.model.subgraphs[op.options[key]], seen):
                    return True
        return False

    # -- ops --------------------------------------------------------------------------------
    def import_op(self, scope: Scope, op, pending: Pending | None) -> None:
        self.stats.tf_ops[op.type] = self.stats.tf_ops.get(op.type, 0) + 1
        if pending is not None:
            emitter = pending.emit
        else:
            emitter = self.legalization.emitters.get(op.type)
            if emitter is None and _is_function_call(scope.graph, op):
                emitter = self.legalization.function_call
        ctx = EmitContext(scope, op, source=None if pending is None else pending.label)
        if emitter is None:
            self._unsupported(ctx, _NO_LEGALISATION)
            return
        try:
            result = emitter(ctx)
        except Unsupported as exc:
            self._unsupported(ctx, str(exc))
            return
        self._bind_outputs(scope, op, result)

    def _bind_outputs(self, scope: Scope, op, result) -> None:
        outs = op.outputs
        if result is None:
            if outs:
                raise ConversionError(f"emitter for {op.type} {op.name!r} returned no outputs")
            return
        if not isinstance(result, (list, tuple)):
            result = [result]
        if len(result) != len(outs):
            raise ConversionError(
                f"emitter for {op.type} {op.name!r} returned {len(result)} values for {len(outs)} outputs")
        for t, v in zip(outs, result):
            scope.bind(t, v)

    def _unsupported(self, ctx: EmitContext, reason: str) -> None:
        op = ctx.op
        if self.allow_custom_ops and not any(t.dtype.name in ("resource", "variant") for t in op.inputs):
            outputs = [ctx.out(i) for i in range(len(op.outputs))]
            options = custom_ops.encode_attrs(op)
            ctx.emit("CUSTOM", ctx.inputs(), outputs, fold=False, custom_code=op.type, custom_options=options)
            self.stats.custom[op.type] = self.stats.custom.get(op.type, 0) + 1
            self._bind_outputs(ctx.scope, op, outputs)
            return
        self.unsupported.setdefault(op.type, []).append(
            reason if reason != _NO_LEGALISATION else f"{ctx.name}: {reason}")
        # Keep importing so that every unsupported op is reported at once.
        self._bind_outputs(ctx.scope, op, [ctx.out(i) for i in range(len(op.outputs))])

    # -- functions --------------------------------------------------------------------------
    def new_subgraph(self, name: str) -> Subgraph:
        return self.model.add_subgraph(name)

    def import_signature(self, key: str, fn, input_names: list[str], output_names: list[str]):
        """Import concrete function ``fn`` as the subgraph of signature ``key``."""
        from ..ir import Signature

        start = time.perf_counter()
        graph = fn.graph
        sg = self.new_subgraph(key)
        scope = Scope(self, graph, sg)
        captured = {id(internal) for _, internal in graph.captures}
        user_inputs = [t for t in graph.inputs if id(t) not in captured]
        if len(user_inputs) != len(input_names):
            raise ConversionError(
                f"signature {key!r}: {len(user_inputs)} inputs but {len(input_names)} input names")
        sig_inputs = {}
        for t, name in zip(user_inputs, input_names):
            sig = shape_signature(t.shape)
            if sig is None:
                raise ConversionError(f"signature {key!r}: input {name!r} has unknown rank")
            ir = sg.add_tensor(f"{key}_{name}:0", to_dtype(t.dtype), static_shape(sig), shape_signature=sig)
            scope.bind(t, ir)
            sg.inputs.append(ir)
            sig_inputs[name] = ir
        self.bind_captures(scope, graph)
        values = scope.run(fn.outputs)
        outputs = [self.as_output(scope, v, f"{key}: output {name!r}") for v, name in zip(values, output_names)]
        outputs = distinct_outputs(sg, outputs, output_names, constants=True)
        sg.outputs = outputs
        signature = Signature(key, sg, sig_inputs, dict(zip(output_names, outputs)))
        self.model.signatures.append(signature)
        self.stats.seconds += time.perf_counter() - start
        return signature

    def bind_captures(self, scope: Scope, graph) -> None:
        for external, internal in graph.captures:
            if internal.dtype.name == "resource":
                scope.bind(internal, ResourceRef(self.var_for(external, internal.op.name)))
            elif hasattr(external, "numpy"):
                value = np.asarray(external.numpy())
                scope.bind(internal, scope.sg.add_constant(internal.op.name, value, to_dtype(internal.dtype)))
            else:
                raise ConversionError(f"cannot convert captured tensor {internal.name!r} ({external!r})")

    def as_output(self, scope: Scope, value, what: str) -> Tensor:
        if isinstance(value, TensorListValue):
            return value.tensor
        if isinstance(value, ResourceRef):
            raise ConversionError(f"{what} is a resource handle; return its value instead")
        return value

    # -- errors -----------------------------------------------------------------------------
    def _reasons(self, most: int = 5) -> str:
        """Why ops with an emitter still could not be converted (an op with no emitter at all
        needs no explanation), the first few of them."""
        reasons = list(dict.fromkeys(why for whys in self.unsupported.values() for why in whys
                                     if not why.endswith(_NO_LEGALISATION)))
        if not reasons:
            return ""
        more = f" (and {len(reasons) - most} more)" if len(reasons) > most else ""
        return f" Why: {'; '.join(reasons[:most])}{more}."

    def check_supported(self) -> None:
        """Raise the error users know from TF's converter when some ops had no legalisation."""
        if not self.unsupported:
            return
        builtin = sorted({op.op_type for _, _, op in self.model.operators() if op.op_type != "CUSTOM"})
        custom = sorted(self.unsupported)
        error = ConversionError(
            "Some of the operators in the model are not supported by the standard TensorFlow Lite "
            "runtime and are not recognized by TensorFlow. If you have a custom implementation for "
            "them you can disable this error with --allow_custom_ops, or by setting "
            f"allow_custom_ops=True when calling tf.lite.TFLiteConverter().{self._reasons()} Here is a list "
            f"of builtin operators you are using: {', '.join(builtin)}. Here is a list of operators for "
            f"which you will need custom implementations: {', '.join(custom)}.")
        error.details = [d for ops in self.unsupported.values() for d in ops]
        raise error


def _is_function_call(graph, op) -> bool:
    g = graph
    while g is not None:
        if g._get_function(op.type) is not None:  # noqa: SLF001
            return True
        g = getattr(g, "outer_graph", None)
    return False


def _variable_name(handle, hint: str) -> str:
    """A readable shared name for a variable (the handle's own name when it has one)."""
    try:
        text = repr(handle)
        start = text.index('name="') + 6
        name = text[start:text.index('"', start)]
        if name:
            return name
    except ValueError:  # str.index: the handle's repr names no variable
        pass
    return hint or "variable"
